"""Bridges fitted from a collection's own backfill, put in service only when better.

Every item the backfill has committed has a vector in the current (new) space and still its vector
in its old space: real (new, old) pairs of the same items. :func:`fit_collection_bridges` reads
them, fits the candidates of :mod:`nobackfill.compat.fitted` (per pair set: image, text, both) on
the pairs outside a held-out fifth of the items (split by scene: an image with its captions, the
same items every time),
and per old space and direction chooses without labels (agreement with the new model's ranking of
the held-out items, held-out queries of the direction's query modality, and the example query texts
an upgrade was given: the only text queries of a collection of images alone). The bridge serving that
direction, if any, is scored on the same held-out items; the new fit replaces it only if its score
is higher by ``min_gain``. A new bridge is stored in the collection's catalog as a versioned upgrade
directory (``fitted-<space>-<direction>-v<k>``, :mod:`nobackfill.compat.fitted.stored`: one
transaction, a version never reused), so every machine of a shared deployment (PostgreSQL + Milvus)
reads it; then the plan swaps it in with its route (bridge / fused / old-model, by the same score) in
one transaction; a process killed during a fit leaves the serving bridge and plan as they were. A route pinned by a
user, or chosen on labels (``calibrate``), is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np

from ..compat.fitted import (FitConfig, FittedBridge, HeldOut, candidate_score, choose_direction, fit_candidates,
                             held_out_set, heldout_mask, route_scores)
from ..compat.fitted.stored import (collection_cache, drop_stored, is_stored, materialize, next_version,
                                   save_stored)
from ..collection.collection import Collection
from ..catalog.plan import Merge, Plan, RouteChoice, UpgradeRecord
from ..search.routes import DIRECTIONS, RoutePlanner
from ..search.models import ModelPool
from .calibrate import agreed_score_maps

__all__ = ["FitBridgesConfig", "backfilled_pairs", "fit_collection_bridges", "fitted_bridges", "fitted_status", "scene_of",
           "users_planner", "with_given_route"]

#: the fewest held-out queries a score is computed on
MIN_HELDOUT = 8
#: why a text-query direction of a collection without captions keeps its route
NO_QUERIES = ("no captions to hold out and no query texts given: pass example search texts (no labels) with "
              "`collection upgrade --queries FILE` to fit and score a bridge for text queries")


def few_queries(given: int) -> str:
    """Why a text-query direction scored on the ``given`` example query texts alone keeps its route."""
    return (f"too few of the {given} query texts given could score a bridge: it needs {MIN_HELDOUT} whose new-model "
            "match is an item held out of the fit; pass more example search texts (tens to hundreds) with "
            "`collection upgrade --queries FILE`")


@dataclass
class FitBridgesConfig:
    """How fitted bridges are chosen and swapped in."""

    heldout: float = 0.2
    min_gain: float = 0.01
    min_pairs: int = 32
    max_queries: int = 2000
    max_gallery: int = 20000
    fit: FitConfig = field(default_factory=FitConfig)
    queries: tuple[str, ...] = ()  # example query texts (no labels), scored beside the held-out captions


@dataclass
class QueryTexts:
    """Given query texts (never fitted on: every one is held out) with their new-model and, where
    the old model embeds text, old-model vectors."""

    texts: list[str]
    new: np.ndarray
    old: np.ndarray | None


@dataclass
class Pairs:
    keys: list[str]
    new: np.ndarray
    old: np.ndarray
    sources: list[Any] = field(default_factory=list)  # per key: an image path or a caption (for given bridges)
    scenes: list[str] = field(default_factory=list)  # per key: its scene (:func:`scene_of`), held out together


def scene_of(item: Any) -> str:
    """The scene of an item: a caption's image (its ``image_id`` metadata, set when a data folder's
    captions are added) or the item itself. An image and its captions are sampled first together and
    held out together, so a held-out caption's image is a held-out image (the score's reference is
    then the new model's match, not a near tie among unrelated images)."""
    if getattr(item, "modality", None) == "text":
        image = (getattr(item, "metadata", None) or {}).get("image_id")
        if isinstance(image, str) and image:
            return image
    return str(item.id)


