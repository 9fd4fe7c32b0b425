"""Collections: the items of a gallery and their vectors in several embedding spaces at once.

A :class:`Collection` is what a live upgrade needs: after a better model is registered, items
embedded by the old model stay searchable (through a route, see :mod:`nobackfill.search`) while
new items, and later backfilled ones, live in the new model's space. It is two things:

* a **catalog** (:mod:`nobackfill.index.catalog`; SQLite ``catalog.sqlite`` in the collection's
  directory, or PostgreSQL for a collection shared by several machines): the items (id, modality,
  source reference, metadata, the *vector key* ``<id>#<rev>`` of their current version), the serving
  plan (spaces, current model, upgrades, routes, merge), which store row serves each item, and the
  backfill's documents. Opening reads its header; nothing is replayed.
* one **vector store per space** (a crash-safe :class:`~nobackfill.index.store.Gallery` under
  ``spaces/<space>/``, or a Milvus collection), whose rows are keyed by vector key, so an upserted
  item never reuses a vector of its old content.

The space that *serves* an item is the first space of the plan's preference order (current model
first, then the newer spaces before the older) whose store holds its key; the catalog keeps that
up to date at every commit (an item's row, and per store row the item it serves), so a reader never
derives it. Every live item is served by at most one space, so a search over all spaces returns it
at most once.

Every change is atomic and survives SIGKILL: vectors are committed to a space's store first (its
own atomic manifest), then one catalog transaction records the items and what serves them. A kill
before the transaction commits leaves vectors that no item references (invisible, and reused
without re-embedding when the item is added again).

A collection of the previous format (``collection.json`` + ``log/``) and a plain single-space
gallery directory are converted into a catalog the first time they are opened (:mod:`.migrate`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import orjson

from .backends import AUTO_GRAPH_AT, parse_spec, validate_spec
from .catalog import CATALOG_FILE, PAGE, Catalog, CatalogError, Row, Writer, memory_catalog, unsourced_sql
from .migrate import gallery_items, read_v1
from .plan import Plan, PlanError, Space
from .snapshot import EMPTY, HitTable, Snapshot, SpaceView
from .storage import MANIFEST_FILE as V1_FILE
from .storage import LocalStorage, SpaceStore, Storage, open_storage
from .store import MODALITIES, GalleryError

__all__ = [
    "CATALOG_FILE",
    "COLLECTION_FILE",
    "Collection",
    "CollectionError",
    "CollectionBusyError",
    "CorruptCollectionError",
    "Item",
    "ItemNotFoundError",
    "NotACollectionError",
    "Snapshot",
    "SpaceView",
    "is_collection",
    "vector_key",
]

log = logging.getLogger(__name__)

SPACE_DIR = "spaces"
#: the file whose presence means a (local) collection exists: its catalog
COLLECTION_FILE = CATALOG_FILE
INGEST_LOCK = "ingest"  # catalog lock names
MAX_ID_LENGTH = 512


class CollectionError(Exception):
    """Base class for collection problems."""


class NotACollectionError(CollectionError, FileNotFoundError):
    """The directory holds neither a collection nor a gallery."""


class CorruptCollectionError(CollectionError):
    """The catalog (or, when converting, ``collection.json`` or a log chunk) is unreadable or
    inconsistent."""


class ItemNotFoundError(CollectionError, KeyError):
    """No live item has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CollectionBusyError(CollectionError):
    """Another process holds the collection's ingest lock."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vector_key(item_id: str, rev: str) -> str:
    """The gallery row key of an item version: ``<id>#<rev>`` (``rev`` is hex, so unambiguous)."""
    return f"{item_id}#{rev}" if rev else item_id


def is_collection(path: str | Path) -> bool:
    """True if ``path`` (a directory or a storage URI) holds a collection or a single-space gallery
    (which opens as one)."""
    return open_storage(path).exists()


# --------------------------------------------------------------------------- items


