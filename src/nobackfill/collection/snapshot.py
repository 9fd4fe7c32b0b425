"""What a reader of a collection holds: a :class:`Snapshot` (one consistent state: the plan and, per
space and modality, the catalog row each store row serves), its :class:`SpaceView` per space, and
the :class:`HitTable` that names hits without a database round trip. Built by
:meth:`~nobackfill.collection.collection.Collection.snapshot`; never changed once built."""

from __future__ import annotations

import functools
import json
import threading
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from ..catalog.catalog import Catalog
from ..catalog.items import Item
from ..catalog.plan import Plan
from ..gallery.manifest import MODALITIES
from ..storage.base import SpaceStore

__all__ = ["EMPTY", "HitTable", "Snapshot", "SnapshotSource", "SpaceView"]


class SnapshotSource(Protocol):
    """What a :class:`Snapshot` reads through (a :class:`~nobackfill.collection.collection.Collection`
    is one): the catalog, each space's store, and the items and hit tables read from the catalog."""

    catalog: Catalog

    def gallery(self, space_id: str) -> SpaceStore: ...

    def lookup(self, item_id: str) -> Item | None: ...

    def items(self) -> dict[str, Item]: ...

    def _hits_for(self, rids: Sequence[int]) -> "HitTable": ...


class SpaceView:
    """What one space serves for one modality in a snapshot: per row of its store, the rid of the
    item that row serves (``rids``; 0: none). ``mask``, ``count`` and ``item_ids`` derive from it."""

    def __init__(self, snapshot: "Snapshot", space_id: str, modality: str, gallery: SpaceStore,
                 rids: np.ndarray) -> None:
        self.snapshot = snapshot
        self.space_id = space_id
        self.modality = modality
        self.gallery = gallery
        self.rids = rids

    @functools.cached_property
    def mask(self) -> np.ndarray:
        """The rows this space serves (bool, one per row)."""
        return self.rids > 0

    @functools.cached_property
    def count(self) -> int:
        """Rows this view serves (computed once: a snapshot's views never change)."""
        return int(np.count_nonzero(self.rids))

    @functools.cached_property
    def item_ids(self) -> list[str | None]:
        """The item id served by each row (None elsewhere): resolves every served row, so meant for
        checks and small collections; searches resolve their hits only (:meth:`Snapshot.resolve`)."""
        named = self.snapshot.hits(self.rids[self.rids > 0].tolist())
        return [named[r][0] if r in named else None for r in self.rids.tolist()]


