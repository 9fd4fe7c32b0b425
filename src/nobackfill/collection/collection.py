"""Collections: the items of a gallery and their vectors in several embedding spaces at once.

A :class:`Collection` is what a live upgrade needs: after a better model is registered, items
embedded by the old model stay searchable (through a route, see :mod:`nobackfill.search`) while
new items, and later backfilled ones, live in the new model's space. It is two things:

* a **catalog** (:mod:`nobackfill.catalog.catalog`; SQLite ``catalog.sqlite`` in the collection's
  directory, or PostgreSQL for a collection shared by several machines): the items (id, modality,
  source reference, metadata, the *vector key* ``<id>#<rev>`` of their current version), the serving
  plan (spaces, current model, upgrades, routes, merge), which store row serves each item, and the
  backfill's documents. Opening reads its header; nothing is replayed.
* one **vector store per space** (a crash-safe :class:`~nobackfill.gallery.gallery.Gallery` under
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

The items and errors are in :mod:`.items`, the writers in :mod:`.collection_writes`, locks,
checks and status in :mod:`.collection_status`, where vectors are and conversions in
:mod:`.placement`; this module holds :class:`Collection` (opening it, reading it, its snapshots) and
is the one to import.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..gallery.atomic_files import _now
from ..ann.backends import check_buildable, validate_spec
from ..catalog.catalog import CATALOG_FILE, PAGE, Catalog, CatalogError, memory_catalog, unsourced_sql
from ..catalog.writer import KEYED_PAGES_DOC
from .status import INGEST_LOCK, CollectionStatus
from .writes import _WRITES, CollectionWrites
from ..catalog.items import (MAX_ID_LENGTH, CollectionBusyError, CollectionError, CorruptCollectionError, Item,
                             ItemNotFoundError, NotACollectionError, _item, row_json, vector_key)
from .migrate import gallery_items, read_v1
from .placement import SPACE_DIR, _filler, _gallery_header, _space_dirname, _space_entry
from ..catalog.plan import Plan, Space
from .keyed import KeyedRows
from .snapshot import EMPTY, HitTable, Snapshot, SpaceView
from ..storage.base import MANIFEST_FILE as V1_FILE
from ..storage.local import LocalStorage
from ..storage.base import SpaceStore, Storage
from .uri import open_storage
from ..gallery.manifest import MODALITIES

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

#: the file whose presence means a (local) collection exists: its catalog
COLLECTION_FILE = CATALOG_FILE

# importable from here as before the split (nobackfill modules and tests use them)
_REEXPORTED = (INGEST_LOCK, MAX_ID_LENGTH, row_json)


def is_collection(path: str | Path) -> bool:
    """True if ``path`` (a directory or a storage URI) holds a collection or a single-space gallery
    (which opens as one)."""
    return open_storage(path).exists()


# --------------------------------------------------------------------------- collection


class Collection(CollectionWrites, CollectionStatus):
    """Items in several embedding spaces: a catalog plus one vector store per space (see the module
    doc).

    Open with :meth:`create` or :meth:`open`. Writers (:meth:`commit`, :meth:`put_vectors`,
    :meth:`set_plan`) may run in several processes; each is one catalog transaction. Readers take
    :meth:`snapshot`.
    """

    #: a snapshot is reused without asking the catalog for this long (seconds), unless this process
    #: committed meanwhile: a commit of another process is seen at most this late (the question is
    #: a read transaction: 10-100 us, and up to 0.3 ms right after a graph search; asked every 2 ms
    #: it was a few percent of a 1M-item query's mean time)
    RECHECK_S = 0.01

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
        self._slotted = False  # the pages give keyless stores' items slots (KEYED_PAGES_DOC seen)
        self._keyed_rows = KeyedRows()
        self._snapshot: Snapshot | None = None
        self._hit_table: HitTable | None = None  # loaded by the first search
        self._epoch = catalog.epoch
        self._checked = 0.0  # monotonic time of the last generation read
        self._seen_writes = -1
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ construction

    @classmethod
    def check_new(cls, path: str | Path, backend: str | None = None) -> Any:
        """The storage at ``path`` if a collection can be created there (nothing holds one; ``backend``,
        where given, a valid index spec), else the refusal :meth:`create` would give: callable before
        a model loads, so a mistyped location is refused in a moment."""
        storage = open_storage(path)
        storage.check_creatable()
        if storage.exists():
            raise FileExistsError(f"{storage} already holds a collection: use it as it is (add, import, upgrade ... "
                                  "name it), or choose another location (nobackfill deletes no collection: remove "
                                  "it yourself to start over)")
        if backend is not None:
            validate_spec(backend)
        return storage

    @classmethod
    def create(cls, path: str | Path, *, space_id: str, dim: int, model: str, name: str = "",
               modalities: Sequence[str] = MODALITIES, backend: str = "auto",
               collection_name: str | None = None, adopt: Mapping[str, Any] | None = None) -> "Collection":
        """A new collection at ``path`` (a directory or a storage URI, :func:`~.storage.parse_uri`)
        whose current model embeds into ``space_id``.

        ``model`` is where the model lives (a directory; recorded so a searcher can load it),
        ``name`` a readable name, ``modalities`` what the model embeds (a text-only model: texts).
        ``backend`` is every space's vector index: ``auto`` (exact search below
        :data:`~nobackfill.ann.backends.AUTO_GRAPH_AT` vectors, an HNSW32 graph built in the
        background past it), a faiss factory string (``Flat``, ``HNSW32``, ...) or ``flat`` /
        ``hnsw:...``. Refuses a location that already holds a collection, a gallery or other files.
        ``adopt``: the space's vectors are a collection the user already has, registered in place
        (:meth:`~.storage.Storage.adopt_space`; Milvus storage only).
        """
        storage = cls.check_new(path)
        own = f"{SPACE_DIR}/{_space_dirname(space_id)}"
        stray = storage.stray_entries(own)  # empty, or what a killed create of the same collection left
        if stray:
            raise FileExistsError(f"{storage} exists and is not empty ({', '.join(sorted(stray)[:3])}): choose a new "
                                  "location for the collection")
        backend = validate_spec(backend)
        check_buildable(backend, int(dim))  # before any store is made (trial U: IVF9999,Zork was accepted)
        mods = [m for m in MODALITIES if m in set(modalities)]
        if not mods:
            raise ValueError(f"modalities must name at least one of {MODALITIES}, got {list(modalities)}")
        now = _now()
        space = _space_entry(space_id, dim, model, name, mods, own)
        default_name = Path(storage.location).resolve().name if isinstance(storage, LocalStorage) else \
            getattr(storage, "name", "") or "default"  # the URI's #NAME, not its ?catalog= part
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
        why = storage.why_not_a_collection()
        if why is not None:  # said before any server is asked
            raise NotACollectionError(f"{storage} is not a collection: {why}")
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
            if not isinstance(storage, LocalStorage) or storage.catalog_in_database:
                raise NotACollectionError(f"{storage} is not a collection: its catalog holds no collection of that "
                                          "name; create one with 'nobackfill collection create'")
            if not storage.root.is_dir():
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

    def _hits_for(self, rids: list[int]) -> "HitTable":
        """The table naming hits, holding ``rids`` if the catalog does (read on first use; the rows
        inserted since are read when a rid past its last is asked for)."""
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
        return table

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

    def _take_header(self, header: dict[str, Any]) -> None:
        """Adopt ``header`` (just read from the catalog) unless this object already holds a later one."""
        with self._lock:
            if int(header["generation"]) > int(self._header["generation"]):
                self._header = header

    def snapshot(self) -> Snapshot:
        """The current consistent state (cached while nothing was committed)."""
        if self.catalog.epoch != self._epoch:  # a plain gallery's catalog went from memory to disk
            with self._lock:
                self._epoch, self._serving_gen, self._snapshot = self.catalog.epoch, -1, None
                self._slotted = False
                self._keyed_rows.forget()
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
            # one committed state, the keys served by stores without lasting positions included: a
            # batch moved between two spaces is seen moved or not, never out of both
            with self.catalog.reading():
                header = self.catalog.header()
                plan = header["plan"]
                keyless = [sid for sid in plan.serving_order()
                           if not getattr(self.gallery(sid, plan), "stable_positions", False)]
                if keyless and not self._slotted and self.catalog.read_doc(KEYED_PAGES_DOC) is not None:
                    self._slotted, self._serving_gen = True, -1  # slots seen first: every page read again
                    self._keyed_rows.forget()
                self._merge_pages(self.catalog.pages(self._serving_gen))
                slotted = {sid for sid in keyless if self._slotted and
                           getattr(self.gallery(sid, plan), "keys_from_catalog", False)}
                by_slot = {(sid, m): self._keyed_rows.rids_by_row(self.catalog, self.gallery(sid, plan), sid, m,
                                                                  self._serving.get((sid, m), EMPTY))
                           for sid in slotted for m in MODALITIES}
                keyed = {(sid, m): self._keys_served(sid, m) for sid in keyless if sid not in slotted
                         for m in MODALITIES}
                vectors_ts = self.catalog.vectors_ts() if keyless else 0
            self._serving_gen = header["generation"]
            self._header = header
            serving: dict[tuple[str, str], np.ndarray] = {}
            for sid in plan.serving_order():
                g = self.gallery(sid, plan)
                from_catalog = getattr(g, "keys_from_catalog", False)
                if from_catalog:  # the rows the catalog names, visible once the server reached their commit
                    g.guarantee(vectors_ts)
                else:  # after the catalog was read: a store holds its rows before the catalog names them
                    g.refresh()
                for m in MODALITIES:
                    if (sid, m) in by_slot:
                        serving[(sid, m)] = by_slot[(sid, m)]
                        continue
                    if from_catalog:
                        g.know(m, [k for _, k in keyed[(sid, m)]])
                    if (sid, m) in keyed:
                        serving[(sid, m)] = self._served_by_key(g, m, keyed[(sid, m)])
                        continue
                    arr = self._serving.get((sid, m), EMPTY)
                    n = g.count(m)
                    serving[(sid, m)] = arr[:n] if len(arr) >= n else np.concatenate([arr, np.zeros(n - len(arr), np.int64)])
            self._snapshot = Snapshot(self, header["generation"], plan, serving,
                                      {m: header[f"n_{m}"] for m in MODALITIES})
            return self._snapshot

    def _merge_pages(self, pages: list[tuple[str, str, int, bytes]]) -> None:
        """Bring :attr:`_serving` to the pages read (all of them when it was not loaded)."""
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

    def _keys_served(self, space_id: str, modality: str) -> list[tuple[int, str]]:
        """``(rid, key)`` of the items the catalog says ``space_id`` serves (for a store without
        lasting positions; read in the snapshot's transaction)."""
        return self.catalog.query("SELECT rid, key FROM items WHERE space = ? AND modality = ?", (space_id, modality))

    def _served_by_key(self, g: SpaceStore, modality: str, rows: list[tuple[int, str]]) -> np.ndarray:
        """Rids by this process's rows of a store without lasting positions: the ``(rid, key)`` rows
        the catalog says it serves, mapped by key."""
        pos = g.positions(modality, [k for _, k in rows])
        out = np.zeros(g.count(modality), np.int64)
        for rid, key in rows:
            p = pos.get(key)
            if p is not None and p < len(out):
                out[p] = rid
        return out
