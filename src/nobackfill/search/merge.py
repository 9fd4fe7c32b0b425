"""Merging ranked lists from several embedding spaces, whose scores are not comparable.

Each space answers a query with its own top-k (its own route, its own score scale); the merge
decides the order of the union. Three methods:

* ``raw`` - by raw score. With metric-compatible spaces this is the "distance rank merge" of Online
  Backfilling (Seo et al., arXiv 2301.03767, Sec. 3.1: the two lists merged by their distances);
  our spaces are not trained to be metric-compatible, so raw scores may favour one space.
* ``calibrated`` - by a per-(space, route, direction) monotone map of the score to the chance that
  the item is relevant, fitted on a calibration split (:class:`ScoreMap`, Platt scaling: a logistic
  curve on the score), so that a score means the same chance of relevance in every space.
* ``rank`` - by rank alone, scaled by each space's share of the items: an item ranked ``r`` (from
  0) in a space holding a fraction ``f`` of the searchable items is placed at ``(r + 0.5) / f``,
  where it would rank if that space's items were a random sample of all of them. No score is
  compared across spaces; equal places go to the space first in ``prefer`` (the current model's).

:func:`merge` returns the top-k of the union; an item appears in one space's list only (the
collection serves each item from one space), so there is nothing to de-duplicate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain, count, repeat
from operator import itemgetter
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = ["DEFAULT_MERGE", "MERGES", "Candidate", "ScoreMap", "candidates", "merge", "merge_order", "named_lists"]

MERGES = ("raw", "calibrated", "rank")
#: the merge of a collection whose plan has not chosen one (no calibration): raw scores, the
#: distance merge of Seo et al.; calibration replaces it with the best merge on the calibration split
DEFAULT_MERGE = "raw"


class Candidate(NamedTuple):
    """One hit of one space's list: ``rank`` is its 0-based rank within that list; ``metadata`` the
    item's metadata JSON, carried to its hit. A named tuple: a search makes one for every hit of
    every space it merges (see :func:`candidates`)."""

    item_id: Any
    score: float
    space: str
    route: str
    rank: int
    metadata: str = ""


def candidates(space: str, route: str, scores: Sequence[float], item_ids: Sequence[Any],
               metadata: Sequence[str] | None = None) -> list[Candidate]:
    """One space's ranked list (``scores``, ``item_ids`` and their ``metadata`` in rank order) as
    candidates, made in C (``Candidate(...)`` is a Python call per hit, each a microsecond or more
    once the index search has evicted the interpreter's caches)."""
    return list(map(tuple.__new__, repeat(Candidate), zip(item_ids, scores, repeat(space), repeat(route), count(),
                                                          repeat("") if metadata is None else metadata)))


@dataclass
class ScoreMap:
    """``p(relevant | score) = sigmoid(a * score + b)``: Platt scaling (monotone for ``a > 0``)."""

    a: float
    b: float
    n: int = 0

    def __call__(self, scores: np.ndarray | float) -> np.ndarray:
        z = self.a * np.asarray(scores, np.float64) + self.b
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "n": self.n}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "ScoreMap":
        return cls(float(obj["a"]), float(obj["b"]), int(obj.get("n", 0)))

    @classmethod
    def fit(cls, scores: np.ndarray, relevant: np.ndarray, *, l2: float = 1e-3, steps: int = 50) -> "ScoreMap":
        """Maximum-likelihood logistic fit of ``relevant`` (bool) on ``scores`` (Newton's method on
        two parameters, a small L2 penalty on the slope; Platt's target smoothing for 0/1 labels).
        The slope is kept >= 0 so the map stays monotone non-decreasing."""
        s = np.asarray(scores, np.float64).ravel()
        y = np.asarray(relevant, bool).ravel()
        if s.size != y.size or s.size == 0:
            raise ValueError(f"need as many labels as scores (got {s.size} scores, {y.size} labels)")
        n_pos, n_neg = int(y.sum()), int((~y).sum())
        t = np.where(y, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))  # Platt (1999)
        mu, sd = float(s.mean()), float(s.std()) or 1.0
        x = (s - mu) / sd
        a, b = 1.0, math.log((n_pos + 1.0) / (n_neg + 1.0))
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-np.clip(a * x + b, -60, 60)))
            w = np.maximum(p * (1 - p), 1e-12)
            g = np.array([np.sum((p - t) * x) + l2 * a, np.sum(p - t)])
            h = np.array([[np.sum(w * x * x) + l2, np.sum(w * x)], [np.sum(w * x), np.sum(w)]])
            try:
                step = np.linalg.solve(h, g)
            except np.linalg.LinAlgError:
                break
            a, b = a - step[0], b - step[1]
            if np.abs(step).max() < 1e-9:
                break
        a = max(a, 0.0)
        return cls(a / sd, b - a * mu / sd, int(s.size))


