"""Bridges fitted on (new, old) pairs: the families, the label-free score, the choice, the upgrade format."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from nobackfill.compat.fitted import (FAMILIES, FitConfig, FittedBridge, HeldOut, agreement, bridge_score,
                                      candidate_score, choose_direction, fit_candidates, fit_family, heldout_mask,
                                      route_scores, t_critical)
from nobackfill.compat.fitted.families import ENSEMBLE, ensemble_map
from nobackfill.compat.upgrade import load_upgrade
from nobackfill.encoders.base import l2_normalise

FAST = FitConfig(epochs=30, hidden=64, max_steps=400)


def _spaces(n: int, d_new: int = 24, d_old: int = 12, seed: int = 0, noise: float = 0.05):
    """Items with a latent content ``z``: new vectors a rotation of ``z`` (padded), old ones a
    linear map of it plus noise."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, d_old))
    rot, _ = np.linalg.qr(rng.standard_normal((d_new, d_new)))
    new = l2_normalise((np.concatenate([z, 0.2 * rng.standard_normal((n, d_new - d_old))], 1) @ rot).astype(np.float32))
    mix = np.eye(d_old) + 0.3 * rng.standard_normal((d_old, d_old))
    old = l2_normalise((z @ mix + noise * rng.standard_normal((n, d_old))).astype(np.float32))
    return new, old


def _cos(a, b):
    return float((l2_normalise(a) * l2_normalise(b)).sum(1).mean())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_maps_held_out_items_close_to_their_old_vectors(family):
    new, old = _spaces(900)
    m = fit_family(family, new[:600], old[:600], FAST)
    out = m(new[600:])
    assert out.shape == (300, 12)
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert _cos(out, old[600:]) > 0.7  # chance is ~0
    assert m.meta["pairs"] == 600 and m.meta["fit_s"] >= 0


def test_orthogonal_map_of_equal_widths_is_orthogonal_and_recovers_a_rotation():
    rng = np.random.default_rng(1)
    x = l2_normalise(rng.standard_normal((200, 8)).astype(np.float32))
    r, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    m = fit_family("orthogonal", x, x @ r.astype(np.float32))
    w = m.tensors["w"]
    assert np.allclose(w.T @ w, np.eye(8), atol=1e-4)
    assert _cos(m(x), x @ r) > 0.999