def backfilled_pairs(collection: Collection, old_space: str, plan: Plan | None = None) -> dict[str, Pairs]:
    """Per modality, the items with a vector in both the current space and ``old_space``: their
    keys and both vectors (rows aligned)."""
    plan = plan or collection.plan
    out: dict[str, Pairs] = {}
    for m in ("image", "text"):
        if not (plan.current_space.embeds(m) and plan.space(old_space).embeds(m)):
            continue
        g_new, g_old = collection.gallery(plan.current, plan), collection.gallery(old_space, plan)
        if not g_new.count(m) or not g_old.count(m):
            continue
        live = {it.key: it for it in collection.iter_items(m)}
        new_rows = {k: i for i, k in enumerate(g_new.ids(m)) if k in live}
        old_rows = {k: i for i, k in enumerate(g_old.ids(m)) if k in new_rows}
        keys = sorted(old_rows)
        if not keys:
            continue
        vn, vo = np.asarray(g_new.vectors(m)), np.asarray(g_old.vectors(m))
        src = [live[k].source.get("path" if m == "image" else "text") for k in keys]
        out[m] = Pairs(keys, vn[[new_rows[k] for k in keys]], vo[[old_rows[k] for k in keys]], src,
                       [scene_of(live[k]) for k in keys])
    return out


def fitted_bridges(plan: Plan) -> dict[tuple[str, str], UpgradeRecord]:
    """The fitted bridge serving each (old space, direction): from the current space's queries (those
    fitted for an earlier current model take none of today's; trial AD: "unreadable" at each refit)."""
    return {(u.target, d): u for u in plan.upgrades if u.kind == "fitted" and u.source == plan.current
            for d in u.directions}


def _held(direction: str, pairs: dict[str, Pairs], masks: dict[str, np.ndarray], cfg: "FitBridgesConfig",
          old_embeds_query: bool, given: QueryTexts | None = None) -> tuple[HeldOut | None, list[Any]]:
    """The held-out queries of ``direction`` that count (:func:`~nobackfill.compat.fitted.held_out_set`:
    those whose new-model match among the backfilled items is held out, never fitted on, as the
    items not yet backfilled are not), at most ``cfg.max_queries``: the collection's held-out items
    of the query modality, then the ``given`` query texts (a text-query direction; the only queries
    of a collection without captions); the gallery: the backfilled items of the gallery modality, at
    most ``cfg.max_gallery`` (the held-out ones first, then fitted ones as distractors). Returns the
    set and its queries' sources (an image path or a text, what a user's bridge embeds)."""
    qmod, gmod = DIRECTIONS[direction]
    if gmod not in pairs:
        return None, []
    g = pairs[gmod]
    q = pairs.get(qmod)
    qi = np.flatnonzero(masks[qmod])[:2 * cfg.max_queries] if q is not None else np.zeros(0, np.int64)
    ext = given if given is not None and qmod == "text" and len(given.texts) else None
    n_q = len(qi) + (len(ext.texts) if ext is not None else 0)  # about half keep their match held out
    if n_q < MIN_HELDOUT or len(g.keys) < 2 * MIN_HELDOUT:
        return None, []
    held_rows, fitted_rows = np.flatnonzero(masks[gmod]), np.flatnonzero(~masks[gmod])
    rows = np.sort(np.concatenate([held_rows[:cfg.max_gallery],
                                   fitted_rows[:max(0, cfg.max_gallery - len(held_rows))]]))
    exclude = None
    if qmod == gmod:  # a query's own item: its gallery column (-1: not in the gallery, or a given text)
        col = np.full(len(g.keys), -1, np.int64)
        col[rows] = np.arange(len(rows))
        exclude = col[qi]
    parts = [(q.new[qi], q.old[qi] if old_embeds_query else None, [q.sources[i] for i in qi])] if len(qi) else []
    if ext is not None:
        parts.append((ext.new, ext.old if old_embeds_query else None, list(ext.texts)))
        if exclude is not None:
            exclude = np.concatenate([exclude, np.full(len(ext.texts), -1, np.int64)])
    q_new = np.concatenate([p[0] for p in parts])
    q_old = np.concatenate([p[1] for p in parts]) if old_embeds_query and all(p[1] is not None for p in parts) \
        else None
    sources = [x for p in parts for x in p[2]]
    held, kept = held_out_set(direction, q_new, g.new[rows], g.old[rows], masks[gmod][rows], q_old, exclude,
                              min_queries=MIN_HELDOUT)
    sources = [x for x, k in zip(sources, kept) if k]
    if len(sources) > cfg.max_queries:
        sources = sources[:cfg.max_queries]
        held = held.take(np.arange(cfg.max_queries))
    return held, sources


