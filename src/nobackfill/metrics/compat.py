"""Compatibility metrics, shared by the backward-compatible upgrade methods (XBT, Jang & Lim 2024) and
the compatibility-learning family (Biondi et al.'s tutorial).

**Criterion (XBT Eq. 1, after BCT).** With cosine distance ``d`` and labels ``y`` (paired
image-text or same class), a new query model is compatible with the old gallery when

    d(q_new_i, g_old_j) <= d(q_old_i, g_old_j)   for every paired   (y_i == y_j)
    d(q_new_i, g_old_j) >= d(q_old_i, g_old_j)   for every unpaired (y_i != y_j)

Exhaustive checking is quadratic, so :func:`criterion_rates` reports the *fraction* of sampled
paired / unpaired ``(i, j)`` that satisfy each inequality. For cross-modal retrieval
(:func:`cross_modal_criterion`) the two cases are ``w_new / v_old`` (text queries, image
gallery) and ``v_new / w_old`` (image queries, text gallery).

**Empirical criterion and the compatibility matrix (Biondi et al.'s tutorial).** ``C[t, k]`` is the performance
(e.g. R@1) of query model ``t`` against a gallery indexed by model ``k`` (``k <= t``); ``C[k, k]``
is model ``k``'s self-test. Model ``t`` is compatible with ``k`` when the cross-test beats the
older self-test, ``C[t, k] > C[k, k]``. Over ``T`` models::

    AC  = 2 / (T (T-1)) * sum_{t=2..T} sum_{k<t} 1(C[t,k] > C[k,k])
    ACA = 2 / (T (T-1)) * sum_{t=2..T} sum_{k<t, C[t,k] > C[k,k]} C[t,k]
    AA  = 2 / (T (T+1)) * sum_{t=1..T} sum_{k<=t} C[t,k]

**Ties** are a parameter everywhere (``strict``): ``strict=True`` means a tie does *not*
satisfy the inequality. Defaults follow the sources: Eq. 1 is written with ``<=`` / ``>=``, so
:func:`criterion_rates` defaults to ``strict=False`` (ties satisfy it); the tutorial's AC/ACA use
``>``, so the matrix functions default to ``strict=True``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


# ----------------------------------------------------------------------------- Eq. 1 criterion
def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be 2-D, got shape {x.shape}")
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _paired_indices(q_labels: np.ndarray, g_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(g_labels, kind="stable")
    sorted_labels = g_labels[order]
    lo = np.searchsorted(sorted_labels, q_labels, "left")
    hi = np.searchsorted(sorted_labels, q_labels, "right")
    counts = hi - lo
    qi = np.repeat(np.arange(len(q_labels)), counts)
    offs = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    gj = order[np.repeat(lo, counts) + offs]
    return qi, gj


def _sample_unpaired(q_labels: np.ndarray, g_labels: np.ndarray, n: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if len(np.unique(np.concatenate([q_labels, g_labels]))) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    qi, gj = [], []
    need = n
    for _ in range(100):
        a = rng.integers(len(q_labels), size=2 * need + 16)
        b = rng.integers(len(g_labels), size=2 * need + 16)
        keep = q_labels[a] != g_labels[b]
        qi.append(a[keep][:need])
        gj.append(b[keep][:need])
        need -= int(min(keep.sum(), need))
        if need <= 0:
            break
    return np.concatenate(qi), np.concatenate(gj)


def criterion_rates(query_new: np.ndarray, query_old: np.ndarray, gallery_old: np.ndarray,
                    query_labels: Sequence[int], gallery_labels: Sequence[int], *,
                    n_paired: int | None = None, n_unpaired: int = 20000, seed: int = 0,
                    strict: bool = False) -> dict:
    """Fractions of sampled pairs satisfying Eq. 1 (cosine distance).

    ``query_new[i]`` / ``query_old[i]``: query ``i`` embedded by the new (possibly upgraded) and
    the old model, both in the gallery's space; ``gallery_old[j]``: gallery item ``j``. Pair
    ``(i, j)`` is *paired* when ``query_labels[i] == gallery_labels[j]``. All paired pairs are
    used unless ``n_paired`` caps them (uniform sample); ``n_unpaired`` unpaired pairs are drawn
    uniformly. ``strict=True`` requires ``<`` / ``>`` (a tie fails).

    Returns ``{"paired": rate, "unpaired": rate, "n_paired", "n_unpaired", "strict"}``.
    """
    qn, qo, g = _unit(query_new), _unit(query_old), _unit(gallery_old)
    if qn.shape != qo.shape:
        raise ValueError(f"query_new {qn.shape} and query_old {qo.shape} must have equal shapes")
    if qn.shape[1] != g.shape[1]:
        raise ValueError(f"queries have dim {qn.shape[1]} but the gallery has dim {g.shape[1]}")
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    if len(ql) != len(qn) or len(gl) != len(g):
        raise ValueError("one label per query and per gallery item is needed")
    rng = np.random.default_rng(seed)
    pi, pj = _paired_indices(ql, gl)
    if n_paired is not None and len(pi) > n_paired:
        pick = rng.choice(len(pi), n_paired, replace=False)
        pi, pj = pi[pick], pj[pick]
    ui, uj = _sample_unpaired(ql, gl, int(n_unpaired), rng)

    def dist(q, i, j):
        return 1.0 - np.einsum("nd,nd->n", q[i], g[j])

    out = {"strict": bool(strict)}
    for name, i, j, better in (("paired", pi, pj, np.less), ("unpaired", ui, uj, np.greater)):
        if len(i) == 0:
            out[name], out[f"n_{name}"] = float("nan"), 0
            continue
        d_new, d_old = dist(qn, i, j), dist(qo, i, j)
        ok = better(d_new, d_old) if strict else (better(d_new, d_old) | (d_new == d_old))
        out[name], out[f"n_{name}"] = float(ok.mean()), int(len(i))
    return out


def cross_modal_criterion(new_texts: np.ndarray, new_images: np.ndarray, old_texts: np.ndarray,
                          old_images: np.ndarray, text_to_image: Sequence[int], **kw) -> dict:
    """Eq. 1 for both cross-modal cases: ``{"w_new/v_old": rates, "v_new/w_old": rates}``.
    ``new_*`` must already live in the old space (e.g. ``phi`` applied)."""
    t2i = np.asarray(text_to_image)
    img_ids = np.arange(len(old_images))
    return {
        "w_new/v_old": criterion_rates(new_texts, old_texts, old_images, t2i, img_ids, **kw),
        "v_new/w_old": criterion_rates(new_images, old_images, old_texts, img_ids, t2i, **kw),
    }


# ----------------------------------------------------------------------------- empirical / matrix
def gap_closure(x: float, lo: float, hi: float) -> float | None:
    """Share of the old -> new gap a row closes: ``(x - lo) / (hi - lo)`` (``lo`` old/old, ``hi``
    new/new, ``x`` the upgraded row); None when there is no gap."""
    return float((x - lo) / (hi - lo)) if hi != lo else None


def empirical_criterion(cross: float, self_old: float, strict: bool = True) -> bool:
    """Cross-test beats the old self-test: ``M(new_Q, old_G) > M(old_Q, old_G)`` (``>=`` if not strict)."""
    return bool(cross > self_old) if strict else bool(cross >= self_old)


def compatibility_matrix(score: Callable[[int, int], float], n_models: int, full: bool = False) -> np.ndarray:
    """``C[t, k] = score(t, k)`` (query model ``t``, gallery model ``k``; models in release order).
    Only ``k <= t`` is evaluated unless ``full``; the rest is NaN."""
    if n_models < 1:
        raise ValueError("need at least one model")
    c = np.full((n_models, n_models), np.nan)
    for t in range(n_models):
        for k in range(n_models if full else t + 1):
            c[t, k] = float(score(t, k))
    return c


def _check_matrix(c: np.ndarray) -> np.ndarray:
    c = np.asarray(c, np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"a compatibility matrix is square, got shape {c.shape}")
    low = np.tril_indices(c.shape[0])
    if np.isnan(c[low]).any():
        raise ValueError("the lower triangle (k <= t) of the compatibility matrix has NaNs")
    return c


def compatible_pairs(c: np.ndarray, strict: bool = True) -> list[tuple[int, int, bool]]:
    """``(t, k, C[t,k] > C[k,k])`` for every ``k < t`` (0-based)."""
    c = _check_matrix(c)
    return [(t, k, empirical_criterion(c[t, k], c[k, k], strict)) for t in range(1, len(c)) for k in range(t)]


def average_compatibility(c: np.ndarray, strict: bool = True) -> float:
    """AC; NaN for a single model (no pair to test)."""
    pairs = compatible_pairs(c, strict)
    return float(np.mean([ok for _, _, ok in pairs])) if pairs else float("nan")


def average_compatibility_accuracy(c: np.ndarray, strict: bool = True) -> float:
    """ACA: the sum of compatible cross-tests over the number of pairs (incompatible ones add 0)."""
    c = _check_matrix(c)
    pairs = compatible_pairs(c, strict)
    return float(sum(c[t, k] for t, k, ok in pairs if ok) / len(pairs)) if pairs else float("nan")


def average_accuracy(c: np.ndarray) -> float:
    """AA over the lower triangle including the diagonal."""
    c = _check_matrix(c)
    return float(c[np.tril_indices(len(c))].mean())


def compatibility_summary(c: np.ndarray, strict: bool = True, names: Sequence[str] | None = None) -> dict:
    """``{"C": nested lists (None above the diagonal), "AC", "AA", "ACA", "strict", "pairs"}``."""
    c = _check_matrix(c)
    n = len(c)
    names = list(names) if names is not None else [str(i + 1) for i in range(n)]
    return {
        "models": names,
        "C": [[None if k > t else float(c[t, k]) for k in range(n)] for t in range(n)],
        "AC": average_compatibility(c, strict), "AA": average_accuracy(c),
        "ACA": average_compatibility_accuracy(c, strict), "strict": bool(strict),
        "pairs": [{"query": names[t], "gallery": names[k], "compatible": ok} for t, k, ok in compatible_pairs(c, strict)],
    }
