"""Routes: how a query reaches a gallery space, and the query pipeline that search, ``eval`` and the
benchmarks share.

For a query embedded by the collection's current model and a space ``S`` of the collection:

* ``native`` - ``S`` is the current model's space: the query as embedded.
* ``old-model`` - the query embedded by ``S``'s own model, kept warm (old/old quality).
* ``bridge`` - the current model's query carried into ``S`` by registered upgrades: at most one
  encoder upgrade applied to the current model (XBT, Jang & Lim 2024, Eq. 4: ``phi(E_new(x))`` with the
  upgrade's adapters on), then vector bridges (phi, Procrustes, SLERP) along the shortest chain.
* ``fused`` - the score-level combination ``s = (1 - w) s_old + w s_bridge``. Both queries live in
  ``S``, and a score is an inner product, so ``s = <(1 - w) q_old + w q_bridge, v>``: one search
  with the combined query gives every item's fused score exactly. ``w`` is chosen per direction on a
  calibration split (:mod:`nobackfill.lifecycle.calibrate`), never on the evaluated one.

Directions name the query and gallery modalities: ``t2i``, ``i2t``, ``t2t``, ``i2i``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..encoders.base import DualEncoder, encode
from ..catalog.plan import Plan, RouteChoice, UpgradeRecord
from ..gallery.types import SpaceMismatchError
from .models import ModelPool
from .query_cache import QueryCache

__all__ = ["BRIDGE", "DIRECTIONS", "FUSED", "NATIVE", "OLD_MODEL", "ROUTES", "BridgePath", "NoRouteError",
           "QuerySide", "RoutePlanner", "direction_of", "find_bridge", "reco_refiner"]

NATIVE, OLD_MODEL, BRIDGE, FUSED = "native", "old-model", "bridge", "fused"
#: the routes to a space that is not the query model's own
ROUTES = (OLD_MODEL, BRIDGE, FUSED)
DIRECTIONS = {"t2i": ("text", "image"), "i2t": ("image", "text"), "t2t": ("text", "text"), "i2i": ("image", "image")}
#: the route a space gets when no calibration chose one (and ``bridge`` is not available)
DEFAULT_ROUTE = BRIDGE
#: the weight of a fused route asked for without one (no pin, no calibration)
DEFAULT_FUSED_WEIGHT = 0.5

Refine = Callable[[np.ndarray, str, str], np.ndarray]


class NoRouteError(SpaceMismatchError):
    """No route reaches a space for a direction (e.g. a text-only old model and image queries)."""


def direction_of(query_modality: str, gallery_modality: str) -> str:
    for name, pair in DIRECTIONS.items():
        if pair == (query_modality, gallery_modality):
            return name
    raise ValueError(f"no direction from {query_modality!r} queries to {gallery_modality!r} items")


def _embeds(encoder: DualEncoder, modality: str) -> bool:
    return modality in tuple(getattr(encoder, "modalities", ("image", "text")))


# ----------------------------------------------------------------------------- bridge chains
@dataclass(frozen=True)
class BridgePath:
    """Upgrades that take the current model's queries into a target space: an optional encoder
    upgrade (applied to the model) and vector bridges (applied to its outputs), in order."""

    encoder_upgrade: str | None
    vector_upgrades: tuple[str, ...]

    def describe(self) -> list[str]:
        return ([self.encoder_upgrade] if self.encoder_upgrade else []) + list(self.vector_upgrades)


def find_bridge(upgrades: Sequence[UpgradeRecord], source: str, target: str,
                direction: str | None = None) -> BridgePath | None:
    """The shortest chain of registered ``upgrades`` from queries of the model of space ``source``
    to space ``target`` (for ``direction``: only upgrades that serve it; a bridge fitted for one
    direction is preferred to a general one of the same length)."""
    upgrades = [u for u in upgrades if u.serves(direction)]
    if direction is not None:  # bridges fitted for this direction first: the shortest chain takes the first found
        upgrades = sorted(upgrades, key=lambda u: not u.directions)
    vector = [u for u in upgrades if not u.encoder]
    starts: list[tuple[str | None, str]] = [(None, source)]
    starts += [(u.path, u.target) for u in upgrades if u.encoder and u.source == source]
    best: BridgePath | None = None
    for enc_path, start in starts:
        chain = _vector_chain(vector, start, target)
        if chain is None or (enc_path is None and not chain):
            continue  # no chain, or source == target (that is the native route, not a bridge)
        cand = BridgePath(enc_path, tuple(chain))
        if best is None or len(cand.describe()) < len(best.describe()):
            best = cand
    return best


def _vector_chain(vector: Sequence[UpgradeRecord], start: str, target: str) -> list[str] | None:
    from ..compat.bridges import shortest_chain

    return shortest_chain(lambda s: [(u.target, u.path) for u in vector if u.source == s], start, target)


# ----------------------------------------------------------------------------- query sides
class QuerySide:
    """Embeds queries into space ``space_id`` along ``route``.

    ``direct`` embeds straight into the space (native / old-model); ``bridged`` is the encoder of a
    bridge route (the current model, upgraded or not) and ``bridge`` the vector bridge after it
    (None when the encoder upgrade lands in the space); ``fused`` uses both with ``weight``.
    ``refine`` (RECO, Iscen et al. 2023) refines an encoder's outputs in its own space before any vector
    bridge: ``refine(vectors, modality, space_id)``.
    """

    def __init__(self, space_id: str, route: str, *, direct: DualEncoder | None = None,
                 bridged: DualEncoder | None = None, bridge: Any = None, weight: float | None = None,
                 path: BridgePath | None = None, refine: Refine | None = None,
                 text_cache: QueryCache | None = None) -> None:
        if route in (NATIVE, OLD_MODEL) and direct is None:
            raise ValueError(f"route {route} needs the space's own encoder")
        if route in (BRIDGE, FUSED) and bridged is None:
            raise ValueError(f"route {route} needs a bridge")
        if route == FUSED and (direct is None or weight is None or not 0.0 <= weight <= 1.0):
            raise ValueError(f"route fused needs the old model and a weight in [0, 1], got {weight}")
        self.space_id, self.route = space_id, route
        self.direct, self.bridged, self.bridge = direct, bridged, bridge
        self.weight, self.path, self.refine = weight, path, refine
        self.text_cache = text_cache  # repeated text queries are not embedded again
        self._can_embed: dict[str, bool] = {}  # modality -> whether every encoder of the route embeds it

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route}
        if self.route == FUSED:
            out["w"] = self.weight
        if self.path is not None:
            out["bridges"] = self.path.describe()
        return out

    def encoders(self) -> list[DualEncoder]:
        return [e for e in (self.direct, self.bridged) if e is not None]

    def refined(self) -> bool:
        """Whether RECO refines this side's queries: a refiner of one space (:func:`reco_refiner`) refines
        the outputs of an encoder of that space only."""
        space = getattr(self.refine, "space_id", None)
        return self.refine is not None and (space is None or any(e.space_id == space for e in self.encoders()))

    def can_embed(self, modality: str) -> bool:
        known = self._can_embed
        if modality not in known:
            known[modality] = all(_embeds(e, modality) for e in self.encoders())
        return known[modality]

    def _run(self, encoder: DualEncoder, modality: str, inputs: Sequence[Any], cache: dict | None) -> np.ndarray:
        key = (id(encoder), modality)
        if cache is not None and key in cache:
            return cache[key]
        if modality == "text" and self.text_cache is not None:
            q = self.text_cache.embed_texts(encoder, inputs)
        else:
            q = encode(encoder, modality, inputs)
        if self.refine is not None:
            q = self.refine(q, modality, encoder.space_id)
        if cache is not None:
            cache[key] = q
        return q

    def _bridged(self, modality: str, inputs: Sequence[Any], cache: dict | None) -> np.ndarray:
        q = self._run(self.bridged, modality, inputs, cache)
        return q if self.bridge is None else np.asarray(self.bridge(q), np.float32)

    def embed(self, modality: str, inputs: Sequence[Any], cache: dict | None = None) -> np.ndarray:
        """Query vectors in :attr:`space_id` for ``inputs`` (texts, or image paths / PIL images).
        ``cache`` (a dict shared by the query sides of one search) embeds each encoder once."""
        if not (self._can_embed.get(modality) or self.can_embed(modality)):
            names = ", ".join(getattr(e, "name", type(e).__name__) for e in self.encoders())
            raise NoRouteError(self.space_id, "?", f"embed {modality} queries for space {self.space_id}",
                               what=f"{modality} queries", hint=f"route {self.route} uses {names}, which cannot "
                                                                f"embed {modality}s")
        if self.route in (NATIVE, OLD_MODEL):
            return self._run(self.direct, modality, inputs, cache)
        if self.route == BRIDGE:
            return self._bridged(modality, inputs, cache)
        w = float(self.weight)
        cache = {} if cache is None else cache  # the two encoders may be one: it embeds once
        return ((1.0 - w) * self._run(self.direct, modality, inputs, cache)
                + w * self._bridged(modality, inputs, cache)).astype(np.float32)


# ----------------------------------------------------------------------------- planning
class RoutePlanner:
    """Routes of one collection plan (its current model, spaces and registered upgrades) over a
    :class:`~nobackfill.search.models.ModelPool`."""

    def __init__(self, plan: Plan, pool: ModelPool, refine: Refine | None = None) -> None:
        self.plan, self.pool, self.refine = plan, pool, refine
        self.text_cache: QueryCache | None = getattr(pool, "query_cache", None)  # a pool-like stand-in may have none
        self._bridges: dict[tuple, Any] = {}

    @property
    def current(self) -> str:
        return self.plan.current

    def _queries(self, ref: str, space_id: str, what: str) -> DualEncoder:
        """The query encoder of the model at ``ref`` (ONNX Runtime where exported; a pool-like stand-in
        without :meth:`~nobackfill.search.models.ModelPool.query_encoder` gives its model)."""
        get = getattr(self.pool, "query_encoder", None) or self.pool.get
        return get(ref, space_id, what=what)

    def encoder(self, space_id: str) -> DualEncoder:
        """The own model of ``space_id`` as it embeds queries (warm)."""
        s = self.plan.space(space_id)
        return self._queries(s.model, space_id, f"model of space {s.name or space_id}")

    def bridge_path(self, space_id: str, direction: str | None = None) -> BridgePath | None:
        return find_bridge(self.plan.upgrades, self.current, space_id, direction)

    def available(self, space_id: str, direction: str) -> list[str]:
        """The routes to ``space_id`` usable for ``direction`` (model modalities considered; no
        model is loaded)."""
        qmod, gmod = DIRECTIONS[direction]
        space = self.plan.space(space_id)
        if not space.embeds(gmod):
            return []
        cur_ok = self.plan.current_space.embeds(qmod)
        if space_id == self.current:
            return [NATIVE] if cur_ok else []
        out = []
        if space.embeds(qmod):
            out.append(OLD_MODEL)
        if cur_ok and self.bridge_path(space_id, direction) is not None:
            out.append(BRIDGE)
            if OLD_MODEL in out:
                out.append(FUSED)
        return out

    def chosen(self, space_id: str, direction: str) -> tuple[str, float | None]:
        """The route (and fused weight) the plan chose for ``space_id`` and ``direction``; without
        a choice in the plan, :data:`DEFAULT_ROUTE` if available, else ``old-model``."""
        if space_id == self.current:
            return NATIVE, None
        avail = self.available(space_id, direction)
        entry = self.plan.route(space_id, direction)
        if entry is not None and entry.route in avail:
            return entry.route, entry.w
        if DEFAULT_ROUTE in avail:
            return DEFAULT_ROUTE, None
        if OLD_MODEL in avail:
            return OLD_MODEL, None
        raise NoRouteError(space_id, self.current, f"search space {space_id} with {direction} queries",
                           what="current model's queries",
                           hint="no route reaches it (register a bridge, or keep a model that embeds this modality)")

    def query_side(self, space_id: str, direction: str, route: str | None = None,
                   weight: float | None = None) -> QuerySide:
        """The query pipeline into ``space_id`` for ``direction`` along ``route`` (default: the
        chosen one)."""
        if route is None:
            route, weight = self.chosen(space_id, direction)
        avail = self.available(space_id, direction)
        if route not in avail:
            raise NoRouteError(space_id, self.current, f"use route {route!r} to space {space_id} for {direction}",
                               what="current model's queries", hint=f"available routes: {', '.join(avail) or 'none'}")
        if route == FUSED and weight is None:  # the pinned / chosen w, else the calibrated best, else 0.5
            entry = self.plan.route(space_id, direction) or RouteChoice()
            weight = entry.w
            if weight is None:
                weight = ((entry.calibration or {}).get(FUSED) or {}).get("w", DEFAULT_FUSED_WEIGHT)
        cur = self.plan.current_space
        current = self._queries(cur.model, self.current, "current model")
        if route == NATIVE:
            return QuerySide(space_id, NATIVE, direct=current, refine=self.refine, text_cache=self.text_cache)
        direct = self.encoder(space_id) if route in (OLD_MODEL, FUSED) else None
        bridged = bridge = path = None
        if route in (BRIDGE, FUSED):
            path = self.bridge_path(space_id, direction)
            bridged = (self.pool.upgraded(cur.model, path.encoder_upgrade, self.current)
                       if path.encoder_upgrade else current)
            bridge = self._vector_bridge(path.vector_upgrades, bridged.space_id, space_id)
        return QuerySide(space_id, route, direct=direct, bridged=bridged, bridge=bridge, weight=weight, path=path,
                         refine=self.refine, text_cache=self.text_cache)

    def _vector_bridge(self, dirs: Sequence[str], source: str, target: str):
        if not dirs:
            if source != target:
                raise SpaceMismatchError(target, source, "bridge queries", what="upgraded queries",
                                         hint="the encoder upgrade does not land in this space")
            return None
        key = tuple(dirs)
        if key not in self._bridges:
            from ..compat.bridges import BridgeRegistry
            from ..compat.upgrade import load_upgrade

            reg = BridgeRegistry.from_bridges(load_upgrade(d).bridge() for d in dirs)
            bridge = reg.resolve(source, target)
            want, out = self.plan.space(target).dim, getattr(bridge, "target_dim", None)
            if want and out and int(out) != int(want):
                raise ValueError(f"bridge {', '.join(str(d) for d in dirs)} outputs {out}-d vectors but space "
                                 f"{self.plan.space(target).name or target} holds {want}-d vectors: the "
                                 "bridge was fitted for another model")
            self._bridges[key] = bridge
        return self._bridges[key]


def reco_refiner(reco: Path, spaces: set[str]) -> Refine:
    """RECO's refinement (Iscen et al. 2023) of query vectors of its own space; refuses a RECO directory
    of a space none of ``spaces`` is. The refiner names its space (``space_id``) and itself (``label``,
    ``reco(DIR)``, as ``eval retrieval`` labels its rows)."""
    from ..reco.model import load_reco

    model, memory = load_reco(reco)
    if model.spec.space_id not in spaces:
        raise ValueError(f"{reco} refines space {model.spec.space_id}, but the query model is in "
                         f"{', '.join(sorted(spaces))}")

    def refine(vectors: np.ndarray, modality: str, space_id: str) -> np.ndarray:
        if space_id != model.spec.space_id:
            return vectors
        return np.asarray(model.refine(memory, vectors, modality), np.float32)

    refine.space_id, refine.path = model.spec.space_id, str(reco)  # type: ignore[attr-defined]
    refine.label = f"reco({Path(os.path.abspath(reco)).name or reco})"  # type: ignore[attr-defined]
    return refine


def upgrade_entry(upgrade: Any) -> UpgradeRecord:
    """The plan's record of a loaded :class:`~nobackfill.compat.upgrade.Upgrade`."""
    return UpgradeRecord(path=str(Path(upgrade.directory).resolve()), kind=upgrade.kind, source=upgrade.source_id,
                         target=upgrade.target_id, encoder=not upgrade.is_bridge, name=Path(upgrade.directory).name)