@dataclass(frozen=True)
class Item:
    """One gallery item: an image or a caption, with what is needed to embed it again.

    ``source`` is ``{"path": absolute image path, "sha256": hash of its bytes}`` for an image and
    ``{"text": caption}`` for a text; ``key`` is the gallery row key of this version of the item
    (:func:`vector_key`)."""

    id: str
    modality: str
    key: str
    source: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "modality": self.modality, "key": self.key, "source": dict(self.source),
                "metadata": dict(self.metadata)}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "Item":
        if not isinstance(obj, dict):
            raise CorruptCollectionError(f"{where}: item must be an object, got {type(obj).__name__}")
        try:
            item = cls(id=obj["id"], modality=obj["modality"], key=obj["key"], source=obj["source"],
                       metadata=obj.get("metadata") or {})
        except KeyError as e:
            raise CorruptCollectionError(f"{where}: item is missing field {e}") from None
        problem = item.problem()
        if problem:
            raise CorruptCollectionError(f"{where}: {problem}")
        return item

    def problem(self) -> str | None:
        """Why this item is not valid, or None."""
        if not isinstance(self.id, str) or not self.id.strip():
            return f"item id must be a non-empty string, got {self.id!r}"
        if len(self.id) > MAX_ID_LENGTH or (not self.id.isprintable() and any(ord(c) < 32 for c in self.id)):
            return f"item id {self.id[:40]!r} is longer than {MAX_ID_LENGTH} characters or has control characters"
        if self.modality not in MODALITIES:
            return f"item {self.id!r}: modality must be one of {MODALITIES}, got {self.modality!r}"
        if not isinstance(self.key, str) or not self.key:
            return f"item {self.id!r}: empty vector key"
        if not isinstance(self.source, (dict, Mapping)):  # dict first: the ABC check is slow
            return f"item {self.id!r}: source must be an object"
        want = "path" if self.modality == "image" else "text"
        if not isinstance(self.source.get(want), str):  # may be empty for rows of an old gallery
            return f"item {self.id!r}: a {self.modality} source needs a string {want!r}"
        if not isinstance(self.metadata, (dict, Mapping)):
            return f"item {self.id!r}: metadata must be an object"
        return None

    @property
    def payload(self) -> str:
        """What an encoder embeds: the image path or the caption text."""
        return self.source["path"] if self.modality == "image" else self.source["text"]


#: commits made by this process (readers of other Collection objects then re-check at once)
_WRITES = [0]


def _item(r: Row) -> Item:
    return Item(id=r.id, modality=r.modality, key=r.key, source=r.source, metadata=r.metadata)


_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
if json.encoder.c_make_encoder is not None:  # the encoder json.dumps uses, without its per-call set-up
    _c_json = json.encoder.c_make_encoder(None, _JSON.default, json.encoder.encode_basestring, None, ": ", ", ",
                                          True, False, False)
    _JSON.encode = lambda o: "".join(_c_json(o, 0))  # type: ignore[method-assign]


def row_json(obj: Mapping[str, Any]) -> str:
    """The JSON of an item's source or metadata in rows given to :meth:`Collection.commit_rows`
    (orjson, keys sorted: canonical, so equal objects give equal text; a NaN becomes null)."""
    if not obj:
        return "{}"
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
    except TypeError as e:  # orjson.JSONEncodeError
        raise ValueError(f"not a JSON object of JSON values: {e}") from None


def _row_json(r: Row) -> tuple[str, str, str, str, str]:
    """A stored row in the form :meth:`Collection.commit_rows` takes."""
    return r.id, r.modality, r.key, row_json(r.source), row_json(r.metadata)


def _item_json(it: Item) -> tuple[str, str, str, str, str]:
    """The catalog row of an item: ``(id, modality, key, source JSON, metadata JSON)``."""
    src = it.source if type(it.source) is dict else dict(it.source)
    meta = it.metadata if type(it.metadata) is dict else dict(it.metadata)
    return it.id, it.modality, it.key, _JSON.encode(src), _JSON.encode(meta)


# --------------------------------------------------------------------------- collection


