"""``nobackfill bench late`` end to end on a toy config (tiny world, tiny models, a few steps),
the memory measurement, the hard-negative twins and metrics from score matrices."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _late_helpers import invoke, tiny_model, tiny_tokenizer, tiny_world


def test_hard_negative_twins_swap_one_binding() -> None:
    from nobackfill.data.world import WorldSpec, make_item
    from nobackfill.late.hard_negatives import hard_negative_set

    spec = WorldSpec(n_test=40)
    hn = hard_negative_set(spec, "test", limit_pairs=5)
    assert len(hn) == 10 and hn.caption_image.tolist() == list(range(10))
    for k, i in enumerate(hn.source_index):
        scene, px = make_item(spec.seed, "test", i, spec.concepts)
        np.testing.assert_array_equal(hn.pixels[2 * k], px)  # the original is the world's test item
        assert hn.captions[2 * k] != hn.captions[2 * k + 1]
        assert sorted(hn.captions[2 * k].split()) == sorted(hn.captions[2 * k + 1].split())  # same bag of words
        assert not np.array_equal(hn.pixels[2 * k], hn.pixels[2 * k + 1])


def test_swap_twin_batches_pair_each_scene_with_its_twin() -> None:
    from nobackfill.data.world import WorldStream
    from nobackfill.late.hard_negatives import SwapTwinBatches, swap_attributes

    batches = SwapTwinBatches(9, seed=3)
    px, caps = batches.batch(2)
    assert px.shape == (9, 64, 64, 3) and len(caps) == 9
    again_px, again_caps = batches.batch(2)
    np.testing.assert_array_equal(px, again_px)  # reproducible
    assert again_caps == caps
    # the originals are the stream's scenes (ids 2 * 9 ...), each followed by its twin if it has one
    stream_px, stream_caps, scenes = WorldStream(9, seed=3).batch(2)
    i = k = 0
    while i < 9:
        np.testing.assert_array_equal(px[i], stream_px[k])
        assert caps[i] == stream_caps[k]
        i += 1
        twin = swap_attributes(scenes[k])
        if twin is not None and i < 9:  # the twin: same words, other binding, other pixels
            assert sorted(caps[i].split()) == sorted(caps[i - 1].split()) and caps[i] != caps[i - 1]
            assert not np.array_equal(px[i], px[i - 1])
            i += 1
        k += 1
    assert k < 9 and any(swap_attributes(sc) is not None for sc in scenes[:k])
    assert len(set(caps)) == 9
    with pytest.raises(ValueError, match="batch_size"):
        SwapTwinBatches(1)


def test_metrics_from_scores_match_embedding_metrics_and_lift_top_k() -> None:
    from nobackfill.metrics import retrieval_metrics
    from nobackfill.metrics.scored import lift_top_k, retrieval_metrics_from_scores, top_k_columns

    rng = np.random.default_rng(0)
    img, txt = rng.normal(size=(7, 5)), rng.normal(size=(11, 5))
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    txt /= np.linalg.norm(txt, axis=1, keepdims=True)
    c2i = rng.integers(0, 6, size=11)  # image 6 has no caption
    ref = retrieval_metrics(img, txt, c2i)
    got = retrieval_metrics_from_scores(txt @ img.T, img @ txt.T, c2i)
    for d in ("t2i", "i2t"):
        for key, v in ref[d].items():
            assert got[d][key] == pytest.approx(v, abs=1e-6), (d, key)
    first = np.array([[0.9, 0.1, 0.5, 0.3]])
    top = top_k_columns(first, 2)
    assert sorted(top[0].tolist()) == [0, 2]
    new = np.where(top == 0, 0.0, 1.0)  # re-ranking puts column 2 before column 0
    lifted = lift_top_k(first, top, new)
    assert np.argsort(-lifted[0]).tolist() == [2, 0, 3, 1]


def test_rerank_weight_zero_is_global_scoring_and_val_can_choose_it() -> None:
    """w = 0 in the grid lets the val choice switch re-ranking off (CMLI that only hurts)."""
    from nobackfill.bench.late import LateBenchConfig
    from nobackfill.late.choose import choose_rerank
    from nobackfill.late.rerank import RerankedScores, RerankSet, rerank_metrics
    from nobackfill.metrics.scored import top_k_columns

    rng = np.random.default_rng(1)
    n = 12
    data = RerankSet("toy", list(range(n)), [str(i) for i in range(n)], np.arange(n))
    scored = {}
    for d in ("t2i", "i2t"):
        first = rng.normal(size=(n, n)) + 2.0 * np.eye(n)  # global scoring mostly right
        top = top_k_columns(first, 5)
        cmli = -np.take_along_axis(first, top, axis=1)  # CMLI reverses the first stage: only hurts
        scored[d] = RerankedScores(first, top, {"directional": cmli, "symmetric": cmli})
    glob = rerank_metrics(scored, data, None)
    off = rerank_metrics(scored, data, {"t2i": ("directional", 0.0), "i2t": ("directional", 0.0)})
    assert off == glob
    choice, _ = choose_rerank([(scored, data)], weights=(0.0, 1.0, float("inf")))
    assert choice == {"t2i": ("directional", 0.0), "i2t": ("directional", 0.0)}
    assert 0.0 in LateBenchConfig().weights


def test_memory_worker_measures_a_rise() -> None:
    """Each measurement runs in a fresh subprocess (inside this long-lived test process, pages
    freed by earlier tests are reused and the peak RSS need not rise at all)."""
    from nobackfill.bench.late import LateBenchConfig
    from nobackfill.bench.late_memory import measure_memory

    cfg = LateBenchConfig(memory_batches=(96,), memory_shape=(8, 12, 16), memory_chunk=16, memory_repeats=1)
    (row,) = measure_memory(cfg, log=lambda m: None)  # also checks naive == streamed scores
    # 96 x 96 x 8 x 12 float32 = 3.4 MB for the naive tensor alone; blocks of 16 x 16 are 100x smaller
    assert row["naive_mb"] > 2.0 and row["stream_mb"] < row["naive_mb"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("late_bench")
    tiny_world(root, n_val=20, n_test=16)
    tok = tiny_tokenizer()
    tiny_model(root, "student", 16, tok)
    tiny_model(root, "teacher", 24, tok, seed=1).save(root / "models" / "world-new")
    (root / "toy.toml").write_text(f"""
