"""Changing a collection's serving plan: registering an upgrade, calibrating routes, pinning one.

``upgrade`` makes a new model the collection's current model at once: it creates the (empty) store
of the new space, records the upgrades (XBT, phi, Procrustes ...) that carry the new model's
queries into the older spaces, chooses a route per (old space, direction) -- calibrated on a
calibration split when one is given, else the documented default (``bridge`` where a bridge chain
exists, ``old-model`` otherwise) -- and commits the plan atomically. It re-embeds nothing: its cost
is loading the models plus, with calibration, embedding the calibration split.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

from ..collection.collection import Collection
from ..catalog.plan import Merge, Plan, RouteChoice
from .calibrate import CalibrationTask, calibrate, calibrated_choice
from ..search.models import ModelPool, model_ref
from ..search.routes import DIRECTIONS, FUSED, ROUTES, RoutePlanner, upgrade_entry

__all__ = ["UpgradeRefused", "calibrate_collection", "pin_route", "route_table", "upgrade_collection"]


class RouteRefused(ValueError):
    """A route the collection's plan cannot take now: the current space (always native) or a route
    not available to that space and direction (its models or bridges are missing)."""


class UpgradeRefused(ValueError):
    """An upgrade that cannot be registered (named reason; nothing was changed)."""


def _space_label(plan: Plan, space_id: str) -> str:
    return plan.space(space_id).label if plan.has(space_id) else space_id


def upgrade_collection(collection: Collection, model: str | Path, *, bridges: Sequence[str | Path] = (),
                       calibration: Sequence[CalibrationTask] | None = None, calibration_label: str = "",
                       pool: ModelPool | None = None, guard: Callable[[Plan], None] | None = None,
                       log: Callable[[str], None] | None = None, fit_bridges: bool | None = None,
                       fit_sample: dict[str, Any] | None = None, queries: Sequence[str] = ()) -> Plan:
    """Register ``model`` as the collection's current model (see the module doc); returns the
    committed plan. ``bridges`` are upgrade directories; ``calibration`` tasks choose routes, fused
    weights and the merge. ``guard(plan)`` may refuse (raise) under the commit lock, e.g. while a
    backfill runs. ``fit_bridges`` (default: when no bridge is given) makes the backfill fit bridges
    from its own pairs (:mod:`.backfill_fit`; ``fit_sample``: its ``fraction`` / ``min_pairs`` /
    ``max_pairs`` / ``fit``; ``queries``: example search texts, no labels, the fits score text-query
    bridges on, the only text queries of a collection of images alone). Raises :class:`UpgradeRefused`
    for an upgrade that does not fit the collection, ``ValueError`` for fit settings refused or given
    without fitting (before anything changes)."""
    from ..compat.upgrade import load_upgrade
    from .backfill_fit import FitSampleError, QueriesError, fit_settings

    fit_settings(fit_sample, queries)  # refused before anything changes
    fitting = fit_bridges if fit_bridges is not None else not bridges
    why = "fit_bridges is off" if not bridges else "a bridge was given: add fit_bridges / --fit-bridge to fit too"
    if queries and not fitting:
        raise QueriesError(f"queries: example query texts are what fitted bridges are scored on; this upgrade fits "
                           f"none ({why})")
    if fit_sample and not fitting:
        raise FitSampleError(f"fit_sample: this upgrade fits no bridge ({why})")

    say = log or (lambda _m: None)
    _refuse_during_backfill(collection)
    pool = pool or ModelPool()
    ref = model_ref(model)
    enc = pool.get(ref)
    sid = enc.space_id
    plan = collection.plan
    known = set(plan.space_ids)
    if sid == plan.current:
        raise UpgradeRefused(f"{model} is already the current model of collection {collection.path} ({sid})")
    if sid in known:
        raise UpgradeRefused(f"{model} embeds into space {sid}, which collection {collection.path} already holds "
                             f"({_space_label(plan, sid)}); an upgrade needs a new model")
    mods = tuple(getattr(enc, "modalities", ("image", "text")))
    unembeddable = {m: n for m in ("image", "text") if m not in mods and (n := collection.count(m))}
    if unembeddable:
        held = " and ".join(f"{n} {m}{'s' if n != 1 else ''}" for m, n in unembeddable.items())
        raise UpgradeRefused(f"{model} embeds {' and '.join(mods)} only, and collection {collection.path} holds {held} "
                             f"it could not embed: they would be searchable only through the old space and lost when "
                             f"it is retired; upgrade to a model that embeds {' and '.join(unembeddable)}, or delete "
                             f"those items first")
    ups = [load_upgrade(b) for b in bridges]
    for u in ups:
        for side, space in (("source", u.source_id), ("target", u.target_id)):
            if space not in known | {sid}:
                raise UpgradeRefused(
                    f"upgrade {u.directory}: its {side} space {space} ({u.source.get('name') if side == 'source' else u.target.get('name')}) "
                    f"is neither the new model's ({Path(str(model)).name}: {sid}) nor a space of collection "
                    f"{collection.path} ({', '.join(_space_label(plan, s) for s in sorted(known))}); bridges compose "
                    "only through the collection's own spaces (upgrade to the model in between first)")
        if not u.is_bridge and u.source_id != sid:
            raise UpgradeRefused(f"upgrade {u.directory} is an encoder upgrade of the model of space {u.source_id}, "
                                 f"not of the new model {Path(str(model)).name} ({sid})")
    entry = collection.add_space(space_id=sid, dim=int(enc.embed_dim), model=ref, name=getattr(enc, "name", ""),
                                 modalities=list(getattr(enc, "modalities", ("image", "text"))))
    old_current = collection.plan.current
    new_plan = collection.plan.with_space(entry, current=True).with_upgrades(map(upgrade_entry, ups)).pinned_only()
    planner = RoutePlanner(new_plan, pool)
    unreachable = [s for s in known if not any(planner.available(s, d) for d in DIRECTIONS)]
    if unreachable:
        raise UpgradeRefused("no route reaches space(s) " + ", ".join(_space_label(new_plan, s) for s in unreachable)
                             + " from the new model; register a bridge (--bridge)")
    if calibration:
        say(f"calibrating routes on {calibration_label or 'the calibration split'} ...")
        new_plan = _apply_calibration(new_plan, calibrate(planner, calibration, data_label=calibration_label))
    else:
        new_plan = _carry_merge_maps(collection.plan, new_plan, planner)

    def commit(p: Plan) -> Plan:
        if p.current != old_current:
            raise UpgradeRefused(f"collection {collection.path} was upgraded by another process meanwhile "
                                 f"(current space is now {p.current}); nothing was changed")
        _refuse_during_backfill(collection)
        if guard is not None:
            guard(p)
        return new_plan

    from .backfill_fit import enable_fit
    from .backfill_jobs import JOB_DIR

    # a bridge fit of the last backfill (it ends after the job is done) would put its bridges and its
    # fit state over this upgrade's (trial AD): none runs while the plan changes, none starts meanwhile
    with collection.catalog.lock(f"{JOB_DIR}/fit", blocking=False) as free:
        try:
            if not free:
                raise UpgradeRefused(f"cannot upgrade collection {collection.path} now: a bridge fit of its backfill "
                                     "is running (the last one, after every item is in, or a refit): retry when "
                                     "`collection status` no longer shows it (seconds to a minute)")
            committed = collection.set_plan(commit)
        except BaseException:
            if not collection.plan.has(sid):  # leave nothing behind
                collection.storage.drop_space(entry.dir)
            raise
        if fitting:
            enable_fit(collection, sid, fit_sample, queries)
            say(("" if bridges else "no bridge given: ") + "the backfill starts with a sample of each modality and "
                "fits bridges from it")
        elif not bridges and not calibration:  # the old-model route serves: its merge's maps still fitted
            enable_fit(collection, sid, bridges=False)
    return committed


def _carry_merge_maps(old: Plan, new: Plan, planner: RoutePlanner) -> Plan:
    """``new`` (an upgrade's plan, which starts with no merge) merging by the score maps fitted
    without labels in ``old`` that stay true in it: those of the spaces ``new`` reaches by the
    ``old-model`` route, whose queries are each space's own model's whatever is current; the
    previous current space's ``native`` maps among them (reached that way now). So the items an
    unfinished backfill had moved are merged as before the upgrade, not on raw scores (a new user
    measured R@1 0.563 -> 0.357 on Multi30K captions), until the new backfill's pairs refit them."""
    merge = old.merge
    if merge is None or old.calibration or "without_labels" not in (merge.calibration or {}):
        return new
    maps: dict[str, dict[str, Any]] = {}
    info: dict[str, Any] = {}
    for d, by_key in merge.score_maps.items():
        kept = {}
        for key, obj in by_key.items():
            sid, _, route = key.rpartition("/")
            route = "old-model" if (sid, route) == (old.current, "native") else route
            if route == "old-model" and new.has(sid) and planner.available(sid, d) and \
                    planner.chosen(sid, d)[0] == "old-model":
                kept[f"{sid}/old-model"] = obj
                info[f"{sid}/{d}"] = {**merge.calibration["without_labels"].get(f"{sid}/{d}", {}),
                                      "route": "old-model", "carried_from": old.current}
        if len(kept) > 1:  # a map merges against another map
            maps[d] = kept
    info = {k: v for k, v in info.items() if k.rpartition("/")[2] in maps}
    return dataclasses.replace(new, merge=Merge("calibrated", score_maps=maps, calibration={"without_labels": info})) \
        if maps else new


def _refuse_during_backfill(collection: Collection) -> None:
    """An upgrade registered while a backfill runs is refused (decided: not queued): the backfill
    would otherwise fill a space that is no longer the current one."""
    from .backfill import backfill_running, backfill_status

    job = backfill_running(collection)
    if job is not None:
        st = backfill_status(collection)
        if st["done"] < st["total"]:
            now = "paused" if job.state == "paused" else ("running" if st.get("workers") else "unfinished, no worker now")
            raise UpgradeRefused(f"a backfill of collection {collection.path} into space {job.target} is {now} "
                                 f"({st['done']}/{st['total']} done); let it finish (`nobackfill collection backfill`) "
                                 "or cancel it (`nobackfill collection backfill --cancel`, POST /v1/backfill/cancel) "
                                 "before registering another upgrade (nothing was changed)")


def _apply_calibration(plan: Plan, result: dict[str, Any]) -> Plan:
    """``plan`` with what calibration chose (a pinned route keeps its choice; its numbers are
    updated)."""
    for sid, dirs in result["routes"].items():
        for d, r in dirs.items():
            pinned = plan.route(sid, d)
            if pinned is not None and pinned.pinned:
                plan = plan.with_route(sid, d, dataclasses.replace(pinned, calibration=r["calibration"]))
            else:
                plan = plan.with_route(sid, d, RouteChoice.from_json(r))
    return dataclasses.replace(plan, merge=Merge.from_json(result["merge"]),
                               calibration={**result["calibration"], "new_new": result["new_new"]})


def calibrate_collection(collection: Collection, tasks: Sequence[CalibrationTask], *, label: str = "",
                         pool: ModelPool | None = None) -> Plan:
    """Re-run the calibration of the current plan (pinned routes stay; their numbers are updated)."""
    plan = collection.plan
    from ..compat.fitted.stored import resolve_collection_plan

    result = calibrate(RoutePlanner(resolve_collection_plan(collection, plan), pool or ModelPool()), tasks,
                       data_label=label)

    def commit(p: Plan) -> Plan:
        if p.current != plan.current:
            raise UpgradeRefused("the collection was upgraded meanwhile; calibrate again")
        return _apply_calibration(p, result)

    return collection.set_plan(commit)


def pin_route(collection: Collection, space_id: str, direction: str, route: str | None,
              weight: float | None = None) -> Plan:
    """Pin ``route`` (and, for ``fused``, ``weight``; default: the calibrated weight, else 0.5) for
    one (space, direction); ``route=None`` unpins (the calibrated or default route applies again).
    :class:`RouteRefused` for the current space or a route the space cannot take."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(DIRECTIONS)}, got {direction!r}")
    if route is not None and route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if weight is not None and route != FUSED:  # (it was ignored)
        raise ValueError(f"w is the fused route's weight; route {route!r} takes none")
    if route == FUSED and weight is not None and not 0.0 <= weight <= 1.0:
        raise ValueError(f"a fused route's weight w must lie in [0, 1], got {weight}")

    def commit(p: Plan) -> Plan:
        if space_id == p.current:
            raise RouteRefused(f"space {space_id} is the current model's: it is always searched natively")
        if not p.has(space_id):
            raise ValueError(f"collection {collection.path} has no space {space_id}")
        if p.space(space_id).retired:  # (trial K: a pin on it was answered 200 and did nothing)
            raise RouteRefused(f"space {space_id} is retired: its vectors were dropped and nothing routes to it")
        entry = p.route(space_id, direction) or RouteChoice()
        if route is None:  # what calibration chose from its numbers, else no choice (the default route)
            choice = calibrated_choice(entry.calibration)
            if choice is None:
                return p.with_route(space_id, direction, None)
            return p.with_route(space_id, direction, RouteChoice(route=choice[0], w=choice[1], pinned=False,
                                                                 calibration=entry.calibration))
        avail = RoutePlanner(p, ModelPool()).available(space_id, direction)
        if route not in avail:
            raise RouteRefused(f"route {route} is not available to space {space_id} for {direction} "
                               f"(available: {', '.join(avail) or 'none'})")
        w = (weight if weight is not None else entry.w if entry.w is not None else 0.5) if route == FUSED else None
        return p.with_route(space_id, direction, dataclasses.replace(entry, route=route, w=w, pinned=True))

    return collection.set_plan(commit)


def route_table(plan: Plan) -> dict[str, Any]:
    """Per old space and direction: the route in use, whether calibrated or pinned, and the
    calibration numbers (what ``collection status`` shows)."""
    planner = RoutePlanner(plan, ModelPool())
    out: dict[str, Any] = {}
    for s in plan.old_spaces():
        sid = s.space_id
        rows = {}
        for d in DIRECTIONS:
            avail = planner.available(sid, d)
            if not avail:
                continue
            route, w = planner.chosen(sid, d)
            entry = plan.route(sid, d) or RouteChoice()
            rows[d] = {"route": route, "w": w, "available": avail, "pinned": entry.pinned,
                       "calibrated": entry.calibration is not None,
                       "calibration": {k: v for k, v in (entry.calibration or {}).items() if k != "curve"}}
        out[sid] = rows
    return out