class Snapshot:
    """One consistent state of a collection: its plan and, per space and modality, which store rows
    serve which item. Immutable; a search uses one snapshot from start to end. Items are read from
    the catalog when asked for (:meth:`item`, :meth:`resolve`), never all at once unless
    :attr:`items` is used."""

    def __init__(self, collection: SnapshotSource, generation: int, plan: Plan,
                 serving: dict[tuple[str, str], np.ndarray], counts: dict[str, int]) -> None:
        self.collection = collection
        self.generation = generation
        self.plan = plan
        self._serving = serving  # (space, modality) -> rids of the rows this snapshot sees
        self._item_counts = counts
        self._views: dict[str, dict[str, SpaceView]] = {}
        self._filtered: dict[tuple[str, str, str], np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def current_space(self) -> str:
        return self.plan.current

    def preference(self) -> list[str]:
        """Space ids in serving order: the current space, then the others newest first."""
        return self.plan.serving_order()

    def views(self, modality: str) -> dict[str, SpaceView]:
        """``{space id: SpaceView}`` for ``modality`` in preference order (spaces serving nothing
        of it included)."""
        views = self._views.get(modality)
        if views is None:
            with self._lock:
                views = self._views[modality] = {
                    sid: SpaceView(self, sid, modality, self.collection.gallery(sid),
                                   self._serving.get((sid, modality), EMPTY)) for sid in self.preference()}
        return views

    def item_count(self, modality: str | None = None) -> int:
        """Live items (of ``modality``)."""
        return sum(n for m, n in self._item_counts.items() if modality in (None, m))

    def hits(self, rids: Iterable[int]) -> dict[int, tuple[str, str]]:
        """``rid -> (item id, metadata JSON)`` of served rows, from memory (what a search names)."""
        rids = rids if type(rids) is list else list(rids)
        return self.collection._hits_for(rids).get(rids)

    def hit_fields(self, rids: list[int]) -> list[str] | None:
        """:meth:`HitTable.fields` of ``rids`` (None when one of them is not served)."""
        return self.collection._hits_for(rids).fields(rids)

    def item(self, item_id: str) -> Item | None:
        """The live item ``item_id`` (as the catalog holds it now), or None."""
        return self.collection.lookup(item_id)

    @functools.cached_property
    def items(self) -> dict[str, "Item"]:
        """Every live item by id, read once (a full read of the catalog: for checks and small
        collections, not for the hot path)."""
        return self.collection.items()

    def serving_space(self, item_id: str) -> str | None:
        """The space that serves ``item_id`` (None if no space holds its current vector)."""
        row = self.collection.catalog.rows_by_id([item_id]).get(item_id)
        return None if row is None else row.space

    def counts(self) -> dict[str, dict[str, int]]:
        """``{space id: {"image": n, "text": n}}``: items each space serves."""
        out: dict[str, dict[str, int]] = {sid: {} for sid in self.preference()}
        for m in MODALITIES:
            for sid, view in self.views(m).items():
                out[sid][m] = view.count
        return out

    def unserved(self, modality: str | None = None) -> list[str]:
        """Ids of live items that no space holds a current vector for (to be embedded)."""
        return sorted(r.id for r in self.collection.catalog.rows(modality, "space IS NULL"))

    def filtered_mask(self, view: SpaceView, flt: Mapping[str, Any]) -> np.ndarray:
        """The rows of ``view`` serving an item whose metadata matches ``flt`` (the filter runs in
        the catalog's database, once per snapshot and filter)."""
        key = (view.space_id, view.modality, json.dumps(flt, sort_keys=True, default=str))
        cache = self._filtered
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            allowed = self.collection.catalog.rids_matching(view.modality, flt)
            cache[key] = np.isin(view.rids, allowed) & view.mask
        return cache[key]


EMPTY = np.zeros(0, np.int64)


class HitTable:
    """``rid -> (item id, metadata JSON)`` of every item version read so far, in memory and compact:
    one UTF-8 buffer of records ``id 0x1f metadata`` (an id has no control character and JSON
    escapes them, so the separator never occurs inside either) and one array of record ends (rids
    are nearly dense: inserts only ever append them), so rid's record is ``data[end[rid - 1]:end[rid]]``:
    both bounds are neighbours in one array, most often in one cache line. A rid deleted before it
    was read has an empty record. A rid names one version of one item for ever, so the table only
    grows: a reader extends it with the rows inserted since (``rid > last``) and a search names its
    hits with two memory reads each, no database round trip (a B-tree lookup costs about 5 us a hit
    from Python). Both buffers are numpy arrays, which numpy asks Linux to back with huge pages when
    large (granted only where the kernel finds them: a small part of them on this machine; asking
    it to collapse the rest did not change the search's time). A search's records are decoded at
    once (:meth:`fields`)."""

    def __init__(self) -> None:
        self._end = np.zeros(1024, np.int64)  # end[rid]: offset just past rid's record; end[0] = 0
        self._data = np.zeros(1 << 16, np.uint8)
        # what readers see, replaced at once: (end, data, rids + 1): entries below it are written
        self._view: tuple[memoryview, memoryview, int] = (memoryview(self._end), memoryview(self._data), 1)
        self.last = 0  # the largest rid loaded
        self._lock = threading.Lock()

    def extend(self, rows: Iterable[tuple[int, str, str]]) -> None:
        """Append ``(rid, id, metadata json)`` rows (rids ascending, all above :attr:`last`)."""
        with self._lock:
            n = self._view[2]
            size = int(self._end[n - 1])
            ends: list[int] = []
            parts: list[bytes] = []
            at = size
            for rid, item_id, meta in rows:
                if rid > n + len(ends):  # rids deleted before they were read: empty records
                    ends.extend([at] * (rid - n - len(ends)))
                record = f"{item_id}\x1f{meta}".encode("utf-8")
                parts.append(record)
                at += len(record)
                ends.append(at)
            if not ends:
                return
            self._end = _room(self._end, n + len(ends))
            self._data = _room(self._data, at)
            self._end[n:n + len(ends)] = ends
            self._data[size:at] = np.frombuffer(b"".join(parts), np.uint8)
            self._view = (memoryview(self._end), memoryview(self._data), n + len(ends))
            self.last = n + len(ends) - 1

    def get(self, rids: Iterable[int]) -> dict[int, tuple[str, str]]:
        """The records of ``rids`` that hold one."""
        found, records = self._records(rids)
        fields = _split(records)
        return dict(zip(found, zip(fields[0::2], fields[1::2])))

    def fields(self, rids: Sequence[int]) -> list[str] | None:
        """``[id, metadata JSON, id, metadata JSON, ...]`` of ``rids`` in their order, or None when
        one of them holds no record (:meth:`get` then says which do): a search's hits, made from
        it without a dict."""
        found, records = self._records(rids)
        return _split(records) if len(found) == len(rids) else None

    def _records(self, rids: Iterable[int]) -> tuple[list[int], list[memoryview]]:
        end, data, n = self._view
        found: list[int] = []
        records: list[memoryview] = []
        for rid in rids:
            if 0 < rid < n:
                a, b = end[rid - 1], end[rid]
                if a < b:
                    found.append(rid)
                    records.append(data[a:b])
        return found, records


def _split(records: list[memoryview]) -> list[str]:
    """``[id, metadata JSON, ...]`` of ``records``, decoded at once: they are joined by the separator
    they use inside (one decode and one split for a search's hits, not one each)."""
    if not records:
        return []
    fields = b"\x1f".join(records).decode("utf-8").split("\x1f")
    if len(fields) != 2 * len(records):  # a separator inside a record (the writer broke the rule): one by one
        fields = []
        for r in records:
            item_id, _, meta = bytes(r).decode("utf-8").partition("\x1f")
            fields += (item_id, meta)
    return fields


def _room(arr: np.ndarray, n: int) -> np.ndarray:
    """``arr``, or a copy half as large again when it holds fewer than ``n`` entries (the old array
    is left as it was: readers may hold it)."""
    if n <= len(arr):
        return arr
    out = np.zeros(max(n, len(arr) * 3 // 2), arr.dtype)
    out[:len(arr)] = arr
    return out

