"""Choosing routes, fused weights and the merge on a calibration split (never the evaluated one).

For every space that is not the current model's and every direction the calibration data has
(``t2i`` / ``i2t`` from image-caption pairs, ``t2t`` from caption pairs), the calibration gallery
is embedded by that space's own model and the calibration queries along each route; this measures

* R@1/5/10 of ``old-model`` and ``bridge``, and of ``fused`` for every ``w`` of a grid; ``w`` is the
  best on the grid (R@1, then R@5, then R@10), and the route is the best of the three (``fused``
  with ``w = 0`` *is* ``old-model`` and with ``w = 1`` *is* ``bridge``, and is named so);
* a :class:`~nobackfill.search.merge.ScoreMap` per (space, route, direction), fitted on the top
  ``topn`` scores of every calibration query (relevant or not);
* each merge method on simulated partly backfilled galleries: a random ``f`` of the calibration
  items in the current space (native queries), the rest in the old space (its chosen route), for
  ``f`` in ``fractions``; the default merge is the best mean R@1.

The whole calibration costs embeddings of the calibration split only, whatever the collection's
size.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np

from ..encoders.base import encode
from ..metrics.retrieval import group_ranks, recall_from_ranks
from ..search.merge import DEFAULT_MERGE, MERGES, ScoreMap
from ..search.routes import BRIDGE, DIRECTIONS, FUSED, NATIVE, OLD_MODEL, RoutePlanner

__all__ = ["CalibrationTask", "MIN_AGREED", "WEIGHTS", "agreed_score_maps", "calibrate", "pair_tasks", "text_pair_task"]

WEIGHTS = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 11))
FRACTIONS = (0.1, 0.5, 0.9)
KS = (1, 5, 10)
#: exact ties between merges go to the first of these
MERGE_PREFERENCE = ("calibrated", "rank", "raw")


@dataclass
class CalibrationTask:
    """Queries and gallery of one direction; item ``j`` is relevant to query ``i`` iff their groups
    are equal."""

    direction: str
    queries: list[Any]
    gallery: list[Any]
    query_groups: np.ndarray
    gallery_groups: np.ndarray

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {sorted(DIRECTIONS)}, got {self.direction!r}")
        self.query_groups = np.asarray(self.query_groups).reshape(-1)
        self.gallery_groups = np.asarray(self.gallery_groups).reshape(-1)
        if len(self.queries) != len(self.query_groups) or len(self.gallery) != len(self.gallery_groups):
            raise ValueError("calibration queries / gallery and their groups differ in length")
        if not self.queries or not self.gallery:
            raise ValueError(f"calibration task {self.direction} has no queries or no gallery items")


def pair_tasks(data: Any, directions: Sequence[str] = ("t2i", "i2t")) -> list[CalibrationTask]:
    """``t2i`` and ``i2t`` tasks of a :class:`~nobackfill.data.folder.PairDataset` (captions query
    images and images query captions; relevant: the caption's own image)."""
    images = [str(p) for p in data.image_paths()]
    caps = list(data.captions)
    c2i = np.asarray(data.caption_image)
    tasks = []
    if "t2i" in directions:
        tasks.append(CalibrationTask("t2i", caps, images, c2i, np.arange(len(images))))
    if "i2t" in directions:
        has = np.bincount(c2i, minlength=len(images)) > 0
        idx = np.flatnonzero(has)
        tasks.append(CalibrationTask("i2t", [images[i] for i in idx], caps, idx, c2i))
    return tasks


def text_pair_task(queries: Sequence[str], gallery: Sequence[str]) -> CalibrationTask:
    """A ``t2t`` task: ``queries[i]`` should find ``gallery[i]`` (e.g. two captions of one image)."""
    if len(queries) != len(gallery):
        raise ValueError(f"{len(queries)} queries for {len(gallery)} gallery texts")
    n = np.arange(len(queries))
    return CalibrationTask("t2t", list(queries), list(gallery), n, n)


class _Embeddings:
    """Each (encoder, modality, input list) embedded once across tasks and routes: the caches that
    :meth:`~nobackfill.search.routes.QuerySide.embed` takes, one per distinct input list."""

    def __init__(self) -> None:
        self._caches: dict[int, dict] = {}

    def cache(self, inputs: Sequence[Any]) -> dict:
        return self._caches.setdefault(hash(tuple(str(x) for x in inputs)), {})

    def side(self, side: Any, modality: str, inputs: Sequence[Any]) -> np.ndarray:
        return side.embed(modality, inputs, self.cache(inputs))

    def encoder(self, encoder: Any, modality: str, inputs: Sequence[Any]) -> np.ndarray:
        cache = self.cache(inputs)
        key = (id(encoder), modality)
        if key not in cache:
            cache[key] = encode(encoder, modality, inputs)
        return cache[key]


#: the fewest held-out queries whose top-1 both lists agree on that :func:`agreed_score_maps` fits on
MIN_AGREED = 10


def agreed_score_maps(native: np.ndarray, routed: np.ndarray, topn: int = 10,
                      min_agreed: int = MIN_AGREED) -> tuple[ScoreMap, ScoreMap, int] | None:
    """Score maps for the ``calibrated`` merge without labels: Platt maps (as :func:`calibrate`
    fits on labels) fitted on pseudo-labels, the queries where the new model's top-1 (``native``:
    queries x items, new vectors) and the old space's route's top-1 (``routed``: the same queries and
    items, old vectors) are the same item. That item is taken as relevant and the rest of each top
    ``topn`` as not. Both lists see the same pseudo-label, so neither model's scale is preferred: on a
    query both models answer alike, a map says how high each model's score of the right answer
    stands against its scores of the others, which is what merging two spaces' hits needs (raw
    scores of a 32-d space and of a 384-d one are not comparable). Measured on Multi30K val
    collections upgraded m30k-old-text -> MiniLM without a bridge, half backfilled: the raw merge
    0.39-0.47 R@1 against the old model's 0.63-0.64, these maps 0.61-0.67 (labelled maps: 0.66); on
    the world (``make demo``'s upgrade without a bridge) within 0.011 of the raw merge at every
    fraction. Returns (native map, routed map, agreed queries), or None with fewer than
    ``min_agreed`` agreed queries."""
    native, routed = np.asarray(native, np.float64), np.asarray(routed, np.float64)
    top_n, top_r = native.argmax(axis=1), routed.argmax(axis=1)
    agreed = np.flatnonzero((top_n == top_r) & np.isfinite(native.max(axis=1)) & np.isfinite(routed.max(axis=1)))
    if len(agreed) < max(1, int(min_agreed)):
        return None
    maps = []
    for s in (native, routed):
        sc, cols = _top(s[agreed], np.arange(s.shape[1]), topn)
        ok = np.isfinite(sc)  # a query's own item, masked out of a same-modality gallery
        maps.append(ScoreMap.fit(sc[ok], (cols == top_n[agreed][:, None])[ok]))
    return maps[0], maps[1], int(len(agreed))


def _recall(scores: np.ndarray, task: CalibrationTask) -> dict[str, float]:
    return recall_from_ranks(group_ranks(None, None, task.query_groups, task.gallery_groups, scores=scores), KS)


def _key(r: dict[str, float]) -> tuple[float, ...]:
    return tuple(round(r[f"R@{k}"], 9) for k in KS)


def calibrated_choice(measured: Any) -> tuple[str, float | None] | None:
    """The route (and fused weight) that calibration chooses from its numbers ``measured`` (a
    route choice's ``calibration``: R@k per route measured, the fused route's best ``w``): the
    fused route at its best weight where it was measured (``old-model`` at w = 0, ``bridge`` at
    w = 1), else the better of ``bridge`` and ``old-model`` (``old-model`` on a tie), else the one
    measured; None when nothing was. What :func:`calibrate` chose, and what an unpinned route
    goes back to."""
    if not isinstance(measured, dict):
        return None
    fused = measured.get(FUSED)
    if isinstance(fused, dict) and fused.get("w") is not None:
        w = float(fused["w"])
        return (OLD_MODEL, None) if w == 0.0 else (BRIDGE, None) if w == 1.0 else (FUSED, w)
    old, br = measured.get(OLD_MODEL), measured.get(BRIDGE)
    if isinstance(old, dict) and isinstance(br, dict):
        try:
            return (BRIDGE, None) if _key(br) > _key(old) else (OLD_MODEL, None)
        except (KeyError, TypeError):  # numbers of another form: no choice to go back to
            return None
    if isinstance(old, dict):
        return OLD_MODEL, None
    if isinstance(br, dict):
        return BRIDGE, None
    return None


def _score_map(scores: np.ndarray, task: CalibrationTask, topn: int) -> ScoreMap:
    top = np.argsort(-scores, axis=1)[:, :topn]
    s = np.take_along_axis(scores, top, axis=1)
    rel = task.gallery_groups[top] == task.query_groups[:, None]
    return ScoreMap.fit(s.ravel(), rel.ravel())


def _top(scores: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top ``k`` among columns ``idx``: (scores, column ids), best first."""
    sub = scores[:, idx]
    k = min(k, len(idx))
    part = np.argpartition(-sub, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(sub, part, axis=1), axis=1, kind="stable")
    cols = np.take_along_axis(part, order, axis=1)
    return np.take_along_axis(sub, cols, axis=1), idx[cols]


def _merge_recall(s_new: np.ndarray, s_old: np.ndarray, task: CalibrationTask, in_new: np.ndarray, method: str,
                  maps: dict[tuple[str, str], ScoreMap], old_route: str, k: int = 10) -> dict[str, float]:
    """R@K of a simulated collection whose items ``in_new`` are served natively, the rest through
    ``old_route``, merged with ``method`` (the ordering of :func:`~nobackfill.search.merge.merge_order`,
    vectorised over queries)."""
    parts = []
    for prio, (name, mask, s, route) in enumerate((("new", in_new, s_new, NATIVE), ("old", ~in_new, s_old, old_route))):
        idx = np.flatnonzero(mask)
        if not idx.size:
            continue
        sc, cols = _top(s, idx, k)
        ranks = np.broadcast_to(np.arange(sc.shape[1]), sc.shape)
        if method == "raw":
            key = -sc
        elif method == "calibrated":
            m = maps.get((name, route))
            key = -(m(sc) if m is not None else sc)
        else:
            key = (ranks + 0.5) / max(float(mask.mean()), 1e-9)
        tie = np.full(sc.shape, prio) if method == "rank" else np.zeros(sc.shape)  # the current space first
        parts.append((key, tie, -sc, cols))
    key, tie, by_score, cols = (np.concatenate([p[i] for p in parts], axis=1) for i in range(4))
    order = np.lexsort((by_score, tie, key), axis=1)[:, :k]
    top = np.take_along_axis(cols, order, axis=1)
    rel = task.gallery_groups[top] == task.query_groups[:, None]
    ranks = np.where(rel.any(axis=1), rel.argmax(axis=1) + 1, k + 1)
    return recall_from_ranks(ranks, KS)


def calibrate(planner: RoutePlanner, tasks: Sequence[CalibrationTask], *, weights: Sequence[float] = WEIGHTS,
              fractions: Sequence[float] = FRACTIONS, topn: int = 10, seed: int = 0,
              data_label: str = "") -> dict[str, Any]:
    """Measure every route of every old space on ``tasks`` and choose (see the module doc).

    Returns ``{"routes": {space: {direction: {...}}}, "merge": {...}, "new_new": {...},
    "calibration": {...}}``, the parts of a plan that calibration decides."""
    current = planner.current
    cur_enc = planner.encoder(current)
    routes: dict[str, dict[str, Any]] = {}
    new_new: dict[str, dict[str, float]] = {}
    score_maps: dict[str, dict[str, dict[str, Any]]] = {}
    merge_runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    old_spaces = [s.space_id for s in planner.plan.old_spaces()]
    emb = _Embeddings()
    for task in tasks:
        qmod, gmod = DIRECTIONS[task.direction]
        if NATIVE not in planner.available(current, task.direction):
            continue
        q_new = emb.encoder(cur_enc, qmod, task.queries)
        g_new = emb.encoder(cur_enc, gmod, task.gallery)
        s_new = q_new @ g_new.T
        new_new[task.direction] = _recall(s_new, task)
        maps_d = score_maps.setdefault(task.direction, {})
        maps_d[f"{current}/{NATIVE}"] = _score_map(s_new, task, topn).to_json()
        for sid in old_spaces:
            avail = planner.available(sid, task.direction)
            if not avail:
                continue
            old_enc = planner.encoder(sid)
            g_old = emb.encoder(old_enc, gmod, task.gallery)
            measured: dict[str, Any] = {}
            s_old = s_br = None
            if OLD_MODEL in avail:
                s_old = emb.side(planner.query_side(sid, task.direction, OLD_MODEL), qmod, task.queries) @ g_old.T
                measured[OLD_MODEL] = _recall(s_old, task)
            if BRIDGE in avail:
                s_br = emb.side(planner.query_side(sid, task.direction, BRIDGE), qmod, task.queries) @ g_old.T
                measured[BRIDGE] = _recall(s_br, task)
            if FUSED in avail and s_old is not None and s_br is not None:
                curve = [(float(w), _recall((1 - w) * s_old + w * s_br, task)) for w in weights]
                w_best, r_best = max(curve, key=lambda wr: _key(wr[1]))
                measured[FUSED] = {**r_best, "w": w_best}
                measured["curve"] = [{"w": w, **r} for w, r in curve]
            chosen, w_chosen = calibrated_choice(measured) or (OLD_MODEL, None)
            s_chosen = (1 - w_chosen) * s_old + w_chosen * s_br if chosen == FUSED else \
                s_old if chosen == OLD_MODEL else s_br
            routes.setdefault(sid, {})[task.direction] = {
                "route": chosen, "w": w_chosen, "pinned": False, "calibration": measured}
            maps_d[f"{sid}/{chosen}"] = _score_map(s_chosen, task, topn).to_json()
            maps = {(name, route): ScoreMap.from_json(m) for name, route, m in
                    (("new", NATIVE, maps_d[f"{current}/{NATIVE}"]), ("old", chosen, maps_d[f"{sid}/{chosen}"]))}
            rng = np.random.default_rng(seed)
            runs = merge_runs.setdefault(task.direction, {m: [] for m in MERGES})
            for f in fractions:
                in_new = rng.random(len(task.gallery)) < f
                for method in MERGES:
                    runs[method].append(_merge_recall(s_new, s_chosen, task, in_new, method, maps, chosen))
    merge_table = {d: {m: {f"R@{k}": float(np.mean([r[f"R@{k}"] for r in rs])) for k in KS} for m, rs in runs.items()}
                   for d, runs in merge_runs.items()}
    best = DEFAULT_MERGE
    if merge_table:
        mean = {m: tuple(np.mean([merge_table[d][m][f"R@{k}"] for d in merge_table]) for k in KS) for m in MERGES}
        best = max(MERGE_PREFERENCE, key=lambda m: (tuple(round(x, 9) for x in mean[m]), -MERGE_PREFERENCE.index(m)))
    return {
        "routes": routes,
        "new_new": new_new,
        "merge": {"method": best, "calibration": merge_table, "fractions": list(fractions), "score_maps": score_maps},
        "calibration": {"data": data_label, "directions": [t.direction for t in tasks],
                        "sizes": {t.direction: {"queries": len(t.queries), "gallery": len(t.gallery)} for t in tasks},
                        "weights": list(weights), "at": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }

