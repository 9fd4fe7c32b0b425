"""Which row of a store without lasting row numbers (Milvus: rows are numbered by each process)
serves which item, kept up to date from the catalog alone: the catalog's serving pages give each
such item a slot (its rid; :data:`~nobackfill.catalog.writer.KEYED_PAGES_DOC`), and a reader maps
only the slots that changed since its last snapshot to its rows of the store, by key (one read of
the changed rids' keys). A commit that moves a backfill batch costs a reader that batch, not the
space."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..catalog.catalog import Catalog
from ..catalog.schema import _chunks

__all__ = ["KeyedRows"]

#: more new slots than this (a first snapshot) read the keys of the whole space in one statement
WHOLE_SPACE_AT = 20000


class KeyedRows:
    """Per (space, modality): the slots this reader has mapped (their rids) and each one's row in
    this process's store (-1: none)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], np.ndarray] = {}
        self._row: dict[tuple[str, str], np.ndarray] = {}

    def forget(self) -> None:
        self._seen, self._row = {}, {}

    def rids_by_row(self, catalog: Catalog, store: Any, space: str, modality: str, slots: np.ndarray) -> np.ndarray:
        """The rid each row of ``store`` serves (0: none), from the catalog's slots of (``space``,
        ``modality``) (slot -> rid, as this snapshot's pages say): the keys of new slots' rids are
        read (call inside the snapshot's read transaction) and numbered in the store (``know``,
        no read of the server)."""
        k = (space, modality)
        from_catalog = getattr(store, "keys_from_catalog", False)
        if from_catalog:  # numbered from the catalog, even when it names nothing (never discovered by a read)
            store.know(modality, ())
        seen, row = self._seen.get(k), self._row.get(k)
        n = max(len(slots), 0 if seen is None else len(seen))
        if seen is None or len(seen) < n:
            grown_seen, grown_row = np.zeros(n, np.int64), np.full(n, -1, np.int64)
            if seen is not None:
                grown_seen[:len(seen)], grown_row[:len(row)] = seen, row
            seen, row = grown_seen, grown_row
        cur = np.zeros(n, np.int64)
        cur[:len(slots)] = slots
        changed = np.flatnonzero(cur != seen)
        new = changed[cur[changed] > 0]
        seen[changed] = cur[changed]
        if len(new):
            rids = cur[new].tolist()
            keys = _keys(catalog, space, modality, rids)
            named = [keys.get(r) for r in rids]
            held = [key for key in named if key is not None]
            if from_catalog:
                store.know(modality, held)
            at = store.positions(modality, held)
            row[new] = [at.get(key, -1) if key is not None else -1 for key in named]
        self._seen[k], self._row[k] = seen, row
        out = np.zeros(store.count(modality), np.int64)
        ok = (seen > 0) & (row >= 0) & (row < len(out))
        out[row[ok]] = seen[ok]
        return out


def _keys(catalog: Catalog, space: str, modality: str, rids: list[int]) -> dict[int, str]:
    """``rid -> key`` of ``rids`` (live items of ``space``)."""
    if len(rids) > WHOLE_SPACE_AT:
        rows = catalog.query("SELECT rid, key FROM items WHERE space = ? AND modality = ?", (space, modality))
        return {int(r): key for r, key in rows}
    out: dict[int, str] = {}
    for part in _chunks(rids):
        rows = catalog.query(f"SELECT rid, key FROM items WHERE rid IN ({','.join('?' * len(part))})", list(part))
        out.update((int(r), key) for r, key in rows)
    return out
