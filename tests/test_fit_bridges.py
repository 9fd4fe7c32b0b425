"""Bridges fitted from a collection's own backfill: registered per direction, swapped only when
better, a failed fit leaves the serving bridge, pinned routes kept, shown in status."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair
from nobackfill.compat.fitted import FitConfig
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items
from nobackfill.lifecycle.backfill import backfill_status, run_backfill, start_backfill
from nobackfill.lifecycle.fit_bridges import (FitBridgesConfig, backfilled_pairs, fit_collection_bridges,
                                              fitted_status)
from nobackfill.lifecycle.plan_changes import pin_route, route_table, upgrade_collection
from nobackfill.search import Searcher

CFG = FitBridgesConfig(fit=FitConfig(families=("orthogonal", "ridge", "mlp"), epochs=10, hidden=32, max_steps=100))


def _backfilled(tmp_path, n_images: int = 120, limit: int | None = None):
    old, new, _ = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    upgrade_collection(c, NEW_REF, pool=pool, fit_bridges=False)  # no bridge: the old-model route serves
    run_backfill(c, new, order="random", batch_size=64, limit=limit)
    return c, old, new, pool


def test_pairs_are_the_items_in_both_spaces(tmp_path):
    c, old, new, pool = _backfilled(tmp_path, n_images=40, limit=70)  # (a first batch of 64: the merge's maps)
    pairs = backfilled_pairs(c, old.space_id)
    assert sum(len(p.keys) for p in pairs.values()) == 70
    for p in pairs.values():
        assert p.new.shape[1] == 16 and p.old.shape[1] == 12 and len(p.keys) == len(p.new) == len(p.old)


def test_a_fit_registers_a_bridge_per_direction_and_serves_it(tmp_path):
    c, old, new, pool = _backfilled(tmp_path, limit=300)
    before = c.plan
    assert not [u for u in before.upgrades if u.kind == "fitted"]
    rep = fit_collection_bridges(c, cfg=CFG, pool=pool)
    sid = old.space_id
    assert rep[sid]["t2i"]["swapped"] and rep[sid]["i2t"]["swapped"]
    fitted = [u for u in c.plan.upgrades if u.kind == "fitted"]
    assert {u.directions for u in fitted} >= {("t2i",), ("i2t",)}
    for u in fitted:
        manifest = json.loads((c.path / "bridges" / u.name / "upgrade.json").read_text())
        assert manifest["kind"] == "fitted" and manifest["fitted"]["heldout"]["r1"] == u.info["heldout"]["r1"]
        assert u.info["pairs"] > 0 and u.info["fitted_at"] and u.info["version"] == 1
    # the new space is a linear map of the old one: the old model ranks exactly as the new one, so
    # no bridge can beat it significantly and old-model is kept; the bridge route is available
    table = route_table(c.plan)[sid]
    assert table["t2i"]["route"] == "old-model" and "bridge" in table["t2i"]["available"]
    assert table["t2i"]["calibration"]["fitted"]["family"] == rep[sid]["t2i"]["chosen"].split("@")[0]
    assert rep[sid]["t2i"]["heldout"]["r1"] > 0.9  # the fitted map reproduces the new model's ranking
    pin_route(c, sid, "t2i", "bridge")
    c2 = Collection.open(c.path)
    hits = Searcher(c2, pool=pool).search(text="caption 0 of image 3 seed 0", k=120, target="image").hits
    assert hits and any(h.route == "bridge" for h in hits)
    st = {(r["space"], r["direction"]): r for r in fitted_status(c.plan)}
    assert st[(sid, "t2i")]["family"] == "ensemble" and st[(sid, "t2i")]["pairs"] > 0
    members = st[(sid, "t2i")]["candidate"].split(" + ")  # the three best-scored candidates, averaged
    assert len(members) == 3 and all(m.split("@")[0] in ("orthogonal", "ridge", "mlp") for m in members)


def test_a_refit_that_is_not_better_by_the_gain_is_not_swapped_in(tmp_path):
    c, old, new, pool = _backfilled(tmp_path, limit=300)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    plan = c.plan
    rep = fit_collection_bridges(c, cfg=CFG, pool=pool)  # same pairs: the same score at best
    assert not any(e.get("swapped") for e in rep[old.space_id].values())
    assert c.plan.upgrades == plan.upgrades and c.plan.routes == plan.routes
    assert len(list((c.path / "bridges").glob("fitted-*-t2i-v*"))) == 1
    # a serving bridge that cannot be read any more is replaced: version 2, one record per direction
    serving = [u for u in c.plan.upgrades if u.kind == "fitted" and u.directions == ("t2i",)][0]
    (c.path / "bridges" / serving.name / "fitted.safetensors").unlink()
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    t2i = [u for u in c.plan.upgrades if u.kind == "fitted" and u.directions == ("t2i",)]
    assert len(t2i) == 1 and t2i[0].info["version"] == 2 and t2i[0].path != serving.path


def test_a_refit_that_keeps_the_serving_bridge_chooses_its_route_again(tmp_path):
    """The route chosen at the first fit (on its few held-out queries) is not frozen: a later fit that
    keeps the serving bridge scores its routes again, with that bridge's outputs, and records the
    choice (a pinned route stays, as ever)."""
    from nobackfill.catalog.plan import RouteChoice

    c, old, new, pool = _backfilled(tmp_path, limit=300)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    sid = old.space_id
    first = c.plan.route(sid, "t2i")
    assert first.route == "old-model"  # (a linear map of the old space: no bridge beats the old model)
    # as if the first fit had chosen the bridge on a handful of queries
    c.set_plan(lambda p: p.with_route(sid, "t2i", RouteChoice(route="bridge", calibration=dict(first.calibration))))
    upgrades = c.plan.upgrades
    rep = fit_collection_bridges(c, cfg=CFG, pool=pool)
    assert not rep[sid]["t2i"]["swapped"] and c.plan.upgrades == upgrades  # the same bridge serves
    assert rep[sid]["t2i"]["route"] == "old-model" and c.plan.route(sid, "t2i").route == "old-model"
    pin_route(c, sid, "t2i", "bridge")
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    assert c.plan.route(sid, "t2i").route == "bridge" and c.plan.route(sid, "t2i").pinned


def test_a_fit_that_dies_before_the_swap_leaves_the_serving_bridge(tmp_path, monkeypatch):
    c, old, new, pool = _backfilled(tmp_path, limit=300)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    plan = c.plan
    serving = [u for u in plan.upgrades if u.kind == "fitted" and u.directions == ("t2i",)][0]
    tensors = c.path / "bridges" / serving.name / "fitted.safetensors"
    tensors.rename(tensors.with_suffix(".aside"))  # unreadable for now: the next fit replaces it

    def killed(*_a, **_kw):
        raise KeyboardInterrupt("killed during the fit")

    monkeypatch.setattr(Collection, "set_plan", killed)
    with pytest.raises(KeyboardInterrupt):
        fit_collection_bridges(c, cfg=CFG, pool=pool)
    monkeypatch.undo()
    tensors.with_suffix(".aside").rename(tensors)
    again = Collection.open(c.path)
    assert again.plan.upgrades == plan.upgrades  # the new version was written, never put in service
    assert (c.path / "bridges" / serving.name.replace("-v1", "-v2")).is_dir()
    pin_route(again, old.space_id, "t2i", "bridge")
    hits = Searcher(Collection.open(c.path), pool=pool).search(text="caption 1 of image 3 seed 0", k=120,
                                                                target="image").hits
    assert any(h.route == "bridge" for h in hits)


def test_a_pinned_route_is_kept(tmp_path):
    c, old, new, pool = _backfilled(tmp_path, limit=300)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    pin_route(c, old.space_id, "t2i", "bridge")
    serving = [u for u in c.plan.upgrades if u.kind == "fitted" and u.directions == ("t2i",)][0]
    (c.path / "bridges" / serving.name / "fitted.safetensors").unlink()  # forces a new fit in
    rep = fit_collection_bridges(c, cfg=CFG, pool=pool)
    assert rep[old.space_id]["t2i"]["swapped"] and rep[old.space_id]["t2i"]["route"] == "old-model"
    r = c.plan.route(old.space_id, "t2i")
    assert r.pinned and r.route == "bridge"
    # the merge's maps follow the route served: t2i's were fitted for old-model, not the pinned bridge
    maps = c.plan.merge.score_maps if c.plan.merge is not None else {}
    assert not any(k.startswith(old.space_id) for k in maps.get("t2i", {})), maps


def test_a_route_pinned_after_the_maps_were_fitted_is_merged_on_raw_scores(tmp_path):
    """A pin after the fit leaves maps of another route in the plan: the searcher merges that
    direction by raw scores (never raw scores against chances)."""
    c, old, new, pool = _backfilled(tmp_path, limit=150)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    c = Collection.open(c.path)
    assert c.plan.merge is not None and c.plan.merge.method == "calibrated" and "t2i" in c.plan.merge.score_maps
    route = c.plan.route(old.space_id, "t2i").route
    pin_route(c, old.space_id, "t2i", "bridge" if route != "bridge" else "old-model")
    c = Collection.open(c.path)
    q = "caption 0 of image 3 seed 0"
    got = Searcher(c, pool=pool).search(text=q, k=20, target="image")
    raw = Searcher(c, pool=pool, merge="raw").search(text=q, k=20, target="image")
    assert got.merge == "raw" and [h.id for h in got.hits] == [h.id for h in raw.hits]


def test_merge_maps_without_labels_never_replace_a_labelled_calibration(tmp_path):
    from nobackfill.catalog.plan import Merge
    from nobackfill.lifecycle.fit_bridges import _with_merge_maps

    c, old, new, pool = _backfilled(tmp_path, limit=300)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    plan = c.plan
    assert plan.merge is not None and "without_labels" in plan.merge.calibration
    sid = old.space_id
    route = plan.route(sid, "t2i").route
    found = {(sid, "t2i"): {"route": route, "w": None, "native": {"a": 1.0, "b": 0.0}, "routed": {"a": 2.0, "b": 0.0},
                            "agreed": 20, "queries": 40}}
    labelled = dataclasses.replace(plan, calibration={"data": "val"}, merge=Merge("rank"))
    assert _with_merge_maps(labelled, found) is labelled  # labels decide
    chosen = dataclasses.replace(plan, merge=Merge("rank"))
    assert _with_merge_maps(chosen, found) is chosen  # a merge chosen otherwise is kept
    out = _with_merge_maps(plan, found)
    assert out.merge.score_maps["t2i"][f"{sid}/{route}"] == {"a": 2.0, "b": 0.0}
    gone = _with_merge_maps(plan, {(sid, d): None for d in plan.merge.score_maps})
    assert gone.merge is None  # no direction left with maps: the raw merge again


def test_too_few_pairs_fit_nothing(tmp_path):
    c, old, new, pool = _backfilled(tmp_path, n_images=40, limit=10)  # (64 pairs: the first batch)
    rep = fit_collection_bridges(c, cfg=dataclasses.replace(CFG, min_pairs=65), pool=pool)
    assert "skipped" in rep[old.space_id] and not [u for u in c.plan.upgrades if u.kind == "fitted"]


def _upgraded_no_bridge(tmp_path, n_images: int, **fit_sample):
    old, new, _ = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    upgrade_collection(c, NEW_REF, pool=pool, fit_sample=fit_sample or None)
    return c, old, new, pool


def test_an_upgrade_without_a_bridge_backfills_a_sample_first_then_fits_and_refits(tmp_path, monkeypatch):
    from nobackfill.lifecycle import backfill_fit, fit_bridges
    from nobackfill.lifecycle.backfill_jobs import ORDER_FILE, _read

    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    c, old, new, pool = _upgraded_no_bridge(tmp_path, 120, fraction=0.1, min_pairs=40, max_pairs=60)
    assert backfill_fit.fit_state(c)["next"] is None
    calls = []
    real = fit_bridges.fit_collection_bridges

    def counted(collection, **kw):
        calls.append(backfill_fit.backfilled_count(collection, collection.current_space))
        return real(collection, **{**kw, "cfg": CFG})

    monkeypatch.setattr(fit_bridges, "fit_collection_bridges", counted)
    run_backfill(c, new, order="sequential", batch_size=16, limit=16)
    st = backfill_fit.fit_state(c)
    assert st["next"] == 80  # 40 images + 40 captions: the stratified sample, the first threshold
    order = _read(c, ORDER_FILE)
    head = [c.get(i).modality for i in order[:80]]
    assert head.count("image") == 40 and head.count("text") == 40
    # scenes: the sampled captions are captions of the sampled images (80 of them to choose 40 from)
    sampled_images = {i for i in order[:80] if c.get(i).modality == "image"}
    assert all(c.get(i).metadata["image_id"] in sampled_images for i in order[:80] if c.get(i).modality == "text")
    assert not calls
    run_backfill(c, new, order="sequential", batch_size=16)
    st = backfill_fit.fit_state(c)
    # fits once the sample is in (80 pairs), at each doubling (160, 320), and at the end (360)
    assert calls == [80, 160, 320, 360]
    assert [f["pairs"] for f in st["fits"]] == calls
    # each fit keeps what it said (a backfill followed over HTTP prints it: trial AF)
    assert all(f["said"][0] == f"fitting bridges on {f['pairs']} backfilled pairs (the backfill goes on once they "
               "are chosen)" and f["said"][-1].startswith(f"bridges fitted on {f['pairs']} pairs") for f in st["fits"])
    assert st["next"] is None  # the backfill is done: no threshold left to announce
    assert [u for u in c.plan.upgrades if u.kind == "fitted"]


def test_the_uncertainty_order_backfills_the_scene_sample_first_too(tmp_path):
    """The default order measures a sample before it ranks the rest: with bridges to fit, that sample
    opens with the fit's scene sample (random images, then their captions), which is backfilled before
    anything else, as with the other orders."""
    from nobackfill.lifecycle import backfill_fit
    from nobackfill.lifecycle.backfill_jobs import ORDER_FILE, SAMPLE_FILE, _read

    c, old, new, pool = _upgraded_no_bridge(tmp_path, 120, fraction=0.1, min_pairs=40, max_pairs=60)
    said: list[str] = []
    job = start_backfill(c, new, order="uncertainty", pool=pool, min_sample=20, sample_fraction=0.05,
                         log=said.append)
    assert backfill_fit.fit_state(c)["next"] == 80 and job.sample >= 80 and job.phase == "sample"
    # the measured sample is the fit's and the uncertainty order's own: the line says both counts
    assert any(f"measuring how {job.sample} sampled items are served now (the bridge fit's sample of 80 and "
               f"{job.sample - 80} more)" in m for m in said), said
    head = _read(c, ORDER_FILE)[:80]
    assert head == _read(c, SAMPLE_FILE)["ids"][:80]
    images = {i for i in head if c.get(i).modality == "image"}
    texts = [i for i in head if c.get(i).modality == "text"]
    assert len(images) == len(texts) == 40 and all(c.get(i).metadata["image_id"] in images for i in texts)
    run_backfill(c, new, order="uncertainty", batch_size=16, limit=80, pool=pool)
    done = {i for i, (_, space) in c.serving(list(c.items())).items() if space == new.space_id}
    assert set(head) <= done  # the first fit's pairs are the scene sample


def test_an_upgrade_with_a_bridge_fits_nothing(tmp_path):
    from _collection_helpers import write_procrustes_upgrade
    from nobackfill.lifecycle import backfill_fit

    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=10, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(tmp_path / "up", w, new, old)], pool=pool)
    assert backfill_fit.fit_state(c) is None


def test_cli_upgrade_without_a_bridge_backfills_fits_and_status_shows_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app
    from nobackfill.lifecycle import backfill_fit, fit_bridges

    old, new, _ = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=60, captions_per_image=2)
    c0, c = (Collection.create(tmp_path / n, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
             for n in ("c0", "c"))
    for coll in (c0, c):
        add_items(coll, old, folder_items(data).items, progress=False)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    cli = lambda *a: CliRunner().invoke(app, [str(x) for x in a])  # noqa: E731
    r = cli("collection", "upgrade", c0.path, "--model", NEW_REF)
    assert r.exit_code == 0, r.output
    assert "fits bridges" in " ".join(r.output.split())
    # where the first fit comes: here the default sample (at least 512 a modality) is the whole collection,
    # where a bridge would serve no query (trial AI D3): the command says how to fit one earlier
    assert "the first fit after its sample of 180 of 180 items (100%)" in " ".join(r.output.split())
    assert "--fit-sample 0.05,64 fits the first one after 64 items" in " ".join(r.output.split())
    r = cli("collection", "upgrade", c.path, "--model", NEW_REF, "--fit-sample", "0.1,40")
    assert r.exit_code == 0 and "first fit after its sample of 80 of 180 items (44%)" in " ".join(r.output.split()), \
        r.output
    assert "--fit-sample 0.05,64" not in r.output
    # no step left to the user (trial AG: "uncalibrated defaults ... pass --calibrate DATA" read as one)
    assert "chosen without labels as the backfill goes" in " ".join(r.output.split()) and "pass --calibrate" not in r.output
    assert backfill_fit.fit_state(Collection.open(c.path)) is not None
    r = cli("collection", "backfill", c.path, "--order", "random", "--batch-size", 32)
    assert r.exit_code == 0, r.output
    r = cli("collection", "status", c.path)
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "fitted bridge t2i" in out and re.search(r"bridge fits at \d+, 180 pairs", out), out
    assert "next at" not in out  # done: no more pairs will come
    assert re.search(r"held-out agreement \d\.\d{3} over \d+ held-out queries", out)  # what the score was on
    assert "(chosen without labels, with the fitted bridge)" in out and "routes chosen without labels" in out
    # the fits also fitted the merge's score maps (no labels: where both models agree)
    assert "merge: calibrated (score maps fitted without labels" in out, out
    r = cli("collection", "status", c.path, "--json")
    st = json.loads(r.output)
    assert st["merge"] == "calibrated" and st["merge_without_labels"] is True and st["calibrated"] is False
    assert {b["direction"] for b in st["fitted_bridges"]["serving"]} >= {"t2i", "i2t"}
    r = cli("collection", "retire", c.path, "--space", old.space_id)
    assert r.exit_code == 0, r.output
    out = " ".join(cli("collection", "status", c.path).output.split())
    assert "bridge fits" not in out and "fitted bridge" not in out  # nothing is fitted into a retired space
    # one space left: nothing routes or merges (trial I: "routes uncalibrated (no bridge fitted yet)")
    assert "one space: every search is answered in it" in out and "merge:" not in out and "uncalibrated" not in out, out


def test_status_says_why_a_space_got_no_bridge_and_when_the_last_fit_comes(tmp_path):
    """A fit that skips a whole space (too few pairs) records why; a next threshold past the size of
    the collection is announced as the end of the backfill."""
    from nobackfill.lifecycle import backfill_fit

    c, old, new, pool = _upgraded_no_bridge(tmp_path, 30, fraction=0.1, min_pairs=40, max_pairs=60)
    with pytest.MonkeyPatch.context() as m:  # 16 pairs (not the 64 a first batch reaches for the merge maps)
        m.setattr(backfill_fit, "MERGE_FIRST", 16)
        run_backfill(c, new, order="random", batch_size=8, limit=16, pool=pool)
    backfill_fit.maybe_fit(c, final=True, pool=pool, cfg=CFG)  # 16 pairs: too few for any candidate
    summary = backfill_fit.fit_summary(c)
    assert "backfilled pairs" in summary["fits"][-1]["skipped"][f"{old.space_id}/any direction"]
    st = backfill_fit.fit_state(c)
    for nxt, at_end in ((32, False), (90, True), (500, True)):  # the collection holds 90 items
        st["next"] = nxt
        backfill_fit._write(c, backfill_fit.FIT_FILE, st)
        assert backfill_fit.fit_summary(c)["next_at_end"] is at_end


def test_http_upgrade_without_bridges_passes_fit_bridges(tmp_path):
    pytest.importorskip("fastapi")
    from _collection_helpers import ADMIN, READ, served_old_collection
    from nobackfill.lifecycle import backfill_fit

    api, c, old, new = served_old_collection(tmp_path, make_folder(tmp_path / "data", n_images=6, captions_per_image=2))
    r = api.post("/v1/upgrade", json={"model": "new"}, headers={"Authorization": "Bearer " + ADMIN})
    assert r.status_code == 200, r.text
    assert r.json()["merge"] == "raw"  # the merge in force, as the CLI shows it (not null for the default)
    assert backfill_fit.fit_state(Collection.open(c.path))["target"] == new.space_id
    st = api.get("/v1/status", headers={"Authorization": "Bearer " + READ}).json()
    assert st["fitted_bridges"]["enabled"] and st["fitted_bridges"]["serving"] == []


def test_a_registered_bridge_is_one_more_candidate(tmp_path):
    from _collection_helpers import write_procrustes_upgrade

    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=120, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)  # an exact bridge
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool, fit_bridges=False)
    run_backfill(c, new, order="random", batch_size=64, limit=300)
    rep = fit_collection_bridges(c, cfg=CFG, pool=pool)
    e = rep[old.space_id]["t2i"]
    assert e["chosen"] == "given" and e["heldout"]["r1"] == 1.0 and not e["swapped"]
    assert not [u for u in c.plan.upgrades if u.kind == "fitted" and u.directions == ("t2i",)]
    # the user's bridge kept: its route is tested like a fitted one's and the merge gets its maps
    # (trial O: with --bridge and --fit-bridge the route and the raw merge were never looked at again)
    route = c.plan.route(old.space_id, "t2i")
    assert route is not None and route.route == e["route"] and route.calibration["fitted"] == {"given": True}
    merge = c.plan.merge
    assert merge is not None and "without_labels" in merge.calibration
    assert f"{old.space_id}/{e['route']}" in merge.score_maps["t2i"]


def test_fit_settings_recorded_by_the_upgrade_are_used_by_the_backfills_fits(tmp_path):
    from nobackfill.lifecycle import backfill_fit

    fit = {"families": ("ridge",), "epochs": 5, "max_steps": 50}
    c, old, new, pool = _upgraded_no_bridge(tmp_path, 120, fraction=0.1, min_pairs=40, max_pairs=60, fit=fit)
    assert backfill_fit.fit_state(c)["fit"]["families"] == ["ridge"]
    run_backfill(c, new, order="sequential", batch_size=16, limit=96)  # the sample (80) in: one fit
    fitted = [u for u in c.plan.upgrades if u.kind == "fitted"]
    assert fitted and {m.split("@")[0] for u in fitted for m in u.info["candidate"].split(" + ")} == {"ridge"}
    with pytest.raises(backfill_fit.FitSampleError, match="fields"):
        backfill_fit.enable_fit(c, new.space_id, {"fit": {"famillies": ("ridge",)}})
    with pytest.raises(backfill_fit.FitSampleError, match="unknown bridge families"):
        backfill_fit.enable_fit(c, new.space_id, {"fit": {"families": ("cubic",)}})
    with pytest.raises(backfill_fit.FitSampleError, match="at least one bridge family"):
        backfill_fit.enable_fit(c, new.space_id, {"fit": {"families": []}})
    assert backfill_fit.fit_state(c)["fit"]["families"] == ["ridge"]  # a refused setting changed nothing


def test_pairs_know_their_scenes_and_a_scene_is_held_out_whole(tmp_path):
    from nobackfill.compat.fitted import heldout_mask
    from nobackfill.lifecycle.fit_bridges import scene_of

    c, old, new, pool = _backfilled(tmp_path, n_images=60)
    pairs = backfilled_pairs(c, old.space_id)
    image_ids = {scene_of(c.get(k)) for k in (it.id for it in c.iter_items("image"))}
    assert set(pairs["image"].scenes) == image_ids  # an image is its own scene
    assert set(pairs["text"].scenes) <= image_ids and len(set(pairs["text"].scenes)) == 60  # a caption: its image's
    masks = {m: heldout_mask(p.scenes, 0.2) for m, p in pairs.items()}
    held_images = {s for s, h in zip(pairs["image"].scenes, masks["image"]) if h}
    assert held_images and {s for s, h in zip(pairs["text"].scenes, masks["text"]) if h} == held_images


def test_retiring_a_space_drops_the_bridges_fitted_into_it(tmp_path):
    from nobackfill.compat.fitted.stored import DOC_DIR
    from nobackfill.lifecycle.backfill import retire_space

    c, old, new, pool = _backfilled(tmp_path, n_images=60, limit=150)  # (the old space serves 30 items)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    run_backfill(c, new, order="random", batch_size=64)  # then the rest: the old space serves nothing
    sid = old.space_id
    stem = f"{DOC_DIR}/fitted-{sid}-"
    assert [u for u in c.plan.upgrades if u.kind == "fitted"] and c.catalog.list_docs(stem)
    assert list((c.path / "bridges").glob(f"fitted-{sid}-*"))
    retire_space(c, sid)
    c2 = Collection.open(c.path)
    assert not [u for u in c2.plan.upgrades if u.kind == "fitted"] and not fitted_status(c2.plan)
    assert c2.catalog.list_docs(stem) == [] and not list((c.path / "bridges").glob(f"fitted-{sid}-*"))
    hits = Searcher(c2, pool=pool).search(text="caption 0 of image 3 seed 0", k=5, target="image").hits
    assert hits and all(h.space == new.space_id for h in hits)


def test_a_space_is_not_retired_during_a_fit_and_a_fit_never_serves_a_retired_space(tmp_path, monkeypatch):
    """Retire waits for no fit: refused while one holds the fit lock (the backfill's last fit runs
    after status shows the backfill done). And a fit whose space was retired before its commit puts
    nothing in service and leaves no stored bridge behind."""
    from nobackfill.compat.fitted.stored import DOC_DIR
    from nobackfill.lifecycle.backfill import BackfillError, retire_space
    from nobackfill.lifecycle.backfill_jobs import JOB_DIR

    c, old, new, pool = _backfilled(tmp_path, n_images=60, limit=150)  # (the old space serves 30 items)
    sid = old.space_id
    plan = c.plan
    with c.catalog.lock(f"{JOB_DIR}/fit"):
        with pytest.raises(BackfillError, match="a bridge fit is running"):
            retire_space(c, sid)
    assert Collection.open(c.path).plan == plan
    real = Collection.set_plan

    def retired_meanwhile(self, fn):  # the space is retired between the fit and its commit
        return real(self, lambda p: fn(p.retire(sid)))

    monkeypatch.setattr(Collection, "set_plan", retired_meanwhile)
    rep = fit_collection_bridges(c, cfg=CFG, pool=pool)
    monkeypatch.undo()
    c2 = Collection.open(c.path)
    assert not [u for u in c2.plan.upgrades if u.kind == "fitted"] and c2.space(sid).retired
    assert c2.catalog.list_docs(f"{DOC_DIR}/fitted-{sid}-") == []
    assert all(not e.get("swapped") and "retired" in e.get("skipped", "") for e in rep[sid].values()
               if isinstance(e, dict) and e.get("chosen"))


def test_before_the_first_bridge_fit_the_merge_maps_are_fitted_from_64_pairs(tmp_path):
    """A sample bigger than the pairs so far: no bridge fit yet, but the merge's score maps are
    fitted at 64 pairs (then at each doubling), for the old-model route in force; the first batch
    holds the 64 items whatever the batch size or the limit (trial O: at 51 the raw merge served,
    below the old model), so the maps come with the first items the new space serves."""
    from nobackfill.lifecycle import backfill_fit

    c, old, new, pool = _upgraded_no_bridge(tmp_path, 60, fraction=0.5, min_pairs=170, max_pairs=170)
    said = []
    out = run_backfill(c, new, order="random", batch_size=16, limit=48, pool=pool, log=said.append)
    assert out["committed"] == 64 and any("the first batch is 64 items, past the limit of 48" in x for x in said)
    c = Collection.open(c.path)
    st = backfill_fit.fit_state(c)
    assert st["fits"] == [] and st["merge_maps"]["pairs"] == 64 and st["merge_next"] == 128
    run_backfill(c, new, order="random", batch_size=16, limit=16, pool=pool)  # maps there: batches as asked
    assert backfill_status(Collection.open(c.path))["done"] == 80
    assert c.plan.merge.method == "calibrated" and "without_labels" in c.plan.merge.calibration
    assert all(f"{old.space_id}/old-model" in m for m in c.plan.merge.score_maps.values())
    from typer.testing import CliRunner

    from nobackfill.cli import app

    out = " ".join(CliRunner().invoke(app, ["collection", "status", str(c.path)]).output.split())
    assert "merge: calibrated (score maps fitted without labels" in out and "no bridge fitted yet" in out, out


def test_a_running_fit_is_named_in_status_and_in_the_backfills_output(tmp_path, monkeypatch):
    """Trial H: the backfill seemed to stall for 16-25 s at each refit, with nothing saying why. Now
    status names the fit while it runs (pairs, since, who), the run's own output says when a fit
    starts and what it did, and a fit whose process is gone is not shown as running."""
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app
    from nobackfill.lifecycle import backfill_fit, fit_bridges

    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    c, old, new, pool = _upgraded_no_bridge(tmp_path, 60, fraction=0.1, min_pairs=40, max_pairs=60)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    cli = lambda *a: CliRunner().invoke(app, [str(x) for x in a])  # noqa: E731
    seen: list[tuple[dict | None, str]] = []
    notes: list[tuple[float | None, str]] = []
    real = fit_bridges.fit_collection_bridges

    def watched(collection, **kw):
        seen.append((backfill_fit.fit_summary(Collection.open(c.path))["fitting"],
                     " ".join(cli("collection", "status", c.path).output.split())))
        st = backfill_status(Collection.open(c.path))
        notes.append((st["eta_s"], st.get("note") or ""))
        return real(collection, **{**kw, "cfg": CFG})

    monkeypatch.setattr(fit_bridges, "fit_collection_bridges", watched)
    r = cli("collection", "backfill", c.path, "--order", "sequential", "--batch-size", 16)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    fits = [f["pairs"] for f in backfill_fit.fit_state(c)["fits"]]
    assert len(seen) == len(fits) >= 2, (seen, fits)
    for (fitting, status), pairs in zip(seen, fits):
        assert fitting["pairs"] == pairs and fitting["owner"].split(":")[1] == str(os.getpid()), fitting
        assert f"bridge fit running: on {pairs} pairs since {fitting['since']} (pid {os.getpid()}" in status, status
        assert f"fitting bridges on {pairs} backfilled pairs" in out and f"bridges fitted on {pairs} pairs in" in out
    # the backfill's own status: no ETA while the fit holds its worker, and a note saying why
    assert all(eta is None and "a bridge fit on" in note for eta, note in notes), notes
    assert "commits nothing until it ends" in notes[0][1]  # during the backfill
    assert "the last one, on every pair" in notes[-1][1]  # once it is done
    assert backfill_fit.fit_summary(c)["fitting"] is None  # cleared once each fit is over
    out = " ".join(cli("collection", "status", c.path).output.split())
    assert "bridge fit running" not in out, out
    # a fit killed half-way leaves its mark; its process is gone, so it is not shown as running
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    st = backfill_fit.fit_state(c)
    st["fitting"] = {"pairs": 7, "owner": f"{socket.gethostname()}:{proc.stdout.strip()}:dead", "since": "then",
                     "at": time.time()}
    backfill_fit._write(c, backfill_fit.FIT_FILE, st)
    assert backfill_fit.fit_summary(c)["fitting"] is None
    # on another host the process cannot be checked: shown while recent, not half an hour on
    st["fitting"] = {"pairs": 7, "owner": "another-host:1:x", "since": "now", "at": time.time()}
    backfill_fit._write(c, backfill_fit.FIT_FILE, st)
    assert backfill_fit.fit_summary(c)["fitting"]["pairs"] == 7
    st["fitting"]["at"] = time.time() - backfill_fit.FIT_SHOWN_S - 1
    backfill_fit._write(c, backfill_fit.FIT_FILE, st)
    assert backfill_fit.fit_summary(c)["fitting"] is None


def test_the_services_backfill_thread_logs_its_fits(tmp_path, monkeypatch, caplog):
    """A server's backfill runs in a thread of its own: its bridge fits go to the
    ``nobackfill.client`` logger (and status names them while they run)."""
    import logging

    import nobackfill.search.models as models
    from nobackfill.client.local import LocalClient
    from nobackfill.lifecycle import fit_bridges

    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    c, old, new, pool = _upgraded_no_bridge(tmp_path, 40, fraction=0.1, min_pairs=40, max_pairs=60)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    caplog.set_level(logging.INFO, logger="nobackfill.client")
    client = LocalClient(str(c.path))
    client.backfill_start("sequential")
    deadline = time.time() + 120
    while client.backfill_status().get("worker") == "running" or client.backfill_status()["state"] == "running":
        assert time.time() < deadline
        time.sleep(0.1)
    said = [r.getMessage() for r in caplog.records if r.name == "nobackfill.client"]
    assert any(m.startswith("fitting bridges on ") for m in said), said  # (the first at its batch past 80)
    assert any(m.startswith("bridges fitted on 120 pairs in") for m in said), said


def test_an_upgrade_before_the_backfill_finished_keeps_the_maps_that_stay_true(tmp_path):
    """Trial O: cancel an unfinished backfill and upgrade again, and the label-free maps were
    dropped: three spaces merged on raw scores (R@1 0.563 -> 0.357). The maps of the spaces now
    reached by the old-model route (the previous current space's native ones among them) stay, so
    the same queries get the same hits until the new backfill refits them."""
    from _collection_helpers import NEWER_REF, HashEncoder
    from nobackfill.lifecycle.backfill import cancel_backfill

    c, old, new, pool = _upgraded_no_bridge(tmp_path, 60, fraction=0.5, min_pairs=170, max_pairs=170)
    run_backfill(c, new, order="random", batch_size=16, limit=80, pool=pool)
    c = Collection.open(c.path)
    before = c.plan.merge
    assert before is not None and "without_labels" in before.calibration
    newer = HashEncoder(20, "newer", name="newer")
    pool = pool_with((OLD_REF, old), (NEW_REF, new), (NEWER_REF, newer))
    queries = [f"caption {i} of image {i} seed 0" for i in range(0, 60, 7)]
    hits = [[h.id for h in Searcher(c, pool=pool).search(text=q, k=5, target="image").hits] for q in queries]
    cancel_backfill(c)
    upgrade_collection(c, NEWER_REF, pool=pool, fit_bridges=False)
    c = Collection.open(c.path)
    merge = c.plan.merge
    assert merge is not None and merge.method == "calibrated" and "without_labels" in merge.calibration
    for d, maps in merge.score_maps.items():
        assert set(maps) == {f"{old.space_id}/old-model", f"{new.space_id}/old-model"}, (d, maps)
        assert maps[f"{new.space_id}/old-model"] == before.score_maps[d][f"{new.space_id}/native"]
    assert [[h.id for h in Searcher(c, pool=pool).search(text=q, k=5, target="image").hits] for q in queries] == hits


def test_a_weak_bridge_given_is_tested_against_the_old_model_from_64_pairs(tmp_path):
    """Trial O: the shipped text bridge (weaker than the old model) served from the upgrade to about
    55 % backfilled, on raw scores. With the backfill's fits on, its route is tested without labels
    with the merge maps, before the first bridge fit (every backfilled pair: it was trained
    elsewhere), and the old model serves unless the bridge agrees significantly better."""
    import numpy as np

    from _collection_helpers import write_procrustes_upgrade
    from nobackfill.lifecycle import backfill_fit, merge_maps

    for good in (False, True):
        old, new, w = related_pair()
        pool = pool_with((OLD_REF, old), (NEW_REF, new))
        root = tmp_path / ("good" if good else "weak")
        data = make_folder(root / "data", n_images=60, captions_per_image=2)
        c = Collection.create(root / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
        add_items(c, old, folder_items(data).items, progress=False)
        q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((new.embed_dim, new.embed_dim)))
        bridge = w if good else (q[:, :old.embed_dim] * 1.0).astype(np.float32)  # a rotation that maps nothing right
        up = write_procrustes_upgrade(root / "up", bridge, new, old)
        upgrade_collection(c, NEW_REF, bridges=[up], pool=pool, fit_bridges=True,
                           fit_sample={"fraction": 0.5, "min_pairs": 170, "max_pairs": 170})
        assert c.plan.route(old.space_id, "t2i") is None  # the default: the bridge, untested
        run_backfill(c, new, order="random", batch_size=16, limit=128, pool=pool)  # (the sample's images come first)
        c = Collection.open(c.path)
        assert backfill_fit.fit_state(c)["fits"] == []  # no bridge fit yet: the merge maps' fit did it
        said = []
        merge_maps.fit_merge_maps(c, pool=pool, log=said.append)  # (as the backfill's at 128 pairs, with the test's models)
        c = Collection.open(c.path)
        route = c.plan.route(old.space_id, "t2i")
        # the route leaves the bridge given with a line (trial AE: i2t left the shipped XBT without a word)
        assert any(f"{old.space_id} t2i: the serving bridge stays (your --bridge)" in m and "bridge -> old-model" in m
                   for m in said), said
        assert route is not None and route.calibration["fitted"] == {"given": True}, route
        bridged, own = route.calibration["bridge"]["r1"], route.calibration["old-model"]["r1"]
        if good:  # an exact bridge ties with the old model here (new = old @ A): a tie keeps the old model
            assert bridged == own == 1.0 and route.route == "old-model", route
        else:
            assert bridged < own - 0.5 and route.route == "old-model", route
        assert c.plan.merge is not None and "without_labels" in c.plan.merge.calibration


def test_a_refit_says_a_kept_bridges_route_change_and_the_scores_it_compared():
    """trial Z: the final refit turned t2i from fused to bridge without a word, and a swap printed the
    serving bridge's R@1 alone, as if it had not beaten it by the +0.01 the choice requires."""
    from nobackfill.catalog.plan import RouteChoice
    from nobackfill.lifecycle.fit_bridges import _route_name, _say_rerouted, _scored

    said: list[str] = []
    fused = RouteChoice(route="fused", w=0.8, calibration={"fitted": {}})
    sizes = {"queries": 98, "gallery": 300}
    _say_rerouted(said.append, fused, {"route": "bridge"}, "s1", "t2i", "fitted-s1-t2i-v1", sizes)
    assert said == ["  s1 t2i: the serving bridge stays (fitted-s1-t2i-v1); its route, chosen again on this fit's "
                    "held-out set (98 queries, 300 items): fused w=0.8 -> bridge"]
    for current in (None, RouteChoice(route="bridge", calibration={"fitted": {}}),  # none, or the same route
                    RouteChoice(route="fused", w=0.8, pinned=True),  # pinned by the user: a fit keeps it
                    RouteChoice(route="fused", w=0.8, calibration={"labels": 1})):  # chosen on labels
        _say_rerouted(said.append, current, {"route": "bridge"}, "s1", "t2i", "v1", sizes)
    assert len(said) == 1
    assert _route_name({"route": "fused", "w": 0.9}) == "fused w=0.9" and _route_name({"route": "old-model"}) == "old-model"
    assert _scored({"r1": 0.25, "overlap10": 0.4123}) == "R@1 0.250 + overlap@10 0.412"


def test_an_upgrade_waits_for_no_running_fit_and_the_last_models_bridges_serve_no_longer(tmp_path):
    """Trial AD: over HTTP the backfill reads "done" while its last bridge fit runs; an upgrade then
    was taken, and the ending fit wrote its state over the new upgrade's (no bridge was ever fitted
    for it). Refused while a fit holds the lock, nothing changed; once it ends the upgrade fits its
    own bridges, and those fitted for the earlier current model are no longer called serving (a
    refit tried them on the new model's queries: "unreadable")."""
    from _collection_helpers import NEWER_REF, HashEncoder
    from nobackfill.lifecycle import backfill_fit
    from nobackfill.lifecycle.backfill_jobs import JOB_DIR
    from nobackfill.lifecycle.fit_bridges import fitted_bridges
    from nobackfill.lifecycle.plan_changes import UpgradeRefused

    c, old, new, pool = _backfilled(tmp_path, n_images=60, limit=150)  # (the old space serves 30 items)
    fit_collection_bridges(c, cfg=CFG, pool=pool)
    run_backfill(c, new, order="random", batch_size=64)  # then the rest: the old space serves nothing
    c = Collection.open(c.path)
    assert fitted_bridges(c.plan) and fitted_status(c.plan)
    newer = HashEncoder(20, "newer", name="newer")
    pool = pool_with((OLD_REF, old), (NEW_REF, new), (NEWER_REF, newer))
    plan, spaces = c.plan, sorted(p.name for p in (c.path / "spaces").iterdir())
    with c.catalog.lock(f"{JOB_DIR}/fit"):
        with pytest.raises(UpgradeRefused, match="a bridge fit of its backfill is running"):
            upgrade_collection(c, NEWER_REF, pool=pool)
    c = Collection.open(c.path)
    assert c.plan == plan and sorted(p.name for p in (c.path / "spaces").iterdir()) == spaces
    upgrade_collection(c, NEWER_REF, pool=pool)
    c = Collection.open(c.path)
    assert backfill_fit.fit_state(c)["target"] == newer.space_id and backfill_fit.fit_summary(c)["enabled"]
    assert [u for u in c.plan.upgrades if u.kind == "fitted"]  # kept until their space is retired
    assert fitted_bridges(c.plan) == {} and fitted_status(c.plan) == []


def test_a_last_fit_cut_short_runs_at_the_next_start_of_the_done_backfill(tmp_path, monkeypatch):
    """Trial AD: a SIGTERM during the final fit (every item in) leaves status announcing "next at the
    end" of a done job; the next start (a job of no item) ends with that fit on every pair."""
    from nobackfill.lifecycle import backfill_fit, fit_bridges

    c, old, new, pool = _upgraded_no_bridge(tmp_path, 60, fraction=0.2, min_pairs=20, max_pairs=20)
    real, calls = fit_bridges.fit_collection_bridges, []

    def stopped_at_the_end(collection, **kw):
        n = backfill_fit.backfilled_count(collection, collection.current_space)
        if n == len(collection.items()) and "interrupted" not in calls:
            calls.append("interrupted")
            raise KeyboardInterrupt  # (SIGTERM: the worker's process ends)
        calls.append(n)
        return real(collection, **{**kw, "cfg": CFG})

    monkeypatch.setattr(fit_bridges, "fit_collection_bridges", stopped_at_the_end)
    with pytest.raises(KeyboardInterrupt):
        run_backfill(c, new, order="sequential", batch_size=16, pool=pool)
    st = backfill_fit.fit_state(c)
    assert backfill_status(c)["state"] == "done" and st["next"] is not None
    assert st["fits"][-1]["pairs"] < len(c.items())
    rep = run_backfill(c, new, order="sequential", batch_size=16, pool=pool)  # nothing to backfill: the fit runs
    st = backfill_fit.fit_state(c)
    assert rep["committed"] == 0 and calls[-1] == len(c.items()) and st["fits"][-1]["pairs"] == len(c.items())
    assert st["next"] is None and not backfill_fit.fit_summary(c)["next_at_end"]

