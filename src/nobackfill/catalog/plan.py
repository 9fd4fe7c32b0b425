"""A collection's serving plan as one immutable value (:class:`Plan`).

The plan says which embedding spaces a collection holds (:class:`Space`), which one is current
(new items and queries are embedded by its model), the upgrades registered between them
(:class:`UpgradeRecord`: encoder upgrades and vector bridges, XBT / phi / Procrustes), the route
chosen per (old space, query direction) with its calibration numbers (:class:`RouteChoice`), and
the merge of several spaces' hits (:class:`Merge`).

The catalog owns it: it is stored as JSON in the catalog's header (:meth:`Plan.to_json` /
:meth:`Plan.from_json`, the format of earlier releases) and changed only through
:meth:`~nobackfill.collection.collection.Collection.set_plan`, one transaction that maps the latest plan
to the next (``dataclasses.replace`` and the ``with_*`` helpers below build it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["Merge", "Plan", "PlanError", "RouteChoice", "Space", "UpgradeRecord"]

_MODALITIES = ("image", "text")


class PlanError(ValueError):
    """A plan that is not valid (the message names the field)."""


@dataclass(frozen=True)
class Space:
    """One embedding space of a collection: its model, its vector store's directory (relative to the
    collection) and whether it was retired (its vectors dropped)."""

    space_id: str
    dim: int
    model: str
    dir: str
    name: str = ""
    modalities: tuple[str, ...] = _MODALITIES
    created: str = ""
    retired: bool = False
    #: vectors imported into this space from elsewhere: per import, where from, how many, and the
    #: model check's verdict (or that it was skipped)
    imports: tuple[Mapping[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """``name (space id)``, as messages name a space."""
        return f"{self.name or Path(self.model).name} ({self.space_id})"

    def embeds(self, modality: str) -> bool:
        return modality in self.modalities

    def to_json(self) -> dict[str, Any]:
        out = {"space_id": self.space_id, "dim": self.dim, "model": self.model, "name": self.name,
               "modalities": list(self.modalities), "dir": self.dir, "created": self.created, "retired": self.retired}
        if self.imports:
            out["imports"] = [dict(i) for i in self.imports]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Space":
        if not (isinstance(obj, dict) and isinstance(obj.get("space_id"), str) and obj["space_id"]
                and isinstance(obj.get("dir"), str) and isinstance(obj.get("dim"), int) and obj["dim"] > 0):
            raise PlanError(f"plan.spaces: bad space entry {obj!r} (needs space_id, dir and a positive dim)")
        d = Path(obj["dir"])
        if d.is_absolute() or ".." in d.parts:
            raise PlanError(f"plan.spaces: space directory {obj['dir']!r} must lie inside the collection")
        mods = obj.get("modalities", _MODALITIES)
        if not isinstance(mods, (list, tuple)) or any(m not in _MODALITIES for m in mods):
            raise PlanError(f"plan.spaces: space {obj['space_id']}: modalities must be a subset of {_MODALITIES}, "
                            f"got {mods!r}")
        return cls(space_id=obj["space_id"], dim=int(obj["dim"]), model=str(obj.get("model", "")), dir=obj["dir"],
                   name=str(obj.get("name") or ""), modalities=tuple(mods), created=str(obj.get("created") or ""),
                   retired=bool(obj.get("retired")), imports=tuple(obj.get("imports") or ()))


@dataclass(frozen=True)
class UpgradeRecord:
    """A registered upgrade directory: an encoder upgrade of ``source``'s model (``encoder``) or a
    vector bridge from space ``source`` to space ``target``; ``directions``: the query directions it
    serves (a bridge fitted per direction; empty: every direction); ``info``: what a fitted bridge
    records (family, pairs, held-out score, when)."""

    path: str
    kind: str
    source: str
    target: str
    encoder: bool = False
    name: str = ""
    directions: tuple[str, ...] = ()
    info: Mapping[str, Any] | None = None

    def serves(self, direction: str | None) -> bool:
        return direction is None or not self.directions or direction in self.directions

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("directions", "info")}
        if self.directions:  # only then: plans of earlier releases keep their exact form
            out["directions"] = list(self.directions)
        if self.info is not None:
            out["info"] = dict(self.info)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "UpgradeRecord":
        if not (isinstance(obj, dict) and all(isinstance(obj.get(k), str) for k in ("path", "source", "target"))):
            raise PlanError(f"plan.upgrades: bad entry {obj!r} (needs path, source and target)")
        dirs = obj.get("directions") or ()
        if not isinstance(dirs, (list, tuple)) or not all(isinstance(d, str) for d in dirs):
            raise PlanError(f"plan.upgrades: directions must be a list of names, got {dirs!r}")
        info = obj.get("info")
        if info is not None and not isinstance(info, dict):
            raise PlanError(f"plan.upgrades: info must be an object, got {info!r}")
        return cls(path=obj["path"], kind=str(obj.get("kind", "")), source=obj["source"], target=obj["target"],
                   encoder=bool(obj.get("encoder")), name=str(obj.get("name") or ""), directions=tuple(dirs),
                   info=info)


@dataclass(frozen=True)
class RouteChoice:
    """The route chosen for one (old space, direction): by calibration or pinned by a user (``w``:
    a fused route's weight); ``calibration`` holds what was measured on the calibration split."""

    route: str | None = None
    w: float | None = None
    pinned: bool = False
    calibration: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route, "w": self.w, "pinned": self.pinned}
        if self.calibration is not None:
            out["calibration"] = dict(self.calibration)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "RouteChoice":
        if not isinstance(obj, dict):
            raise PlanError(f"plan.routes: a route entry must be an object, got {obj!r}")
        w = obj.get("w")
        return cls(route=obj.get("route"), w=None if w is None else float(w), pinned=bool(obj.get("pinned")),
                   calibration=obj.get("calibration"))