#: given query texts embedded by a space's model, per (space id, digest of the texts): every refit of
#: a backfill in this process scores the same texts with the same models, so each is embedded once
_QUERY_VECTORS: dict[tuple[str, str], np.ndarray] = {}


def _query_texts(planner: RoutePlanner, space: Any, texts: tuple[str, ...],
                 say: Callable[[str], None]) -> QueryTexts | None:
    """The given query texts embedded by the current model and (where it embeds text) ``space``'s
    (:data:`_QUERY_VECTORS`); None where a model cannot embed them (said: the fit goes on without
    them, as a bridge must be compared with the old model's own route)."""
    from ..evaluate import texts_sha256

    if not texts or not planner.plan.current_space.embeds("text"):
        return None
    digest = texts_sha256(texts)
    vectors: dict[str, np.ndarray] = {}
    for sid in (planner.current, space.space_id):
        if not planner.plan.space(sid).embeds("text"):
            continue
        if (sid, digest) not in _QUERY_VECTORS:
            try:
                v = np.asarray(planner.encoder(sid).encode_texts(list(texts)), np.float32)
            except Exception as e:  # a model no longer at its path: scored without the given queries
                say(f"  the model of space {sid} could not embed the given query texts ({e}); scored without them")
                return None
            if len(_QUERY_VECTORS) >= 8:  # a few upgrades' worth
                _QUERY_VECTORS.pop(next(iter(_QUERY_VECTORS)))
            _QUERY_VECTORS[sid, digest] = v
        vectors[sid] = _QUERY_VECTORS[sid, digest]
    return QueryTexts(list(texts), vectors[planner.current], vectors.get(space.space_id))


def _given_bridge(users: RoutePlanner, sid: str, d: str, sources: list[Any], say: Callable[[str], None]) -> dict:
    """The user's own bridge (XBT, Procrustes ...) to ``sid`` for ``d`` as a candidate: its queries
    for the held-out items' sources; {} when there is none or it cannot run."""
    if "bridge" not in users.available(sid, d) or any(x is None for x in sources):
        return {}
    try:
        side = users.query_side(sid, d, "bridge")
        return {"given": side.embed(DIRECTIONS[d][0], sources)}
    except Exception as e:  # a missing model or upgrade directory: scored without it
        say(f"  the registered bridge to {sid} ({d}) could not embed the held-out queries: {e}")
        return {}


def users_planner(plan: Plan, pool: ModelPool) -> RoutePlanner:
    """Routes through the user's own bridges only (the fitted ones left out)."""
    return RoutePlanner(dataclasses.replace(plan, upgrades=tuple(u for u in plan.upgrades if u.kind != "fitted")), pool)


def with_given_route(p: Plan, sid: str, d: str, routes: dict[str, Any]) -> Plan:
    """``p`` with the route chosen without labels for the user's bridge to ``sid`` (``d``), unless a
    fitted bridge serves it (swapped in meanwhile), the space is gone, or the route is pinned or labelled."""
    cur = p.route(sid, d)
    choice = _route_entry(cur, routes, {"given": True})
    if choice is None or (sid, d) in fitted_bridges(p) or sid not in {s.space_id for s in p.old_spaces()} or \
            (cur is not None and (choice.route, choice.w) == (cur.route, cur.w)):
        return p
    return p.with_route(sid, d, choice)


