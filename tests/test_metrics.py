"""Tests for nobackfill.metrics: R@K / median rank / mAP against a brute-force reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nobackfill.metrics import format_table, protocol_grid, retrieval_metrics, similarity

KS = (1, 2, 5)


# ----------------------------------------------------------------------------- reference
def _ref_query(scores: np.ndarray, relevant: np.ndarray, ties: str) -> tuple[int, float]:
    """Best rank and AP of one query by fully sorting its gallery (tie-break per ``ties``)."""
    rel = np.zeros(scores.size, dtype=bool)
    rel[relevant] = True
    tiebreak = rel if ties == "pessimistic" else ~rel  # False sorts first
    order = np.lexsort((tiebreak, -scores.astype(np.float64)))
    pos = np.flatnonzero(rel[order]) + 1
    return int(pos[0]), float(np.mean(np.arange(1, pos.size + 1) / pos))


def _ref_direction(s: np.ndarray, relevant: list[np.ndarray], ties: str, ks) -> dict:
    best, ap = zip(*(_ref_query(s[i], r, ties) for i, r in enumerate(relevant)))
    best = np.asarray(best)
    out = {f"R@{k}": float(np.mean(best <= k)) for k in ks}
    out.update(median_rank=float(np.median(best)), mAP=float(np.mean(ap)), n_queries=best.size)
    return out


def reference_metrics(img, txt, t2i, ks=KS, ties="pessimistic") -> dict:
    t2i = np.asarray(t2i)
    s_t2i = similarity(txt, img)
    have = [i for i in range(len(img)) if np.any(t2i == i)]
    s_i2t = similarity(img[have], txt)
    return {
        "t2i": _ref_direction(s_t2i, [np.array([j]) for j in t2i], ties, ks),
        "i2t": _ref_direction(s_i2t, [np.flatnonzero(t2i == i) for i in have], ties, ks),
    }


def assert_metrics_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for d in want:
        assert got[d].keys() == want[d].keys(), d
        for key, v in want[d].items():
            assert got[d][key] == pytest.approx(v, abs=1e-12), (d, key)


# ----------------------------------------------------------------------------- strategies
# Unit vectors whose coordinates are 0, +-0.5 or +-1: every cosine is exactly 0, +-0.5 or +-1
# in float32 whatever the summation order, so ties are frequent and exact.
_PALETTE = np.array(
    [s * np.eye(4)[i] for i in range(4) for s in (1.0, -1.0)]
    + [0.5 * np.array(signs) for signs in itertools.product((1.0, -1.0), repeat=4)],
    dtype=np.float32,
)


@st.composite
def retrieval_case(draw, tied: bool):
    n_img = draw(st.integers(1, 12))
    n_txt = draw(st.integers(1, 30))
    t2i = np.array(draw(st.lists(st.integers(0, n_img - 1), min_size=n_txt, max_size=n_txt)))
    if tied:
        img = _PALETTE[draw(st.lists(st.integers(0, len(_PALETTE) - 1), min_size=n_img,
                                     max_size=n_img))]
        txt = _PALETTE[draw(st.lists(st.integers(0, len(_PALETTE) - 1), min_size=n_txt,
                                     max_size=n_txt))]
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        d = draw(st.integers(1, 16))
        img = rng.normal(size=(n_img, d)).astype(np.float32)
        txt = rng.normal(size=(n_txt, d)).astype(np.float32) * rng.uniform(0.1, 10.0)
    chunk = draw(st.integers(1, 40))
    return img, txt, t2i, chunk


_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(retrieval_case(tied=False), st.sampled_from(["pessimistic", "optimistic"]))
def test_matches_bruteforce_random(case, ties):
    img, txt, t2i, chunk = case
    got = retrieval_metrics(img, txt, t2i, ks=KS, chunk=chunk, ties=ties)
    assert_metrics_equal(got, reference_metrics(img, txt, t2i, KS, ties))


@_SETTINGS
@given(retrieval_case(tied=True), st.sampled_from(["pessimistic", "optimistic"]))
def test_matches_bruteforce_with_ties(case, ties):
    img, txt, t2i, chunk = case
    got = retrieval_metrics(img, txt, t2i, ks=KS, chunk=chunk, ties=ties)
    assert_metrics_equal(got, reference_metrics(img, txt, t2i, KS, ties))


@_SETTINGS
@given(retrieval_case(tied=True))
def test_optimistic_never_worse_than_pessimistic(case):
    img, txt, t2i, chunk = case
    opt = retrieval_metrics(img, txt, t2i, ks=KS, chunk=chunk, ties="optimistic")
    pes = retrieval_metrics(img, txt, t2i, ks=KS, chunk=chunk, ties="pessimistic")
    for d in ("t2i", "i2t"):
        assert opt[d]["median_rank"] <= pes[d]["median_rank"]
        assert opt[d]["mAP"] >= pes[d]["mAP"] - 1e-12
        for k in KS:
            assert opt[d][f"R@{k}"] >= pes[d][f"R@{k}"]


# ----------------------------------------------------------------------------- hand-computed
def _hand_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """3 images (basis vectors), 6 unit captions whose cosine to image i is ``S[j, i]``."""
    s = np.array([
        [0.90, 0.10, 0.20],  # caption 0 of image 0: t2i rank 1
        [0.30, 0.50, 0.40],  # caption 1 of image 0: t2i rank 3
        [0.60, 0.70, 0.10],  # caption 2 of image 1: t2i rank 1
        [0.45, 0.35, 0.55],  # caption 3 of image 1: t2i rank 3
        [0.20, 0.65, 0.25],  # caption 4 of image 2: t2i rank 2
        [0.05, 0.15, 0.50],  # caption 5 of image 2: t2i rank 1
    ])
    txt = np.hstack([s, np.sqrt(1.0 - (s**2).sum(1, keepdims=True))])
    img = np.eye(4)[:3]
    return img, txt, np.array([0, 0, 1, 1, 2, 2])


def test_hand_computed_case():
    img, txt, t2i = _hand_case()
    m = retrieval_metrics(img, txt, t2i, ks=(1, 2, 5))
    # t2i ranks [1, 3, 1, 3, 2, 1]
    assert m["t2i"]["R@1"] == pytest.approx(3 / 6)
    assert m["t2i"]["R@2"] == pytest.approx(4 / 6)
    assert m["t2i"]["R@5"] == 1.0
    assert m["t2i"]["median_rank"] == 1.5
    assert m["t2i"]["mAP"] == pytest.approx((1 + 1 / 3 + 1 + 1 / 3 + 1 / 2 + 1) / 6)  # 31/36
    assert m["t2i"]["n_queries"] == 6
    # i2t: image 0 -> captions (0, 2, 3, 1, ...): relevant at 1, 4 -> AP (1 + 2/4) / 2
    #      image 1 -> captions (2, 4, 1, 3, ...): relevant at 1, 4 -> AP 0.75
    #      image 2 -> captions (3, 5, 1, 4, ...): relevant at 2, 4 -> AP (1/2 + 2/4) / 2
    assert m["i2t"]["R@1"] == pytest.approx(2 / 3)
    assert m["i2t"]["R@2"] == 1.0
    assert m["i2t"]["median_rank"] == 1.0
    assert m["i2t"]["mAP"] == pytest.approx((0.75 + 0.75 + 0.5) / 3)
    assert m["i2t"]["n_queries"] == 3


def test_ties_conventions_on_collapsed_embeddings():
    """Every score equal: pessimistic puts the relevant items last, optimistic first."""
    img = np.ones((4, 3))
    txt = np.ones((7, 3))
    t2i = np.array([0, 0, 0, 1, 2, 2, 3])
    pes = retrieval_metrics(img, txt, t2i, ties="pessimistic")
    opt = retrieval_metrics(img, txt, t2i, ties="optimistic")
    assert pes["t2i"]["median_rank"] == 4 and pes["t2i"]["R@1"] == 0.0
    assert opt["t2i"]["median_rank"] == 1 and opt["t2i"]["R@1"] == 1.0
    # i2t pessimistic: image with m captions has them at ranks 7-m+1 .. 7
    best = np.array([5, 7, 6, 7])
    assert pes["i2t"]["median_rank"] == np.median(best)
    ap = [np.mean(np.arange(1, m + 1) / np.arange(8 - m, 8)) for m in (3, 1, 2, 1)]
    assert pes["i2t"]["mAP"] == pytest.approx(np.mean(ap))
    assert opt["i2t"]["mAP"] == 1.0 and opt["i2t"]["R@1"] == 1.0


def test_perfect_embeddings():
    rng = np.random.default_rng(0)
    img = rng.normal(size=(50, 32))
    t2i = np.repeat(np.arange(50), 3)
    txt = img[t2i] * rng.uniform(0.5, 2.0, size=(150, 1))  # scale must not matter
    m = retrieval_metrics(img, txt, t2i, chunk=7)
    for d in ("t2i", "i2t"):
        assert m[d]["R@1"] == 1.0 and m[d]["median_rank"] == 1.0 and m[d]["mAP"] == 1.0


def test_random_embeddings_give_chance_recall():
    rng = np.random.default_rng(1)
    n_img = 500
    img = rng.normal(size=(n_img, 64))
    t2i = np.repeat(np.arange(n_img), 2)
    txt = rng.normal(size=(2 * n_img, 64))
    m = retrieval_metrics(img, txt, t2i, ks=(10, 50), chunk=128)
    assert m["t2i"]["R@10"] == pytest.approx(10 / n_img, abs=0.015)
    assert m["t2i"]["R@50"] == pytest.approx(50 / n_img, abs=0.03)
    # i2t: two relevant among 1000 -> P(hit@k) = 1 - (1 - k/1000)^2
    assert m["i2t"]["R@50"] == pytest.approx(1 - (1 - 50 / 1000) ** 2, abs=0.04)
    assert m["t2i"]["median_rank"] == pytest.approx(n_img / 2, rel=0.15)


def test_images_without_captions_are_gallery_only():
    img, txt, t2i = _hand_case()
    img = np.vstack([img, np.eye(4)[3:]])  # image 3 has no caption
    m = retrieval_metrics(img, txt, t2i)
    assert m["i2t"]["n_queries"] == 3
    assert m["t2i"]["n_queries"] == 6


# ----------------------------------------------------------------------------- similarity
def test_similarity_is_cosine_and_chunk_invariant():
    rng = np.random.default_rng(2)
    q, g = rng.normal(size=(13, 5)), rng.normal(size=(9, 5)) * 3
    want = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
        g / np.linalg.norm(g, axis=1, keepdims=True)).T
    s = similarity(q, g, chunk=4)
    assert s.dtype == np.float32 and s.shape == (13, 9)
    np.testing.assert_allclose(s, want, atol=1e-6)
    np.testing.assert_array_equal(s, similarity(q, g, chunk=4))


def test_similarity_zero_rows_score_zero():
    s = similarity(np.zeros((2, 3)), np.ones((4, 3)))
    assert np.all(s == 0)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "img, txt, t2i, match",
    [
        (np.ones((3, 4)), np.ones((2, 5)), [0, 1], "dim mismatch"),
        (np.ones((3, 4)), np.ones((2, 4)), [0, 3], r"text_to_image\[1\] = 3 is out of range"),
        (np.ones((3, 4)), np.ones((2, 4)), [-1, 0], "out of range"),
        (np.ones((3, 4)), np.ones((2, 4)), [0], "has 1 entries but text_emb has 2"),
        (np.ones((3, 4)), np.ones((2, 4)), [0.0, 1.0], "integers"),
        (np.ones((0, 4)), np.ones((2, 4)), [0, 0], "image_emb is empty"),
        (np.ones((3, 4)), np.ones((0, 4)), [], "text_emb is empty"),
        (np.ones(3), np.ones((2, 4)), [0, 0], "2-D"),
        (np.ones((3, 4)), np.full((2, 4), np.nan), [0, 0], "NaN"),
    ],
)
def test_validation_errors(img, txt, t2i, match):
    with pytest.raises(ValueError, match=match):
        retrieval_metrics(img, txt, t2i)


@pytest.mark.parametrize("kwargs, match", [
    ({"ties": "random"}, "ties"), ({"chunk": 0}, "chunk"), ({"ks": (0,)}, "ks"),
    ({"directions": ("x2y",)}, "directions"),
])
def test_option_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        retrieval_metrics(np.ones((2, 3)), np.ones((2, 3)), [0, 1], **kwargs)


def test_similarity_dim_mismatch():
    with pytest.raises(ValueError, match="dim mismatch"):
        similarity(np.ones((2, 3)), np.ones((2, 4)))


def test_single_direction():
    img, txt, t2i = _hand_case()
    m = retrieval_metrics(img, txt, t2i, directions=("i2t",))
    assert list(m) == ["i2t"]


# ----------------------------------------------------------------------------- grid + table
def _grid_models():
    rng = np.random.default_rng(3)
    t2i = np.repeat(np.arange(20), 2)
    base = rng.normal(size=(20, 8))
    image_embs = {"old": base, "new": base + 0.1 * rng.normal(size=base.shape),
                  "wide": rng.normal(size=(20, 16))}
    text_embs = {"old": base[t2i] + 0.3 * rng.normal(size=(40, 8)),
                 "new": base[t2i] + 0.2 * rng.normal(size=(40, 8)),
                 "wide": rng.normal(size=(40, 16))}
    return image_embs, text_embs, t2i


def test_protocol_grid_cells_match_direct_metrics():
    image_embs, text_embs, t2i = _grid_models()
    grid = protocol_grid(image_embs, text_embs, t2i)
    assert len(grid) == 9
    cell = grid["new/old"]  # new-model queries against the old-model gallery
    assert cell["t2i"] == retrieval_metrics(image_embs["old"], text_embs["new"], t2i)["t2i"]
    assert cell["i2t"] == retrieval_metrics(image_embs["new"], text_embs["old"], t2i)["i2t"]
    for key in ("old/wide", "wide/new"):
        assert grid[key]["t2i"] is None and grid[key]["i2t"] is None
        assert "dim mismatch" in grid[key]["skipped"]
    assert grid["wide/wide"]["t2i"] is not None


def test_protocol_grid_explicit_pairs():
    image_embs, text_embs, t2i = _grid_models()
    grid = protocol_grid(image_embs, text_embs, t2i, pairs=[("new", "old")])
    assert list(grid) == ["new/old"]
    with pytest.raises(ValueError, match="dim mismatch"):
        protocol_grid(image_embs, text_embs, t2i, pairs=[("new", "wide")])
    with pytest.raises(ValueError, match="missing"):
        protocol_grid(image_embs, text_embs, t2i, pairs=[("new", "nope")])


def test_format_table():
    image_embs, text_embs, t2i = _grid_models()
    grid = protocol_grid(image_embs, text_embs, t2i)
    table = format_table(grid)
    lines = table.splitlines()
    assert "t2i R@1" in lines[0] and "i2t R@10" in lines[0]
    row = next(line for line in lines if line.startswith("new/old"))
    r1 = 100 * grid["new/old"]["t2i"]["R@1"]
    assert f"{r1:.1f}" in row
    skipped = next(line for line in lines if line.startswith("old/wide"))
    assert "-" in skipped and "dim mismatch" in skipped
    assert len(lines) == 2 + len(grid) + 1


def test_best_relevant_ranks_agree_with_retrieval_metrics():
    from nobackfill.metrics.retrieval import best_relevant_ranks, retrieval_metrics

    rng = np.random.default_rng(3)
    img, txt = rng.standard_normal((12, 8)), rng.standard_normal((20, 8))
    c2i = rng.integers(0, 10, 20)  # images 10 and 11 have no caption: no i2t query
    m = retrieval_metrics(img, txt, c2i)
    for d, (q, g) in (("t2i", (txt, img)), ("i2t", (img, txt))):
        ranks = best_relevant_ranks(q, g, c2i, d)
        assert len(ranks) == m[d]["n_queries"]
        assert np.mean(ranks == 1) == pytest.approx(m[d]["R@1"]) and np.median(ranks) == m[d]["median_rank"]


def test_r1_by_image_subset_splits_hits_by_the_image_mask():
    from nobackfill.metrics.retrieval import r1_by_image_subset

    eye = np.eye(4, dtype=np.float32)
    c2i = np.array([0, 1, 2, 3])
    texts = eye.copy()
    texts[3] = eye[2]  # caption 3 finds image 2: a t2i miss, and image 3 finds caption 2: an i2t miss
    out = r1_by_image_subset(texts, eye, texts, eye, c2i, np.array([True, True, False, False]))
    assert out["t2i_R@1_seen"] == 1.0 and out["t2i_R@1_unseen"] == 0.5
    assert out["frac_images_seen"] == 0.5


def test_mean_over_seeds_averages_numbers_and_keeps_the_rest():
    from nobackfill.report import mean_over_seeds

    rows = [{"t2i": {"R@1": 0.2}, "i2t": {"R@1": 0.4}, "note": "a"}, {"t2i": {"R@1": 0.4}, "i2t": {"R@1": 0.6}, "note": "b"}]
    m = mean_over_seeds(rows)
    assert m["t2i"]["R@1"] == pytest.approx(0.3) and m["note"] == "a" and m["n_seeds"] == 2
    assert m["std"]["t2i_R@1"] == pytest.approx(0.1)
