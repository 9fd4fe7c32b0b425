"""Class-matched search (Biondi et al.'s tutorial's "1:N search accuracy"): a query is answered correctly when its
nearest gallery item (cosine similarity) has the query's class. Query and gallery may be embedded by
different models (the cross-test ``M(phi_new^Q, phi_old^G)``); when their dimensions differ the
shorter side is zero-padded (the tutorial's ``P = [V | 0]`` projection of softmax features, and the
extra dimensions of BT2), which leaves cosine rankings of the padded side unchanged.

Ties (equal similarities) go to the lowest gallery index (``argmax``); with real-valued features
exact ties do not occur in practice.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np


def pad_to(x: np.ndarray, dim: int) -> np.ndarray:
    """Zero-pad the columns of ``x`` to ``dim``."""
    x = np.asarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"features must be 2-D, got shape {x.shape}")
    if x.shape[1] > dim:
        raise ValueError(f"cannot pad {x.shape[1]} columns down to {dim}")
    return x if x.shape[1] == dim else np.pad(x, ((0, 0), (0, dim - x.shape[1])))


def common_space(query: np.ndarray, gallery: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad query and gallery to the larger dimension and L2-normalise rows."""
    dim = max(np.shape(query)[1], np.shape(gallery)[1])
    q, g = pad_to(query, dim), pad_to(gallery, dim)
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    g = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
    return q, g


def top1_hits(query: np.ndarray, gallery: np.ndarray, query_labels: Sequence[int],
              gallery_labels: Sequence[int], chunk: int = 2048, query_groups: Sequence[int] | None = None,
              gallery_groups: Sequence[int] | None = None) -> np.ndarray:
    """Boolean per query: its nearest gallery item (cosine) has the same label.

    With ``query_groups`` / ``gallery_groups`` (e.g. the camera, or the rendering condition), a gallery
    item with the query's label *and* group is junk - not a candidate - as the Market-1501
    re-identification protocol drops the query identity's images from the query's camera; items of
    other labels in the query's group stay as distractors. A query left without candidates is a miss."""
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    if len(ql) != len(query) or len(gl) != len(gallery):
        raise ValueError(f"labels ({len(ql)}, {len(gl)}) do not match query / gallery rows "
                         f"({len(query)}, {len(gallery)})")
    if len(gallery) == 0:
        raise ValueError("the gallery is empty")
    if (query_groups is None) != (gallery_groups is None):
        raise ValueError("query_groups and gallery_groups go together (both or neither)")
    if query_groups is not None:
        qg, gg = np.asarray(query_groups), np.asarray(gallery_groups)
        if len(qg) != len(ql) or len(gg) != len(gl):
            raise ValueError(f"groups ({len(qg)}, {len(gg)}) do not match query / gallery rows ({len(ql)}, {len(gl)})")
    q, g = common_space(query, gallery)
    nearest, valid = [], []
    for i in range(0, len(q), chunk):
        sim = q[i:i + chunk] @ g.T
        if query_groups is not None:
            junk = (ql[i:i + chunk, None] == gl[None, :]) & (qg[i:i + chunk, None] == gg[None, :])
            sim = np.where(junk, -np.inf, sim)
            valid.append(~junk.all(1))
        nearest.append(np.argmax(sim, axis=1))
    hits = gl[np.concatenate(nearest)] == ql
    return hits & np.concatenate(valid) if valid else hits


def search_accuracy(query: np.ndarray, gallery: np.ndarray, query_labels: Sequence[int],
                    gallery_labels: Sequence[int], query_groups: Sequence[int] | None = None,
                    gallery_groups: Sequence[int] | None = None) -> float:
    """Top-1 class-matched search accuracy (the ``M`` of the compatibility matrix); groups: the junk
    rule of :func:`top1_hits`."""
    return float(top1_hits(query, gallery, query_labels, gallery_labels, query_groups=query_groups,
                           gallery_groups=gallery_groups).mean())


