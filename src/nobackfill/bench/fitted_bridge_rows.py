"""The pieces of ``bench fitted-bridge``: one direction's test data and its routes' recall, the
backfilled pool of one modality, the held-out set of a point, the query overhead per family."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..compat.fitted import FitConfig, HeldOut, held_out_set, heldout_mask
from ..compat.fitted.agreement import BRIDGE, OLD_MODEL
from ..metrics.retrieval import group_ranks, recall_from_ranks


def _ranks(scores: np.ndarray, qg: np.ndarray, gg: np.ndarray) -> np.ndarray:
    return group_ranks(None, None, qg, gg, scores=scores)


def recall_r(scores: np.ndarray, qg: np.ndarray, gg: np.ndarray) -> dict[str, float]:
    r = recall_from_ranks(_ranks(scores, qg, gg), (1, 10))
    return {"r1": round(r["R@1"], 4), "r10": round(r["R@10"], 4)}


@dataclass
class Direction:
    """One direction's test data: new / old / shipped query vectors, the gallery's old and new
    vectors, relevance groups."""

    name: str
    q_new: np.ndarray
    q_old: np.ndarray
    q_shipped: np.ndarray | None
    g_old: np.ndarray
    g_new: np.ndarray
    qg: np.ndarray
    gg: np.ndarray

    def __post_init__(self) -> None:
        self.s_old = self.q_old @ self.g_old.T
        self.old_old = recall_r(self.s_old, self.qg, self.gg)
        self.new_new = recall_r(self.q_new @ self.g_new.T, self.qg, self.gg)
        self.s_shipped = self.q_shipped @ self.g_old.T if self.q_shipped is not None else None

    def bridged(self, bridge) -> np.ndarray:
        return bridge(self.q_new) @ self.g_old.T

    def route(self, route: str, w: float | None, s_bridge: np.ndarray | None) -> dict[str, float]:
        if route == OLD_MODEL or s_bridge is None:
            return self.old_old
        if route == BRIDGE:
            return recall_r(s_bridge, self.qg, self.gg)
        return recall_r((1 - w) * self.s_old + w * s_bridge, self.qg, self.gg)


@dataclass
class Pool:
    """The backfilled items' vectors of one modality (rows in backfill order), their keys, and per
    row the rank of its scene in the sample (``group``: an image and its captions share one; the
    first ``n`` scenes are backfilled at point ``n``)."""

    new: np.ndarray
    old: np.ndarray
    keys: list[str]
    group: np.ndarray | None = None

    def count(self, n: int) -> int:
        """Rows backfilled once the first ``n`` scenes are."""
        return n if self.group is None else int(np.searchsorted(self.group, n))

    @property
    def scenes(self) -> int:
        return len(self.keys) if self.group is None else int(self.group[-1]) + 1 if len(self.group) else 0


def held_out(direction: str, qpool: Pool, gpool: Pool, n: int, qmask: np.ndarray, same: bool,
             gmask: np.ndarray | None = None) -> tuple[HeldOut, np.ndarray]:
    """Queries: the held-out backfilled items of the query modality (never fitted on). Gallery: every
    backfilled item of the gallery modality; with ``gmask`` (the held-out ones) only the queries whose
    new-model match is held out count (:func:`~nobackfill.compat.fitted.held_out_set`). Returns the
    set and which held-out queries it kept (a boolean mask)."""
    qi = np.flatnonzero(qmask[:qpool.count(n)])
    k = gpool.count(n)
    exclude = qi if same else None
    if gmask is None:
        return (HeldOut(direction, qpool.new[qi], gpool.new[:k], gpool.old[:k], qpool.old[qi], exclude),
                np.ones(len(qi), bool))
    return held_out_set(direction, qpool.new[qi], gpool.new[:k], gpool.old[:k], gmask[:k], qpool.old[qi], exclude)


def heldout_masks(pools: Mapping[str, Pool], fraction: float, by: str = "scene") -> dict[str, np.ndarray]:
    """The held-out rows of each pool: by scene (an image and its captions on the same side, so a
    held-out query's matches are held out too) or by item key (``by="item"``)."""
    if by == "item":
        return {m: heldout_mask(p.keys, fraction) for m, p in pools.items()}
    return {m: heldout_mask([f"scene-{g}" for g in p.group] if p.group is not None else p.keys, fraction)
            for m, p in pools.items()}


def masked_shipped(encode_fn, inputs: Sequence[Any], mask: np.ndarray, dim: int) -> np.ndarray:
    """The shipped bridge's vectors of the ``mask`` rows of ``inputs`` (what it is scored on)."""
    idx = np.flatnonzero(mask)
    return encode_fn([inputs[i] for i in idx]) if len(idx) else np.zeros((0, dim), np.float32)


def query_overhead_us(cfg: Any, d_new: int = 128, d_old: int = 64, repeats: int = 2000) -> dict:
    """Microseconds to bridge one query, per family (fitted on random pairs of the world's widths),
    and through an ensemble of the ``cfg.fit.ensemble`` slowest families (its worst case)."""
    from ..compat.fitted import fit_family
    from ..compat.fitted.families import ENSEMBLE, ensemble_map

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((600, d_new)).astype(np.float32), rng.standard_normal((600, d_old)).astype(np.float32)
    q = x[:1]
    maps = {fam: fit_family(fam, x, y, FitConfig(epochs=2, hidden=cfg.fit.hidden)) for fam in cfg.fit.families}
    out = {fam: _us(m, q, repeats) for fam, m in maps.items()}
    slowest = sorted(out, key=out.get, reverse=True)[:cfg.fit.ensemble]
    if len(slowest) > 1:
        out[ENSEMBLE] = _us(ensemble_map([(f, maps[f]) for f in slowest]), q, repeats)
    return out


def _us(m: Any, q: np.ndarray, repeats: int) -> float:
    m(q)
    t0 = time.perf_counter()
    for _ in range(repeats):
        m(q)
    return round(1e6 * (time.perf_counter() - t0) / repeats, 1)


__all__ = ["Direction", "Pool", "held_out", "heldout_masks", "masked_shipped", "query_overhead_us", "recall_r"]
