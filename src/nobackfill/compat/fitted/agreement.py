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
text queries. The gallery may be every backfilled item of the gallery modality (a bridge maps
queries only; a larger gallery tells the candidates apart). For a same-modality direction a
query's own item is left out of its gallery (else every query finds itself). The routes are scored the same way: ``old-model`` ranks ``q_old . g_old``; ``fused``
ranks ``(1 - w) q_old . g_old + w bridge(q_new) . g_old`` for ``w`` on a grid.

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

    def reference(self) -> np.ndarray:
        """The new model's top-``K`` gallery columns per query (computed once)."""
        if self._ref is None:
            self._ref = _topk(self.masked(self.q_new @ self.g_new.T), K)
        return self._ref

    def old_scores(self, queries: np.ndarray) -> np.ndarray:
        """Scores of queries already in the old space against the held-out gallery's old vectors."""
        return np.asarray(queries, np.float32) @ self.g_old.T


def hits(scores: np.ndarray, held: HeldOut) -> np.ndarray:
    """Per query: does the candidate's top-1 equal the reference top-1."""
    return np.argmax(held.masked(scores), axis=1) == held.reference()[:, 0]


def agreement(scores: np.ndarray, held: HeldOut) -> dict[str, float]:
    """``r1`` and ``overlap10`` of a candidate's scores (queries x held-out gallery, old vectors)."""
    ref = held.reference()
    top = _topk(held.masked(scores), ref.shape[1])
    r1 = float(np.mean(top[:, 0] == ref[:, 0]))
    overlap = float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(top.tolist(), ref.tolist())]))
    return {"r1": round(r1, 6), "overlap10": round(overlap, 6)}


def score_key(s: Mapping[str, float]) -> tuple[float, float]:
    """What a choice maximises: agreement R@1, then overlap@10."""
    return (round(float(s["r1"]), 9), round(float(s["overlap10"]), 9))


def bridge_score(bridged_queries: np.ndarray, held: HeldOut) -> dict[str, float]:
    """The held-out score of a bridge given its output for ``held``'s queries."""
    return agreement(held.old_scores(bridged_queries), held)


def route_scores(held: HeldOut, bridged_queries: np.ndarray | None, weights=WEIGHTS,
                 margin: float = 0.0, z: float = 3.0) -> dict[str, Any]:
    """Score ``old-model`` (when ``held.q_old`` is known), ``bridge`` and ``fused`` (``w`` on the
    grid) and choose: the best score, except that a route using the bridge must beat
    ``old-model`` by more than ``margin`` and significantly: per held-out query, the queries it
    agrees on and the old model does not (``wins``) must exceed those the other way (``losses``)
    by ``z * sqrt(wins + losses)`` (a sign test; the old model's quality is what users had, and a
    few held-out queries cannot tell a small gain from noise; ``z = 3`` rather than 2 because the
    candidate was itself the best of many on the same queries, which inflates its score).
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
            w, sc = max(curve, key=lambda ws: score_key(ws[1]))
            out[FUSED] = {**sc, "w": w}
    if not out:
        raise ValueError("route_scores needs the old model's queries or a bridge")
    ranked = sorted((r for r in (OLD_MODEL, BRIDGE, FUSED) if r in out), key=lambda r: score_key(out[r]), reverse=True)
    best = ranked[0]
    if best != OLD_MODEL and OLD_MODEL in out:
        w = out[FUSED]["w"] if best == FUSED else 1.0
        h_best, h_old = hits((1 - w) * s_old + w * s_br, held), hits(s_old, held)
        wins, losses = int(np.sum(h_best & ~h_old)), int(np.sum(h_old & ~h_best))
        out["test"] = {"route": best, "wins": wins, "losses": losses, "z": z}
        if out[best]["r1"] <= out[OLD_MODEL]["r1"] + margin or wins - losses <= z * np.sqrt(wins + losses):
            best = OLD_MODEL
    out["route"] = best
    out["w"] = out[FUSED]["w"] if best == FUSED else None
    return out


__all__ = ["BRIDGE", "FUSED", "HeldOut", "OLD_MODEL", "WEIGHTS", "agreement", "bridge_score", "hits", "route_scores",
           "score_key"]