def _draw_verification_pairs(query_labels: Sequence[int], gallery_labels: Sequence[int], n_pairs: int,
                             seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The draw behind :func:`verification_pairs`."""
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    if len(ql) == 0 or len(gl) == 0:
        raise ValueError("verification pairs need a non-empty query and gallery")
    rng = np.random.default_rng(seed)
    same = ql[:, None] == gl[None, :]
    out_i, out_j, out_s = [], [], []
    for want in (True, False):
        qi, gj = np.nonzero(same == want)
        if len(qi) == 0:
            raise ValueError(f"no {'same' if want else 'different'}-class (query, gallery) pair")
        pick = rng.choice(len(qi), n_pairs, replace=len(qi) < n_pairs)
        out_i.append(qi[pick])
        out_j.append(gj[pick])
        out_s.append(np.full(n_pairs, want))
    order = rng.permutation(2 * n_pairs)
    return np.concatenate(out_i)[order], np.concatenate(out_j)[order], np.concatenate(out_s)[order]


_PAIRS_MEMO: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def verification_pairs(query_labels: Sequence[int], gallery_labels: Sequence[int], n_pairs: int = 3000,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_pairs`` same-class and ``n_pairs`` different-class random ``(query i, gallery j)`` pairs
    (the CoReS evaluation's 3000 + 3000 pairs of open-set images), seeded so every ``C[t, k]`` of a
    matrix is scored on the same pairs. Returns ``(i, j, same)``; memoised on the label contents (a
    matrix draws the same pairs for every entry)."""
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    key = (hashlib.sha1(ql.tobytes()).hexdigest(), ql.dtype.str, hashlib.sha1(gl.tobytes()).hexdigest(),
           gl.dtype.str, int(n_pairs), int(seed))
    if key not in _PAIRS_MEMO:
        if len(_PAIRS_MEMO) > 32:
            _PAIRS_MEMO.clear()
        _PAIRS_MEMO[key] = _draw_verification_pairs(ql, gl, n_pairs, seed)
    return tuple(a.copy() for a in _PAIRS_MEMO[key])


def best_threshold_accuracy(dist: np.ndarray, same: np.ndarray) -> tuple[float, float]:
    """The threshold ``d < thr -> same`` that maximises accuracy on ``(dist, same)``; returns
    ``(threshold, accuracy)``. Candidates: midpoints between consecutive sorted distances."""
    order = np.argsort(dist, kind="stable")
    d, s = dist[order], same[order].astype(np.int64)
    # accuracy when the first m sorted pairs are called "same": TP(m) + TN(m)
    tp = np.concatenate([[0], np.cumsum(s)])
    tn = (len(s) - s.sum()) - np.concatenate([[0], np.cumsum(1 - s)])
    acc = (tp + tn) / len(s)
    m = int(np.argmax(acc))
    thr = -np.inf if m == 0 else (np.inf if m == len(d) else 0.5 * (d[m - 1] + d[m]))
    return float(thr), float(acc[m])


def verification_accuracy(query: np.ndarray, gallery: np.ndarray, query_labels: Sequence[int],
                          gallery_labels: Sequence[int], n_pairs: int = 3000, folds: int = 10,
                          seed: int = 0) -> float:
    """Pair verification accuracy (the ``M`` of the tutorial's CoReS-vs-BCT comparison, "M =
    Verification Accuracy"): squared L2 distance between the L2-normalised query-model and
    gallery-model features of :func:`verification_pairs`; over ``folds`` contiguous folds, the
    threshold that is best on the other folds is scored on the held-out fold; the mean is returned."""
    i, j, same = verification_pairs(query_labels, gallery_labels, n_pairs, seed)
    q, g = common_space(query, gallery)
    dist = ((q[i] - g[j]) ** 2).sum(1)
    accs = []
    for held in np.array_split(np.arange(len(dist)), folds):
        train = np.ones(len(dist), bool)
        train[held] = False
        thr, _ = best_threshold_accuracy(dist[train], same[train])
        accs.append(float(((dist[held] < thr) == same[held]).mean()))
    return float(np.mean(accs))


def neighbour_agreement(query: np.ndarray, gallery: np.ndarray, query_attr: Sequence, gallery_attr: Sequence
                        ) -> float:
    """Fraction of queries whose nearest gallery item (cosine, as in :func:`top1_hits`) shares the
    query's attribute - with a nuisance attribute (e.g. the background), how much an embedding's
    neighbourhoods are organised by it."""
    return float(top1_hits(query, gallery, query_attr, gallery_attr).mean())
