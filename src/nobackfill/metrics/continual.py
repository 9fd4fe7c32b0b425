"""Continual-learning metrics over a recall matrix (CLL-CLIP paper, Yang et al. 2024, Sec. "Metrics").

``a[j][i]`` is Recall@1 on task ``i`` after training on task ``j`` (0-based here; only ``j >= i``
enters the metrics, so a full matrix with zero-shot entries ``j < i`` is accepted):

* ``AR_j = 1/j sum_{i<=j} a[j, i]`` (average recall),
* ``F_j = 1/(j-1) sum_{i<j} max_{k in [i, j-1]} (a[k, i] - a[j, i])`` (forgetting; lower is better).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _matrix(a: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    m = np.asarray(a, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"recall matrix must be square (tasks x tasks), got shape {m.shape}")
    return m


def average_recall(a: Sequence[Sequence[float]] | np.ndarray, j: int | None = None) -> float:
    """``AR_j`` (1-based ``j``; default the last task)."""
    m = _matrix(a)
    j = m.shape[0] if j is None else int(j)
    if not 1 <= j <= m.shape[0]:
        raise ValueError(f"j must be in 1..{m.shape[0]}, got {j}")
    return float(m[j - 1, :j].mean())


def forgetting(a: Sequence[Sequence[float]] | np.ndarray, j: int | None = None) -> float:
    """``F_j`` (1-based ``j``; default the last task); 0 for ``j = 1``."""
    m = _matrix(a)
    j = m.shape[0] if j is None else int(j)
    if not 1 <= j <= m.shape[0]:
        raise ValueError(f"j must be in 1..{m.shape[0]}, got {j}")
    if j == 1:
        return 0.0
    drops = [max(m[k, i] - m[j - 1, i] for k in range(i, j - 1)) for i in range(j - 1)]
    return float(np.mean(drops))


def continual_summary(a: Sequence[Sequence[float]] | np.ndarray) -> dict:
    """``{"AR": AR_T, "F": F_T, "AR_j": [...], "F_j": [...], "matrix": a}``."""
    m = _matrix(a)
    t = m.shape[0]
    return {"AR": average_recall(m), "F": forgetting(m),
            "AR_j": [average_recall(m, j) for j in range(1, t + 1)],
            "F_j": [forgetting(m, j) for j in range(1, t + 1)],
            "matrix": m.tolist()}


__all__ = ["average_recall", "forgetting", "continual_summary"]
