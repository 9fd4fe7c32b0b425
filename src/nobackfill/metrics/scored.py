"""Retrieval metrics from precomputed score matrices (e.g. first-stage scores re-ranked by late
interaction), under the same protocol and tie rule as :func:`nobackfill.metrics.retrieval_metrics`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .retrieval import Ties, _as_index, _check_options, _summarise, ranks_from_score_blocks, relevance_csr

__all__ = ["retrieval_metrics_from_scores", "top_k_columns", "lift_top_k"]


def _blocks(scores: np.ndarray, chunk: int):
    for s in range(0, scores.shape[0], chunk):
        yield s, scores[s:s + chunk]


def retrieval_metrics_from_scores(
    t2i_scores: np.ndarray | None,
    i2t_scores: np.ndarray | None,
    text_to_image: np.ndarray | Sequence[int],
    ks: Sequence[int] = (1, 5, 10),
    *,
    ties: Ties = "pessimistic",
    chunk: int = 1024,
) -> dict[str, dict[str, float]]:
    """R@K, median rank, mAP from score matrices: ``t2i_scores`` ``(N_txt, N_img)`` (caption
    queries over images) and ``i2t_scores`` ``(N_img, N_txt)`` (image queries over captions);
    either may be None to skip that direction."""
    ks_t = _check_options(ks, chunk, ties)
    out: dict[str, dict[str, float]] = {}
    shape = t2i_scores.shape if t2i_scores is not None else i2t_scores.T.shape
    n_txt, n_img = shape
    t2i_idx = _as_index(text_to_image, n_txt, n_img)
    for direction, scores in (("t2i", t2i_scores), ("i2t", i2t_scores)):
        if scores is None:
            continue
        scores = np.asarray(scores, dtype=np.float32)  # the ranking code compares in float32
        expect = (n_txt, n_img) if direction == "t2i" else (n_img, n_txt)
        if scores.shape != expect:
            raise ValueError(f"{direction}_scores has shape {scores.shape}, expected {expect}")
        keep, indptr, indices = relevance_csr(direction, t2i_idx, n_img)
        if keep is not None:
            scores = scores[keep]
        best, ap = ranks_from_score_blocks(_blocks(scores, int(chunk)), scores.shape[0], indptr, indices, ties=ties)
        out[direction] = _summarise(best, ap, ks_t)
    return out


def top_k_columns(first: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's ``k`` highest first-stage scores ``(Q, k)`` (unordered)."""
    k = min(int(k), first.shape[1])
    return np.argpartition(-np.asarray(first), k - 1, axis=1)[:, :k]


def lift_top_k(first: np.ndarray, top: np.ndarray, new_scores: np.ndarray) -> np.ndarray:
    """Re-ranked score matrix (float32): the ``top`` columns of each row get ``new_scores`` plus
    a constant that puts them above every other item (in the new order); the other items keep
    their first-stage scores and order."""
    first = np.asarray(first, dtype=np.float32)
    new = np.asarray(new_scores, dtype=np.float32)
    bonus = np.float32(float(first.max()) - float(new.min()) + 1.0)
    out = first.copy()
    np.put_along_axis(out, top, new + bonus, axis=1)
    return out
