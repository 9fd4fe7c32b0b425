"""The merge's score maps before the first bridge fit (:func:`fit_merge_maps`): what the backfill
fits from 64 backfilled pairs on, so the items already moved into the current space are merged on
one scale with the rest (:mod:`.fit_bridges` fits them with every bridge fit after). A route of the
user's own bridge is tested against the old model here too, on every backfilled pair."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..catalog.plan import Plan, RouteChoice
from ..collection.collection import Collection
from ..compat.fitted import HeldOut, route_scores
from ..search.models import ModelPool
from ..search.routes import DIRECTIONS, RoutePlanner
from .fit_bridges import (FitBridgesConfig, Pairs, _every_backfilled, _merge_maps, _say_rerouted, _with_merge_maps,
                          backfilled_pairs, fitted_bridges, users_planner, with_given_route)

__all__ = ["fit_merge_maps"]


def fit_merge_maps(collection: Collection, *, cfg: FitBridgesConfig | None = None, pool: ModelPool | None = None,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The merge's score maps alone (:func:`_merge_maps`), for every direction an old space serves
    through the ``old-model`` route, on every backfilled pair: what the backfill runs before its first
    bridge fit (whose sample may be most of a small collection), so the items already moved are
    merged on one scale with the rest from the first pairs on. Nothing is fitted but the maps; the
    route of a user's bridge is chosen again first (:func:`_given_routes`), a fitted bridge's route
    keeps its maps until the next bridge fit (``log`` hears of a route it changes: trial AE saw i2t leave
    the XBT given without a word). Returns ``{space/direction: agreed queries, or None}``."""
    cfg = cfg or FitBridgesConfig()
    plan = collection.plan
    if plan.calibration:
        return {}
    pool = pool or ModelPool()  # (the user's bridge embeds the held-out queries)
    planner = RoutePlanner(plan, pool)
    users, fitted = users_planner(plan, pool), fitted_bridges(plan)
    found: dict[tuple[str, str], dict[str, Any] | None] = {}
    rerouted: list[tuple[str, str, dict[str, Any]]] = []
    for space in plan.old_spaces():
        sid = space.space_id
        pairs = backfilled_pairs(collection, sid, plan)
        for d in DIRECTIONS:
            if not pairs or not planner.available(sid, d):
                continue
            if planner.chosen(sid, d)[0] == "old-model":
                found[sid, d] = _merge_maps(d, {"route": "old-model"}, None, None, pairs, cfg)
            elif (sid, d) not in fitted and "bridge" in users.available(sid, d):
                given = _given_routes(users, sid, d, pairs, cfg)  # the user's bridge: its route tested too
                if given is not None:
                    routes, held, bridged = given
                    rerouted.append((sid, d, routes))
                    _say_rerouted(log or (lambda _m: None), plan.route(sid, d) or RouteChoice("bridge"), routes, sid, d,
                                  "your --bridge", held.sizes)
                    found[sid, d] = _merge_maps(d, routes, held, bridged, pairs, cfg)

    def commit(p: Plan) -> Plan:
        for sid, d, routes in rerouted:
            p = with_given_route(p, sid, d, routes)
        live = {s.space_id for s in p.old_spaces()}  # (a space retired meanwhile keeps no maps)
        return _with_merge_maps(p, {k: m for k, m in found.items() if k[0] in live})

    if found:
        collection.set_plan(commit)
    return {f"{sid}/{d}": (m or {}).get("agreed") for (sid, d), m in found.items()}


def _given_routes(users: RoutePlanner, sid: str, d: str, pairs: dict[str, Pairs],
                  cfg: "FitBridgesConfig") -> tuple[dict[str, Any], HeldOut, np.ndarray] | None:
    """The routes of the user's bridge to ``sid`` for ``d`` scored without labels on every
    backfilled pair (:func:`_every_backfilled`: a bridge trained elsewhere recalls nothing of
    them), with its queries' outputs; None where it cannot be scored or cannot embed them."""
    held = _every_backfilled(d, pairs, cfg)
    qmod = DIRECTIONS[d][0]
    if held is None or held.q_old is None:
        return None
    sources = pairs[qmod].sources[:len(held.q_new)]
    if len(sources) < len(held.q_new) or any(x is None for x in sources):
        return None
    try:
        bridged = users.query_side(sid, d, "bridge").embed(qmod, sources)
    except Exception:  # a missing model or upgrade directory: its route stays as it is
        return None
    return route_scores(held, bridged), held, bridged
