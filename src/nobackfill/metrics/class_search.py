"""Class-matched search (seed 002's "1:N search accuracy"): a query is answered correctly when its
nearest gallery item (cosine similarity) has the query's class. Query and gallery may be embedded by
different models (the cross-test ``M(phi_new^Q, phi_old^G)``); when their dimensions differ the
shorter side is zero-padded (the tutorial's ``P = [V | 0]`` projection of softmax features, and the
extra dimensions of BT2), which leaves cosine rankings of the padded side unchanged.

Ties (equal similarities) go to the lowest gallery index (``argmax``); with real-valued features
exact ties do not occur in practice.
"""

from __future__ import annotations

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
              gallery_labels: Sequence[int], chunk: int = 2048) -> np.ndarray:
    """Boolean per query: its nearest gallery item (cosine) has the same label."""
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    if len(ql) != len(query) or len(gl) != len(gallery):
        raise ValueError(f"labels ({len(ql)}, {len(gl)}) do not match query / gallery rows "
                         f"({len(query)}, {len(gallery)})")
    if len(gallery) == 0:
        raise ValueError("the gallery is empty")
    q, g = common_space(query, gallery)
    nearest = np.concatenate([np.argmax(q[i:i + chunk] @ g.T, axis=1) for i in range(0, len(q), chunk)])
    return gl[nearest] == ql


def search_accuracy(query: np.ndarray, gallery: np.ndarray, query_labels: Sequence[int],
                    gallery_labels: Sequence[int]) -> float:
    """Top-1 class-matched search accuracy (the ``M`` of the compatibility matrix)."""
    return float(top1_hits(query, gallery, query_labels, gallery_labels).mean())
