"""The statements of one catalog write transaction (:class:`Writer`, handed out by
:meth:`~nobackfill.catalog.catalog.Catalog.writing`): inserting, deleting and re-serving items, the
serving pages it touched, the plan and documents, and the header written last."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable, Sequence

import numpy as np

from .plan import Plan
from .schema import _ROW_COLS, PAGE, CatalogDatabase, CatalogError, Row, _header, _row, _rows_by, rows_by_key

__all__ = ["KEYED_PAGES_DOC", "ROWS_PER_INSERT", "VECTORS_TS_DOC", "Writer"]

#: the document holding the largest vector-store timestamp (a Milvus hybrid timestamp) of any
#: commit: every vector a commit names was written at or before it (see :meth:`Writer.stamp_vectors`)
VECTORS_TS_DOC = "vectors/timestamp"
#: present once the serving pages hold the items of stores without lasting rows too (Milvus: an item
#: served there with no row recorded, ``pos`` NULL, has the slot of its rid): written with every new
#: catalog, and by the first write to an older one (:meth:`Writer.fill_keyed_pages`)
KEYED_PAGES_DOC = "serving/keyed-slots"
#: the catalog version from which the slots are kept (a version that does not keep them refuses it)
KEYED_VERSION = 3


def _slot(pos: int | None, rid: int) -> int:
    """The serving-page slot of an item served with row ``pos`` (None: a store without lasting
    rows, where the item's rid is its slot: never reused, so never taken by another item)."""
    return rid if pos is None else int(pos)

#: item rows per INSERT statement (7 parameters each: within SQLite's limit of 32766 since 3.32,
#: and its older one of 999)
ROWS_PER_INSERT = 512 if sqlite3.sqlite_version_info >= (3, 32) else 128
#: PostgreSQL: this many rows or more go in by COPY (:meth:`Writer._copy_columns`)
COPY_AT = 2048


class Writer:
    """The statements of one write transaction (:meth:`Catalog.writing`)."""

    def __init__(self, catalog: CatalogDatabase, conn: Any) -> None:
        self.catalog = catalog
        self.conn = conn
        h = self.execute("SELECT format, version, name, backend, created, updated, generation, plan, plan_generation, "
                         "n_image, n_text FROM header WHERE id = 1").fetchone()
        if h is None:
            raise CatalogError(f"catalog {catalog.location} has no header row")
        self.header = _header(h, catalog.location)
        self.generation = self.header["generation"] + 1  # what this transaction commits
        self._pages: dict[tuple[str, str, int], np.ndarray] = {}
        self._counts = {"image": 0, "text": 0}
        self._plan: Plan | None = None
        #: set by a caller that found nothing to change: :meth:`finish` is not called
        self.unchanged = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self.conn.execute(self.catalog._sql(sql), tuple(params))
        except Exception as e:
            raise self.catalog._error(e) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        try:
            cur = self.conn.cursor()
            cur.executemany(self.catalog._sql(sql), list(rows))
        except Exception as e:
            raise self.catalog._error(e) from e

    # items
    def rows_by_id(self, ids: Sequence[str]) -> dict[str, Row]:
        return _rows_by(lambda s, p: self.execute(s, p).fetchall(), "id", ids)

    def rows_by_key(self, keys: Sequence[str]) -> list[Row]:
        """The live rows of item versions ``keys`` (:func:`~.schema.rows_by_key`)."""
        return rows_by_key(lambda s, p: self.execute(s, p).fetchall(), keys)

    def rows_served_by(self, space: str) -> list[Row]:
        return list(map(_row, self.execute(f"SELECT {_ROW_COLS} FROM items WHERE space = ? ORDER BY rid",
                                           (space,)).fetchall()))

    def all_rows(self) -> list[Row]:
        return list(map(_row, self.execute(f"SELECT {_ROW_COLS} FROM items ORDER BY rid").fetchall()))

    def insert(self, items: Sequence[tuple], served: Sequence[tuple[str | None, int | None]] | None = None, *,
               new_ids_only: bool = False) -> list[int | None]:
        """Insert ``(id, modality, key, source json, metadata json)`` rows, each served by
        ``served[i]`` (space, row) if given; their rids, in order. ``new_ids_only``: a row whose id
        is live already is left out (its rid is None), without a lookup per row first."""
        if not items:
            return []
        served = served if served is not None else [(None, None)] * len(items)
        ids, modalities, keys, sources, metadata = (list(c) for c in zip(*items))
        spaces, rows = (list(c) for c in zip(*served))
        return self.insert_columns([ids, modalities, keys, sources, metadata, spaces, rows], new_ids_only=new_ids_only)

    def insert_columns(self, columns: Sequence[list], *, new_ids_only: bool = False) -> list[int | None]:
        """:meth:`insert` of rows given column by column: ids, modalities, keys, source JSON,
        metadata JSON, serving spaces and serving rows (lists of one length; a space or row may be
        None)."""
        ids, mods, _, _, _, spaces, pos = columns
        if not ids:
            return []
        before = int(self.execute("SELECT coalesce(max(rid), 0) FROM items").fetchone()[0]) if new_ids_only else 0
        self._insert_columns(columns, " ON CONFLICT (id) DO NOTHING" if new_ids_only else "")
        rids: list[int | None]
        if new_ids_only:  # one writer at a time: the rows past ``before`` are this insert's
            n_new, lo, hi = self.execute("SELECT count(*), min(rid), max(rid) FROM items WHERE rid > ?",
                                         (before,)).fetchone()
            if n_new == len(ids) and hi - lo + 1 == n_new:  # every row went in, in order: consecutive rids
                rids = list(range(int(lo), int(hi) + 1))
            else:
                got = dict((i, int(r)) for r, i in self.execute("SELECT rid, id FROM items WHERE rid > ?", (before,)))
                rids = [got.get(i) for i in ids]
        else:
            first = self.execute("SELECT rid FROM items WHERE id = ?", (ids[0],)).fetchone()[0]
            last = self.execute("SELECT rid FROM items WHERE id = ?", (ids[-1],)).fetchone()[0]
            if last - first + 1 == len(ids):  # one writer at a time: consecutive rids
                rids = list(range(int(first), int(last) + 1))
            else:  # pragma: no cover - a sequence with gaps
                by_id = self.rows_by_id(ids)
                rids = [by_id[i].rid for i in ids]
        kinds, places = set(mods), set(spaces)
        if None not in rids and len(places) == 1 and None not in places and len(kinds) == 1:
            # one space, one modality, every row inserted (the bulk path): whole arrays at once
            try:
                at = np.asarray(pos, np.int64)
            except (TypeError, ValueError):  # rows without positions: their rids (a store without lasting rows)
                at = np.asarray(rids, np.int64) if all(p is None for p in pos) else None
            if at is not None:
                self._counts[mods[0]] += len(ids)
                self.set_serving_many(places.pop(), mods[0], at, np.asarray(rids, np.int64))
                return rids
        groups: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        for rid, m, sp, p in zip(rids, mods, spaces, pos):
            if rid is None:
                continue
            self._counts[m] += 1
            if sp is not None:
                g = groups.setdefault((sp, m), ([], []))
                g[0].append(_slot(p, rid))
                g[1].append(rid)
        for (sp, modality), (p, rid) in groups.items():
            self.set_serving_many(sp, modality, np.asarray(p, np.int64), np.asarray(rid, np.int64))
        return rids

    def _insert_columns(self, columns: Sequence[list], tail: str) -> None:
        """INSERT rows given column by column (``(id, modality, key, source, metadata, space, pos)``),
        :data:`ROWS_PER_INSERT` to a statement (in order: their rids ascend with them). One
        statement of many rows costs about half as much a row as one statement a row; its
        parameters are laid out by slice assignment, a column at a time (no tuple per row)."""
        head = "INSERT INTO items (id, modality, key, source, metadata, space, pos, generation) VALUES "
        one = f"(?, ?, ?, ?, ?, ?, ?, {int(self.generation)})"
        width, n = len(columns), len(columns[0])
        if self.catalog.dialect == "postgresql" and n >= COPY_AT:
            return self._copy_columns(columns, tail)

        def params(a: int, b: int) -> list:
            flat: list = [None] * (width * (b - a))
            for j, col in enumerate(columns):
                flat[j::width] = col[a:b]
            return flat

        m = ROWS_PER_INSERT
        whole = n - n % m
        try:
            cur = self.conn.cursor()
            if whole:
                cur.executemany(self.catalog._sql(head + ", ".join([one] * m) + tail),
                                [params(a, a + m) for a in range(0, whole, m)])
            if whole < n:
                cur.execute(self.catalog._sql(head + ", ".join([one] * (n - whole)) + tail), params(whole, n))
        except Exception as e:
            raise self.catalog._error(e) from e

    def _copy_columns(self, columns: Sequence[list], tail: str) -> None:
        """:meth:`_insert_columns` on PostgreSQL for many rows: ``COPY`` into a temporary table (no
        statement parameters to adapt), then one ``INSERT ... SELECT`` in their order (their rids
        ascend with it; ``tail``: the conflict clause)."""
        cols = "id, modality, key, source, metadata, space, pos"
        try:
            cur = self.conn.cursor()
            cur.execute("CREATE TEMP TABLE IF NOT EXISTS items_in (n BIGINT, id TEXT, modality TEXT, key TEXT, "
                        "source TEXT, metadata TEXT, space TEXT, pos BIGINT) ON COMMIT DELETE ROWS")
            cur.execute("TRUNCATE items_in")
            with cur.copy(f"COPY items_in (n, {cols}) FROM STDIN") as copy:
                for row in zip(range(len(columns[0])), *columns):
                    copy.write_row(row)
            cur.execute(f"INSERT INTO items ({cols}, generation) SELECT {cols}, {int(self.generation)} FROM items_in "
                        f"ORDER BY n{tail}")
        except Exception as e:
            raise self.catalog._error(e) from e

    def delete(self, rows: Sequence[Row]) -> None:
        for r in rows:
            if r.space is not None:
                self.set_serving(r.space, r.modality, _slot(r.pos, r.rid), 0)
            self._counts[r.modality] -= 1
        self.executemany("DELETE FROM items WHERE rid = ?", [(r.rid,) for r in rows])

    def serve(self, rid: int, modality: str, old: tuple[str | None, int | None], new: tuple[str | None, int | None]) -> None:
        """Move the serving of item ``rid`` from ``old`` (space, row) to ``new``."""
        if old[0] is not None:
            self.set_serving(old[0], modality, _slot(old[1], rid), 0)
        if new[0] is not None:
            self.set_serving(new[0], modality, _slot(new[1], rid), rid)
        self.execute("UPDATE items SET space = ?, pos = ? WHERE rid = ?", (new[0], new[1], rid))

    def set_serving(self, space: str, modality: str, pos: int, rid: int) -> None:
        page, off = divmod(int(pos), PAGE)
        arr = self._page(space, modality, page)
        arr[off] = rid

    def set_serving_many(self, space: str, modality: str, pos: np.ndarray, rids: np.ndarray) -> None:
        """:meth:`set_serving` of many rows at once (a page at a time)."""
        pages, offs = np.divmod(pos, PAGE)
        for page in np.unique(pages):
            sel = pages == page
            self._page(space, modality, int(page))[offs[sel]] = rids[sel]

    def _page(self, space: str, modality: str, page: int) -> np.ndarray:
        k = (space, modality, page)
        arr = self._pages.get(k)
        if arr is None:
            r = self.execute("SELECT data FROM serving WHERE space = ? AND modality = ? AND page = ?",
                             (space, modality, page)).fetchone()
            arr = np.frombuffer(bytes(r[0]), np.int64).copy() if r else np.zeros(PAGE, np.int64)
            self._pages[k] = arr
        return arr

    def drop_serving(self, space: str) -> None:
        """Clear every serving page of ``space`` (retired, or rows renumbered by a repair): written as
        zeros with this generation, so readers holding the pages see the change."""
        for modality, page in self.execute("SELECT modality, page FROM serving WHERE space = ?", (space,)).fetchall():
            self._pages[(space, modality, int(page))] = np.zeros(PAGE, np.int64)
        for k in [k for k in self._pages if k[0] == space]:
            self._pages[k][:] = 0

    def _write_pages(self) -> None:
        blob = (lambda b: b) if self.catalog.dialect == "sqlite" else bytes
        self.executemany("INSERT INTO serving (space, modality, page, generation, data) VALUES (?, ?, ?, ?, ?) "
                         "ON CONFLICT (space, modality, page) DO UPDATE SET generation = excluded.generation, "
                         "data = excluded.data",
                         [(s, m, p, self.generation, blob(a.tobytes())) for (s, m, p), a in self._pages.items()])

    # plan, documents
    def set_plan(self, plan: Plan) -> None:
        self._plan = plan

    def fill_keyed_pages(self) -> bool:
        """A catalog written before :data:`KEYED_PAGES_DOC`: give every item served with no row
        recorded the slot of its rid (pages and a new generation written at once, whether or not
        the caller finishes this transaction), and write the document; True if it did."""
        if self.execute("SELECT 1 FROM docs WHERE name = ?", (KEYED_PAGES_DOC,)).fetchone():
            return False
        rows = self.execute("SELECT rid, space, modality FROM items WHERE space IS NOT NULL AND pos IS NULL").fetchall()
        for rid, space, modality in rows:
            self.set_serving(space, modality, int(rid), int(rid))
        if rows:
            self._write_pages()
            self.execute("UPDATE header SET generation = ? WHERE id = 1", (self.generation,))
        self.execute("UPDATE header SET version = ? WHERE id = 1 AND version < ?", (KEYED_VERSION, KEYED_VERSION))
        self.put_doc(KEYED_PAGES_DOC, b"1")
        return True

    def stamp_vectors(self, ts: int) -> None:
        """Record, in this transaction, that the vectors it names were written to their store at or
        before timestamp ``ts`` (kept as the largest of any commit: a reader that waits for it sees
        every vector the catalog names)."""
        r = self.execute("SELECT data FROM docs WHERE name = ?", (VECTORS_TS_DOC,)).fetchone()
        if r is None or int(bytes(r[0])) < int(ts):
            self.put_doc(VECTORS_TS_DOC, str(int(ts)).encode())

    def put_doc(self, name: str, data: bytes) -> None:
        self.execute("INSERT INTO docs (name, data, version) VALUES (?, ?, 1) ON CONFLICT (name) DO UPDATE SET "
                     "data = excluded.data, version = docs.version + 1", (name, data))

    def finish(self, now: str) -> None:
        """Write the touched pages and the header (called once, last)."""
        self._write_pages()
        h = self.header
        plan_gen = self.generation if self._plan is not None else h["plan_generation"]
        plan = json.dumps((self._plan if self._plan is not None else h["plan"]).to_json(), sort_keys=True,
                          allow_nan=False)
        self.execute("UPDATE header SET generation = ?, updated = ?, plan = ?, plan_generation = ?, n_image = ?, "
                     "n_text = ? WHERE id = 1",
                     (self.generation, now, plan, plan_gen, h["n_image"] + self._counts["image"],
                      h["n_text"] + self._counts["text"]))
