"""The label-free score of a bridge and of a route: agreement with the new model's own ranking.

On items already backfilled (their new *and* old vectors are real), the new model's ranking of a
held-out gallery for a held-out query (``q_new . g_new``) is the reference. A candidate bridge
maps the same query's new vector into the old space and ranks the same items by their *old*
vectors (``bridge(q_new) . g_old``); its score is how well the two rankings agree:

* ``r1`` - R@1 of the reference top-1 (the candidate's top-1 is the new model's top-1), the score
  a choice is made on;
* ``overlap10`` - the mean share of the reference top-10 in the candidate's top-10 (ties broken).

The queries are the collection's own held-out items of the direction's query modality (captions
for ``t2i``, images for ``i2t``, ...), never fitted on: a map fitted on image pairs is judged on
text queries; example query texts given with the upgrade join them (the only text queries of a
collection of images alone). The gallery is every backfilled item of the gallery modality, and only the queries
whose reference top-1 is a held-out item count (:func:`held_out_set`: a query whose match was
fitted on rewards a map for recalling its fit). Items are held out by scene (an image with its
captions), so a held-out caption's image is held out too. For a same-modality direction a
query's own item is left out of its gallery (else every query finds itself). The routes are scored
the same way: ``old-model`` ranks ``q_old . g_old``; ``fused`` ranks
``(1 - w) q_old . g_old + w bridge(q_new) . g_old`` for ``w`` on a grid.

How the proxy can mislead: it measures agreement with the new model, not correctness; where the
new model is weak (its own R@1 is low) or a candidate copies the new model's mistakes, a higher
agreement need not be a higher R@1. With labels (``--calibrate``) the labels decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

OLD_MODEL, BRIDGE, FUSED = "old-model", "bridge", "fused"
WEIGHTS = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 11))
K = 10


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


@dataclass
class HeldOut:
    """One direction's held-out data: queries embedded by the new model (``q_new``) and, where the
    old model embeds their modality, by the old one (``q_old``); gallery items' new and old vectors.
    ``exclude[i]``: the gallery column of query ``i``'s own item (-1: none)."""

    direction: str
    q_new: np.ndarray
    g_new: np.ndarray
    g_old: np.ndarray
    q_old: np.ndarray | None = None
    exclude: np.ndarray | None = None
    _ref: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.q_new = np.asarray(self.q_new, np.float32)
        self.g_new = np.asarray(self.g_new, np.float32)
        self.g_old = np.asarray(self.g_old, np.float32)
        if len(self.g_new) != len(self.g_old):
            raise ValueError(f"held-out gallery: {len(self.g_new)} new vectors for {len(self.g_old)} old ones")
        if self.q_old is not None:
            self.q_old = np.asarray(self.q_old, np.float32)
            if len(self.q_old) != len(self.q_new):
                raise ValueError(f"held-out queries: {len(self.q_new)} new vectors for {len(self.q_old)} old ones")
        if self.exclude is not None:
            self.exclude = np.asarray(self.exclude, np.int64).reshape(-1)
            if len(self.exclude) != len(self.q_new):
                raise ValueError("held-out exclude: one entry per query")
        if len(self.q_new) < 1 or len(self.g_new) < 2:
            raise ValueError(f"held-out {self.direction}: needs queries and at least 2 gallery items, "
                             f"got {len(self.q_new)} and {len(self.g_new)}")

    @property
    def sizes(self) -> dict[str, int]:
        return {"queries": int(len(self.q_new)), "gallery": int(len(self.g_new))}

    def masked(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` with each query's own item pushed last."""
        if self.exclude is None:
            return scores
        out = np.array(scores, np.float32, copy=True)
        rows = np.flatnonzero(self.exclude >= 0)
        out[rows, self.exclude[rows]] = -np.inf
        return out

    def take(self, rows: np.ndarray) -> "HeldOut":
        """The same gallery with only the queries ``rows`` (indices or a boolean mask)."""
        return HeldOut(self.direction, self.q_new[rows], self.g_new, self.g_old,
                       None if self.q_old is None else self.q_old[rows],
                       None if self.exclude is None else self.exclude[rows])

    def reference(self) -> np.ndarray:
        """The new model's top-``K`` gallery columns per query (computed once)."""
        if self._ref is None:
            self._ref = _topk(self.masked(self.q_new @ self.g_new.T), K)
        return self._ref

    def old_scores(self, queries: np.ndarray) -> np.ndarray:
        """Scores of queries already in the old space against the held-out gallery's old vectors."""
        return np.asarray(queries, np.float32) @ self.g_old.T


def held_out_set(direction: str, q_new: np.ndarray, g_new: np.ndarray, g_old: np.ndarray, g_heldout: np.ndarray,
                 q_old: np.ndarray | None = None, exclude: np.ndarray | None = None,
                 min_queries: int = 2) -> tuple[HeldOut, np.ndarray]:
    """The held-out set a choice is scored on: held-out queries (never fitted on), every backfilled
    gallery item, and of the queries only those whose reference top-1 (the new model's match) is a
    held-out gallery item (``g_heldout``, a boolean mask). A query whose match was fitted on is left
    out: a flexible map (an MLP) maps it onto that fitted neighbour's old vector by recalling the
    fit, which no real query can (the items not yet backfilled were never fitted), and so scored
    higher than it serves (measured by ``bench fitted-bridge``). The fitted items stay in the gallery
    as distractors: a larger gallery tells the candidates apart. With fewer than ``min_queries``
    such queries, every held-out query is kept (a small collection). Returns the set and which of the
    given queries it kept (a boolean mask)."""
    full = HeldOut(direction, q_new, g_new, g_old, q_old, exclude)
    g_heldout = np.asarray(g_heldout, bool).reshape(-1)
    if len(g_heldout) != len(full.g_new):
        raise ValueError(f"held-out gallery mask: {len(g_heldout)} entries for {len(full.g_new)} items")
    keep = g_heldout[full.reference()[:, 0]]
    if int(keep.sum()) < max(1, min_queries) or keep.all():
        return full, np.ones(len(keep), bool)
    return full.take(keep), keep


def hits(scores: np.ndarray, held: HeldOut) -> np.ndarray:
    """Per query: does the candidate's top-1 equal the reference top-1."""
    return np.argmax(held.masked(scores), axis=1) == held.reference()[:, 0]


def per_query(scores: np.ndarray, held: HeldOut) -> tuple[np.ndarray, np.ndarray]:
    """Per query: does the candidate's top-1 equal the reference top-1 (0/1), and the share of the
    reference top-10 in the candidate's top-10."""
    ref = held.reference()
    top = _topk(held.masked(scores), ref.shape[1])
    hit = (top[:, 0] == ref[:, 0]).astype(np.float64)
    overlap = np.array([len(set(a) & set(b)) / len(b) for a, b in zip(top.tolist(), ref.tolist())], np.float64)
    return hit, overlap


def agreement(scores: np.ndarray, held: HeldOut) -> dict[str, float]:
    """``r1`` and ``overlap10`` of a candidate's scores (queries x held-out gallery, old vectors)."""
    hit, overlap = per_query(scores, held)
    return {"r1": round(float(hit.mean()), 6), "overlap10": round(float(overlap.mean()), 6)}


def candidate_score(s: Mapping[str, float]) -> float:
    """What the choice among bridges maximises: agreement R@1 + overlap@10. Where a query has several
    right answers (an image's captions, a caption's siblings) R@1 of the one reference top-1 is a
    noisy count; the top-10 overlap steadies it (on the design splits of ``bench fitted-bridge``,
    world val and Multi30K train captions 3 -> 4, it chose closer to the best family than either)."""
    return round(float(s["r1"]) + float(s["overlap10"]), 9)


def bridge_score(bridged_queries: np.ndarray, held: HeldOut) -> dict[str, float]:
    """The held-out score of a bridge given its output for ``held``'s queries."""
    return agreement(held.old_scores(bridged_queries), held)


def t_critical(z: float, df: int) -> float:
    """The Student t value with ``df`` degrees of freedom exceeded as rarely as the standard normal
    exceeds ``z``: what a paired test on ``df + 1`` queries compares its mean / standard error with
    (the normal ``z`` alone passes small samples too often: on 15 queries z = 3 is the t's 0.9952
    quantile, not 0.99865). The Cornish-Fisher expansion of the t quantile in powers of 1 / df
    (Abramowitz & Stegun 26.7.5), within 3e-3 of the exact value for ``df`` >= 7 at z <= 3; inf
    below 1 degree of freedom."""
    if df < 1:
        return float("inf")
    x, v = float(z), float(df)
    g = ((x ** 3 + x) / 4, (5 * x ** 5 + 16 * x ** 3 + 3 * x) / 96,
         (3 * x ** 7 + 19 * x ** 5 + 17 * x ** 3 - 15 * x) / 384,
         (79 * x ** 9 + 776 * x ** 7 + 1482 * x ** 5 - 1920 * x ** 3 - 945 * x) / 92160)
    return x + sum(gi / v ** (i + 1) for i, gi in enumerate(g))


def route_scores(held: HeldOut, bridged_queries: np.ndarray | None, weights=WEIGHTS,
                 margin: float = 0.0, z: float = 3.0) -> dict[str, Any]:
    """Score ``old-model`` (when ``held.q_old`` is known), ``bridge`` and ``fused`` (``w`` on the grid) and
    choose: the best agreement (:func:`candidate_score`: R@1 + overlap@10), except that a route using the
    bridge must beat ``old-model`` by more than ``margin`` and significantly: per held-out query, the
    difference of the two routes' agreement (hit + top-10 overlap) must have a mean above ``z`` standard
    errors (a paired test; the old model's quality is what users had, and a few held-out queries cannot tell
    a small gain from noise; ``z = 3`` rather than 2 because the candidate was itself the best of many on the
    same queries, which inflates its score; on few queries the bar is the t value of the same level,
    :func:`t_critical`: a 300-caption collection whose first fit held out 15 queries passed z = 3 with a
    fused route that served 0.487 R@1 where the old model served 0.637; the t bar, 3.64 there, keeps the old
    model: 0.643), and it must win more queries' top-1 agreement than it loses. The top-10 overlap counts
    where a query has several right answers (an image's captions), so the test sees a gain that top-1 hits
    alone are too few to show; a route that gains only in the overlap (Multi30K at 128 pairs: 0 wins, 0
    losses) is not a gain at R@1 (measured on the design splits of ``bench fitted-bridge``).
    Returns ``{route: score, ..., "route": chosen, "w": fused weight or None, "test": {...}}``."""
    out: dict[str, Any] = {}
    s_old = held.old_scores(held.q_old) if held.q_old is not None else None
    s_br = held.old_scores(bridged_queries) if bridged_queries is not None else None
    if s_old is not None:
        out[OLD_MODEL] = agreement(s_old, held)
    if s_br is not None:
        out[BRIDGE] = agreement(s_br, held)
    if s_old is not None and s_br is not None:
        curve = [(float(w), agreement((1 - w) * s_old + w * s_br, held)) for w in weights if 0.0 < w < 1.0]
        if curve:
            w, sc = max(curve, key=lambda ws: candidate_score(ws[1]))
            out[FUSED] = {**sc, "w": w}
    if not out:
        raise ValueError("route_scores needs the old model's queries or a bridge")
    ranked = sorted((r for r in (OLD_MODEL, BRIDGE, FUSED) if r in out), key=lambda r: candidate_score(out[r]),
                    reverse=True)
    best = ranked[0]
    if best != OLD_MODEL and OLD_MODEL in out:
        w = out[FUSED]["w"] if best == FUSED else 1.0
        d = np.add(*per_query((1 - w) * s_old + w * s_br, held)) - np.add(*per_query(s_old, held))
        mean = float(d.mean())
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")
        h_best, h_old = hits((1 - w) * s_old + w * s_br, held), hits(s_old, held)
        bar = t_critical(z, len(d) - 1)
        out["test"] = {"route": best, "mean_gain": round(mean, 6), "se": round(se, 6), "z": z,
                       "t": round(bar, 4), "queries": int(len(d)),
                       "wins": int(np.sum(h_best & ~h_old)), "losses": int(np.sum(h_old & ~h_best))}
        t = out["test"]
        if candidate_score(out[best]) <= candidate_score(out[OLD_MODEL]) + margin or not mean > bar * se \
                or t["wins"] <= t["losses"]:
            best = OLD_MODEL
    out["route"] = best
    out["w"] = out[FUSED]["w"] if best == FUSED else None
    return out


__all__ = ["BRIDGE", "FUSED", "HeldOut", "OLD_MODEL", "WEIGHTS", "agreement", "bridge_score", "candidate_score",
           "held_out_set", "hits", "per_query", "route_scores", "t_critical"]