@dataclass(frozen=True)
class Merge:
    """How hits of several spaces are merged (``method``), with the per-direction score maps and the
    numbers that chose it on the calibration split."""

    method: str
    score_maps: Mapping[str, Any] = field(default_factory=dict)
    calibration: Mapping[str, Any] = field(default_factory=dict)
    fractions: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "score_maps": dict(self.score_maps), "calibration": dict(self.calibration),
                "fractions": list(self.fractions)}

    @classmethod
    def from_json(cls, obj: Any) -> "Merge | None":
        if obj is None:
            return None
        if not (isinstance(obj, dict) and isinstance(obj.get("method"), str)):
            raise PlanError(f"plan.merge: needs a method, got {obj!r}")
        return cls(method=obj["method"], score_maps=obj.get("score_maps") or {},
                   calibration=obj.get("calibration") or {}, fractions=tuple(obj.get("fractions") or ()))


@dataclass(frozen=True)
class Plan:
    """What a collection serves and how (see the module doc). Immutable: build the next one with
    ``dataclasses.replace`` or the ``with_*`` methods."""

    current: str
    spaces: tuple[Space, ...]
    upgrades: tuple[UpgradeRecord, ...] = ()
    routes: Mapping[str, Mapping[str, RouteChoice]] = field(default_factory=dict)
    merge: Merge | None = None
    calibration: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        ids = [s.space_id for s in self.spaces]
        if not ids:
            raise PlanError("plan.spaces must list at least one space")
        if len(set(ids)) != len(ids):
            raise PlanError("plan.spaces lists a space twice")
        if self.current not in ids:
            raise PlanError(f"plan.current {self.current!r} is not one of the plan's spaces ({', '.join(ids)})")
        if self.space(self.current).retired:
            raise PlanError("the current space cannot be retired")

    # ------------------------------------------------------------------ reading
    def space(self, space_id: str) -> Space:
        """The entry of ``space_id``; ``KeyError`` naming the known spaces."""
        for s in self.spaces:
            if s.space_id == space_id:
                return s
        raise KeyError(f"no space {space_id} in the plan (spaces: {', '.join(s.space_id for s in self.spaces)})")

    def has(self, space_id: str) -> bool:
        return any(s.space_id == space_id for s in self.spaces)

    @property
    def space_ids(self) -> list[str]:
        return [s.space_id for s in self.spaces]

    @property
    def current_space(self) -> Space:
        return self.space(self.current)

    def old_spaces(self) -> list[Space]:
        """The spaces other than the current one that still hold vectors."""
        return [s for s in self.spaces if s.space_id != self.current and not s.retired]

    def serving_order(self) -> list[str]:
        """Space ids in serving order: the current space, then the others (not retired) newest
        first. An item is served by the first of them whose store holds its vector."""
        live = [s.space_id for s in self.spaces if not s.retired]
        return [self.current] + [s for s in reversed(live) if s != self.current]

    def route(self, space_id: str, direction: str) -> RouteChoice | None:
        """The choice recorded for (``space_id``, ``direction``), if any."""
        return self.routes.get(space_id, {}).get(direction)

    @property
    def merge_method(self) -> str | None:
        return self.merge.method if self.merge is not None else None

    # ------------------------------------------------------------------ the next plan
    def with_space(self, space: Space, *, current: bool = False) -> "Plan":
        """This plan with ``space`` appended (and made current with ``current``)."""
        return dataclasses.replace(self, spaces=(*self.spaces, space),
                                   current=space.space_id if current else self.current)

    def with_upgrades(self, records: Iterable[UpgradeRecord]) -> "Plan":
        """This plan with ``records`` registered (those of a directory already listed skipped)."""
        ups = {u.path: u for u in self.upgrades}
        for r in records:
            ups.setdefault(r.path, r)
        return dataclasses.replace(self, upgrades=tuple(ups.values()))

    def with_fitted(self, record: UpgradeRecord) -> "Plan":
        """This plan with the fitted bridge ``record`` in place of any fitted one for the same
        (source, target, directions): one swap, the older artifact kept on disk until retire."""
        keep = tuple(u for u in self.upgrades if not (u.kind == "fitted" and u.source == record.source
                                                      and u.target == record.target and u.directions == record.directions))
        return dataclasses.replace(self, upgrades=(*keep, record))

    def with_route(self, space_id: str, direction: str, choice: RouteChoice | None) -> "Plan":
        """This plan with ``choice`` recorded for (``space_id``, ``direction``) (None: removed)."""
        routes = {s: dict(d) for s, d in self.routes.items()}
        if choice is None:
            routes.get(space_id, {}).pop(direction, None)
        else:
            routes.setdefault(space_id, {})[direction] = choice
        return dataclasses.replace(self, routes={s: d for s, d in routes.items() if d})

    def pinned_only(self) -> "Plan":
        """This plan with every route choice dropped but the pinned ones, and no merge or
        calibration (what an upgrade starts from: the numbers were measured for another model)."""
        routes = {s: {d: r for d, r in dirs.items() if r.pinned} for s, dirs in self.routes.items()}
        return dataclasses.replace(self, routes={s: d for s, d in routes.items() if d}, merge=None, calibration=None)

    def with_import(self, space_id: str, record: Mapping[str, Any]) -> "Plan":
        """This plan with an import into ``space_id`` recorded."""
        return dataclasses.replace(self, spaces=tuple(
            dataclasses.replace(s, imports=(*s.imports, dict(record))) if s.space_id == space_id else s
            for s in self.spaces))

    def retire(self, space_id: str) -> "Plan":
        """This plan with ``space_id`` retired (its routes dropped, and the bridges fitted into it: they
        served its routes alone; a bridge the user registered stays, it is the user's file)."""
        spaces = tuple(dataclasses.replace(s, retired=True) if s.space_id == space_id else s for s in self.spaces)
        ups = tuple(u for u in self.upgrades if not (u.kind == "fitted" and u.target == space_id))
        return dataclasses.replace(self, spaces=spaces, upgrades=ups,
                                   routes={s: d for s, d in self.routes.items() if s != space_id})

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The stored form (that of earlier releases, so older readers keep working)."""
        return {"current": self.current, "spaces": [s.to_json() for s in self.spaces],
                "upgrades": [u.to_json() for u in self.upgrades],
                "routes": {s: {d: r.to_json() for d, r in dirs.items()} for s, dirs in self.routes.items()},
                "merge": self.merge.to_json() if self.merge is not None else None,
                "calibration": dict(self.calibration) if self.calibration is not None else None}

    @classmethod
    def from_json(cls, obj: Any) -> "Plan":
        """Parse a stored plan; :class:`PlanError` names what is wrong."""
        if not isinstance(obj, dict):
            raise PlanError("plan must be an object")
        spaces = obj.get("spaces")
        if not isinstance(spaces, list) or not spaces:
            raise PlanError("plan.spaces must be a non-empty list")
        routes = obj.get("routes") or {}
        if not isinstance(routes, dict) or not all(isinstance(d, dict) for d in routes.values()):
            raise PlanError("plan.routes must map a space to {direction: route entry}")
        cal = obj.get("calibration")
        if cal is not None and not isinstance(cal, dict):
            raise PlanError("plan.calibration must be an object")
        return cls(current=obj.get("current"), spaces=tuple(Space.from_json(s) for s in spaces),
                   upgrades=tuple(UpgradeRecord.from_json(u) for u in obj.get("upgrades") or ()),
                   routes={s: {d: RouteChoice.from_json(r) for d, r in dirs.items()} for s, dirs in routes.items()},
                   merge=Merge.from_json(obj.get("merge")), calibration=cal)

    @classmethod
    def single(cls, space: Space) -> "Plan":
        """The plan of a collection with one space."""
        return cls(current=space.space_id, spaces=(space,))