def test_mlps_are_seeded():
    new, old = _spaces(400)
    for family in ("mlp", "mlp-plain"):
        a = fit_family(family, new, old, FAST)
        b = fit_family(family, new, old, FAST)
        assert all(np.array_equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
        c = fit_family(family, new, old, FitConfig(epochs=30, hidden=64, max_steps=400, seed=1))
        assert not np.array_equal(a.tensors["w1"], c.tensors["w1"])


def test_residual_mlp_keeps_the_orthogonal_map_as_its_skip():
    new, old = _spaces(400)
    m, o = fit_family("mlp", new, old, FAST), fit_family("orthogonal", new, old)
    assert np.allclose(m.tensors["w"], o.tensors["w"], atol=1e-5)


def test_fitting_refuses_unpaired_or_too_few_rows():
    new, old = _spaces(20)
    with pytest.raises(ValueError, match="row-paired"):
        fit_family("ridge", new, old[:10])
    with pytest.raises(ValueError, match="at least 8 pairs"):
        fit_family("ridge", new[:4], old[:4])
    with pytest.raises(ValueError, match="unknown bridge famil"):
        FitConfig(families=("nope",))


def test_saved_fitted_bridge_is_an_upgrade_the_bridge_loader_serves(tmp_path):
    new, old = _spaces(300)
    for family in FAMILIES:
        m = fit_family(family, new, old, FAST)
        b = FittedBridge(m, "space-new", "space-old", {"pairs": 300, "heldout": {"r1": 0.5, "overlap10": 0.6}})
        d = b.save(tmp_path / family)
        manifest = json.loads((d / "upgrade.json").read_text())
        assert manifest["kind"] == "fitted" and manifest["fitted"]["family"] == family
        assert manifest["fitted"]["heldout"]["r1"] == 0.5 and manifest["fitted"]["fitted_at"]
        assert "fitted.safetensors" in manifest["files"]
        up = load_upgrade(d)
        assert up.is_bridge
        loaded = up.bridge()
        assert (loaded.source, loaded.target, loaded.family) == ("space-new", "space-old", family)
        assert np.array_equal(loaded(new[:5]), b(new[:5]))
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.pt"))


def test_damaged_fitted_upgrade_is_refused_with_its_directory(tmp_path):
    new, old = _spaces(100)
    d = FittedBridge(fit_family("ridge", new, old), "a", "b").save(tmp_path / "u")
    (d / "fitted.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="sha256 differs"):
        load_upgrade(d).bridge()
    m = json.loads((d / "upgrade.json").read_text())
    m["files"] = {}
    m["fitted"]["family"] = "nope"
    (d / "upgrade.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="fitted.family"):
        load_upgrade(d).bridge()


def _held(new_q, new_g, old_g, old_q=None, exclude=None):
    return HeldOut("t2i", new_q, new_g, old_g, old_q, exclude)


def test_agreement_is_one_for_the_new_models_own_ranking_and_low_for_noise():
    new, old = _spaces(300)
    held = _held(new[:100], new[100:], new[100:])  # "old" vectors equal to the new ones
    assert agreement(new[:100] @ new[100:].T, held) == {"r1": 1.0, "overlap10": 1.0}
    rng = np.random.default_rng(0)
    assert agreement(rng.standard_normal((100, 200)), held)["r1"] < 0.1


def test_same_modality_queries_do_not_find_themselves():
    new, old = _spaces(200)
    held = HeldOut("t2t", new, new, old, exclude=np.arange(200))
    ref = held.reference()
    assert not np.any(ref[:, 0] == np.arange(200))


def test_route_choice_keeps_the_old_model_unless_the_bridge_agrees_better():
    new, old = _spaces(600, noise=0.3)
    good = fit_family("ridge", new[:400], old[:400])
    held = _held(new[400:500], new[500:], old[500:], old_q=old[400:500])
    rng = np.random.default_rng(0)
    junk = l2_normalise(rng.standard_normal((100, 12)).astype(np.float32))
    r = route_scores(held, junk)
    assert r["route"] == "old-model" and r["w"] is None
    r = route_scores(held, good(new[400:500]))
    assert r["bridge"]["r1"] > 0
    assert r["route"] in ("bridge", "fused", "old-model")
    t = r["test"]  # the best bridge route against the old model, query by query
    assert t["t"] > t["z"]  # the t bar of 100 queries: a little above z
    significant = t["mean_gain"] > t["t"] * t["se"] and t["wins"] > t["losses"]
    assert r["route"] == (t["route"] if significant else "old-model")
    # a bridge that reproduces the new model's ranking exactly is clearly better: it serves
    exact = HeldOut("t2i", new[400:500], new[500:], new[500:], old[400:500, :12] @ np.zeros((12, 24), np.float32)
                    + l2_normalise(np.random.default_rng(1).standard_normal((100, 24)).astype(np.float32)))
    r = route_scores(exact, new[400:500])
    assert r["bridge"]["r1"] == 1.0 and r["route"] in ("bridge", "fused") and r["test"]["losses"] == 0
    # a margin larger than any gain keeps the old model's route
    assert route_scores(held, good(new[400:500]), margin=1.0)["route"] == "old-model"


def test_the_paired_test_bar_is_the_t_value_of_the_same_level():
    """Student t quantiles at the normal's 0.99865 (z = 3) and 0.97725 (z = 2) levels, from tables:
    a few queries need a much larger mean gain than z standard errors; many queries, about z."""
    exact = {(3.0, 7): 4.5300, (3.0, 14): 3.6358, (3.0, 57): 3.1371, (3.0, 999): 3.0075, (2.0, 7): 2.4288,
             (2.0, 29): 2.0900}
    for (z, df), t in exact.items():
        assert abs(t_critical(z, df) - t) < 3e-3, (z, df)
    assert t_critical(3.0, 0) == float("inf")
    bars = [t_critical(3.0, df) for df in (7, 14, 30, 100, 10_000)]
    assert bars == sorted(bars, reverse=True) and bars[-1] > 3.0


def test_choice_scores_every_candidate_and_refits_the_chosen_one_on_all_pairs():
    new, old = _spaces(1200)
    keys = [f"k{i}" for i in range(1000)]
    held_mask = heldout_mask(keys, 0.2)
    fit_idx, held_idx = np.flatnonzero(~held_mask), np.flatnonzero(held_mask)
    pairs_fit = {"image": (new[fit_idx], old[fit_idx])}
    cands = fit_candidates(pairs_fit, FAST)
    assert set(cands) == {f"{f}@image" for f in FAMILIES}  # no text pairs: no text or both sets
    rng = np.random.default_rng(0)
    held = _held(new[1000:], new[held_idx], old[held_idx])
    junk = l2_normalise(rng.standard_normal((200, 12)).astype(np.float32))
    single = dataclasses.replace(FAST, ensemble=1)  # the best-scored candidate alone
    ch = choose_direction(held, cands, given={"user-bridge": junk}, pairs={"image": (new[:1000], old[:1000])},
                          cfg=single)
    assert set(ch.scores) == set(cands) | {"user-bridge"}
    assert ch.chosen == max(cands, key=lambda n: candidate_score(ch.scores[n])) and ch.heldout == ch.scores[ch.chosen]
    assert ch.bridge.meta["pairs"] == 1000 and ch.bridge.meta["candidate"] == ch.chosen and ch.members == [ch.chosen]
    assert ch.to_json()["route"] == ch.route
    # a given bridge chosen: nothing fitted to serve
    held2 = _held(old[1000:], old[held_idx], old[held_idx])  # the reference is old/old
    ch2 = choose_direction(held2, {}, given={"user-bridge": old[1000:], "junk": junk})
    assert ch2.chosen == "user-bridge" and ch2.bridge is None and ch2.scores["user-bridge"]["r1"] == 1.0
    assert ch2.members == []


def test_choice_serves_the_mean_of_the_best_scored_candidates_refitted_on_all_pairs():
    new, old = _spaces(1200)
    held_mask = heldout_mask([f"k{i}" for i in range(1000)], 0.2)
    fit_idx, held_idx = np.flatnonzero(~held_mask), np.flatnonzero(held_mask)
    cands = fit_candidates({"image": (new[fit_idx], old[fit_idx])}, FAST)
    held = _held(new[1000:], new[held_idx], old[held_idx])
    junk = l2_normalise(np.random.default_rng(0).standard_normal((200, 12)).astype(np.float32))
    ch = choose_direction(held, cands, given={"user-bridge": junk}, pairs={"image": (new[:1000], old[:1000])}, cfg=FAST)
    ranked = sorted(cands, key=lambda n: candidate_score(ch.scores[n]), reverse=True)
    assert ch.chosen == ENSEMBLE and ch.members == ranked[:3] and set(ch.scores) == {*cands, "user-bridge", ENSEMBLE}
    # what was scored is the mean of the members as fitted; what serves, the members refitted on all pairs
    mean = l2_normalise(np.mean([cands[n](held.q_new) for n in ranked[:3]], axis=0))
    assert np.allclose(ch.scored_map(held.q_new), mean, atol=1e-6)
    assert ch.heldout == bridge_score(mean, held)
    b = ch.bridge
    assert b.family == ENSEMBLE and b.meta["members"] == ranked[:3] and b.meta["pairs"] == 1000
    assert b.meta["candidate"] == " + ".join(ranked[:3]) and b.meta["member_pairs"] == [1000] * 3
    refit = [fit_family(n.split("@")[0], new[:1000], old[:1000], FAST) for n in ranked[:3]]
    assert np.allclose(b(new[1000:1010]), l2_normalise(np.mean([m(new[1000:1010]) for m in refit], axis=0)), atol=1e-5)
    # another direction sharing members reuses their refits (one fit per candidate)
    refits = {}
    a = choose_direction(held, cands, pairs={"image": (new[:1000], old[:1000])}, cfg=FAST, refits=refits)
    assert set(refits) == set(a.members)
    kept = dict(refits)
    b2 = choose_direction(held, cands, pairs={"image": (new[:1000], old[:1000])}, cfg=FAST, refits=refits)
    assert all(refits[n] is kept[n] for n in kept) and np.array_equal(b2.bridge(new[:5]), a.bridge(new[:5]))
    # a given bridge better than the ensemble is kept (nothing fitted to serve)
    ch3 = choose_direction(held, cands, given={"user-bridge": held.q_new @ np.zeros((24, 12), np.float32)
                                               + fit_family("ridge", new, old)(held.q_new)}, cfg=FAST)
    if candidate_score(ch3.scores["user-bridge"]) >= candidate_score(ch3.scores[ENSEMBLE]):
        assert ch3.chosen == "user-bridge" and ch3.bridge is None
    # one candidate: no ensemble
    one = choose_direction(held, {"ridge@image": cands["ridge@image"]}, cfg=FAST)
    assert one.chosen == "ridge@image" and ENSEMBLE not in one.scores and one.bridge.family == "ridge"


def test_ensemble_is_saved_and_loaded_as_one_fitted_upgrade(tmp_path):
    new, old = _spaces(300)
    members = [(f"{f}@image", fit_family(f, new, old, FAST)) for f in ("orthogonal", "mlp", "ridge")]
    ens = ensemble_map(members)
    assert ens.in_dim == 24 and ens.out_dim == 12
    assert np.allclose(ens(new[:7]), l2_normalise(np.mean([m(new[:7]) for _, m in members], axis=0)), atol=1e-6)
    d = FittedBridge(ens, "space-new", "space-old", {"heldout": {"r1": 0.5, "overlap10": 0.6}}).save(tmp_path / "e")
    manifest = json.loads((d / "upgrade.json").read_text())["fitted"]
    assert manifest["family"] == ENSEMBLE and manifest["members"] == [n for n, _ in members]
    assert manifest["member_families"] == ["orthogonal", "mlp", "ridge"]
    loaded = load_upgrade(d).bridge()
    assert loaded.family == ENSEMBLE and np.array_equal(loaded(new[:5]), ens(new[:5]))
    # a member's tensors missing, or its family unknown: refused naming the file and what is missing
    m = json.loads((d / "upgrade.json").read_text())
    m["files"] = {}
    m["fitted"]["member_families"] = ["orthogonal", "mlp", "mlp"]  # member 2 (ridge) has no MLP tensors
    (d / "upgrade.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"fitted.safetensors: missing tensors .*'2.w1'.*\(fitted.family ensemble\)"):
        load_upgrade(d).bridge()
    m["fitted"]["member_families"] = ["orthogonal", "nope"]
    (d / "upgrade.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match="member_families"):
        load_upgrade(d).bridge()
    with pytest.raises(ValueError, match="same widths"):
        ensemble_map([members[0], ("x", fit_family("ridge", new[:, :12], old))])
    with pytest.raises(ValueError, match="ensemble must be positive|must be positive"):
        FitConfig(ensemble=0)


def test_heldout_mask_is_deterministic_and_near_its_fraction():
    keys = [f"item-{i}" for i in range(5000)]
    a, b = heldout_mask(keys, 0.2), heldout_mask(list(reversed(keys)), 0.2)
    assert np.array_equal(a, b[::-1])
    assert 0.17 < a.mean() < 0.23
    with pytest.raises(ValueError):
        heldout_mask(keys, 0.0)


def test_bridge_score_is_agreement_of_the_bridged_queries():
    new, old = _spaces(300)
    held = _held(new[:100], new[100:], old[100:])
    m = fit_family("ridge", new[100:], old[100:])
    assert bridge_score(m(new[:100]), held) == agreement(m(new[:100]) @ old[100:].T, held)


def test_heldout_mask_keeps_a_scene_together_and_holds_out_at_least_min_count():
    scenes = [f"scene-{i // 3}" for i in range(300)]  # three items a scene
    m = heldout_mask(scenes, 0.2)
    for s in range(100):
        assert len(set(m[3 * s:3 * s + 3])) == 1
    small = [f"s{i}" for i in range(30)]
    plain, floor = heldout_mask(small, 0.1), heldout_mask(small, 0.1, min_count=8)
    assert floor.sum() >= 8 and np.all(floor[plain])  # the same items, and more
    assert heldout_mask(small[:6], 0.1, min_count=8).sum() <= 3  # at most half


def test_held_out_set_drops_queries_whose_match_was_fitted_on():
    from nobackfill.compat.fitted import held_out_set

    new, old = _spaces(400)
    g_held = np.zeros(300, bool)
    g_held[:60] = True
    # queries: near-copies of gallery items 0..99 (their new-model match); 60 held out, 40 fitted
    q = l2_normalise(new[:100] + 0.01 * np.random.default_rng(1).standard_normal(new[:100].shape).astype(np.float32))
    held, kept = held_out_set("t2i", q, new[:300], old[:300], g_held, q_old=old[:100])
    assert kept.sum() == 60 and np.all(kept[:60]) and not kept[60:].any()
    assert len(held.q_new) == 60 and len(held.q_old) == 60 and len(held.g_new) == 300  # fitted items stay as distractors
    # a map that recalls the fitted items exactly (memorises them) and is noise elsewhere: scored on
    # every query it looks good; on the queries that count it does not
    rng = np.random.default_rng(2)
    memo = np.where(g_held[:100, None], l2_normalise(rng.standard_normal((100, 12)).astype(np.float32)), old[:100])
    full = HeldOut("t2i", q, new[:300], old[:300])
    assert bridge_score(memo, full)["r1"] >= 0.4 and bridge_score(memo[kept], held)["r1"] < 0.1
    few, kept_all = held_out_set("t2i", q, new[:300], old[:300], g_held, min_queries=80)  # too few: every query
    assert kept_all.all() and len(few.q_new) == 100
    with pytest.raises(ValueError, match="mask"):
        held_out_set("t2i", q, new[:300], old[:300], g_held[:10])
