"""Where a collection's vectors are: the first space of the plan's serving order whose store holds
an item's key (the space that serves it), the catalog a conversion fills from that (a collection of
the previous format, a plain gallery), and the plan entry and directory of a new space."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..gallery.atomic_files import _now, _sha256
from ..catalog.catalog import Writer
from ..catalog.items import Item, _item_json
from ..catalog.plan import Plan, Space
from ..storage.base import SpaceStore, Storage
from ..gallery.manifest import MODALITIES

__all__ = ["SPACE_DIR"]

#: where a local collection keeps its spaces' stores
SPACE_DIR = "spaces"


def _gallery_header(storage: Storage, g: Any) -> dict[str, Any]:
    space = _space_entry(g.space_id, g.dim, g.model, Path(g.model).name, list(MODALITIES), ".")
    return {"name": Path(storage.location).resolve().name, "backend": g.backend,
            "created": g.manifest.get("created", _now()), "updated": _now(),
            "plan": Plan.single(space)}


def _filler(storage: Storage, header: dict[str, Any], items: Mapping[str, Any],
            docs: Mapping[str, bytes]) -> Callable[[Writer], None]:
    """Fills a new catalog: ``items`` (JSON objects) in order, each served by the first space of
    the plan holding its key, and ``docs``."""

    def fill(w: Writer) -> None:
        rows = [Item.from_json(obj, f"{storage} item") for obj in items.values()]
        placed = _locate_all(storage, header["plan"], rows)
        w.insert([_item_json(it) for it in rows], [placed.get((it.modality, it.key), (None, None)) for it in rows])
        for name, data in docs.items():
            w.put_doc(name, data)
        w.finish(_now())

    return fill


def _row_of(store: SpaceStore, pos: int) -> int | None:
    """What the catalog records of a store row: its position where the store keeps positions for
    ever (a gallery), else nothing (Milvus numbers rows per process; readers map keys)."""
    return pos if getattr(store, "stable_positions", False) else None


def _first_holders(plan: Plan, modality: str, keys: Sequence[str],
                   store: Callable[[str], SpaceStore | None]) -> dict[str, tuple[str, int | None]]:
    """Key -> (space, row as the catalog records it) of the first space in ``plan``'s serving order
    whose store (``store(space)``; None: none) holds it."""
    out: dict[str, tuple[str, int | None]] = {}
    todo = list(dict.fromkeys(keys))
    for sid in plan.serving_order():
        if not todo:
            break
        g = store(sid) if plan.space(sid).embeds(modality) else None
        if g is None:
            continue
        found = g.positions(modality, todo)
        out.update((k, (sid, _row_of(g, p))) for k, p in found.items())
        todo = [k for k in todo if k not in found]
    return out


def _locate_all(storage: Storage, plan: Plan, items: Sequence[Item]) -> dict[tuple[str, str], tuple]:
    """(modality, key) -> (space, row) for a conversion (no collection yet: stores opened from
    the plan's directories)."""
    dirs = {s.space_id: s.dir for s in plan.spaces}
    opened: dict[str, SpaceStore | None] = {}

    def store(sid: str) -> SpaceStore | None:
        if sid not in opened:
            opened[sid] = storage.open_space(dirs[sid]) if storage.has_space(dirs[sid]) else None
        return opened[sid]

    return {(m, k): v for m in MODALITIES
            for k, v in _first_holders(plan, m, [it.key for it in items if it.modality == m], store).items()}


def _space_dirname(space_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", space_id)
    return safe[:48] + "-" + _sha256(space_id.encode())[:8] if len(safe) > 48 or safe != space_id else safe


def _space_entry(space_id: str, dim: int, model: str, name: str, modalities: Sequence[str], directory: str) -> Space:
    if not isinstance(space_id, str) or not space_id:
        raise ValueError("space_id must be a non-empty string")
    if int(dim) <= 0:
        raise ValueError(f"dim must be positive, got {dim}")
    return Space(space_id=space_id, dim=int(dim), model=str(model), name=name or Path(str(model)).name,
                 modalities=tuple(modalities), dir=directory, created=_now())
