"""Negative / positive flips between two model versions (Biondi et al.'s tutorial, "Negative Flips Reduction").

A *negative flip* is a sample the old model got right and the new model gets wrong. For a
discriminative model (classification), or any per-sample correctness such as retrieval top-1
(:func:`nobackfill.metrics.class_search.top1_hits`)::

    NFR = 1/N sum_i 1(yhat_new_i != y_i, yhat_old_i == y_i)      (the tutorial's NFR slide)
    PFR = 1/N sum_i 1(yhat_new_i == y_i, yhat_old_i != y_i)

**Relative NFR** is not on the tutorial's slides; it is the normalisation of Positive-Congruent
Training (Yan et al., CVPR 2021, the paper behind Focal Distillation): the NFR divided by the NFR
two *independent* models with the same error rates would have, ``(1 - ER_old) * ER_new``. A value
below 1 means fewer flips than chance coincidence of errors predicts.

For generative outputs scored by a similarity ``S`` (the tutorial's MUSCLE slide),
``D(x_i) = S(new_i, y_i) - S(old_i, y_i)`` and ``NFR~ = mean 1(D < 0)``, ``PFR~ = mean 1(D > 0)``
(:func:`score_flip_rates`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _bool_vector(x: Sequence[bool] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr.astype(bool)


def flip_rates(old_correct: Sequence[bool] | np.ndarray, new_correct: Sequence[bool] | np.ndarray) -> dict:
    """NFR, PFR, relative NFR and both error rates from per-sample correctness of the old and the
    new model (same samples, same order). ``rel_NFR`` is NaN when ``(1 - ER_old) * ER_new == 0``."""
    old, new = _bool_vector(old_correct, "old_correct"), _bool_vector(new_correct, "new_correct")
    if len(old) != len(new):
        raise ValueError(f"old_correct has {len(old)} samples, new_correct {len(new)}")
    if len(old) == 0:
        raise ValueError("no samples to compare")
    nfr = float(np.mean(old & ~new))
    er_old, er_new = float(np.mean(~old)), float(np.mean(~new))
    expected = (1.0 - er_old) * er_new
    return {"NFR": nfr, "PFR": float(np.mean(~old & new)),
            "rel_NFR": nfr / expected if expected > 0 else float("nan"),
            "ER_old": er_old, "ER_new": er_new, "n": int(len(old))}


def prediction_flip_rates(old_pred: Sequence[int] | np.ndarray, new_pred: Sequence[int] | np.ndarray,
                          labels: Sequence[int] | np.ndarray) -> dict:
    """:func:`flip_rates` for class predictions (classification NFR / PFR)."""
    old_pred, new_pred, labels = np.asarray(old_pred), np.asarray(new_pred), np.asarray(labels)
    if not (len(old_pred) == len(new_pred) == len(labels)):
        raise ValueError(f"old_pred ({len(old_pred)}), new_pred ({len(new_pred)}) and labels ({len(labels)}) "
                         "must have equal lengths")
    return flip_rates(old_pred == labels, new_pred == labels)


def negative_flip_rate(old_pred, new_pred, labels) -> float:
    """NFR of class predictions (the tutorial's equation)."""
    return prediction_flip_rates(old_pred, new_pred, labels)["NFR"]


def positive_flip_rate(old_pred, new_pred, labels) -> float:
    """PFR of class predictions."""
    return prediction_flip_rates(old_pred, new_pred, labels)["PFR"]


def relative_nfr(old_pred, new_pred, labels) -> float:
    """NFR / ((1 - ER_old) ER_new) (Yan et al., 2021)."""
    return prediction_flip_rates(old_pred, new_pred, labels)["rel_NFR"]


def score_flip_rates(old_scores: Sequence[float] | np.ndarray, new_scores: Sequence[float] | np.ndarray) -> dict:
    """Generative-task flips (MUSCLE slide): ``D = S_new - S_old`` per sample; ``NFR~ = mean(D < 0)``,
    ``PFR~ = mean(D > 0)``."""
    old, new = np.asarray(old_scores, np.float64), np.asarray(new_scores, np.float64)
    if old.shape != new.shape or old.ndim != 1:
        raise ValueError(f"scores must be 1-D of equal length, got {old.shape} and {new.shape}")
    d = new - old
    return {"NFR": float(np.mean(d < 0)), "PFR": float(np.mean(d > 0)), "n": int(len(d))}
