"""The typed serving plan: parsing (with named errors), the stored JSON form, and the changes."""

from __future__ import annotations

import dataclasses

import pytest

from nobackfill.catalog.plan import Merge, Plan, PlanError, RouteChoice, Space, UpgradeRecord


def _plan() -> Plan:
    old = Space(space_id="old", dim=8, model="/m/old", dir="spaces/old", name="old")
    new = Space(space_id="new", dim=16, model="/m/new", dir="spaces/new", name="new")
    return Plan(current="new", spaces=(old, new),
                upgrades=(UpgradeRecord(path="/u/x", kind="procrustes", source="new", target="old"),),
                routes={"old": {"t2i": RouteChoice(route="fused", w=0.3, calibration={"fused": {"R@1": 0.5}})}},
                merge=Merge(method="rank", score_maps={"t2i": {}}), calibration={"data": "val"})


def test_a_plan_round_trips_through_its_stored_form():
    plan = _plan()
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.serving_order() == ["new", "old"] and plan.old_spaces()[0].space_id == "old"
    assert plan.route("old", "t2i").w == 0.3 and plan.route("old", "i2t") is None
    assert plan.merge_method == "rank" and plan.current_space.dim == 16


@pytest.mark.parametrize("mutate, words", [
    (lambda j: j.update(current="nowhere"), "plan.current 'nowhere'"),
    (lambda j: j["spaces"].append(dict(j["spaces"][0])), "lists a space twice"),
    (lambda j: j["spaces"][0].update(dir="../outside"), "must lie inside"),
    (lambda j: j["spaces"][0].update(dim=0), "positive dim"),
    (lambda j: j["spaces"][1].update(retired=True), "current space cannot be retired"),
    (lambda j: j["spaces"][0].update(modalities=["audio"]), "modalities"),
    (lambda j: j.update(spaces=[]), "non-empty"),
    (lambda j: j.update(upgrades=[{"path": 3}]), "plan.upgrades"),
    (lambda j: j.update(merge={"score_maps": {}}), "plan.merge"),
    (lambda j: j.update(routes={"old": {"t2i": "fused"}}), "plan.routes"),
])
def test_a_bad_stored_plan_is_refused_naming_the_field(mutate, words):
    obj = _plan().to_json()
    mutate(obj)
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(".", r"\.")):
        Plan.from_json(obj)


def test_changes_build_new_plans_and_leave_the_old_one_alone():
    plan = _plan()
    pinned = plan.with_route("old", "i2t", RouteChoice(route="bridge", pinned=True))
    assert plan.route("old", "i2t") is None and pinned.route("old", "i2t").pinned
    fresh = pinned.pinned_only()
    assert fresh.route("old", "t2i") is None and fresh.route("old", "i2t").route == "bridge"
    assert fresh.merge is None and fresh.calibration is None
    newer = Space(space_id="newer", dim=4, model="/m/newer", dir="spaces/newer")
    up = plan.with_space(newer, current=True).with_upgrades([plan.upgrades[0], dataclasses.replace(
        plan.upgrades[0], path="/u/y", source="newer", target="new")])
    assert up.current == "newer" and [u.path for u in up.upgrades] == ["/u/x", "/u/y"]
    assert up.serving_order() == ["newer", "new", "old"]
    retired = up.retire("old")
    assert retired.serving_order() == ["newer", "new"] and "old" not in retired.routes
    with pytest.raises(PlanError, match="cannot be retired"):
        up.retire("newer")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.current = "old"  # type: ignore[misc]


# ----------------------------------------------------------------------------- pin, then unpin
def _upgraded(tmp_path, calibrated: bool):
    """A text collection upgraded to a noisy rotation of its model with a Procrustes bridge:
    calibrated on paraphrased captions (fused wins at some 0 < w < 1), or not."""
    import numpy as np

    from _collection_helpers import NEW_REF, OLD_REF, HashEncoder, pool_with, write_procrustes_upgrade
    from nobackfill.collection.collection import Collection
    from nobackfill.collection.ingest import add_items, text_item
    from nobackfill.lifecycle.calibrate import CalibrationTask
    from nobackfill.lifecycle.plan_changes import upgrade_collection

    old = HashEncoder(12, "old", name="old")
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    new = HashEncoder(12, "noisy", base=old, mix=(q + 0.2 * rng.standard_normal(q.shape)).astype(np.float32),
                      name="new")
    texts = [f"caption {i}" for i in range(50)]
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=12, model=OLD_REF, name="old",
                          modalities=old.modalities)
    add_items(c, old, [text_item(t, id=f"t{i}") for i, t in enumerate(texts)], progress=False)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    up = write_procrustes_upgrade(tmp_path / "up", q.T.astype(np.float32), new, old)
    task = CalibrationTask("t2t", [t + " (paraphrased)" for t in texts], texts, np.arange(50), np.arange(50))
    upgrade_collection(c, NEW_REF, bridges=[up], calibration=[task] if calibrated else None, pool=pool)
    return c, old.space_id


@pytest.mark.parametrize("pin", [("old-model", None), ("bridge", None), ("fused", 0.25)])
def test_unpinning_brings_the_calibrated_route_back(tmp_path, pin):
    from nobackfill.lifecycle.plan_changes import pin_route, route_table

    c, old = _upgraded(tmp_path, calibrated=True)
    before = route_table(c.plan)[old]["t2t"]
    assert before["calibrated"] and not before["pinned"]
    pin_route(c, old, "t2t", pin[0], pin[1])
    pinned = route_table(c.plan)[old]["t2t"]
    assert pinned["pinned"] and (pinned["route"], pinned["w"]) == (pin[0], pin[1] if pin[0] == "fused" else None)
    pin_route(c, old, "t2t", None)
    after = route_table(c.plan)[old]["t2t"]
    assert (after["route"], after["w"], after["pinned"], after["calibrated"]) == \
        (before["route"], before["w"], False, True)
    assert c.plan.route(old, "t2t").calibration == c.plan.route(old, "t2t").calibration  # numbers kept


def test_unpinning_an_uncalibrated_route_brings_the_default_back(tmp_path):
    from nobackfill.lifecycle.plan_changes import pin_route, route_table

    c, old = _upgraded(tmp_path, calibrated=False)
    assert route_table(c.plan)[old]["t2t"]["route"] == "bridge"  # the documented default
    pin_route(c, old, "t2t", "old-model")
    assert route_table(c.plan)[old]["t2t"]["route"] == "old-model"
    pin_route(c, old, "t2t", None)
    after = route_table(c.plan)[old]["t2t"]
    assert (after["route"], after["pinned"], after["calibrated"]) == ("bridge", False, False)