preset = "{root / 'student.toml'}"
steps = 2
kd_steps = 2
batch_size = 6
n_val = 10
val_hard_pairs = 4
test_hard_pairs = 5
routing_pairs = 6
rerank_k = 4
weights = [0.0, 0.5, inf]
extra_seeds = [1]
swap_twins = true
memory_batches = [4]
memory_shape = [4, 5, 8]
memory_repeats = 1
memory_chunk = 2
""")
    return root


def test_bench_late_cli_toy(toy) -> None:
    out = toy / "runs" / "late.json"
    r = invoke("bench", "late", "--json", out, "--models", toy / "models", "--world", toy / "world",
               "--config", toy / "toy.toml", "--jobs", 1)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    for sec in ("retrieval", "hard_negatives"):
        assert {"global", "cmli_rerank", "cmli_trained"} <= set(res[sec])
        for m in res[sec].values():
            assert 0.0 <= m["t2i"]["R@1"] <= m["t2i"]["R@10"] <= 1.0
    assert res["hard_negatives"]["global"]["t2i"]["n_queries"] == 10
    assert {"student_no_kd", "global_kd", "target_cmli", "target_cmli_empty", "teacher_world_new"} <= set(res["kd"])
    assert 0.0 <= res["kd"]["empty_routing"]["share"] <= 1.0
    assert [m["batch"] for m in res["memory"]] == [4]
    assert all(set(m) >= {"batch", "naive_mb", "stream_mb", "naive_s", "stream_s"} for m in res["memory"])
    assert set(res["rerank_choice"]) == {"global", "cmli", "world_new", "global_seed1", "cmli_seed1"}
    for choice in res["rerank_choice"].values():
        assert {c["score"] for c in choice.values()} <= {"directional", "symmetric"}
        assert {c["weight"] for c in choice.values()} <= {0.0, 0.5, "inf"}
    # the re-ranking gains: per training seed (0 and the extra seed 1) and their mean
    seeds = res["seeds"]
    assert seeds["n_seeds"] == 2 and set(seeds["per_seed"]) == {"0", "1"}
    s0 = seeds["per_seed"]["0"]["hard_negatives"]
    want = 100 * (res["hard_negatives"]["cmli_trained"]["t2i"]["R@1"] - res["hard_negatives"]["global"]["t2i"]["R@1"])
    assert s0["over_global_model"]["t2i"] == pytest.approx(want, abs=0.01)
    for t, gains in res["rerank_gain"].items():
        for k, v in gains.items():
            per = [seeds["per_seed"][sd][t][k]["i2t"] for sd in ("0", "1")]
            assert v["i2t"] == pytest.approx(sum(per) / 2, abs=0.01)
    assert json.loads((toy / "runs" / "late-work" / "cmli_seed1" / "recipe.json").read_text())["seed"] == 1
    assert json.loads((toy / "runs" / "late-work" / "global" / "recipe.json").read_text())["swap_twins"] is True
    assert json.loads((toy / "runs" / "late-work" / "global_kd" / "recipe.json").read_text())["swap_twins"] is False
    assert out.with_suffix(".md").read_text().startswith("# bench late")
    # a second run reuses the trained models (same recipe)
    r = invoke("bench", "late", "--json", out, "--models", toy / "models", "--world", toy / "world",
               "--config", toy / "toy.toml", "--no-world-new")
    assert r.exit_code == 0, r.output
    assert all(v["reused"] for v in json.loads(out.read_text())["training"].values())


def test_bench_late_bad_config_names_the_field(toy, tmp_path) -> None:
    r = invoke("bench", "late", "--json", tmp_path / "x.json", "--models", toy / "models", "--world", toy / "world",
               "--extra-seeds", "1,two")
    assert r.exit_code != 0 and "--extra-seeds" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("stepz = 3\n")
    r = invoke("bench", "late", "--json", tmp_path / "x.json", "--models", toy / "models", "--world", toy / "world",
               "--config", bad)
    assert r.exit_code == 2 and "stepz" in r.output