_SCORE = itemgetter(1)  # a candidate's score (a C call, where a lambda is a Python one)


def merge_order(candidates: Sequence[Candidate], method: str, *, score_maps: dict[tuple[str, str], ScoreMap] | None = None,
                shares: dict[str, float] | None = None, prefer: Sequence[str] = ()) -> list[Candidate]:
    """``candidates`` (from every space) in merged order. ``score_maps`` maps ``(space, route)`` to
    a :class:`ScoreMap` (``calibrated``; a candidate without a map keeps its raw score); ``shares``
    maps a space to its fraction of the searchable items and ``prefer`` orders spaces for equal
    places (``rank``)."""
    if method not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {method!r}")
    if method == "raw":  # by descending score; equal scores keep their order (the sort is stable)
        return sorted(candidates, key=_SCORE, reverse=True)
    if method == "calibrated":
        maps = score_maps or {}

        def key(c: Candidate) -> tuple[float, float]:
            m = maps.get((c.space, c.route))
            return (-float(m(c.score)) if m is not None else -c.score, -c.score)

        return sorted(candidates, key=key)
    shares = shares or {}
    order = {s: i for i, s in enumerate(prefer)}

    def rank_key(c: Candidate) -> tuple[float, int, float]:
        f = max(float(shares.get(c.space, 1.0)), 1e-9)
        return ((c.rank + 0.5) / f, order.get(c.space, len(order)), -c.score)

    return sorted(candidates, key=rank_key)


def merge(lists: dict[str, list[Candidate]], k: int, method: str, **kw: Any) -> list[Candidate]:
    """The top ``k`` of the per-space ``lists`` merged with ``method`` (see :func:`merge_order`)."""
    return merge_order(list(chain.from_iterable(lists.values())), method, **kw)[: int(k)]


def named_lists(snap: Any, ranked: list[tuple[str, str, list[float], list[int]]]) -> dict[str, list[Candidate]]:
    """Each space's ranked list ``(space, route, scores, rids)`` as candidates named from the hit table
    of ``snap`` (a :class:`~nobackfill.collection.collection.Snapshot`), all spaces' records decoded
    at once; rows deleted since the snapshot's rows were read are left out (the others keep their rank)."""
    rids = [r for *_, space_rids in ranked for r in space_rids]
    fields = snap.hit_fields(rids)
    lists: dict[str, list[Candidate]] = {}
    if fields is None:  # a row deleted since: named one by one
        named = snap.hits(rids)
        for sid, route, scores, space_rids in ranked:
            rows = [named.get(r, (None, "")) for r in space_rids]
            listed = candidates(sid, route, scores, [row[0] for row in rows], [row[1] for row in rows])
            lists[sid] = [c for c in listed if c.item_id is not None]
        return lists
    at = 0
    for sid, route, scores, space_rids in ranked:
        end = at + 2 * len(space_rids)
        lists[sid] = candidates(sid, route, scores, fields[at:end:2], fields[at + 1:end:2])
        at = end
    return lists
