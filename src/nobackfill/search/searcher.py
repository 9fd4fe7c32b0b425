"""The :class:`Searcher`: one object that answers text or image queries over a collection.

It keeps the models warm (:class:`~nobackfill.search.models.ModelPool`) and, for each query, uses
one :class:`~nobackfill.collection.collection.Snapshot` of the collection from start to end: every space
that serves items of the searched modality is searched with its own route (native for the current
model's space; ``old-model``, ``bridge`` or ``fused`` for older spaces, see
:mod:`nobackfill.search.routes`) restricted to the rows it serves (so an item is returned at most
once and a deleted item never), and the per-space lists are merged (:mod:`nobackfill.search.merge`).

Two ways to build one:

* over a collection's plan (``Searcher(collection)``): the current model embeds the queries and the
  plan's routes reach the older spaces (``nobackfill collection search``, the service);
* with an explicit query model (``Searcher(collection, query_model=..., bridges=[...])``): the
  given model's queries reach each space natively or through the given upgrades, and nothing else
  (``nobackfill search --gallery G --model M [--bridge U]``).

The CLI's ``search`` and ``collection search``, ``eval`` (through :meth:`Searcher.query_side`), the
benchmarks and the HTTP service all go through this class.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from itertools import count, repeat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..encoders.base import DualEncoder
from ..collection.collection import Collection, Snapshot
from ..catalog.plan import Plan, Space, UpgradeRecord
from .limits import Limits
from ..gallery.types import SpaceMismatchError
from .fanout import search_spaces
from .filters import check_filter, matches_filter  # noqa: F401 (matches_filter: this module's name for it)
from .merge import DEFAULT_MERGE, MERGES, ScoreMap, merge, named_lists
from .models import ModelPool, model_ref
from .routes import (BRIDGE, DIRECTIONS, NATIVE, NoRouteError, QuerySide, RoutePlanner, direction_of, reco_refiner,
                     upgrade_entry)

__all__ = ["DEFAULT_MERGE", "HIT_FIELDS", "Hit", "SearchResponse", "Searcher", "explicit_plan", "hit_json", "matches_filter", "query_side_for"]

#: the routes whose first-stage lists CMLI re-ranks (the query embedded by the space's own model)
RERANKED = ("native", "old-model")


class Hit(tuple):
    """One result: the item, its score under the route that answered, and where it came from.

    A named tuple ``(rank, score, id, space, route, metadata JSON)``: a search makes ``k`` of them
    per query, and a tuple is made in C (a class with ``__init__`` runs a Python call per hit, each
    a microsecond or more once the index search has evicted the interpreter's caches). Its
    ``metadata`` is parsed from the catalog's JSON when first read (most callers read a hit's id
    and score only: a search then parses nothing)."""

    def __new__(cls, rank: int, score: float, id: str, space: str, route: str,
                metadata: dict[str, Any] | str | None = None) -> "Hit":
        return tuple.__new__(cls, (rank, score, id, space, route, {} if metadata is None else metadata))

    def __getnewargs__(self) -> tuple:  # copy and pickle make it again from its six fields
        return tuple(self)

    rank = property(operator.itemgetter(0), doc="1-based rank in the merged list")
    score = property(operator.itemgetter(1), doc="the score under the route that answered")
    id = property(operator.itemgetter(2), doc="the item's id")
    space = property(operator.itemgetter(3), doc="the space whose vector answered")
    route = property(operator.itemgetter(4), doc="the route that reached that space")

    @property
    def metadata(self) -> dict[str, Any]:
        m = self[5]
        if type(m) is str:  # parsed once, kept beside the tuple
            m = self.__dict__.get("_metadata")
            if m is None:
                m = self.__dict__["_metadata"] = _loads(self[5])
        return m

    def __repr__(self) -> str:
        return (f"Hit(rank={self.rank}, score={self.score!r}, id={self.id!r}, space={self.space!r}, "
                f"route={self.route!r}, metadata={self.metadata!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hit) and self[:5] == other[:5] and self.metadata == other.metadata

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # its metadata is a mutable dict

    def to_json(self) -> dict[str, Any]:
        return hit_json(self.rank, self.score, self.id, self.space, self.route, self.metadata)


#: a hit's own fields in its JSON form: a metadata key of one of these names is found in ``metadata`` only
HIT_FIELDS = frozenset({"rank", "score", "id", "space", "route", "metadata"})


def hit_json(rank: int, score: float, id: str, space: str, route: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A hit's JSON form (``--json``, the HTTP API): its own fields and ``metadata``, the item's
    metadata whole; the metadata's keys are also flattened beside them (as earlier releases gave
    them), but for those named as a hit's own fields (:data:`HIT_FIELDS`)."""
    return {**{k: v for k, v in metadata.items() if k not in HIT_FIELDS}, "rank": rank, "score": score, "id": id,
            "space": space, "route": route, "metadata": dict(metadata)}