class Collection:
    """Items in several embedding spaces: a catalog plus one vector store per space (see the module
    doc).

    Open with :meth:`create` or :meth:`open`. Writers (:meth:`commit`, :meth:`put_vectors`,
    :meth:`set_plan`) may run in several processes; each is one catalog transaction. Readers take
    :meth:`snapshot`.
    """

    #: a snapshot is reused without asking the catalog for this long (seconds), unless this process
    #: committed meanwhile: a commit of another process is seen at most this late
    RECHECK_S = 0.002

    def __init__(self, storage: Storage, catalog: Catalog) -> None:
        """Internal; use :meth:`create` or :meth:`open`."""
        self.storage = storage
        self.catalog = catalog
        #: a local collection's directory, or the storage URI (messages name it)
        self.path: Path | str = storage.root if isinstance(storage, LocalStorage) else storage.location
        self._header = catalog.header()
        self._galleries: dict[str, SpaceStore] = {}
        self._serving: dict[tuple[str, str], np.ndarray] = {}
        self._serving_gen = -1  # the generation self._serving is at (-1: not loaded)
        self._snapshot: Snapshot | None = None
        self._hit_table: HitTable | None = None  # loaded by the first search
        self._epoch = catalog.epoch
        self._checked = 0.0  # monotonic time of the last generation read
        self._seen_writes = -1
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, path: str | Path, *, space_id: str, dim: int, model: str, name: str = "",
               modalities: Sequence[str] = MODALITIES, backend: str = "auto",
               collection_name: str | None = None, adopt: Mapping[str, Any] | None = None) -> "Collection":
        """A new collection at ``path`` (a directory or a storage URI, :func:`~.storage.parse_uri`)
        whose current model embeds into ``space_id``.

        ``model`` is where the model lives (a directory; recorded so a searcher can load it),
        ``name`` a readable name, ``modalities`` what the model embeds (a text-only model: texts).
        ``backend`` is every space's vector index: ``auto`` (exact search below
        :data:`~nobackfill.index.backends.AUTO_GRAPH_AT` vectors, an HNSW32 graph built in the
        background past it), a faiss factory string (``Flat``, ``HNSW32``, ...) or ``flat`` /
        ``hnsw:...``. Refuses a location that already holds a collection, a gallery or other files.
        ``adopt``: the space's vectors are a collection the user already has, registered in place
        (:meth:`~.storage.Storage.adopt_space`; Milvus storage only).
        """
        storage = open_storage(path)
        if storage.exists():
            raise FileExistsError(f"{storage} already holds a collection (open it, or delete it)")
        own = f"{SPACE_DIR}/{_space_dirname(space_id)}"
        stray = storage.stray_entries(own)  # empty, or what a killed create of the same collection left
        if stray:
            raise FileExistsError(f"{storage} exists and is not empty ({', '.join(sorted(stray)[:3])}): choose a new "
                                  "location for the collection")
        backend = validate_spec(backend)
        mods = [m for m in MODALITIES if m in set(modalities)]
        if not mods:
            raise ValueError(f"modalities must name at least one of {MODALITIES}, got {list(modalities)}")
        now = _now()
        space = _space_entry(space_id, dim, model, name, mods, own)
        default_name = Path(storage.location).resolve().name if isinstance(storage, LocalStorage) else \
            storage.location.rpartition("#")[2] or "default"
        header = {"name": collection_name or default_name, "backend": backend, "created": now, "updated": now,
                  "plan": Plan.single(space)}
        if adopt is not None:
            storage.adopt_space(space.dir, space_id=space_id, dim=int(dim), model=str(model), backend=backend,
                                external=adopt)
        else:
            storage.create_space(space.dir, space_id=space_id, dim=int(dim), model=str(model), backend=backend)
        storage.create_catalog(header)
        return cls.open(storage)

    @classmethod
    def open(cls, path: "str | Path | Storage") -> "Collection":
        """Open a collection (a directory or a storage URI). A collection of the previous format
        (``collection.json`` + item log) or a single-space gallery directory is converted once into
        a catalog (its old files are kept until the catalog is in place)."""
        storage = path if isinstance(path, Storage) else open_storage(path)
        catalog = storage.catalog()
        if catalog is None:
            catalog = cls._migrate(storage)
        try:
            return cls(storage, catalog)
        except CatalogError as e:
            raise CorruptCollectionError(str(e)) from e

    @classmethod
    def _migrate(cls, storage: Storage) -> Catalog:
        """The catalog of a format-1 collection (written now, once) or of a plain gallery (in
        memory until the first write; see :mod:`.migrate`)."""
        if storage.read_manifest() is not None:  # locked only when there is something to convert
            with storage.migration_lock():
                catalog = storage.catalog()
                if catalog is not None:  # another process converted it meanwhile
                    return catalog
                v1 = read_v1(storage, CorruptCollectionError)
                assert v1 is not None
                m = v1.manifest
                header = {"name": m["name"], "backend": m["backend"], "created": m.get("created", _now()),
                          "updated": _now(), "plan": m["plan"]}
                log.info("converting %s to a catalog (%d items)", storage, len(v1.items))
                catalog = storage.create_catalog(header, _filler(storage, header, v1.items, v1.docs))
                storage.retire_v1()
                return catalog
        g = storage.legacy_gallery()
        if g is None:
            if isinstance(storage, LocalStorage) and not storage.root.is_dir():
                raise NotACollectionError(f"{storage} is not a collection: no such directory")
            raise NotACollectionError(f"{storage} is not a collection: no {CATALOG_FILE} (nor a {V1_FILE} or "
                                      "gallery manifest.json) in it; create one with 'nobackfill collection create'")
        assert isinstance(storage, LocalStorage)
        header = _gallery_header(storage, g)
        return memory_catalog(header, _filler(storage, header, gallery_items(g), {}), storage.root,
                              lambda: cls._convert_gallery(storage))

    @staticmethod
    def _convert_gallery(storage: Storage) -> Catalog:
        """The first write to a plain gallery: its catalog is written beside its files (which stay
        a valid gallery)."""
        with storage.migration_lock():
            catalog = storage.catalog()
            if catalog is None:
                g = storage.legacy_gallery()
                assert g is not None
                header = _gallery_header(storage, g)
                catalog = storage.create_catalog(header, _filler(storage, header, gallery_items(g), {}))
            return catalog

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        return self._header["name"]

    @property
    def backend(self) -> str:
        return self._header["backend"]

    @property
    def generation(self) -> int:
        return int(self._header["generation"])

    @property
    def plan(self) -> Plan:
        """The serving plan (immutable; change it with :meth:`set_plan`)."""
        return self._header["plan"]

    @property
    def current_space(self) -> str:
        return self.plan.current

    @property
    def is_legacy_gallery(self) -> bool:
        """True while this is a plain gallery directory that no collection write has touched (its
        catalog is in memory; the first write puts it beside the gallery's files)."""
        return self.catalog.before_write is not None

    def space(self, space_id: str) -> Space:
        """The plan's entry of a space; ``KeyError`` naming the known spaces."""
        try:
            return self.plan.space(space_id)
        except KeyError:
            raise KeyError(f"collection {self.path} has no space {space_id} (spaces: "
                           f"{', '.join(self.plan.space_ids)})") from None

    def space_ids(self) -> list[str]:
        """Serving order: the current space first, then the others newest first."""
        return self.plan.serving_order()

    def gallery(self, space_id: str, plan: Plan | None = None) -> SpaceStore:
        """The vector store of ``space_id`` (opened once and cached; ``plan``: the plan naming it,
        default the committed one)."""
        g = self._galleries.get(space_id)
        if g is None:
            with self._lock:
                g = self._galleries.get(space_id)
                if g is None:
                    entry = plan.space(space_id) if plan is not None else self.space(space_id)
                    g = self.storage.open_space(entry.dir)
                    if g.space_id != space_id:
                        raise CorruptCollectionError(f"{self.storage}: space store {entry.dir} holds space "
                                                     f"{g.space_id}, but the catalog says {space_id}")
                    self._galleries[space_id] = g
        return g

    def items(self) -> dict[str, Item]:
        """Every live item by id, in insertion order (a full read of the catalog)."""
        return {r.id: _item(r) for r in self.catalog.rows()}

    def iter_items(self, modality: str | None = None) -> Iterator[Item]:
        """Every live item (of ``modality``) in insertion order."""
        return map(_item, self.catalog.rows(modality))

    def get(self, item_id: str) -> Item:
        """The live item ``item_id``; :class:`ItemNotFoundError` if there is none."""
        item = self.lookup(item_id)
        if item is None:
            raise ItemNotFoundError(f"no item with id {item_id!r} in collection {self.path}")
        return item

    def lookup(self, item_id: str) -> Item | None:
        """The live item ``item_id``, or None."""
        row = self.catalog.rows_by_id([item_id]).get(item_id)
        return None if row is None else _item(row)

    def get_many(self, ids: Iterable[str]) -> dict[str, Item]:
        """The live items among ``ids`` (one query per 500 ids)."""
        return {i: _item(r) for i, r in self.catalog.rows_by_id(list(ids)).items()}

    def serving(self, ids: Iterable[str]) -> dict[str, tuple[Item, str | None]]:
        """The live items among ``ids`` with the space serving each (None: no space holds it)."""
        return {i: (_item(r), r.space) for i, r in self.catalog.rows_by_id(list(ids)).items()}

    def not_served_by(self, space_id: str, modalities: Iterable[str] = MODALITIES, *,
                      sourced: bool = False) -> list[Item]:
        """Live items of ``modalities`` that ``space_id`` does not serve, in insertion order (with
        ``sourced``, only those that have a source to embed them from)."""
        mods = set(modalities)
        where = "(space IS NULL OR space <> ?)" + (f" AND NOT {unsourced_sql(self.catalog.dialect)}" if sourced else "")
        return [_item(r) for r in self.catalog.rows(where=where, params=(space_id,)) if r.modality in mods]

    def _hit_rows(self, rids: Iterable[int]) -> dict[int, tuple[str, str]]:
        rids = list(rids)
        table = self._hit_table
        if table is None:
            with self._lock:
                if self._hit_table is None:
                    table = HitTable()
                    self._read_hit_rows(table)
                    self._hit_table = table
                table = self._hit_table
        if rids and max(rids) > table.last:  # inserted since: read the new rows only
            with self._lock:
                self._read_hit_rows(table)
        return table.get(rids)

    def _read_hit_rows(self, table: "HitTable", page: int = 65536) -> None:
        """Extend ``table`` with the rows past its last rid, a page at a time (the first search of
        a large collection never holds every row as Python objects at once)."""
        while True:
            rows = self.catalog.query("SELECT rid, id, metadata FROM items WHERE rid > ? ORDER BY rid LIMIT ?",
                                      (table.last, page))
            table.extend(rows)
            if len(rows) < page:
                return

    def __len__(self) -> int:
        self.refresh()
        return self._header["n_image"] + self._header["n_text"]

    def count(self, modality: str | None = None) -> int:
        self.refresh()
        return sum(self._header[f"n_{m}"] for m in MODALITIES if modality in (None, m))

    def __repr__(self) -> str:
        return f"Collection({str(self.path)!r}, items={len(self)}, spaces={len(self.space_ids())})"

    # ------------------------------------------------------------------ reading

    def refresh(self) -> bool:
        """Pick up commits made by other processes (one indexed read when nothing changed)."""
        gen, plan_gen = self.catalog.generation()
        if gen == self._header["generation"]:
            return False
        with self._lock:
            self._header = self.catalog.header()
        return True

    def snapshot(self) -> Snapshot:
        """The current consistent state (cached while nothing was committed)."""
        if self.catalog.epoch != self._epoch:  # a plain gallery's catalog went from memory to disk
            with self._lock:
                self._epoch, self._serving_gen, self._snapshot = self.catalog.epoch, -1, None
                self._hit_table = None
        snap = self._snapshot
        now = time.monotonic()
        if snap is not None and now - self._checked < self.RECHECK_S and self._seen_writes == _WRITES[0]:
            return snap  # checked a moment ago, and nothing was committed in this process since
        self._seen_writes = _WRITES[0]
        gen, _ = self.catalog.generation()
        self._checked = now
        if snap is not None and snap.generation == gen:
            return snap
        with self._lock:
            with self.catalog.reading():
                header = self.catalog.header()
                pages = self.catalog.pages(self._serving_gen) if self._serving_gen >= 0 else self.catalog.pages(-1)
            if self._serving_gen < 0:
                self._serving = {}
            size: dict[tuple[str, str], int] = {}
            for space, modality, page, _ in pages:
                size[(space, modality)] = max(size.get((space, modality), 0), (page + 1) * PAGE)
            changed: dict[tuple[str, str], np.ndarray] = {}
            for k, n in size.items():  # a snapshot's arrays never change: the changed ones are new arrays
                old = self._serving.get(k, EMPTY)
                arr = changed[k] = np.zeros(max(n, len(old)), np.int64)
                arr[:len(old)] = old
            for space, modality, page, data in pages:
                changed[(space, modality)][page * PAGE:(page + 1) * PAGE] = np.frombuffer(data, np.int64)
            self._serving = {**self._serving, **changed}
            self._serving_gen = header["generation"]
            self._header = header
            plan = header["plan"]
            serving: dict[tuple[str, str], np.ndarray] = {}
            for sid in plan.serving_order():
                g = self.gallery(sid)
                g.refresh()
                for m in MODALITIES:
                    if not getattr(g, "stable_positions", False):
                        serving[(sid, m)] = self._served_by_key(g, sid, m)
                        continue
                    arr = self._serving.get((sid, m), EMPTY)
                    n = g.count(m)
                    serving[(sid, m)] = arr[:n] if len(arr) >= n else np.concatenate([arr, np.zeros(n - len(arr), np.int64)])
            self._snapshot = Snapshot(self, header["generation"], plan, serving,
                                      {m: header[f"n_{m}"] for m in MODALITIES})
            return self._snapshot

    def _served_by_key(self, g: SpaceStore, space_id: str, modality: str) -> np.ndarray:
        """Rids by this process's rows of a store without lasting positions (read from the items
        the catalog says the space serves, mapped by key)."""
        rows = self.catalog.query("SELECT rid, key FROM items WHERE space = ? AND modality = ?", (space_id, modality))
        pos = g.positions(modality, [k for _, k in rows])
        out = np.zeros(g.count(modality), np.int64)
        for rid, key in rows:
            p = pos.get(key)
            if p is not None and p < len(out):
                out[p] = rid
        return out

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Writer]:
        """One catalog transaction; the in-memory header follows it once committed."""
        try:
            with self._lock, self.catalog.writing() as w:
                yield w
                if not w.unchanged:
                    w.finish(_now())
        finally:
            _WRITES[0] += 1  # every reader of this process asks the catalog again
        self._header = self.catalog.header()

    def _locate(self, plan: Plan, modality: str, keys: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """Key -> (space, row) of the first space in serving order whose store holds it; called inside
        the write transaction (a vector committed by a racing writer is seen, or that writer's own
        transaction finds this one's items), each store refreshed first."""

        def store(sid: str) -> SpaceStore:
            g = self.gallery(sid, plan)
            g.refresh()
            return g

        return _first_holders(plan, modality, keys, store)

    def commit(self, puts: Sequence[Item] = (), deletes: Sequence[str] = (), *,
               missing_ok: bool = False) -> int:
        """Apply item puts (add or replace by id) and deletes in one atomic commit; returns the
        number of events written. Deleting an id that is not live raises
        :class:`ItemNotFoundError` (nothing is written) unless ``missing_ok``."""
        puts = list(puts)
        for it in puts:
            problem = it.problem()
            if problem:
                raise ValueError(problem)
        try:
            rows = [_item_json(it) for it in puts]
        except (TypeError, ValueError) as e:
            raise ValueError(f"item metadata must be JSON-serialisable: {e}") from None
        return self.commit_rows(rows, deletes, missing_ok=missing_ok)

    def commit_rows(self, rows: Sequence[tuple[str, str, str, str, str]], deletes: Sequence[str] = (), *,
                    missing_ok: bool = False, stored: tuple[str, Mapping[str, int]] | None = None,
                    skip_unchanged: bool = False) -> int:
        """:meth:`commit` of items given as catalog rows ``(id, modality, key, source JSON,
        metadata JSON)`` that the caller validated (the bulk path of
        :func:`~nobackfill.index.importing.add_vectors`). ``stored = (space, {key: row})``: where
        the caller just stored the rows' vectors; used (without asking the store) while that space
        is still the current one, which serves first. ``skip_unchanged``: rows equal to the live
        item are left alone (not counted)."""
        rows, deletes = list(rows), list(deletes)
        if not rows and not deletes:
            return 0
        with self._writing() as w:
            put_ids = {r[0] for r in rows}
            if len(put_ids) < len(rows):  # an id put twice: the last one
                rows = list({r[0]: r for r in rows}.values())
            plan = w.header["plan"]
            hint_space, hint = stored if stored is not None and stored[0] == plan.current else (None, {})
            new = 0

            def stored_rows(rs: Sequence[tuple]) -> list[tuple[str, int | None]]:  # (space, row) from the hint
                stable = getattr(self.gallery(hint_space, plan), "stable_positions", False)
                return [(hint_space, hint[r[2]] if stable else None) for r in rs]

            if skip_unchanged and not deletes and hint_space is not None and all(r[2] in hint for r in rows):
                # the bulk path: new ids go in at once, without a lookup each; the others below
                rids = w.insert(rows, stored_rows(rows), new_ids_only=True)
                rows = [r for r, rid in zip(rows, rids) if rid is None]
                new = len(rids) - len(rows)
                if not rows:
                    return new
                put_ids = {r[0] for r in rows}
            old = w.rows_by_id(list(put_ids | set(deletes)))
            if skip_unchanged and old:
                rows = [r for r in rows if r[0] not in old or _row_json(old[r[0]]) != r]
                put_ids = {r[0] for r in rows}
                if not rows and not deletes:
                    w.unchanged = not new  # nothing written: no new generation, readers keep their snapshot
                    return new
            missing = [i for i in deletes if i not in old and i not in put_ids]
            if missing and not missing_ok:
                raise ItemNotFoundError(f"no item with id {missing[0]!r} in collection {self.path}"
                                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            gone = [old[i] for i in dict.fromkeys(deletes) if i in old and i not in put_ids]
            replaced = [old[r[0]] for r in rows if r[0] in old]
            w.delete(gone + replaced)
            placed: dict[tuple[str, str], tuple[str, int | None]] = {}
            for o in replaced:  # same content: the row that served it serves it again
                if o.space is not None and o.pos is not None:
                    placed[(o.modality, o.key)] = (o.space, o.pos)
            if hint_space is not None and not placed and all(r[2] in hint for r in rows):  # all just stored
                w.insert(rows, stored_rows(rows))
                return new + len(rows) + len(gone)
            for m in MODALITIES:
                keys = [r[2] for r in rows if r[1] == m]
                if placed:
                    keys = [k for k in keys if (m, k) not in placed]
                if hint_space is not None:
                    g = self.gallery(hint_space, plan)
                    placed.update(((m, k), (hint_space, _row_of(g, hint[k]))) for k in keys if k in hint)
                    keys = [k for k in keys if k not in hint]
                if keys:
                    placed.update(((m, k), v) for k, v in self._locate(plan, m, keys).items())
            w.insert(rows, [placed.get((r[1], r[2]), (None, None)) for r in rows])
        return new + len(rows) + len(gone)

    def delete(self, ids: Iterable[str], *, missing_ok: bool = False) -> int:
        """Delete items by id; they are never returned again."""
        return self.commit(deletes=list(ids), missing_ok=missing_ok)

    def put_vectors(self, space_id: str, modality: str, keys: Sequence[str], vectors: np.ndarray) -> int:
        """Commit vectors of ``space_id`` for item versions ``keys`` (rows already present are
        skipped, so a retried batch never stores a vector twice); live items of those versions that
        a later space in serving order served move to this one. Returns how many rows were added."""
        g = self.gallery(space_id)
        added = g.add(modality, list(keys), vectors, [{} for _ in keys], space_id=space_id, skip_existing=True)
        self.serve_stored(space_id, modality, keys)
        return added

    def serve_stored(self, space_id: str, modality: str, keys: Sequence[str]) -> None:
        """Live items of versions ``keys`` that ``space_id``'s store holds and that a later space in
        serving order (or none) served are served by ``space_id`` from now on (the catalog half of
        :meth:`put_vectors`; alone, it finishes the commit of vectors stored by a process killed
        before its catalog transaction)."""
        if not keys:
            return
        g = self.gallery(space_id)
        with self._writing() as w:
            rows = [r for r in w.rows_by_key(list(keys)) if r.modality == modality]
            pref = w.header["plan"].serving_order()
            if space_id not in pref:
                return
            rank = {s: i for i, s in enumerate(pref)}
            move = [r for r in rows if r.space is None or rank.get(r.space, len(pref)) > rank[space_id]]
            if move:
                g.refresh()
                pos = g.positions(modality, [r.key for r in move])
                for r in move:
                    if r.key in pos:
                        w.serve(r.rid, modality, (r.space, r.pos), (space_id, _row_of(g, pos[r.key])))

    def add_space(self, *, space_id: str, dim: int, model: str, name: str = "",
                  modalities: Sequence[str] = MODALITIES) -> Space:
        """Create the (empty) store of a new space; the plan lists it once :meth:`set_plan`
        commits a plan naming it (:meth:`Plan.with_space`). Returns its plan entry."""
        mods = [m for m in MODALITIES if m in set(modalities)]
        entry = _space_entry(space_id, dim, model, name, mods, f"{SPACE_DIR}/{_space_dirname(space_id)}")
        self.storage.create_space(entry.dir, space_id=space_id, dim=int(dim), model=str(model),
                                  backend=self.backend)
        return entry

    def set_plan(self, update: Callable[[Plan], Plan]) -> Plan:
        """Atomically replace the plan by ``update(plan)``, the one way a plan changes. ``update``
        runs inside the write transaction on the latest plan, so it can refuse (raise) based on it.
        Where the serving order changes (a space retired, the current model changed back), every
        item affected is served again by the first space that holds it. Returns the committed plan."""
        with self._writing() as w:
            before = w.header["plan"]
            try:
                plan = update(before)
            except PlanError as e:
                raise PlanError(f"collection {self.path}: {e}") from None
            if not isinstance(plan, Plan):
                raise TypeError(f"a plan update must return a Plan, got {type(plan).__name__}")
            for s in plan.spaces:
                if not s.retired and not self.storage.has_space(s.dir):
                    raise ValueError(f"plan names space {s.space_id} but {self.storage} has no store "
                                     f"{s.dir} (call add_space first)")
            self._reserve(w, before, plan)
            w.set_plan(plan)
        return self.plan

    def _reserve(self, w: Writer, before: Plan, after: Plan) -> None:
        """Serve every item again by the serving order of ``after`` where it differs from ``before``."""
        old, new = before.serving_order(), after.serving_order()
        dropped = [s for s in old if s not in new]
        added = [s for s in new if s not in old]
        empty_added = all(not self.gallery(s, after).count(m) for s in added for m in MODALITIES)
        if [s for s in new if s not in added] == [s for s in old if s not in dropped] and empty_added and not dropped:
            return  # a new, empty space in front: nothing moves
        if [s for s in new if s not in added] == [s for s in old if s not in dropped] and empty_added:
            rows = [r for s in dropped for r in w.rows_served_by(s)]
        else:
            rows = w.all_rows()
        for s in dropped:
            w.drop_serving(s)
        for m in MODALITIES:
            mine = [r for r in rows if r.modality == m]
            where = self._locate(after, m, [r.key for r in mine]) if mine else {}
            for r in mine:
                target = where.get(r.key)
                if target != (r.space, r.pos):
                    w.serve(r.rid, m, (None, None) if r.space in dropped else (r.space, r.pos),
                            target if target is not None else (None, None))

    def rebuild_serving(self) -> int:
        """Work out again, from the stores, which row serves each item (after a store lost or
        renumbered rows: ``verify --repair``); returns how many items no space holds now."""
        with self._writing() as w:
            plan = w.header["plan"]
            for sid in plan.serving_order():
                w.drop_serving(sid)
            rows = w.all_rows()
            unserved = 0
            for m in MODALITIES:
                mine = [r for r in rows if r.modality == m]
                where = self._locate(plan, m, [r.key for r in mine]) if mine else {}
                for r in mine:
                    target = where.get(r.key, (None, None))
                    unserved += target[0] is None
                    w.serve(r.rid, m, (None, None), target)
        return unserved

    @contextlib.contextmanager
    def ingesting(self, *, wait: bool = False) -> Iterator[None]:
        """Hold the ingest lock (one ``add`` at a time). Without ``wait``, raise
        :class:`CollectionBusyError` naming the process that holds it."""
        with self.catalog.lock(INGEST_LOCK, blocking=wait) as taken:
            if not taken:
                holder = self.lock_holder(INGEST_LOCK)
                raise CollectionBusyError(f"collection {self.path} is busy: {holder} is adding items; wait for it "
                                          "to finish or pass --wait to queue behind it")
            self._record_holder(INGEST_LOCK)
            yield

    def lock_holder(self, name: str) -> str:
        """Who holds lock ``name`` (as its holder recorded)."""
        try:
            info = json.loads(self.catalog.read_doc(f"locks/{name}.holder") or b"")
            host = f" on {info['host']}" if info.get("host") else ""
            return f"process {info['pid']}{host} (started {info['since']})"
        except (ValueError, KeyError, TypeError):
            return "another process"

    def _record_holder(self, name: str) -> None:
        import socket

        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
        with contextlib.suppress(CatalogError):
            self.catalog.write_doc(f"locks/{name}.holder", json.dumps(info).encode())

    # ------------------------------------------------------------------ integrity and status

    def build_graph_indexes(self, log: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
        """Build now the graph index of every ``auto`` space past its threshold (or extend its
        cached graph with the rows added since): a command that adds items calls it before it exits,
        so the next reader loads the graph instead of searching exactly or extending it. Returns
        ``{space: index info}`` of the spaces it touched."""
        say = log or (lambda _m: None)
        out: dict[str, dict[str, Any]] = {}
        for sid in self.space_ids():
            g = self.gallery(sid)
            if not str(getattr(g, "backend", "")).startswith("auto") or not hasattr(g, "build_index"):
                continue
            g.refresh()
            _, opts = parse_spec(g.backend)
            at = int(opts.get("at", AUTO_GRAPH_AT))
            graph = str(opts.get("graph", "HNSW32"))
            for m in MODALITIES:
                n = g.count(m)
                if n < at:
                    continue
                if g.index_info().get(m, {}).get("in_use") != graph:
                    say(f"building the {graph} index of {n} {m} vectors in space {sid} (searches stay exact "
                        "until it is ready) ...")
                out[sid] = g.build_index(m)  # or extends the cached graph with the rows added since
        return out

    def verify(self) -> list[str]:
        """Problems found (empty when all is well): the catalog database's own check and its
        invariants, every space's store verified, every served row inside its store."""
        try:
            self.refresh()
            problems = self.catalog.check()
            if problems:
                return problems
            self.snapshot()
        except (CollectionError, CatalogError) as e:
            return [str(e)]
        for s in self.plan.spaces:
            if s.retired:
                continue
            try:
                g = self.gallery(s.space_id)
                report = g.verify()
            except (CollectionError, GalleryError, OSError) as e:
                problems.append(str(e))
                continue
            problems += report.problems
            for m in MODALITIES:
                arr = self._serving.get((s.space_id, m), EMPTY)
                if np.any(arr[g.count(m):]):
                    problems.append(f"{self.catalog}: space {s.space_id} serves {m} rows past the "
                                    f"{g.count(m)} its store holds")
        return problems

    def unsourced_counts(self) -> dict[tuple[str | None, str], int]:
        """``{(serving space or None, modality): n}`` of the live items with no source to embed them
        again from: searchable where their vectors are, never backfilled
        (:func:`~nobackfill.index.catalog.unsourced_sql`). One read through their partial index,
        counted here: a condition on ``space`` or a GROUP BY sends SQLite's planner to the index of
        served items, over every row."""
        out: dict[tuple[str | None, str], int] = {}
        for key in self.catalog.query(f"SELECT space, modality FROM items WHERE {unsourced_sql(self.catalog.dialect)}"):
            out[(key[0], key[1])] = out.get((key[0], key[1]), 0) + 1
        return out

    def count_unsourced(self, space_id: str | None = None) -> dict[str, int]:
        """Per modality, the live items without a source (served by ``space_id``, if given)."""
        out: dict[str, int] = {}
        for (space, m), n in self.unsourced_counts().items():
            if space_id is None or space == space_id:
                out[m] = out.get(m, 0) + n
        return out

    def unsourced_ids(self, space_id: str) -> list[str]:
        """Ids of the live items without a source that ``space_id`` serves."""
        sql = f"SELECT id FROM items WHERE {unsourced_sql(self.catalog.dialect)} AND space = ? ORDER BY rid"
        return [r[0] for r in self.catalog.query(sql, (space_id,))]

    def status(self) -> dict[str, Any]:
        """Counts per space and modality, the current space, and what the plan says."""
        snap = self.snapshot()
        plan = snap.plan
        counts = snap.counts()
        spaces = {}
        for s in plan.spaces:
            spaces[s.space_id] = {"name": s.name, "model": s.model, "dim": s.dim, "current": s.space_id == plan.current,
                                  "retired": s.retired, **counts.get(s.space_id, {m: 0 for m in MODALITIES})}
            if s.imports:
                spaces[s.space_id]["imports"] = [dict(i) for i in s.imports]
            if not s.retired:
                info = getattr(self.gallery(s.space_id), "index_info", None)
                spaces[s.space_id]["index"] = info() if info else {}
        served = sum(n for c in counts.values() for n in c.values())
        return {"name": self.name, "path": str(self.storage), "generation": snap.generation,
                "items": {m: snap.item_count(m) for m in MODALITIES}, "catalog": self.catalog.dialect,
                "current": plan.current, "spaces": spaces, "unserved": snap.item_count() - served,
                "unsourced": sum(self.count_unsourced().values()),
                "backend": self.backend}


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


# --------------------------------------------------------------------------- helpers


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