def _route_name(routes: Any) -> str:
    """A route as the command says it: ``bridge``, ``old-model``, ``fused w=0.8``."""
    route, w = (routes["route"], routes.get("w")) if isinstance(routes, dict) else (routes.route, routes.w)
    return f"{route} w={w:g}" if route == "fused" and w is not None else str(route)


def _scored(s: dict[str, Any]) -> str:
    """A held-out score as compared (R@1 + overlap@10: ``candidate_score``): a swap at an R@1 equal to
    the serving bridge's looked against the +0.01 rule when only R@1 was said (trial Z)."""
    return f"R@1 {s['r1']:.3f} + overlap@10 {s['overlap10']:.3f}"


def _say_rerouted(say: Callable[[str], None], current: RouteChoice | None, routes: dict[str, Any], sid: str,
                  d: str, name: str, sizes: dict[str, int]) -> None:
    """Say a kept bridge's route chosen again on this fit's held-out set, when it changes (the final
    refit turned t2i from fused to bridge without a word: trial Z)."""
    if current is None or _route_name(current) == _route_name(routes) or _route_entry(current, routes, {}) is None:
        return  # (a route pinned, or chosen on labels, is not changed by a fit)
    say(f"  {sid} {d}: the serving bridge stays ({name}); its route, chosen again on this fit's held-out set ("
        f"{sizes['queries']} queries, {sizes['gallery']} items): {_route_name(current)} -> {_route_name(routes)}")


def _route_entry(current: RouteChoice | None, routes: dict[str, Any], info: dict[str, Any]) -> RouteChoice | None:
    """The route choice to record, or None to keep the current one (pinned, or chosen on labels)."""
    if current is not None and (current.pinned or (current.calibration and "fitted" not in current.calibration)):
        return None
    cal = {"fitted": info, **{k: v for k, v in routes.items() if k not in ("route", "w")}}
    return RouteChoice(route=routes["route"], w=routes.get("w"), calibration=cal)