@dataclass
class SearchResponse:
    """Hits of one query, and what answered it."""

    query: str
    modality: str  # the searched items' modality
    direction: str
    hits: list[Hit]
    merge: str
    generation: int
    #: what refined or re-ranked the hits beyond their routes (RECO, CMLI re-ranking): ``{"step", "label",
    #: "spaces", ...}`` each (a hit's ``route`` says only how its query reached its space)
    applied: Sequence[dict[str, Any]] = ()

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "modality": self.modality, "applied": [dict(a) for a in self.applied],
                "hits": [h.to_json() for h in self.hits]}


try:  # metadata of the hits is parsed per search: orjson where installed (about 5x faster)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads


@dataclass
class _Prepared:
    """A snapshot's search set-up for one kind of query (see :meth:`Searcher._prepare`)."""

    gmod: str
    direction: str
    views: dict[str, Any]
    spaces: list[tuple[str, QuerySide, Any, int]]  # (space, query side, mask or None, rows allowed)
    method: str
    maps: dict[str, Any]
    shares: dict[str, float]
    prefer: list[str]
    applied: list[dict[str, Any]]


class Searcher:
    """Answers ``search(text=... | image=..., k, filter)`` over a collection (see the module doc).

    ``query_model`` (a model directory or a loaded encoder) and ``bridges`` (upgrade directories)
    switch to the explicit-query-model mode. ``reco`` (a RECO directory, Iscen et al. 2023) refines the
    query embeddings of its own space; ``rerank`` (``cmli`` / ``cmli-sym``, the Target-CMLI paper) re-scores the
    first-stage top ``rerank_k`` of a space that stores token outputs, when the query is embedded by
    that space's own model. ``merge`` and ``routes`` (``{space: route}``) override the plan's.
    """

    def __init__(self, collection: Collection | str | Path, *, pool: ModelPool | None = None,
                 query_model: str | Path | DualEncoder | None = None, bridges: Sequence[str | Path] = (),
                 reco: str | Path | None = None, rerank: str = "", rerank_k: int = 100, rerank_weight: float = 1.0,
                 merge: str | None = None, routes: Mapping[str, str] | None = None,
                 limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.collection = collection if isinstance(collection, Collection) else Collection.open(collection)
        self.pool = pool or ModelPool()
        if merge is not None and merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
        self.merge_override = merge
        self.route_override = dict(routes or {})
        self.rerank, self.rerank_k, self.rerank_weight = rerank, int(rerank_k), float(rerank_weight)
        if rerank:
            from ..late.rerank import RERANK_SCORES

            if rerank not in RERANK_SCORES:
                raise ValueError(f"rerank must be one of {sorted(RERANK_SCORES)}, got {rerank!r}")
            if self.rerank_k < 1:  # (0 re-ranked nothing, without a word)
                raise ValueError(f"rerank_k must be >= 1 (the first-stage candidates re-ranked), got {rerank_k}")
        self._query_model: DualEncoder | None = None
        self._upgrades: list[dict[str, Any]] = []
        if query_model is not None:
            self._setup_query_model(query_model, bridges)
        elif bridges:
            raise ValueError("bridges are given with an explicit query model (query_model=...); a collection's own "
                             "upgrades are registered with 'collection upgrade'")
        self._refine = None
        if reco is not None:
            spaces = set(self.collection.plan.space_ids)
            if self._query_model is not None:
                spaces |= {self._query_model.space_id} | {u.target for u in self._upgrades if u.encoder}
            self._refine = reco_refiner(Path(reco), spaces)
        self._planners: dict[str, RoutePlanner] = {}
        self._last_planner: tuple[Snapshot, RoutePlanner] | None = None  # the planner of the last snapshot
        self._prepared: tuple[Snapshot | None, dict[tuple, _Prepared]] = (None, {})  # per query kind, last snapshot
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ set-up
    def _setup_query_model(self, query_model: str | Path | DualEncoder, bridges: Sequence[str | Path]) -> None:
        from ..compat.upgrade import load_upgrade

        if isinstance(query_model, DualEncoder):
            enc, ref = query_model, f"<{getattr(query_model, 'name', 'model')}>"
            self.pool.put(ref, enc)
        else:
            ref = model_ref(query_model)
            enc = self.pool.query_encoder(ref)
        self._query_model, self._query_ref = enc, ref
        ups = [load_upgrade(b) for b in bridges]
        _check_upgrades(ups, enc)
        self._upgrades = [upgrade_entry(u) for u in ups]

    def _plan(self, snap: Snapshot) -> Plan:
        """The plan routes are resolved on: the collection's, or (explicit query model) its spaces
        with the query model as the current one and the given upgrades."""
        if self._query_model is None:
            from ..compat.fitted.stored import resolve_collection_plan  # bridges kept in the catalog, read here
            return resolve_collection_plan(self.collection, snap.plan)
        return explicit_plan(snap.plan.spaces, self._query_ref, self._query_model, self._upgrades)

    def planner(self, snap: Snapshot | None = None) -> RoutePlanner:
        """The route planner of the collection's current plan (cached per plan)."""
        snap = snap or self.collection.snapshot()
        last = self._last_planner
        if last is not None and last[0] is snap:  # one snapshot, one plan: the hot path
            return last[1]
        plan = self._plan(snap)
        key = repr(plan)
        with self._lock:
            p = self._planners.get(key)
            if p is None:
                p = self._planners[key] = RoutePlanner(plan, self.pool, refine=self._refine)
        self._last_planner = (snap, p)
        return p

    def query_side(self, space_id: str, direction: str, route: str | None = None, weight: float | None = None,
                   *, snap: Snapshot | None = None) -> QuerySide:
        """The query pipeline into ``space_id`` (``eval`` and the benchmarks embed with it)."""
        planner = self.planner(snap)
        if self._query_model is not None and route is None:
            route = NATIVE if space_id == planner.current else BRIDGE
            if route == BRIDGE and BRIDGE not in planner.available(space_id, direction):
                raise SpaceMismatchError(space_id, planner.current, f"search space {space_id}",
                                         what="query model's embeddings",
                                         hint="embed the queries with the gallery's model or pass a bridge (--bridge)")
        return planner.query_side(space_id, direction, route, weight)

    def warm(self) -> list[str]:
        """Load every model the current plan's routes need (a service calls this at start-up)."""
        snap = self.collection.snapshot()
        for direction, (_, gmod) in DIRECTIONS.items():
            for sid, view in snap.views(gmod).items():
                if view.count == 0:
                    continue
                try:
                    self._side(snap, sid, direction)
                except (NoRouteError, SpaceMismatchError):
                    continue
        return self.pool.loaded()

    # ------------------------------------------------------------------ search
    def _side(self, snap: Snapshot, space_id: str, direction: str) -> QuerySide:
        return self.query_side(space_id, direction, self.route_override.get(space_id), snap=snap)

    def _target(self, snap: Snapshot, query_modality: str, target: str | None) -> str:
        if target is not None:
            if target not in ("image", "text"):
                raise ValueError(f"target must be 'image' or 'text', got {target!r}")
            return target
        other = "image" if query_modality == "text" else "text"
        has = {m: any(v.count for v in snap.views(m).values()) for m in ("image", "text")}
        return other if has[other] or not has[query_modality] else query_modality

    def search(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: Mapping[str, Any] | None = None) -> SearchResponse:
        """Top ``k`` items for one text or image query (``target``: the items' modality; default
        images for a text query and texts for an image query, when the collection holds them)."""
        if (text is None) == (image is None):
            raise ValueError("give exactly one of text= or image=")
        if text is not None:
            if not isinstance(text, str) or not text.strip():
                raise ValueError("the text query is empty")
            return self.search_batch(texts=[text], k=k, target=target, filter=filter)[0]
        return self.search_batch(images=[image], k=k, target=target, filter=filter)[0]

    def search_batch(self, *, texts: Sequence[str] | None = None, images: Sequence[Any] | None = None, k: int = 10,
                     target: str | None = None, filter: Mapping[str, Any] | None = None,
                     cache: dict | None = None) -> list[SearchResponse]:
        """:meth:`search` for many queries of one modality at once (one snapshot, batched encoders).
        ``cache`` (a dict kept by the caller) reuses query embeddings across calls with the same
        queries and models (benchmarks that search one query set many times)."""
        if (texts is None) == (images is None):
            raise ValueError("give exactly one of texts= or images=")
        qmod = "text" if texts is not None else "image"
        inputs = list(texts if texts is not None else images)
        if not inputs:
            return []
        k = int(k)
        if not 1 <= k <= self.limits.max_k:
            raise ValueError(f"k must be between 1 and {self.limits.max_k}, got {k}")
        filter = check_filter(filter)
        snap = self.collection.snapshot()
        prep = self._prepare(snap, qmod, target, filter)
        gmod, method, views = prep.gmod, prep.method, prep.views
        if cache is not None:
            cache = cache.setdefault((qmod, hash(tuple(str(x) for x in inputs))), {})
        depth = max(k, self.rerank_k) if self.rerank else k
        if cache is None:  # the spaces' query sides embed with each encoder once
            cache = {}
        asked = [(sid, side, views[sid], side.embed(qmod, inputs, cache), mask) for sid, side, mask, _ in prep.spaces]
        searched = [(sid, side, view, res) for (sid, side, view, _, _), res in zip(asked, search_spaces(asked, gmod, depth))]
        if len(searched) == 1 and len(inputs) == 1 and not self.rerank:  # the hot path: one query, one list
            sid, side, view, res = searched[0]
            fields = snap.hit_fields(view.rids[res.positions[0]].tolist())
            if fields is not None:  # its hits made in C (None: a row deleted since the snapshot's rows were read)
                hits = list(map(tuple.__new__, repeat(Hit), zip(count(1), res.scores.tolist()[0], fields[0::2],
                                                                repeat(sid), repeat(side.route), fields[1::2])))
                return [self._response(snap, qmod, prep, inputs[0], hits)]
        kw = {"score_maps": prep.maps, "shares": prep.shares, "prefer": prep.prefer}
        out, make = [], tuple.__new__
        for qi, query in enumerate(inputs):  # plain loops: every search of several spaces (a backfill) runs this
            ranked = []
            for sid, side, view, res in searched:
                scores, positions = res.scores[qi], res.positions[qi]
                if self.rerank and side.route in RERANKED:
                    scores, positions = self._rerank(view, side, gmod, query, res, qi, k)
                if depth > k:  # (searched deeper for the re-ranking)
                    positions = positions[:k]
                    scores = scores[:len(positions)]
                ranked.append((sid, side.route, scores.tolist(), view.rids[positions].tolist()))
            lists = named_lists(snap, ranked)
            # one list: every merge keeps its order
            top = lists.popitem()[1][:k] if len(lists) == 1 else merge(lists, k, method, **kw)
            hits = [make(Hit, (r, c.score, c.item_id, c.space, c.route, c.metadata)) for r, c in enumerate(top, 1)]
            out.append(self._response(snap, qmod, prep, query, hits))
        return out

    @staticmethod
    def _response(snap: Snapshot, qmod: str, prep: "_Prepared", query: Any, hits: list[Hit]) -> SearchResponse:
        """The response of one query from its ranked hits."""
        label = query if isinstance(query, str) else str(getattr(query, "filename", "") or "<image>")
        return SearchResponse(query=label if qmod == "text" else str(label), modality=prep.gmod,
                              direction=prep.direction, hits=hits, merge=prep.method, generation=snap.generation,
                              applied=prep.applied)

    def _applied(self, sides: Sequence[tuple[str, QuerySide]]) -> list[dict[str, Any]]:
        """What refines or re-ranks the searches of ``sides`` (``(space, query side)``) beyond their routes,
        labelled as ``eval retrieval`` labels its rows (trial Y: ``search --reco`` / ``--rerank`` said
        ``"route": "native"`` only, as a plain search does)."""
        out: list[dict[str, Any]] = []
        if refined := [sid for sid, side in sides if side.refined()]:
            out.append({"step": "reco", "label": getattr(self._refine, "label", "reco"),
                        "reco": getattr(self._refine, "path", None), "spaces": refined})
        if reranked := [sid for sid, side in sides if self.rerank and side.route in RERANKED]:
            w = self.rerank_weight
            out.append({"step": "rerank", "label": f"rerank({self.rerank}, top {self.rerank_k}, weight {w:g})",
                        "rerank": self.rerank, "rerank_k": self.rerank_k, "weight": w if np.isfinite(w) else str(w),
                        "spaces": reranked})
        return out

    def _prepare(self, snap: Snapshot, qmod: str, target: str | None, flt: Mapping[str, Any] | None) -> "_Prepared":
        """What every query of one kind needs from a snapshot -- the target modality, the spaces to
        search with their query sides and masks, the merge -- worked out once per snapshot."""
        key = (qmod, target, repr(sorted(flt.items())) if flt else "")
        cached = self._prepared
        if cached[0] is not snap:
            cached = self._prepared = (snap, {})
        prep = cached[1].get(key)
        if prep is not None:
            return prep
        gmod = self._target(snap, qmod, target)
        direction = direction_of(qmod, gmod)
        plan = self._plan(snap)
        if not plan.current_space.embeds(qmod):  # (it named a route from a space to itself, "routes: none")
            raise ValueError(f"the current model ({plan.current_space.name}) embeds "
                             f"{' and '.join(plan.current_space.modalities)} only: it cannot embed {'an' if qmod == 'image' else 'a'} "
                             f"{qmod} query")
        views = snap.views(gmod)
        spaces = []
        for sid, view in views.items():
            if flt:
                mask = snap.filtered_mask(view, flt)  # the filter runs in the catalog's database
                n_allowed = int(np.count_nonzero(mask))
            else:  # never None: rows the store gained after this snapshot must stay out
                mask, n_allowed = view.mask, view.count
            if n_allowed:
                spaces.append((sid, self._side(snap, sid, direction), mask, n_allowed))
        total = sum(n for *_, n in spaces) or 1
        method, maps = self.merge_override or plan.merge_method or DEFAULT_MERGE, _score_maps(plan, direction)
        unmapped = any((sid, side.route) not in maps for sid, side, *_ in spaces)
        if method == "calibrated" and len(spaces) > 1 and unmapped:
            method = "raw"  # a list without its map (a route pinned since) would set raw scores against chances
        prep = _Prepared(gmod=gmod, direction=direction, views=views, spaces=spaces, method=method, maps=maps,
                         shares={sid: n / total for sid, *_, n in spaces}, prefer=snap.preference(),
                         applied=self._applied([(sid, side) for sid, side, *_ in spaces]))
        if len(cached[1]) < 64:
            cached[1][key] = prep
        return prep

    def _rerank(self, view, side: QuerySide, gmod: str, query: Any, res, qi: int, k: int):
        """CMLI re-ranking (the Target-CMLI paper) of one query's first-stage list in one space."""
        from ..gallery.types import SearchResult
        from ..late.rerank import rerank_search

        first = SearchResult(scores=res.scores[qi:qi + 1], ids=[res.ids[qi]], positions=res.positions[qi:qi + 1])
        out = rerank_search(view.gallery, side.direct, gmod, query if isinstance(query, str) else str(query), first,
                            k, self.rerank_weight, self.rerank)
        return out.scores[0], out.positions[0]


def explicit_plan(spaces: Sequence[Space], query_ref: str, query_model: DualEncoder,
                  upgrades: Sequence[UpgradeRecord]) -> Plan:
    """A plan (to plan routes on) whose current model is ``query_model`` (loaded under ``query_ref``)
    over ``spaces``, with ``upgrades`` only: queries reach a space natively or through those upgrades."""
    q = query_model
    if any(s.space_id == q.space_id for s in spaces):  # the query model is a space's own model: use the loaded one
        spaces = [dataclasses.replace(s, model=query_ref, retired=False) if s.space_id == q.space_id else s
                  for s in spaces]
    else:
        spaces = [*spaces, Space(space_id=q.space_id, model=query_ref, dim=int(q.embed_dim), dir="-",
                                 modalities=tuple(getattr(q, "modalities", ("image", "text"))),
                                 name=getattr(q, "name", ""))]
    return Plan(current=q.space_id, spaces=tuple(spaces), upgrades=tuple(upgrades))


def query_side_for(query_model: DualEncoder, gallery_space: str, *, bridges: Sequence[str | Path] = (),
                   reco: str | Path | None = None, direction: str = "t2i",
                   pool: ModelPool | None = None, gallery_name: str = "") -> QuerySide:
    """The query pipeline of ``nobackfill search`` / ``eval retrieval`` without a collection: the
    queries of ``query_model`` into ``gallery_space`` (natively, or through ``bridges``; refined by
    ``reco``). Raises :class:`SpaceMismatchError`, naming every space, when no given bridge reaches it."""
    from ..compat.upgrade import load_upgrade

    pool = pool or ModelPool()
    ref = f"<{getattr(query_model, 'name', 'query model')}>"
    pool.put(ref, query_model)
    ups = [load_upgrade(b) for b in bridges]
    _check_upgrades(ups, query_model, _named(gallery_space, gallery_name))
    gallery = Space(space_id=gallery_space, model="-", dim=0, dir="-")
    plan = explicit_plan([gallery], ref, query_model, [upgrade_entry(u) for u in ups])
    refine = reco_refiner(Path(reco), {query_model.space_id} | {u.target_id for u in ups if not u.is_bridge}) \
        if reco is not None else None
    planner = RoutePlanner(plan, pool, refine=refine)
    if gallery_space == query_model.space_id:
        return planner.query_side(gallery_space, direction, NATIVE)
    if BRIDGE not in planner.available(gallery_space, direction):
        raise SpaceMismatchError(gallery_space, query_model.space_id, "embed queries for the gallery",
                                 what="query model's embeddings", expected_name=gallery_name,
                                 other_name=getattr(query_model, "name", ""),
                                 hint=f"{_maps(ups)}: no chain of them reaches the gallery" if ups else
                                 "embed them with the gallery's model or pass a bridge (--bridge)")
    return planner.query_side(gallery_space, direction, BRIDGE)


def _named(space_id: str, name: str = "") -> str:
    return f"{space_id} ({name})" if name else space_id


def _maps(ups: Sequence[Any]) -> str:
    """What the upgrades ``ups`` map, from and to, in words (for the errors)."""
    return "; ".join(f"{u.directory} maps {_named(u.source_id, u.source.get('name', ''))} to "
                     f"{_named(u.target_id, u.target.get('name', ''))}" for u in ups)


def _check_upgrades(ups: Sequence[Any], encoder: DualEncoder, gallery: str = "") -> None:
    if sum(1 for u in ups if not u.is_bridge) > 1:
        raise ValueError("at most one encoder upgrade (xbt / direct-*) can be applied to a model")
    for u in ups:
        if not u.is_bridge and u.source_id != encoder.space_id:
            raise SpaceMismatchError(u.source_id, encoder.space_id, f"apply upgrade {u.directory}",
                                     what="query model's embeddings", expected="upgrade's source (its new model)",
                                     expected_name=u.source.get("name", ""), other_name=getattr(encoder, "name", ""),
                                     hint=_maps([u]) + (f"; the gallery is in space {gallery}" if gallery else "")
                                     + "; give the query model the upgrade was trained for")


def _score_maps(plan: Plan, direction: str) -> dict[tuple[str, str], ScoreMap]:
    """``{(space, route): ScoreMap}`` of ``direction`` from the plan's calibration."""
    out = {}
    maps = plan.merge.score_maps if plan.merge is not None else {}
    for key, obj in (maps.get(direction) or {}).items():
        space, _, route = key.rpartition("/")
        out[(space, route)] = ScoreMap.from_json(obj)
    return out
