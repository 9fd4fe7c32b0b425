"""Collections: the items of a gallery and their vectors in several embedding spaces at once.

A :class:`Collection` is what a live upgrade needs: after a better model is registered, items
embedded by the old model stay searchable (through a route, see :mod:`nobackfill.search`) while
new items, and later backfilled ones, live in the new model's space. Layout::

    collection.json          the only commit point: format, name, index backend, generation, the
                             item-log chunks (count + sha256) and the serving plan (spaces, current
                             model, upgrades, routes, merge)
    log/<generation>.jsonl   the item events of one commit, one JSON object a line:
                             {"op": "put", "item": {...}} or {"op": "delete", "id": ...}
    spaces/<space>/          one crash-safe :class:`~nobackfill.index.store.Gallery` per space; its
                             rows are keyed by the item's *vector key* ``<id>#<rev>`` (``rev``: a
                             hash of the item's source), so an upserted item never reuses a vector
                             of its old content
    .collection-lock         commit lock (advisory ``flock``); ``.ingest-lock``: one adder at a time

What is stored once and what is derived:

* an item (id, modality, source reference, metadata, vector key) lives in the item log; the live
  items are the log replayed (a delete is a tombstone: the id is gone from every later snapshot);
* which spaces hold a vector for an item is derived from the galleries (the spaces whose gallery
  holds its key);
* the space that *serves* an item is the first space of the plan's preference order (current
  model first, then the newer spaces before the older) holding its key. Every live item is served
  by at most one space, so a search over all spaces returns it at most once.

Every change is atomic and survives SIGKILL: vectors are committed to a space's gallery first (its
own atomic manifest), then the item events are written to a new log chunk and ``collection.json``
is replaced. A kill before the last step leaves vectors that no item references (invisible, and
reused without re-embedding when the item is added again) and an unlisted log file (ignored,
removed by the next commit).

An existing single-space gallery directory opens as a one-space collection: its rows become items
(``key == id``) and its directory is the space's store. The first write adds ``collection.json``
beside the gallery's files, which stay a valid gallery.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .backends import AUTO_GRAPH_AT, parse_spec, validate_spec
from .storage import MANIFEST_FILE as COLLECTION_FILE
from .storage import LocalStorage, SpaceStore, Storage, flock, open_storage
from .store import MODALITIES, Gallery, GalleryError

__all__ = [
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

FORMAT = "nobackfill-collection"
VERSION = 1
LOG_DIR = "log"
SPACE_DIR = "spaces"
COMMIT_LOCK = "collection"  # storage lock names
INGEST_LOCK = "ingest"
#: a commit writes a compacted log (the live items only) once the log has this many chunks
COMPACT_AFTER = 256
MAX_ID_LENGTH = 512


class CollectionError(Exception):
    """Base class for collection problems."""


class NotACollectionError(CollectionError, FileNotFoundError):
    """The directory holds neither a collection nor a gallery."""


class CorruptCollectionError(CollectionError):
    """``collection.json`` or a committed log chunk is unreadable or inconsistent."""


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
        if len(self.id) > MAX_ID_LENGTH or any(ord(c) < 32 for c in self.id):
            return f"item id {self.id[:40]!r} is longer than {MAX_ID_LENGTH} characters or has control characters"
        if self.modality not in MODALITIES:
            return f"item {self.id!r}: modality must be one of {MODALITIES}, got {self.modality!r}"
        if not isinstance(self.key, str) or not self.key:
            return f"item {self.id!r}: empty vector key"
        if not isinstance(self.source, Mapping):
            return f"item {self.id!r}: source must be an object"
        want = "path" if self.modality == "image" else "text"
        if not isinstance(self.source.get(want), str):  # may be empty for rows of an old gallery
            return f"item {self.id!r}: a {self.modality} source needs a string {want!r}"
        if not isinstance(self.metadata, Mapping):
            return f"item {self.id!r}: metadata must be an object"
        return None

    @property
    def payload(self) -> str:
        """What an encoder embeds: the image path or the caption text."""
        return self.source["path"] if self.modality == "image" else self.source["text"]


# --------------------------------------------------------------------------- locks


#: kept for callers of the old name (the backfill job's file lock)
_flock = flock


# --------------------------------------------------------------------------- snapshot


@dataclass
class SpaceView:
    """What one space serves for one modality in a snapshot: the rows of its gallery that are
    searchable (``mask``) and the item id of each such row (``item_ids[pos]``, None elsewhere)."""

    space_id: str
    modality: str
    gallery: Gallery
    mask: np.ndarray
    item_ids: list[str | None]

    @functools.cached_property
    def count(self) -> int:
        """Rows this view serves (computed once: a snapshot's views never change)."""
        return int(np.count_nonzero(self.mask))


class Snapshot:
    """One consistent state of a collection: its live items, its plan and, per space and modality,
    which gallery rows serve which item. Immutable; a search uses one snapshot from start to end."""

    def __init__(self, collection: "Collection", generation: int, items: dict[str, Item], plan: dict[str, Any],
                 lengths: dict[tuple[str, str], int]) -> None:
        self.collection = collection
        self.generation = generation
        self.items = items
        self.plan = plan
        self._lengths = lengths  # (space, modality) -> gallery rows visible to this snapshot
        self._views: dict[str, dict[str, SpaceView]] = {}
        self._lock = threading.Lock()

    @property
    def current_space(self) -> str:
        return self.plan["current"]

    def preference(self) -> list[str]:
        """Space ids in serving order: the current space, then the others newest first."""
        return _preference(self.plan)

    def views(self, modality: str) -> dict[str, SpaceView]:
        """``{space id: SpaceView}`` for ``modality`` in preference order (spaces serving nothing
        of it included, with an all-False mask)."""
        with self._lock:
            if modality not in self._views:
                self._views[modality] = self._build_views(modality)
            return self._views[modality]

    def _build_views(self, modality: str) -> dict[str, SpaceView]:
        by_key = {it.key: it.id for it in self.items.values() if it.modality == modality}
        served: set[str] = set()
        out: dict[str, SpaceView] = {}
        for sid in self.preference():
            g = self.collection.gallery(sid)
            keys = g.ids(modality)[: self._lengths.get((sid, modality), 0)]
            mask = np.zeros(len(keys), dtype=bool)
            item_ids: list[str | None] = [None] * len(keys)
            for pos, key in enumerate(keys):
                iid = by_key.get(key)
                if iid is not None and iid not in served:
                    served.add(iid)
                    mask[pos] = True
                    item_ids[pos] = iid
            out[sid] = SpaceView(sid, modality, g, mask, item_ids)
        return out

    def serving_space(self, item_id: str) -> str | None:
        """The space that serves ``item_id`` (None if no space holds its current vector)."""
        item = self.items.get(item_id)
        if item is None:
            return None
        for sid, view in self.views(item.modality).items():
            if item_id in _served_ids(view):
                return sid
        return None

    def counts(self) -> dict[str, dict[str, int]]:
        """``{space id: {"image": n, "text": n}}``: items each space serves."""
        out: dict[str, dict[str, int]] = {sid: {} for sid in self.preference()}
        for m in MODALITIES:
            for sid, view in self.views(m).items():
                out[sid][m] = view.count
        return out

    def unserved(self, modality: str | None = None) -> list[str]:
        """Ids of live items that no space holds a current vector for (to be embedded)."""
        mods = [modality] if modality else list(MODALITIES)
        served = {iid for m in mods for v in self.views(m).values() for iid in _served_ids(v)}
        return sorted(i for i, it in self.items.items() if it.modality in mods and i not in served)


def _served_ids(view: SpaceView) -> set[str]:
    return {i for i in view.item_ids if i is not None}


def _preference(plan: dict[str, Any]) -> list[str]:
    spaces = [s["space_id"] for s in plan["spaces"] if not s.get("retired")]
    current = plan["current"]
    return [current] + [s for s in reversed(spaces) if s != current]


# --------------------------------------------------------------------------- collection


class Collection:
    """Items in several embedding spaces under one directory (see the module doc).

    Open with :meth:`create` or :meth:`open`. Writers (:meth:`commit`, :meth:`put_vectors`,
    :meth:`set_plan`) may run in several processes; each commit takes the commit lock, re-reads
    the state and applies its events on top. Readers take :meth:`snapshot`.
    """

    def __init__(self, storage: Storage, manifest: dict[str, Any], *, legacy: bool = False) -> None:
        """Internal; use :meth:`create` or :meth:`open`."""
        self.storage = storage
        #: a local collection's directory, or the storage URI (messages name it)
        self.path: Path | str = storage.root if isinstance(storage, LocalStorage) else storage.location
        self._legacy = legacy  # a plain gallery directory not yet written to as a collection
        self._manifest = manifest
        self._items: dict[str, Item] = {}
        self._loaded_log: list[str] = []
        self._galleries: dict[str, SpaceStore] = {}
        self._stat = storage.manifest_token()
        self._snapshot: Snapshot | None = None
        self._snapshot_key: tuple | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, path: str | Path, *, space_id: str, dim: int, model: str, name: str = "",
               modalities: Sequence[str] = MODALITIES, backend: str = "auto",
               collection_name: str | None = None) -> "Collection":
        """A new collection at ``path`` (a directory or a storage URI, :func:`~.storage.parse_uri`)
        whose current model embeds into ``space_id``.

        ``model`` is where the model lives (a directory; recorded so a searcher can load it),
        ``name`` a readable name, ``modalities`` what the model embeds (a text-only model: texts).
        ``backend`` is every space's vector index: ``auto`` (exact search below
        :data:`~nobackfill.index.backends.AUTO_GRAPH_AT` vectors, an HNSW32 graph built in the
        background past it), a faiss factory string (``Flat``, ``HNSW32``, ...) or ``flat`` /
        ``hnsw:...``. Refuses a location that already holds a collection, a gallery or other files.
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
        manifest = {
            "format": FORMAT, "version": VERSION, "name": collection_name or default_name,
            "backend": backend, "created": now, "updated": now, "generation": 0, "log": [],
            "plan": {"current": space_id, "spaces": [space], "upgrades": [], "routes": {}, "merge": None},
        }
        with storage.lock(COMMIT_LOCK):
            storage.create_space(space["dir"], space_id=space_id, dim=int(dim), model=str(model), backend=backend)
            storage.write_manifest(_manifest_bytes(manifest))
        return cls.open(storage)

    @classmethod
    def open(cls, path: "str | Path | Storage") -> "Collection":
        """Open a collection (a directory or a storage URI), or a single-space gallery directory as
        a one-space collection."""
        storage = path if isinstance(path, Storage) else open_storage(path)
        data = storage.read_manifest()
        if data is not None:
            c = cls(storage, _parse_manifest(data, storage))
            c._load_log()
            return c
        g = storage.legacy_gallery()
        if g is not None:
            return cls._open_legacy(storage, g)
        if isinstance(storage, LocalStorage) and not storage.root.is_dir():
            raise NotACollectionError(f"{storage} is not a collection: no such directory")
        raise NotACollectionError(f"{storage} is not a collection: no {COLLECTION_FILE} (nor a gallery manifest.json) "
                                  f"in it; create one with 'nobackfill collection create'")

    @classmethod
    def _open_legacy(cls, storage: Storage, g: Gallery) -> "Collection":
        space = _space_entry(g.space_id, g.dim, g.model, Path(g.model).name, list(MODALITIES), ".")
        manifest = {
            "format": FORMAT, "version": VERSION, "name": Path(storage.location).resolve().name, "backend": g.backend,
            "created": g.manifest.get("created", _now()), "updated": g.manifest.get("updated", _now()),
            "generation": 0, "log": [],
            "plan": {"current": g.space_id, "spaces": [space], "upgrades": [], "routes": {}, "merge": None},
        }
        c = cls(storage, manifest, legacy=True)
        c._galleries[g.space_id] = g
        c._items = _items_from_gallery(g)
        return c

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        return self._manifest["name"]

    @property
    def backend(self) -> str:
        return self._manifest["backend"]

    @property
    def generation(self) -> int:
        return int(self._manifest["generation"])

    @property
    def plan(self) -> dict[str, Any]:
        """A copy of the serving plan."""
        return json.loads(json.dumps(self._manifest["plan"]))

    @property
    def current_space(self) -> str:
        return self._manifest["plan"]["current"]

    @property
    def is_legacy_gallery(self) -> bool:
        """True while this is a plain gallery directory that no collection write has touched."""
        return self._legacy

    def space(self, space_id: str) -> dict[str, Any]:
        """The plan's entry of a space (a copy); ``KeyError`` naming the known spaces."""
        for s in self._manifest["plan"]["spaces"]:
            if s["space_id"] == space_id:
                return dict(s)
        known = ", ".join(s["space_id"] for s in self._manifest["plan"]["spaces"])
        raise KeyError(f"collection {self.path} has no space {space_id} (spaces: {known})")

    def space_ids(self) -> list[str]:
        """Serving order: the current space first, then the others newest first."""
        return _preference(self._manifest["plan"])

    def gallery(self, space_id: str) -> SpaceStore:
        """The vector store of ``space_id`` (opened once and cached)."""
        with self._lock:
            g = self._galleries.get(space_id)
            if g is None:
                entry = self.space(space_id)
                g = self._galleries[space_id] = self.storage.open_space(entry["dir"])
                if g.space_id != space_id:
                    raise CorruptCollectionError(f"{self.storage}: space store {entry['dir']} holds space {g.space_id}, "
                                                 f"but {COLLECTION_FILE} says {space_id}")
            return g

    def items(self) -> dict[str, Item]:
        """The live items by id (a shallow copy)."""
        self.refresh()
        return dict(self._items)

    def get(self, item_id: str) -> Item:
        """The live item ``item_id``; :class:`ItemNotFoundError` if there is none."""
        self.refresh()
        item = self._items.get(item_id)
        if item is None:
            raise ItemNotFoundError(f"no item with id {item_id!r} in collection {self.path}")
        return item

    def lookup(self, item_id: str) -> Item | None:
        """The live item ``item_id`` as last loaded, or None (no refresh, no copy: for hot loops
        that call :meth:`refresh` themselves)."""
        return self._items.get(item_id)

    def __len__(self) -> int:
        return len(self._items)

    def count(self, modality: str | None = None) -> int:
        if modality is None:
            return len(self._items)
        return sum(1 for it in self._items.values() if it.modality == modality)

    def __repr__(self) -> str:
        return f"Collection({str(self.path)!r}, items={len(self._items)}, spaces={len(self.space_ids())})"

    # ------------------------------------------------------------------ reading

    def refresh(self) -> bool:
        """Pick up commits made by other processes (one ``stat`` when nothing changed)."""
        if self._legacy:
            data = self.storage.read_manifest()
            if data is not None:  # someone converted it meanwhile
                with self._lock:
                    self._legacy = False
                    self._manifest = _parse_manifest(data, self.storage)
                    self._stat = self.storage.manifest_token()
                    self._items, self._loaded_log = {}, []
                    self._load_log()
                return True
            return False
        st = self.storage.manifest_token()
        if st == self._stat:
            return False
        with self._lock:
            self._manifest = _read_manifest(self.storage)
            self._stat = st
            self._load_log()
        return True

    def _load_log(self) -> None:
        """Replay the log chunks not loaded yet (all of them if the history was rewritten)."""
        names = [c["file"] for c in self._manifest["log"]]
        if names[: len(self._loaded_log)] != self._loaded_log:
            self._items, self._loaded_log = {}, []
        items = dict(self._items)
        for entry in self._manifest["log"][len(self._loaded_log):]:
            for event in self._read_chunk(entry):
                _apply(items, event)
            self._loaded_log.append(entry["file"])
        self._items = items

    def _read_chunk(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        path = f"{self.storage}/{entry['file']}" if not isinstance(self.storage, LocalStorage) else \
            self.storage.root / entry["file"]
        try:
            data = self.storage.read_chunk(entry["file"])
        except OSError as e:
            raise CorruptCollectionError(f"cannot read committed log chunk {path}: {e.strerror or e}; "
                                         f"run 'nobackfill verify {self.path}'") from e
        if _sha256(data) != entry["sha256"]:
            raise CorruptCollectionError(f"log chunk {path} does not match the sha256 in {COLLECTION_FILE} "
                                         f"(changed or damaged on disk); run 'nobackfill verify {self.path}'")
        events = []
        for no, line in enumerate(data.decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path} line {no}"
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorruptCollectionError(f"{where}: invalid JSON ({e})") from None
            events.append(_check_event(ev, where))
        if len(events) != entry["count"]:
            raise CorruptCollectionError(f"{path} has {len(events)} events, {COLLECTION_FILE} says {entry['count']}")
        return events

    def snapshot(self) -> Snapshot:
        """The current consistent state (cached while nothing changed on disk)."""
        with self._lock:
            self.refresh()
            lengths: dict[tuple[str, str], int] = {}
            for sid in self.space_ids():
                g = self.gallery(sid)
                g.refresh()
                for m in MODALITIES:
                    lengths[(sid, m)] = g.count(m)
            # the manifest object is replaced whenever it is re-read or written, so its identity
            # (kept alive by the key) stands for the plan it holds
            key = (self.generation, self._legacy, lengths, self._manifest)
            old = self._snapshot_key
            if self._snapshot is None or old is None or key[:3] != old[:3] or key[3] is not old[3]:
                self._snapshot = Snapshot(self, self.generation, dict(self._items), self.plan, lengths)
                self._snapshot_key = key
            return self._snapshot

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def _committing(self) -> Iterator[dict[str, Any]]:
        """Commit lock + a fresh copy of the manifest to modify; the caller writes it."""
        with self.storage.lock(COMMIT_LOCK):
            if not self._legacy or self.storage.read_manifest() is not None:
                self._legacy = False
                self._manifest = _read_manifest(self.storage)
                self._load_log()
            yield json.loads(json.dumps(self._manifest))

    def _write(self, manifest: dict[str, Any]) -> None:
        manifest["updated"] = _now()
        self.storage.write_manifest(_manifest_bytes(manifest))
        self._manifest, self._stat = manifest, self.storage.manifest_token()
        self._legacy = False

    def _append_log(self, manifest: dict[str, Any], events: list[dict[str, Any]]) -> None:
        """Write ``events`` as the next log chunk and list it in ``manifest`` (not yet committed)."""
        gen = int(manifest["generation"]) + 1
        data = "".join(json.dumps(e, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
                       for e in events).encode("utf-8")
        name = f"{LOG_DIR}/{gen:08d}.jsonl"
        self.storage.write_chunk(name, data)
        manifest["log"].append({"file": name, "count": len(events), "sha256": _sha256(data)})
        manifest["generation"] = gen

    def commit(self, puts: Sequence[Item] = (), deletes: Sequence[str] = (), *,
               missing_ok: bool = False) -> int:
        """Apply item puts (add or replace by id) and deletes in one atomic commit; returns the
        number of events written. Deleting an id that is not live raises
        :class:`ItemNotFoundError` (nothing is written) unless ``missing_ok``."""
        puts, deletes = list(puts), list(deletes)
        for it in puts:
            problem = it.problem()
            if problem:
                raise ValueError(problem)
        try:
            [json.dumps(it.to_json(), allow_nan=False) for it in puts]
        except (TypeError, ValueError) as e:
            raise ValueError(f"item metadata must be JSON-serialisable: {e}") from None
        if not puts and not deletes:
            return 0
        with self._lock, self._committing() as manifest:
            missing = [i for i in deletes if i not in self._items and i not in {p.id for p in puts}]
            if missing and not missing_ok:
                raise ItemNotFoundError(f"no item with id {missing[0]!r} in collection {self.path}"
                                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            events = [{"op": "put", "item": it.to_json()} for it in puts]
            events += [{"op": "delete", "id": i} for i in deletes if i not in missing]
            if self._legacy_seed_needed(manifest):
                self._seed_legacy_log(manifest)
            self._append_log(manifest, events)
            items = dict(self._items)
            for e in events:
                _apply(items, e)
            if len(manifest["log"]) > COMPACT_AFTER:
                self._compact(manifest, items)
            self._write(manifest)
            self._items = items
            self._loaded_log = [c["file"] for c in manifest["log"]]
            self._collect_garbage_locked()
        return len(events)

    def _legacy_seed_needed(self, manifest: dict[str, Any]) -> bool:
        return self._legacy and self.storage.read_manifest() is None and not manifest["log"] and bool(self._items)

    def _seed_legacy_log(self, manifest: dict[str, Any]) -> None:
        """First write to a plain gallery: its rows become the first log chunk."""
        self._append_log(manifest, [{"op": "put", "item": it.to_json()} for it in self._items.values()])

    def _compact(self, manifest: dict[str, Any], items: dict[str, Item]) -> None:
        """Replace the log by one chunk of the live items (tombstones are not needed any more)."""
        manifest["log"] = []
        self._append_log(manifest, [{"op": "put", "item": it.to_json()} for it in items.values()])

    def delete(self, ids: Iterable[str], *, missing_ok: bool = False) -> int:
        """Delete items by id (tombstones); they are never returned again."""
        return self.commit(deletes=list(ids), missing_ok=missing_ok)

    def put_vectors(self, space_id: str, modality: str, keys: Sequence[str], vectors: np.ndarray) -> int:
        """Commit vectors of ``space_id`` for item versions ``keys`` (rows already present are
        skipped, so a retried batch never stores a vector twice); returns how many were added."""
        g = self.gallery(space_id)
        return g.add(modality, list(keys), vectors, [{} for _ in keys], space_id=space_id, skip_existing=True)

    def add_space(self, *, space_id: str, dim: int, model: str, name: str = "",
                  modalities: Sequence[str] = MODALITIES) -> dict[str, Any]:
        """Create the (empty) store of a new space; the plan lists it once :meth:`set_plan`
        commits a plan naming it. Returns the plan entry to put in ``plan["spaces"]``."""
        mods = [m for m in MODALITIES if m in set(modalities)]
        entry = _space_entry(space_id, dim, model, name, mods, f"{SPACE_DIR}/{_space_dirname(space_id)}")
        self.storage.create_space(entry["dir"], space_id=space_id, dim=int(dim), model=str(model),
                                  backend=self.backend)
        return entry

    def set_plan(self, update: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
        """Atomically replace the plan by ``update(plan)`` (``update`` may modify its argument in
        place and return None). ``update`` runs under the commit lock on the latest plan, so it can
        refuse (raise) based on it. Returns the committed plan."""
        with self._lock, self._committing() as manifest:
            plan = manifest["plan"]
            new = update(plan)
            plan = new if new is not None else plan
            _check_plan(plan, self.path)
            for s in plan["spaces"]:
                if not s.get("retired") and not self.storage.has_space(s["dir"]):
                    raise ValueError(f"plan names space {s['space_id']} but {self.storage} has no store "
                                     f"{s['dir']} (call add_space first)")
            if self._legacy_seed_needed(manifest):
                self._seed_legacy_log(manifest)
            manifest["plan"] = plan
            self._write(manifest)
        return self.plan

    @contextlib.contextmanager
    def ingesting(self, *, wait: bool = False) -> Iterator[None]:
        """Hold the ingest lock (one ``add`` at a time). Without ``wait``, raise
        :class:`CollectionBusyError` naming the process that holds it."""
        with self.storage.lock(INGEST_LOCK, blocking=wait) as taken:
            if not taken:
                holder = self.storage.lock_holder(INGEST_LOCK)
                raise CollectionBusyError(f"collection {self.path} is busy: {holder} is adding items; wait for it "
                                          "to finish or pass --wait to queue behind it")
            self.storage.record_holder(INGEST_LOCK)
            yield

    def _collect_garbage_locked(self) -> None:
        self.storage.remove_unlisted_chunks({c["file"] for c in self._manifest["log"]})

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
        """Problems found (empty when all is well): every log chunk re-hashed and parsed, every
        space's store verified, every plan entry's store present."""
        problems: list[str] = []
        try:
            self.refresh()
        except (CollectionError, GalleryError) as e:
            return [str(e)]
        if not self._legacy:
            for entry in self._manifest["log"]:
                try:
                    self._read_chunk(entry)
                except CorruptCollectionError as e:
                    problems.append(str(e))
        for s in self._manifest["plan"]["spaces"]:
            if s.get("retired"):
                continue
            try:
                report = self.gallery(s["space_id"]).verify()
            except (CollectionError, GalleryError, OSError) as e:
                problems.append(str(e))
                continue
            problems += report.problems
        return problems

    def status(self) -> dict[str, Any]:
        """Counts per space and modality, the current space, and what the plan says."""
        snap = self.snapshot()
        plan = snap.plan
        counts = snap.counts()
        spaces = {}
        for s in plan["spaces"]:
            spaces[s["space_id"]] = {"name": s.get("name", ""), "model": s.get("model", ""), "dim": s.get("dim"),
                                     "current": s["space_id"] == plan["current"], "retired": bool(s.get("retired")),
                                     **counts.get(s["space_id"], {m: 0 for m in MODALITIES})}
            if not s.get("retired"):
                info = getattr(self.gallery(s["space_id"]), "index_info", None)
                spaces[s["space_id"]]["index"] = info() if info else {}
        return {"name": self.name, "path": str(self.storage), "generation": snap.generation,
                "items": {m: sum(1 for it in snap.items.values() if it.modality == m) for m in MODALITIES},
                "current": plan["current"], "spaces": spaces, "unserved": len(snap.unserved()),
                "backend": self.backend}


# --------------------------------------------------------------------------- helpers


def _space_dirname(space_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", space_id)
    return safe[:48] + "-" + _sha256(space_id.encode())[:8] if len(safe) > 48 or safe != space_id else safe


def _space_entry(space_id: str, dim: int, model: str, name: str, modalities: Sequence[str], directory: str) -> dict:
    if not isinstance(space_id, str) or not space_id:
        raise ValueError("space_id must be a non-empty string")
    if int(dim) <= 0:
        raise ValueError(f"dim must be positive, got {dim}")
    return {"space_id": space_id, "dim": int(dim), "model": str(model), "name": name or Path(str(model)).name,
            "modalities": list(modalities), "dir": directory, "created": _now(), "retired": False}


def _manifest_bytes(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False).encode("utf-8") + b"\n"


def _read_manifest(storage: Storage) -> dict[str, Any]:
    data = storage.read_manifest()
    if data is None:
        raise NotACollectionError(f"{storage} is not a collection: its {COLLECTION_FILE} is gone")
    return _parse_manifest(data, storage)


def _parse_manifest(data: bytes, storage: Storage) -> dict[str, Any]:
    where = f"{storage}/{COLLECTION_FILE}"
    try:
        m = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCollectionError(f"{where}: unreadable ({e})") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CorruptCollectionError(f"{where}: not a {FORMAT} file")
    if not isinstance(m.get("version"), int) or not 1 <= m["version"] <= VERSION:
        raise CorruptCollectionError(f"{where}: unsupported version {m.get('version')!r} (this nobackfill reads <= "
                                     f"{VERSION})")
    try:
        for key, typ in (("name", str), ("backend", str), ("generation", int), ("log", list), ("plan", dict)):
            if not isinstance(m.get(key), typ):
                raise ValueError(f"field {key!r} missing or not {typ.__name__}")
        for c in m["log"]:
            if not (isinstance(c, dict) and isinstance(c.get("file"), str) and isinstance(c.get("count"), int)
                    and isinstance(c.get("sha256"), str)):
                raise ValueError(f"bad log entry {c!r}")
        _check_plan(m["plan"], storage.location)
    except ValueError as e:
        raise CorruptCollectionError(f"corrupt collection manifest {where}: {e}") from e
    return m


def _check_plan(plan: Any, root: Any) -> None:
    if not isinstance(plan, dict):
        raise ValueError("plan must be an object")
    spaces = plan.get("spaces")
    if not isinstance(spaces, list) or not spaces:
        raise ValueError("plan.spaces must be a non-empty list")
    ids = []
    for s in spaces:
        if not (isinstance(s, dict) and isinstance(s.get("space_id"), str) and isinstance(s.get("dir"), str)
                and isinstance(s.get("dim"), int)):
            raise ValueError(f"bad space entry {s!r}")
        d = Path(s["dir"])
        if d.is_absolute() or ".." in d.parts:
            raise ValueError(f"space directory {s['dir']!r} must lie inside {root}")
        ids.append(s["space_id"])
    if len(set(ids)) != len(ids):
        raise ValueError("plan.spaces lists a space twice")
    if plan.get("current") not in ids:
        raise ValueError(f"plan.current {plan.get('current')!r} is not one of the plan's spaces")
    if any(s.get("retired") for s in spaces if s["space_id"] == plan["current"]):
        raise ValueError("the current space cannot be retired")


def _check_event(ev: Any, where: str) -> dict[str, Any]:
    if not isinstance(ev, dict) or ev.get("op") not in ("put", "delete"):
        raise CorruptCollectionError(f"{where}: an event must be an object with op 'put' or 'delete'")
    if ev["op"] == "put":
        ev = {"op": "put", "item": Item.from_json(ev.get("item"), where)}
    elif not isinstance(ev.get("id"), str):
        raise CorruptCollectionError(f"{where}: a delete needs a string 'id'")
    return ev


def _apply(items: dict[str, Item], event: dict[str, Any]) -> None:
    if event["op"] == "put":
        item = event["item"]
        if not isinstance(item, Item):
            item = Item.from_json(item, "event")
        items[item.id] = item
    else:
        items.pop(event["id"], None)


def _items_from_gallery(g: Gallery) -> dict[str, Item]:
    """The rows of a plain gallery as items (``key == id``; sources from its metadata)."""
    items: dict[str, Item] = {}
    for modality in MODALITIES:
        for id_, meta in zip(g.ids(modality), g.metadata(modality)):
            want = "path" if modality == "image" else "text"
            src = {want: str(meta.get(want, ""))}
            items[id_] = Item(id=id_, modality=modality, key=id_, source=src, metadata=dict(meta))
    return items