def fit_collection_bridges(collection: Collection, *, cfg: FitBridgesConfig | None = None,
                           pool: ModelPool | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fit, choose and (where better) swap in a bridge per old space and direction (module doc).
    Returns ``{space: {direction: {"swapped", "chosen", "heldout", "serving", "route", "scored", "path"}}}``
    (``scored``: the held-out queries and gallery items the choice was scored on)."""
    cfg = cfg or FitBridgesConfig()
    say = log or (lambda _m: None)
    plan, pool = collection.plan, pool or ModelPool()
    cache = collection_cache(collection)
    planner, users = RoutePlanner(plan, pool), users_planner(plan, pool)
    serving = fitted_bridges(plan)
    report: dict[str, Any] = {}
    changes: list[tuple[UpgradeRecord, str, dict[str, Any], dict[str, Any]]] = []
    rerouted: list[tuple[UpgradeRecord, dict[str, Any]]] = []  # a serving bridge kept, its route chosen again
    rerouted_given: list[tuple[str, str, dict[str, Any]]] = []  # likewise the user's registered bridge
    merge_maps: dict[tuple[str, str], dict[str, Any] | None] = {}  # the merge's maps without labels (_merge_maps)
    for space in plan.old_spaces():
        sid = space.space_id
        pairs = backfilled_pairs(collection, sid, plan)
        if not pairs or max(len(p.keys) for p in pairs.values()) < cfg.min_pairs:
            report[sid] = {"skipped": f"{sum(len(p.keys) for p in pairs.values())} backfilled pairs "
                                      f"(at least {cfg.min_pairs} of one modality needed)"}
            continue
        masks = {m: heldout_mask(p.scenes or p.keys, cfg.heldout, min_count=MIN_HELDOUT) for m, p in pairs.items()}
        fit_pairs = {m: (p.new[~masks[m]], p.old[~masks[m]]) for m, p in pairs.items()}
        cands = fit_candidates(fit_pairs, cfg.fit, min_pairs=cfg.min_pairs)
        all_pairs = {m: (p.new, p.old) for m, p in pairs.items()}
        refits: dict[str, Any] = {}  # a candidate refitted on all pairs once, whichever directions it serves
        for d in DIRECTIONS:
            qmod, _ = DIRECTIONS[d]
            if not planner.available(sid, d) or not plan.current_space.embeds(qmod):
                continue
            given_texts = _query_texts(planner, space, tuple(cfg.queries), say) if qmod == "text" else None
            held, sources = _held(d, pairs, masks, cfg, space.embeds(qmod), given_texts)
            if held is None or not cands:
                if qmod == "text" and "text" not in pairs and DIRECTIONS[d][1] in pairs:
                    report.setdefault(sid, {})[d] = {"skipped": few_queries(len(cfg.queries)) if cfg.queries
                                                     else NO_QUERIES}
                continue
            old_rec = serving.get((sid, d))
            given = _given_bridge(users, sid, d, sources, say)
            if old_rec is not None:
                try:
                    from ..compat.upgrade import load_upgrade

                    given["serving"] = load_upgrade(materialize(collection.catalog, old_rec.path, cache)
                                                    if is_stored(old_rec.path) else old_rec.path).bridge()(held.q_new)
                except (OSError, ValueError) as e:
                    say(f"  serving bridge {old_rec.path} unreadable ({e}); it will be replaced")
            ch = choose_direction(held, cands, given=given, pairs=all_pairs, cfg=cfg.fit, refits=refits)
            serving_score = ch.scores.get("serving")
            entry = {"chosen": ch.chosen, "heldout": ch.heldout, "serving": serving_score, "route": ch.route,
                     "swapped": False, "pairs": {m: len(p.keys) for m, p in pairs.items()}, "scored": held.sizes}
            report.setdefault(sid, {})[d] = entry
            best = candidate_score(ch.scores[ch.chosen]) if ch.chosen is not None else None
            if ch.bridge is None or (serving_score is not None and best < candidate_score(serving_score) + cfg.min_gain):
                # the serving bridge (or the user's own) stays; a fitted one's route is chosen again on the
                # larger held-out set of this fit, with its own outputs
                if old_rec is not None and ch.chosen is not None and "serving" in given:
                    routes = ch.routes if ch.chosen == "serving" else route_scores(held, given["serving"])
                    entry["route"] = routes["route"]
                    rerouted.append((old_rec, routes))
                    _say_rerouted(say, plan.route(sid, d), routes, sid, d, old_rec.name, held.sizes)
                    merge_maps[sid, d] = _merge_maps(d, routes, held, given["serving"], pairs, cfg)
                elif old_rec is None and "given" in given:  # the user's bridge serves on: its route tested too
                    routes = ch.routes if ch.chosen == "given" else route_scores(held, given["given"])
                    entry["route"] = routes["route"]
                    rerouted_given.append((sid, d, routes))  # (said: trial AE saw i2t leave XBT without a word)
                    _say_rerouted(say, plan.route(sid, d) or RouteChoice("bridge"), routes, sid, d, "your --bridge", held.sizes)
                    merge_maps[sid, d] = _merge_maps(d, routes, held, given["given"], pairs, cfg)
                continue
            merge_maps[sid, d] = _merge_maps(d, ch.routes, held, given[ch.chosen] if ch.chosen in given
                                             else ch.scored_map(held.q_new), pairs, cfg)
            info = {"family": ch.bridge.family, "candidate": ch.bridge.meta.get("candidate", ch.chosen), "direction": d,
                    "pairs": int(ch.bridge.meta.get("pairs", 0)), "pair_counts": entry["pairs"],
                    "heldout": ch.heldout, "heldout_sizes": ch.sizes,
                    "fitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            changes.append((old_rec, d, {"space": space, "bridge": ch.bridge, "info": info}, ch.routes))
            entry["swapped"] = True
    if not changes and not rerouted and not rerouted_given:
        return report
    new_records = []
    for old_rec, d, what, routes in changes:
        sid = what["space"].space_id
        stem = f"fitted-{sid}-{d}"
        version = next_version(collection.catalog, stem)
        name = f"{stem}-v{version}"
        info = {**what["info"], "version": version}
        bridge = FittedBridge(what["bridge"], plan.current, sid, info)
        path = save_stored(collection.catalog, name, lambda directory: bridge.save(
            directory, {"space_id": plan.current, "name": plan.current_space.name, "embed_dim": plan.current_space.dim},
            {"space_id": sid, "name": what["space"].name, "embed_dim": what["space"].dim}))
        with contextlib.suppress(OSError):  # readable here at once (a read-only cache is filled by the readers)
            materialize(collection.catalog, path, cache)
        rec = UpgradeRecord(path=path, kind="fitted", source=plan.current, target=sid, name=name, directions=(d,),
                            info=info)
        new_records.append((rec, routes))
        report[sid][d]["path"] = rec.path
        serving = report[sid][d].get("serving")
        say(f"  {sid} {d}: {info['candidate']} on {info['pairs']} pairs, held-out agreement "
            f"{_scored(info['heldout'])}"
            + (f" against the serving bridge's {_scored(serving)}" if serving else "")
            + f" -> route {_route_name(routes)} ({name})")

    gone: set[str] = set()  # bridges of a space retired meanwhile: never put in service

    def commit(p: Plan) -> Plan:
        if p.current != plan.current:
            raise RuntimeError("the collection was upgraded meanwhile; the fitted bridges were not swapped in")
        live = {s.space_id for s in p.spaces if not s.retired}
        gone.clear()
        gone.update(rec.name for rec, _ in new_records if rec.target not in live)
        for rec, routes in new_records:
            if rec.name in gone:
                continue
            d = rec.directions[0]
            p = p.with_fitted(rec)
            choice = _route_entry(p.route(rec.target, d), routes, dict(rec.info or {}))
            if choice is not None:
                p = p.with_route(rec.target, d, choice)
        for sid, d, routes in rerouted_given:
            p = with_given_route(p, sid, d, routes)
        for rec, routes in rerouted:  # only where that bridge still serves (not replaced, not retired)
            d = rec.directions[0]
            if fitted_bridges(p).get((rec.target, d)) != rec:
                continue
            cur = p.route(rec.target, d)
            choice = _route_entry(cur, routes, dict(rec.info or {}))
            if choice is not None and (cur is None or (choice.route, choice.w) != (cur.route, cur.w)):
                p = p.with_route(rec.target, d, choice)
        return _with_merge_maps(p, {k: m for k, m in merge_maps.items() if k[0] in live})

    collection.set_plan(commit)
    for sid in sorted({rec.target for rec, _ in new_records if rec.name in gone}):
        drop_stored(collection.catalog, f"fitted-{sid}-", cache)  # as retire does: every version
        for e in report.get(sid, {}).values():
            if isinstance(e, dict) and e.get("swapped"):
                e.update(swapped=False, path=None, skipped="the space was retired during the fit")
    return report


def _every_backfilled(direction: str, pairs: dict[str, Pairs], cfg: "FitBridgesConfig") -> HeldOut | None:
    """Every backfilled item of the query modality (at most ``cfg.max_queries``) as a query against
    every backfilled item of the gallery modality (at most ``cfg.max_gallery``; a query's own item
    left out), with both models' vectors: what the ``old-model`` route's score map is fitted on, as
    no bridge is involved and so nothing fitted can be recalled."""
    qmod, gmod = DIRECTIONS[direction]
    if qmod not in pairs or gmod not in pairs:
        return None
    q, g = pairs[qmod], pairs[gmod]
    qi, gi = np.arange(min(len(q.keys), cfg.max_queries)), np.arange(min(len(g.keys), cfg.max_gallery))
    exclude = np.where(qi < len(gi), qi, -1) if qmod == gmod else None
    try:
        return HeldOut(direction, q.new[qi], g.new[gi], g.old[gi], q.old[qi], exclude)
    except ValueError:  # too few items
        return None


def _merge_maps(direction: str, routes: dict[str, Any], held: HeldOut | None, bridged: np.ndarray | None,
                pairs: dict[str, Pairs], cfg: "FitBridgesConfig") -> dict[str, Any] | None:
    """The score maps of ``direction`` that the ``calibrated`` merge uses without labels
    (:func:`~.calibrate.agreed_score_maps`), for the route ``routes`` chose (``bridged``: the
    bridge's outputs for the queries of ``held``): a route with a bridge is scored on the held-out
    queries and items it was chosen on (``held``), the ``old-model`` route on every backfilled pair
    (:func:`_every_backfilled`: many more queries); None where the route cannot be scored or too few
    queries agree."""
    route, w = routes["route"], routes.get("w")
    if route == "old-model":
        held = _every_backfilled(direction, pairs, cfg) or held
    if held is None:
        return None
    s_old = held.old_scores(held.q_old) if held.q_old is not None else None
    s_br = held.old_scores(bridged) if bridged is not None else None
    if route == "fused":
        routed = (1 - w) * s_old + w * s_br if s_old is not None and s_br is not None and w is not None else None
    else:
        routed = s_old if route == "old-model" else s_br
    if routed is None:
        return None
    got = agreed_score_maps(held.masked(held.q_new @ held.g_new.T), held.masked(routed))
    if got is None:
        return None
    native, mapped, agreed = got
    return {"route": route, "w": w, "native": native.to_json(), "routed": mapped.to_json(), "agreed": agreed,
            "queries": int(len(held.q_new))}


def _with_merge_maps(p: Plan, found: dict[tuple[str, str], dict[str, Any] | None]) -> Plan:
    """``p`` merging by the score maps ``found`` this fit (per old space and direction; None: none)
    where no labels calibrated it (labels decide): a direction keeps maps only for the route it now
    serves (a pinned or other route drops them, and a direction with none merges raw scores), and the
    merge is ``calibrated`` while any direction has maps."""
    if p.calibration or not found:
        return p
    planner = RoutePlanner(p, ModelPool())  # the routes in force (a default one has no choice recorded)
    mine = p.merge is not None and "without_labels" in (p.merge.calibration or {})
    if p.merge is not None and not mine:
        return p  # a merge someone chose: kept
    maps = {d: dict(v) for d, v in (p.merge.score_maps if mine else {}).items()}
    info = dict(p.merge.calibration["without_labels"]) if mine else {}
    for (sid, d), m in found.items():
        route, w = planner.chosen(sid, d) if planner.available(sid, d) else (None, None)
        carried = (info.get(f"{sid}/{d}") or {}).get("carried_from")
        if m is None and carried and route == "old-model" and f"{sid}/old-model" in maps.get(d, {}):
            continue  # a map an upgrade carried (_carry_merge_maps) serves until one is fitted here
        dm = {k: v for k, v in maps.get(d, {}).items() if not k.startswith(f"{sid}/")}
        info.pop(f"{sid}/{d}", None)
        if m is not None and route == m["route"] and (route != "fused" or w == m["w"]):
            dm[f"{p.current}/native"], dm[f"{sid}/{m['route']}"] = m["native"], m["routed"]
            info[f"{sid}/{d}"] = {k: m[k] for k in ("route", "w", "agreed", "queries")}
        if not any(not k.startswith(f"{p.current}/") for k in dm):
            dm = {}  # no old space's map left: the native one alone would merge against raw scores
        maps.pop(d, None)
        if dm:
            maps[d] = dm
    merge = Merge("calibrated", score_maps=maps, calibration={"without_labels": info}) if maps else None
    return dataclasses.replace(p, merge=merge)


def fitted_status(plan: Plan) -> list[dict[str, Any]]:
    """What ``status`` shows of the fitted bridges in service: space, direction, family, pairs,
    held-out score, when, version."""
    out = []
    for (sid, d), u in sorted(fitted_bridges(plan).items()):
        info = dict(u.info or {})
        out.append({"space": sid, "direction": d, "family": info.get("family"), "candidate": info.get("candidate"),
                    "pairs": info.get("pairs"), "heldout": (info.get("heldout") or {}).get("r1"),
                    "heldout_queries": (info.get("heldout_sizes") or {}).get("queries"),
                    "fitted_at": info.get("fitted_at"), "version": info.get("version"), "path": u.path})
    return out

