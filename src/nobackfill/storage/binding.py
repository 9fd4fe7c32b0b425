"""Which vectors a catalog in a database belongs to.

A PostgreSQL catalog is named by the collection's name (``#photos``) in its database, whatever
comes before the ``#``: ``milvus-lite:/a.db#photos?catalog=postgresql://...`` and
``milvus://host:19530#photos?catalog=postgresql://...`` name the same catalog. Without a check, a
typo in the vector part (a host, a port, a file) opened the catalog with no vectors behind it, or
with another collection's, and an upgrade through it committed a space whose store then lived
elsewhere (trial Q). So a collection created with a database catalog records, in a catalog document,
where its vectors are (``kind``, ``where``) and a random ``uid`` that its vector store holds too (a
document in Milvus, a file in a directory). Opening it elsewhere is refused, naming both locations:

- another kind of vector store (a directory, milvus-lite, a Milvus server): refused at open;
- milvus-lite (a file on one machine): another file is refused at open;
- a directory or a Milvus server, which several machines may reach by other paths or host names:
  their store's ``uid`` must match (a directory's at open; a server's at open when the URI names
  another address than the one recorded, else when it is first connected to, so that a command
  reading only the catalog through the recorded address connects to nothing).

A catalog created before this check has no such document and is opened as before. A copy of a
directory (``cp -a``) holds the same mark: the catalog cannot tell it from its own directory mounted
elsewhere, so a copy must not be opened with the catalog (copy the catalog too, into SQLite or another
database, for a second collection).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..catalog.catalog import Catalog

__all__ = ["BINDING_DOC", "STORE_MARK", "WrongVectorsError", "bound_fill", "check_binding", "new_uid",
           "wrong_store"]

#: the catalog document: ``{"kind", "where", "uid"}``
BINDING_DOC = "storage/vectors.json"
#: the name of the store's own mark (a Milvus document; a directory's file is ``.`` + it)
STORE_MARK = "nobackfill-vectors-uid"


class WrongVectorsError(ValueError):
    """A catalog opened through a location that does not hold its collection's vectors."""

    field = "collection"


def new_uid() -> str:
    return uuid.uuid4().hex


def bound_fill(fill: Callable[[Any], None] | None, kind: str, where: str, uid: str) -> Callable[[Any], None]:
    """``fill`` (a catalog's first rows) plus the binding document, in the create's one transaction."""
    doc = json.dumps({"kind": kind, "where": where, "uid": uid}, sort_keys=True).encode()

    def both(writer: Any) -> None:
        if fill is not None:
            fill(writer)
        writer.put_doc(BINDING_DOC, doc)

    return both


def check_binding(catalog: "Catalog", location: str, kind: str, where: str, *,
                  same_where: bool) -> tuple[str, str] | None:
    """``(uid, where)``: the mark the store must hold and where the catalog says it is (None: a
    catalog from before the check, opened as it is); :class:`WrongVectorsError` if ``catalog``
    belongs to another kind of store, or (``same_where``) to another one of this kind."""
    raw = catalog.read_doc(BINDING_DOC)
    if raw is None:
        return None
    got = json.loads(raw)
    if got.get("kind") != kind or (same_where and got.get("where") != where):
        raise WrongVectorsError(f"{location}: the catalog {catalog.location} holds a collection whose vectors are "
                                f"at {got.get('where')}, not at {where}: name that location (two locations never "
                                "open one collection)")
    return str(got.get("uid") or ""), str(got.get("where"))


def wrong_store(location: str, catalog: "Catalog", where: str, found: str | None) -> WrongVectorsError:
    """The refusal of a store that does not hold ``catalog``'s mark (``found``: its own, or None),
    naming where the catalog says its vectors are."""
    what = "holds another collection's vectors" if found else "holds no vectors of this collection"
    raw = catalog.read_doc(BINDING_DOC)
    there = str(json.loads(raw).get("where")) if raw else "elsewhere"
    return WrongVectorsError(f"{location}: {where} {what}; the catalog {catalog.location} is the catalog of the "
                             f"collection whose vectors are at {there} (recorded when it was created): name that "
                             "location (two locations never open one collection)")
