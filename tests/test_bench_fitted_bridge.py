"""``bench fitted-bridge``: one point of the curve on synthetic vectors, its table and plot."""

from __future__ import annotations

import numpy as np
import pytest

from nobackfill.bench.fitted_bridge import Direction, FittedBridgeBenchConfig, Pool, run_point
from nobackfill.bench.fitted_bridge_report import REPORT, format_markdown
from nobackfill.compat.fitted import FitConfig, heldout_mask
from nobackfill.encoders.base import l2_normalise


def _world(n: int, seed: int):
    """Images and captions of ``n`` scenes: new vectors a rotation of the scene (captions slightly
    off), old vectors a noisier linear map of it."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 8))
    rot, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    mix = np.eye(8) + 0.4 * rng.standard_normal((8, 8))

    def new(v):
        return l2_normalise((np.concatenate([v, 0.1 * rng.standard_normal((n, 8))], 1) @ rot).astype(np.float32))

    def old(v):
        return l2_normalise((v @ mix + 0.6 * rng.standard_normal((n, 8))).astype(np.float32))

    cap = z + 0.2 * rng.standard_normal(z.shape)
    return {"image": (new(z), old(z)), "text": (new(cap), old(cap))}


def test_one_point_measures_every_family_the_choice_and_the_routes(tmp_path):
    train, test = _world(600, 0), _world(200, 1)
    pools = {m: Pool(v[0], v[1], [f"{m}-{i}" for i in range(600)]) for m, v in train.items()}
    masks = {m: heldout_mask(p.keys, 0.2) for m, p in pools.items()}
    groups = np.arange(200)
    dirs = {"t2i": Direction("t2i", test["text"][0], test["text"][1], test["text"][1], test["image"][1],
                             test["image"][0], groups, groups)}
    shipped = {m: pools[m].old[np.flatnonzero(masks[m])] for m in pools}  # a "shipped bridge": the old model
    cfg = FittedBridgeBenchConfig(fit=FitConfig(epochs=20, hidden=32, max_steps=200))
    res = run_point(300, pools, dirs, masks, shipped, 1200, cfg)
    row = res["t2i"]
    assert set(row["families"]) == {f"{f}@{s}" for f in cfg.fit.families for s in ("image", "text", "both")} | {"ensemble"}
    assert row["chosen"] in row["families"] and 0 <= row["heldout"]["r1"] <= 1
    assert row["served_route"] in ("bridge", "fused", "old-model")
    assert row["fraction"] == 0.5 and row["pairs"] == 300
    assert row["new_new_r1"] > row["old_old_r1"]
    assert row["choice_gap"] >= 0
    assert row["with_shipped"]["shipped_heldout"] >= 0
    assert res["_fit_s"]["all"] >= 0
    out = {"world": {"t2i": [row]}, "query_overhead_us": {"mlp": 12.0}}
    text = format_markdown(out)
    assert "world t2i" in text and row["chosen"] in text
    REPORT.write(out, tmp_path / "fb.json")
    assert (tmp_path / "fb.md").is_file() and (tmp_path / "fb.png").is_file()


def test_the_held_out_scenes_are_whole_and_a_bad_scheme_is_refused():
    from nobackfill.bench.fitted_bridge_rows import heldout_masks

    z = np.zeros((300, 4), np.float32)
    pools = {"image": Pool(z[:100], z[:100], [f"image-{i}" for i in range(100)], np.arange(100)),
             "text": Pool(z, z, [f"text-{i}" for i in range(300)], np.repeat(np.arange(100), 3))}
    m = heldout_masks(pools, 0.2)
    assert 0.1 < m["image"].mean() < 0.3 and np.array_equal(np.repeat(m["image"], 3), m["text"])
    by_item = heldout_masks(pools, 0.2, "item")
    assert not np.array_equal(np.repeat(by_item["image"], 3), by_item["text"])
    for bad in ({"heldout_by": "scenes"}, {"heldout_queries": "some"}):
        with pytest.raises(ValueError, match="heldout_by"):
            FittedBridgeBenchConfig(**bad)


def test_a_direction_scored_on_given_queries_uses_the_one_pair_set():
    from nobackfill.bench.fitted_bridge import GivenQueries

    train, test, other = _world(600, 0), _world(200, 1), _world(300, 2)
    pools = {m: Pool(v[0], v[1], [f"{m}-{i}" for i in range(600)]) for m, v in train.items()}
    masks = {m: heldout_mask(p.keys, 0.2) for m, p in pools.items()}
    groups = np.arange(200)
    t2i = Direction("t2i", test["text"][0], test["text"][1], test["text"][1], test["image"][1], test["image"][0],
                    groups, groups)
    queries = Pool(other["text"][0], other["text"][1], [f"q-{i}" for i in range(300)], np.zeros(300, np.int64))
    given = {"t2i-images": GivenQueries(queries, "image", other["text"][1])}
    shipped = {m: pools[m].old[np.flatnonzero(masks[m])] for m in pools}
    cfg = FittedBridgeBenchConfig(fit=FitConfig(families=("orthogonal", "ridge"), epochs=5, max_steps=50))
    res = run_point(300, pools, {"t2i": t2i, "t2i-images": t2i}, masks, shipped, 1200, cfg, given)
    row = res["t2i-images"]
    assert set(row["families"]) == {"orthogonal@image", "ridge@image", "ensemble"}  # images alone: no caption pairs
    assert row["chosen"] == "ensemble" and all(m.endswith("@image") for m in row["members"])
    assert row["heldout_sizes"]["queries"] <= 300
    assert row["heldout_sizes"]["gallery"] == res["t2i"]["heldout_sizes"]["gallery"] == 300
    assert row["with_shipped"]["chosen"] in ("shipped", *row["families"])
    assert len(res["t2i"]["families"]) == 7  # 2 families x 3 pair sets, and their ensemble


def test_the_text_part_also_runs_on_val_captions_3_to_4(monkeypatch):
    """One run makes both Multi30K curves (val 1 -> 2 and 3 -> 4); not with --eval-dir; the pair is checked."""
    import nobackfill.bench.fitted_bridge as fb

    seen = []
    monkeypatch.setattr(fb, "run_text", lambda cfg, log, caps=(1, 2): seen.append(caps) or {"fit_s": {}, "n": {}})
    monkeypatch.setattr(fb, "query_overhead_us", lambda cfg: {})
    out = fb.run_fitted_bridge_bench(FittedBridgeBenchConfig(parts=("text",)))
    assert seen == [(1, 2), (3, 4)] and {"text", "text_val34"} <= set(out)
    seen.clear()
    out = fb.run_fitted_bridge_bench(FittedBridgeBenchConfig(parts=("text",), eval_dir="elsewhere"))
    assert seen == [(1, 2)] and "text_val34" not in out
    for bad in ((3, 3), (1, 6), (1, 2, 3)):
        with pytest.raises(ValueError, match="also_captions"):
            FittedBridgeBenchConfig(also_captions=bad)
