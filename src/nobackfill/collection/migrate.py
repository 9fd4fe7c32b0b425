"""Reading collections of the previous format, once, into a catalog.

Format 1 kept a collection's state in ``collection.json`` (the plan and the list of item-log chunks
with their sha256) and ``log/<generation>.jsonl`` (item events), replayed at every open; its backfill
documents lay under ``backfill/``. A plain single-space gallery directory opened as a one-space
collection whose items were its rows (``key == id``). :func:`read_v1` and :func:`gallery_items`
read those; :meth:`~nobackfill.collection.collection.Collection.open` writes what they return into a new
catalog (atomically: the old files stay until the catalog is in place) and never reads them again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..catalog.plan import Plan
from ..gallery.gallery import Gallery
from ..gallery.manifest import MODALITIES

__all__ = ["V1", "gallery_items", "read_v1"]

FORMAT = "nobackfill-collection"
VERSION = 1


class V1:
    """What a format-1 collection held: its manifest fields, live items (the log replayed, as
    ``{id: item json}`` in log order) and backfill documents (``{name: bytes}``)."""

    def __init__(self, manifest: dict[str, Any], items: dict[str, dict[str, Any]], docs: dict[str, bytes]) -> None:
        self.manifest = manifest
        self.items = items
        self.docs = docs


def read_v1(storage: Any, error: type[Exception]) -> V1 | None:
    """The format-1 state in ``storage`` (None if it holds none); ``error`` names a damaged file."""
    data = storage.read_manifest()
    if data is None:
        return None
    where = f"{storage}/collection.json"
    try:
        m = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{where}: unreadable ({e})") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION:
        raise error(f"{where}: not a {FORMAT} file of version {VERSION}")
    try:
        for key, typ in (("name", str), ("backend", str), ("generation", int), ("log", list), ("plan", dict)):
            if not isinstance(m.get(key), typ):
                raise ValueError(f"field {key!r} missing or not {typ.__name__}")
        m["plan"] = Plan.from_json(m["plan"])
    except ValueError as e:
        raise error(f"corrupt collection manifest {where}: {e}") from e
    items: dict[str, dict[str, Any]] = {}
    for entry in m["log"]:
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise error(f"{where}: bad log entry {entry!r}")
        try:
            chunk = storage.read_chunk(name)
        except OSError as e:
            raise error(f"cannot read committed log chunk {storage}/{name}: {e.strerror or e}") from e
        if hashlib.sha256(chunk).hexdigest() != entry.get("sha256"):
            raise error(f"log chunk {storage}/{name} does not match the sha256 in collection.json (changed or "
                        "damaged on disk)")
        for no, line in enumerate(chunk.decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{storage}/{name} line {no}: invalid JSON ({e})") from None
            if not isinstance(ev, dict) or ev.get("op") not in ("put", "delete"):
                raise error(f"{storage}/{name} line {no}: an event must be an object with op 'put' or 'delete'")
            if ev["op"] == "put":
                it = ev.get("item")
                if not isinstance(it, dict) or not isinstance(it.get("id"), str):
                    raise error(f"{storage}/{name} line {no}: a put needs an item with an id")
                items[it["id"]] = it
            else:
                items.pop(ev.get("id"), None)
    docs = {name: storage.read_doc(name) or b"" for name in storage.list_docs("backfill/")}
    return V1(m, items, docs)


def gallery_items(g: Gallery) -> dict[str, dict[str, Any]]:
    """The rows of a plain gallery as items (``key == id``; sources from their metadata)."""
    items: dict[str, dict[str, Any]] = {}
    for modality in MODALITIES:
        for id_, meta in zip(g.ids(modality), g.metadata(modality)):
            want = "path" if modality == "image" else "text"
            items[id_] = {"id": id_, "modality": modality, "key": id_, "source": {want: str(meta.get(want, ""))},
                          "metadata": dict(meta)}
    return items
