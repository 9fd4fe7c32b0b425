"""The catalog of a collection: its items, serving plan, serving rows and backfill documents in a
real database -- SQLite (stdlib ``sqlite3``, WAL, one file) for an embedded collection, PostgreSQL
(psycopg 3, one schema per collection) for one shared by several machines. Same schema on both::

    header    one row: format, version, name, index backend, created/updated, generation (bumped by
              every commit), the plan (JSON) and the generation that last changed it, live items per
              modality
    items     rid (never reused), id (unique among live items), modality, vector key, source and
              metadata (JSON), the space serving it and its row there (NULL: no space holds it)
    serving   per (space, modality) the rid of the item each store row serves (0: none), in pages of
              :data:`PAGE` rows stamped with the generation that last wrote them
    docs      small named documents (the backfill's job, order and leases) with a version

Opening reads the header, never the history. A reader keeps each space's serving rows in memory and
re-reads only the pages written since its generation. Writers serialise on the header row
(``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE`` on PostgreSQL); a commit is one
transaction, so a SIGKILL at any point leaves the old or the new catalog.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .plan import Plan
from .storage import flock

__all__ = ["CATALOG_FILE", "PAGE", "Catalog", "CatalogError", "Row", "filter_sql", "open_catalog"]

CATALOG_FILE = "catalog.sqlite"
FORMAT = "nobackfill-catalog"
VERSION = 2
#: store rows per serving page (a page is PAGE int64 rids)
PAGE = 4096

_SCHEMA = """
CREATE TABLE IF NOT EXISTS header (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    format TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL, backend TEXT NOT NULL,
    created TEXT NOT NULL, updated TEXT NOT NULL, generation BIGINT NOT NULL, plan TEXT NOT NULL,
    plan_generation BIGINT NOT NULL, n_image BIGINT NOT NULL, n_text BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    rid {rid} PRIMARY KEY, id TEXT NOT NULL UNIQUE, modality TEXT NOT NULL, key TEXT NOT NULL,
    source TEXT NOT NULL, metadata TEXT NOT NULL, space TEXT, pos BIGINT, generation BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS items_key ON items (key);
CREATE INDEX IF NOT EXISTS items_served ON items (space, modality);
CREATE TABLE IF NOT EXISTS serving (
    space TEXT NOT NULL, modality TEXT NOT NULL, page BIGINT NOT NULL, generation BIGINT NOT NULL,
    data {blob} NOT NULL, PRIMARY KEY (space, modality, page));
CREATE INDEX IF NOT EXISTS serving_generation ON serving (generation);
CREATE TABLE IF NOT EXISTS docs (name TEXT PRIMARY KEY, data {blob} NOT NULL, version BIGINT NOT NULL);
"""


class CatalogError(Exception):
    """The catalog database is missing, unreadable or inconsistent (the message names it)."""


@dataclass(frozen=True)
class Row:
    """One live item as stored: ``rid`` (its row, never reused), the item's fields, and the space
    serving it with its row there (None: no space holds its vector)."""

    rid: int
    id: str
    modality: str
    key: str
    source: dict[str, Any]
    metadata: dict[str, Any]
    space: str | None
    pos: int | None


_ROW_COLS = "rid, id, modality, key, source, metadata, space, pos"


def _row(r: Sequence[Any]) -> Row:
    return Row(int(r[0]), r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6],
               None if r[7] is None else int(r[7]))


def _chunks(seq: Sequence[Any], n: int = 4000) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def filter_sql(flt: Mapping[str, Any], dialect: str) -> tuple[str, list[Any]]:
    """A metadata filter (``{"key": value | [values]}``, dotted keys for nested objects) as a SQL
    condition on ``items.metadata`` (``?`` placeholders, as :meth:`Catalog.query` takes) and its
    parameters; every key must match (see
    :func:`nobackfill.search.searcher.matches_filter`)."""
    conds, params = [], []
    for key, want in flt.items():
        parts = [str(p) for p in str(key).split(".")]
        wants = list(want) if isinstance(want, (list, tuple, set)) else [want]
        if dialect == "sqlite":
            path = "$" + "".join('."' + p.replace('"', '""') + '"' for p in parts)
            expr, ors = "json_extract(metadata, ?)", []
            for w in wants:
                if w is None:
                    ors.append(f"({expr} IS NULL)")
                    params.append(path)
                elif isinstance(w, (dict, list)):
                    ors.append("(json(json_extract(metadata, ?)) = json(?))")
                    params += [path, json.dumps(w, sort_keys=True)]
                else:
                    ors.append(f"({expr} = ? AND json_type(metadata, ?) {_json_type_sql(w)})")
                    params += [path, int(w) if isinstance(w, bool) else w, path]
        else:
            ors = []
            for w in wants:
                if w is None:
                    ors.append("((metadata::jsonb #> ?) IS NULL OR (metadata::jsonb #> ?) = 'null'::jsonb)")
                    params += [parts, parts]
                else:
                    ors.append("((metadata::jsonb #> ?) = ?::jsonb)")
                    params += [parts, json.dumps(w)]
        conds.append("(" + " OR ".join(ors or ["0 = 1"]) + ")")
    return " AND ".join(conds) or "1 = 1", params


def unsourced_sql(dialect: str) -> str:
    """A condition on ``items`` true for an item with nothing to embed it again from (an image
    without a path, a text without a text: imported from a url or without a source column)."""
    if dialect == "sqlite":
        get = "coalesce(json_extract(source, '$.{}'), '')"
    else:
        get = "coalesce(source::jsonb ->> '{}', '')"
    return f"((modality = 'image' AND {get.format('path')} = '') OR (modality = 'text' AND {get.format('text')} = ''))"


def _unsourced_index(dialect: str) -> str:
    """A partial index of the items without a source: counting them reads only those."""
    return f"CREATE INDEX IF NOT EXISTS items_unsourced ON items (modality) WHERE {unsourced_sql(dialect)}"


def _json_type_sql(w: Any) -> str:
    """The JSON types that equal Python value ``w`` (1 == 1.0 == True, as in Python)."""
    if isinstance(w, str):
        return "= 'text'"
    return "IN ('integer', 'real', 'true', 'false')"


class Catalog:
    """A collection's catalog in SQLite or PostgreSQL (see the module doc). Thread-safe: one
    connection reads, one writes, each behind its own lock."""

    def __init__(self, location: str, dialect: str, connect: Any, lock_dir: Path | None, schema: str = "") -> None:
        self.location = location
        self.dialect = dialect
        self._connect = connect
        self._lock_dir = lock_dir
        self._schema = schema
        self._indexed = False
        self._read_conn: Any = None
        self._write_conn: Any = None
        self._rlock = threading.RLock()
        self._wlock = threading.RLock()
        #: an in-memory catalog (a plain gallery opened as a collection) calls this before its first
        #: write: it returns the real catalog, which this object becomes (see :func:`memory_catalog`)
        self.before_write: Any = None
        self.epoch = 0  # bumped when this object starts to stand for another database

    def __str__(self) -> str:
        return self.location

    # ------------------------------------------------------------------ connections
    def _sql(self, sql: str) -> str:
        return sql if self.dialect == "sqlite" else sql.replace("?", "%s")

    def _reader(self) -> Any:
        if self._read_conn is None:
            self._read_conn = self._connect()
        return self._read_conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Rows of one read statement (autocommit: the latest committed state)."""
        with self._rlock:
            try:
                return self._reader().execute(self._sql(sql), tuple(params)).fetchall()
            except Exception as e:
                self._drop_if_broken("_read_conn")
                raise self._error(e) from e

    @contextlib.contextmanager
    def reading(self) -> Iterator["Catalog"]:
        """One read transaction: the statements inside see one committed state."""
        with self._rlock:
            conn = self._reader()
            try:
                conn.execute("BEGIN" if self.dialect == "sqlite" else "BEGIN ISOLATION LEVEL REPEATABLE READ")
                yield self
            except Exception as e:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                raise self._error(e) from e
            else:
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def writing(self) -> Iterator["Writer"]:
        """A write transaction, serialised with every other writer of this catalog (any process,
        any machine); committed when the block ends, rolled back if it raises."""
        from .store import _crash_point

        if self.before_write is not None:
            self._become(self.before_write())
        with self._wlock:
            if self._write_conn is None:
                self._write_conn = self._connect()
            conn = self._write_conn
            try:
                if self.dialect == "sqlite":
                    conn.execute("BEGIN IMMEDIATE")
                else:
                    conn.execute("BEGIN")
                    conn.execute("SELECT generation FROM header WHERE id = 1 FOR UPDATE")
            except Exception as e:
                self._drop_if_broken("_write_conn")
                raise self._error(e) from e
            try:
                if not self._indexed:  # catalogs written before the index existed get it at their first write
                    conn.execute(_unsourced_index(self.dialect))
                    self._indexed = True
                w = Writer(self, conn)
                yield w
                _crash_point("before")  # test-only kill points around the commit (see store._crash_point)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                raise
            _crash_point("after")

    def _drop_if_broken(self, attr: str) -> None:
        """Forget a connection the server closed (a restart, a network cut): the next call opens a
        new one instead of failing for ever."""
        conn = getattr(self, attr)
        if conn is not None and (getattr(conn, "closed", False) or getattr(conn, "broken", False)):
            setattr(self, attr, None)

    def _become(self, real: "Catalog") -> None:
        with self._rlock, self._wlock:
            self.close()
            self.location, self.dialect, self._connect = real.location, real.dialect, real._connect
            self._lock_dir, self._schema = real._lock_dir, real._schema
            self.before_write = None
            self._keeper = None
            self.epoch += 1

    def _error(self, e: Exception) -> Exception:
        if isinstance(e, CatalogError):
            return e
        return CatalogError(f"catalog {self.location}: {type(e).__name__}: {e}")

    def close(self) -> None:
        for conn in (self._read_conn, self._write_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
        self._read_conn = self._write_conn = None

    # ------------------------------------------------------------------ schema
    def create(self, header: Mapping[str, Any], fill: Any = None) -> None:
        """Create the tables and the header row in one transaction, ``fill(writer)`` adding rows in
        it (PostgreSQL; SQLite catalogs are made by :func:`create_sqlite`)."""
        conn = self._connect()
        try:
            conn.execute("BEGIN")
            if self._schema:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
                conn.execute(f'SET LOCAL search_path TO "{self._schema}"')
            probe = "SELECT to_regclass('header')" if self.dialect == "postgresql" else \
                "SELECT max(name) FROM sqlite_master WHERE name = 'header'"
            if conn.execute(probe).fetchone()[0] is not None:
                raise FileExistsError(f"catalog {self.location} already exists")
            _create_tables(conn, self.dialect, header)
            if fill is not None:
                fill(Writer(self, conn))
            conn.execute("COMMIT")
        except Exception as e:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            raise self._error(e) from e
        finally:
            conn.close()

    def exists(self) -> bool:
        try:
            return bool(self.query("SELECT count(*) FROM header")[0][0])
        except CatalogError:
            return False

    def header(self) -> dict[str, Any]:
        rows = self.query("SELECT format, version, name, backend, created, updated, generation, plan, plan_generation, "
                          "n_image, n_text FROM header WHERE id = 1")
        if not rows:
            raise CatalogError(f"catalog {self.location} has no header row (not a collection catalog)")
        return _header(rows[0], self.location)

    def generation(self) -> tuple[int, int]:
        """``(generation, plan generation)``: one indexed read."""
        r = self.query("SELECT generation, plan_generation FROM header WHERE id = 1")
        return int(r[0][0]), int(r[0][1])

    # ------------------------------------------------------------------ items
    def rows_by_rid(self, rids: Sequence[int]) -> dict[int, Row]:
        out: dict[int, Row] = {}
        for part in _chunks(list(rids)):
            sql = f"SELECT {_ROW_COLS} FROM items WHERE rid IN ({','.join('?' * len(part))})"
            out.update((r.rid, r) for r in map(_row, self.query(sql, [int(x) for x in part])))
        return out

    def rows_by_id(self, ids: Sequence[str]) -> dict[str, Row]:
        return _rows_by(self.query, "id", ids)

    def rows(self, modality: str | None = None, where: str = "", params: Sequence[Any] = ()) -> Iterator[Row]:
        """Every live item (of ``modality``), in insertion order."""
        conds = ([f"modality = '{modality}'"] if modality else []) + ([where] if where else [])
        sql = f"SELECT {_ROW_COLS} FROM items" + (" WHERE " + " AND ".join(conds) if conds else "") + " ORDER BY rid"
        return map(_row, self.query(sql, params))

    def rids_matching(self, modality: str, flt: Mapping[str, Any]) -> np.ndarray:
        cond, params = filter_sql(flt, self.dialect)
        rows = self.query(f"SELECT rid FROM items WHERE modality = ? AND {cond}", (modality, *params))
        return np.fromiter((r[0] for r in rows), np.int64, len(rows))

    # ------------------------------------------------------------------ serving pages
    def pages(self, since: int) -> list[tuple[str, str, int, bytes]]:
        """``(space, modality, page, data)`` of every serving page written after generation ``since``."""
        return [(r[0], r[1], int(r[2]), bytes(r[3])) for r in
                self.query("SELECT space, modality, page, data FROM serving WHERE generation > ?", (int(since),))]

    # ------------------------------------------------------------------ documents
    def read_doc(self, name: str) -> bytes | None:
        r = self.query("SELECT data FROM docs WHERE name = ?", (name,))
        return bytes(r[0][0]) if r else None

    def write_doc(self, name: str, data: bytes) -> None:
        with self.writing() as w:
            w.put_doc(name, data)

    def delete_doc(self, name: str) -> None:
        with self.writing() as w:
            w.execute("DELETE FROM docs WHERE name = ?", (name,))

    def swap_doc(self, name: str, expected: bytes | None, data: bytes) -> bool:
        """Compare-and-set: replace document ``name`` by ``data`` only if it still holds
        ``expected`` (None: only if there is none); True if this call replaced it. One statement
        that returns a row when it matched (``UPDATE ... WHERE data = expected RETURNING``), so of
        two processes swapping the same document from the same state exactly one wins."""
        with self.writing() as w:
            if expected is None:
                row = w.execute("INSERT INTO docs (name, data, version) VALUES (?, ?, 1) ON CONFLICT (name) DO NOTHING "
                                "RETURNING version", (name, data)).fetchone()
            else:
                row = w.execute("UPDATE docs SET data = ?, version = version + 1 WHERE name = ? AND data = ? "
                                "RETURNING version", (data, name, expected)).fetchone()
        return row is not None

    def list_docs(self, prefix: str) -> list[str]:
        return sorted(r[0] for r in self.query("SELECT name FROM docs WHERE substr(name, 1, ?) = ?",
                                               (len(prefix), prefix)))

    # ------------------------------------------------------------------ locks
    @contextlib.contextmanager
    def lock(self, name: str, blocking: bool = True) -> Iterator[bool]:
        """An exclusive named lock held by this process until the block ends (released by the
        operating system or the database if the process dies): ``flock`` beside a SQLite catalog,
        a session advisory lock on PostgreSQL. Yields False when not taken (``blocking=False``)."""
        if self.dialect == "sqlite":
            assert self._lock_dir is not None
            with flock(self._lock_dir / f".{name}-lock", blocking=blocking) as taken:
                yield taken
            return
        conn = self._connect()
        try:
            key = f"nobackfill:{self._schema}:{name}"
            if blocking:
                conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
                taken = True
            else:
                taken = bool(conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,))
                             .fetchone()[0])
            yield taken
        finally:
            conn.close()  # ends the session: its advisory locks go with it

    # ------------------------------------------------------------------ integrity
    def check(self) -> list[str]:
        """The database's own check (``PRAGMA quick_check`` on SQLite) and the catalog's invariants."""
        problems: list[str] = []
        if self.dialect == "sqlite":
            try:
                res = [r[0] for r in self.query("PRAGMA quick_check")]
            except CatalogError as e:
                return [str(e)]
            if res != ["ok"]:
                problems += [f"{self.location}: quick_check: {r}" for r in res[:10]]
                return problems
        h = self.header()
        for m in ("image", "text"):
            n = int(self.query("SELECT count(*) FROM items WHERE modality = ?", (m,))[0][0])
            if n != h[f"n_{m}"]:
                problems.append(f"{self.location}: header says {h[f'n_{m}']} {m} items, the items table holds {n}")
        served = self.query("SELECT space, modality, count(*) FROM items WHERE space IS NOT NULL AND pos IS NOT NULL "
                            "GROUP BY space, modality")
        want = {(s, m): int(n) for s, m, n in served}
        have: dict[tuple[str, str], int] = {}
        for space, modality, _page, data in self.pages(-1):
            have[(space, modality)] = have.get((space, modality), 0) + int(np.count_nonzero(np.frombuffer(data, np.int64)))
        for k in set(want) | set(have):
            if want.get(k, 0) != have.get(k, 0):
                problems.append(f"{self.location}: space {k[0]} serves {have.get(k, 0)} {k[1]} rows but "
                                f"{want.get(k, 0)} items name it")
        return problems


class Writer:
    """The statements of one write transaction (:meth:`Catalog.writing`)."""

    def __init__(self, catalog: Catalog, conn: Any) -> None:
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
        out: list[Row] = []
        for part in _chunks(list(keys)):
            sql = f"SELECT {_ROW_COLS} FROM items WHERE key IN ({','.join('?' * len(part))})"
            out += map(_row, self.execute(sql, list(part)).fetchall())
        return out

    def rows_served_by(self, space: str) -> list[Row]:
        return list(map(_row, self.execute(f"SELECT {_ROW_COLS} FROM items WHERE space = ? ORDER BY rid",
                                           (space,)).fetchall()))

    def all_rows(self) -> list[Row]:
        return list(map(_row, self.execute(f"SELECT {_ROW_COLS} FROM items ORDER BY rid").fetchall()))

    def insert(self, items: Sequence[tuple[str, str, str, str, str]],
               served: Sequence[tuple[str | None, int | None]] | None = None, *,
               new_ids_only: bool = False) -> list[int | None]:
        """Insert ``(id, modality, key, source json, metadata json)`` rows, each served by
        ``served[i]`` (space, row) if given; their rids, in order. ``new_ids_only``: a row whose id
        is live already is left out (its rid is None), without a lookup per row first."""
        if not items:
            return []
        served = served if served is not None else [(None, None)] * len(items)
        sql = self.catalog._sql("INSERT INTO items (id, modality, key, source, metadata, space, pos, generation) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)" + (" ON CONFLICT (id) DO NOTHING" if new_ids_only else ""))
        rows = [(*it, sp, pos, self.generation) for it, (sp, pos) in zip(items, served)]
        before = int(self.execute("SELECT coalesce(max(rid), 0) FROM items").fetchone()[0]) if new_ids_only else 0
        try:
            cur = self.conn.cursor()
            cur.executemany(sql, rows)
        except Exception as e:
            raise self.catalog._error(e) from e
        rids: list[int | None]
        if new_ids_only:  # one writer at a time: the rows past ``before`` are this insert's
            got = dict((i, int(r)) for r, i in self.execute("SELECT rid, id FROM items WHERE rid > ?", (before,)))
            rids = [got.get(it[0]) for it in items]
        else:
            first = self.execute("SELECT rid FROM items WHERE id = ?", (items[0][0],)).fetchone()[0]
            last = self.execute("SELECT rid FROM items WHERE id = ?", (items[-1][0],)).fetchone()[0]
            if last - first + 1 == len(items):  # one writer at a time: consecutive rids
                rids = list(range(int(first), int(last) + 1))
            else:  # pragma: no cover - a sequence with gaps
                by_id = self.rows_by_id([it[0] for it in items])
                rids = [by_id[it[0]].rid for it in items]
        groups: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        for rid, it, (sp, pos) in zip(rids, items, served):
            if rid is None:
                continue
            self._counts[it[1]] += 1
            if sp is not None and pos is not None:
                g = groups.setdefault((sp, it[1]), ([], []))
                g[0].append(pos)
                g[1].append(rid)
        for (sp, modality), (pos, rid) in groups.items():
            self.set_serving_many(sp, modality, np.asarray(pos, np.int64), np.asarray(rid, np.int64))
        return rids

    def delete(self, rows: Sequence[Row]) -> None:
        for r in rows:
            if r.space is not None and r.pos is not None:
                self.set_serving(r.space, r.modality, r.pos, 0)
            self._counts[r.modality] -= 1
        self.executemany("DELETE FROM items WHERE rid = ?", [(r.rid,) for r in rows])

    def serve(self, rid: int, modality: str, old: tuple[str | None, int | None], new: tuple[str | None, int | None]) -> None:
        """Move the serving of item ``rid`` from ``old`` (space, row) to ``new``."""
        if old[0] is not None and old[1] is not None:
            self.set_serving(old[0], modality, old[1], 0)
        if new[0] is not None and new[1] is not None:
            self.set_serving(new[0], modality, new[1], rid)
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

    # plan, documents
    def set_plan(self, plan: Plan) -> None:
        self._plan = plan

    def put_doc(self, name: str, data: bytes) -> None:
        self.execute("INSERT INTO docs (name, data, version) VALUES (?, ?, 1) ON CONFLICT (name) DO UPDATE SET "
                     "data = excluded.data, version = docs.version + 1", (name, data))

    def finish(self, now: str) -> None:
        """Write the touched pages and the header (called once, last)."""
        blob = (lambda b: b) if self.catalog.dialect == "sqlite" else bytes
        self.executemany("INSERT INTO serving (space, modality, page, generation, data) VALUES (?, ?, ?, ?, ?) "
                         "ON CONFLICT (space, modality, page) DO UPDATE SET generation = excluded.generation, "
                         "data = excluded.data",
                         [(s, m, p, self.generation, blob(a.tobytes())) for (s, m, p), a in self._pages.items()])
        h = self.header
        plan_gen = self.generation if self._plan is not None else h["plan_generation"]
        plan = json.dumps((self._plan if self._plan is not None else h["plan"]).to_json(), sort_keys=True,
                          allow_nan=False)
        self.execute("UPDATE header SET generation = ?, updated = ?, plan = ?, plan_generation = ?, n_image = ?, "
                     "n_text = ? WHERE id = 1",
                     (self.generation, now, plan, plan_gen, h["n_image"] + self._counts["image"],
                      h["n_text"] + self._counts["text"]))


def _rows_by(query: Any, column: str, values: Sequence[str]) -> dict[str, Row]:
    out: dict[str, Row] = {}
    for part in _chunks(list(values)):
        sql = f"SELECT {_ROW_COLS} FROM items WHERE {column} IN ({','.join('?' * len(part))})"
        for r in map(_row, query(sql, list(part))):
            out[getattr(r, column)] = r
    return out


def _header(r: Sequence[Any], where: str) -> dict[str, Any]:
    keys = ("format", "version", "name", "backend", "created", "updated", "generation", "plan", "plan_generation",
            "n_image", "n_text")
    h = dict(zip(keys, r))
    if h["format"] != FORMAT:
        raise CatalogError(f"catalog {where}: not a {FORMAT} database")
    if not isinstance(h["version"], int) or not 1 <= h["version"] <= VERSION:
        raise CatalogError(f"catalog {where}: unsupported version {h['version']!r} (this nobackfill reads <= {VERSION})")
    try:
        h["plan"] = Plan.from_json(json.loads(h["plan"]))
    except ValueError as e:
        raise CatalogError(f"catalog {where}: unreadable plan ({e})") from e
    for k in ("generation", "plan_generation", "n_image", "n_text"):
        h[k] = int(h[k])
    return h


def _create_tables(conn: Any, dialect: str, header: Mapping[str, Any]) -> None:
    ddl = _SCHEMA.format(rid="INTEGER" if dialect == "sqlite" else "BIGSERIAL",
                         blob="BLOB" if dialect == "sqlite" else "BYTEA")
    if dialect == "sqlite":
        ddl = ddl.replace("rid INTEGER PRIMARY KEY", "rid INTEGER PRIMARY KEY AUTOINCREMENT")
    for stmt in [s for s in ddl.split(";") if s.strip()]:
        conn.execute(stmt)
    conn.execute(_unsourced_index(dialect))
    ph = "?" if dialect == "sqlite" else "%s"
    conn.execute(f"INSERT INTO header (id, format, version, name, backend, created, updated, generation, plan, "
                 f"plan_generation, n_image, n_text) VALUES (1, {', '.join([ph] * 11)})",
                 (FORMAT, VERSION, header["name"], header["backend"], header["created"], header["updated"],
                  int(header.get("generation", 0)), json.dumps(header["plan"].to_json(), sort_keys=True), 0, 0, 0))


# --------------------------------------------------------------------------- SQLite


def _sqlite_connect(path: Path) -> Any:
    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL: a commit survives a process kill
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA cache_size = -32768")  # up to 32 MiB of pages: bulk commits at millions of items
        return conn

    return connect


def sqlite_catalog(path: str | Path) -> Catalog:
    """The SQLite catalog at ``path`` (a ``catalog.sqlite`` file; its directory holds its locks)."""
    path = Path(path)
    return Catalog(str(path), "sqlite", _sqlite_connect(path), path.parent)


def create_sqlite(path: str | Path, header: Mapping[str, Any],
                  fill: Any = None) -> Catalog:
    """Create the SQLite catalog ``path`` atomically: built in a temporary file (``fill(writer)``
    may add rows in the same transaction), then renamed into place, so ``path`` exists only once
    it is whole."""
    from .store import _crash_point, _fsync_dir

    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute("BEGIN")
            _create_tables(conn, "sqlite", header)
            if fill is not None:
                fill(Writer(Catalog(str(path), "sqlite", None, path.parent), conn))
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        _crash_point("before")
        os.replace(tmp, path)
    except BaseException:
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            with contextlib.suppress(OSError):
                p.unlink()
        raise
    _fsync_dir(path.parent)
    _crash_point("after")
    return sqlite_catalog(path)


def memory_catalog(header: Mapping[str, Any], fill: Any, lock_dir: Path, before_write: Any) -> Catalog:
    """A catalog in memory, filled by ``fill(writer)``: what a plain gallery directory is opened
    with (nothing is written to it by reading). ``before_write()`` is called before its first write
    and returns the real catalog (created on disk then), which the returned object becomes."""
    uri = f"file:nobackfill-{uuid.uuid4().hex}?mode=memory&cache=shared"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)

    cat = Catalog("<in memory>", "sqlite", connect, lock_dir)
    cat._keeper = connect()  # the shared in-memory database lives while a connection does
    cat.create(header, fill)
    cat.before_write = before_write
    return cat


# --------------------------------------------------------------------------- PostgreSQL


def postgres_catalog(url: str, name: str) -> Catalog:
    """The catalog of collection ``name`` in the PostgreSQL database ``url`` (schema ``nb_<name>``)."""
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover - a core dependency
        raise CatalogError("a PostgreSQL catalog needs psycopg 3 (pip install 'psycopg[binary]')") from e
    schema = "nb_" + re.sub(r"[^a-z0-9_]", "_", name.lower())[:50]

    def connect() -> Any:
        conn = psycopg.connect(url, autocommit=True)
        conn.execute(f'SET search_path TO "{schema}"')
        return conn

    return Catalog(redact(f"{url}#{name}"), "postgresql", connect, None, schema=schema)


def redact(uri: str) -> str:
    """``uri`` with any password in a ``postgresql://USER:PASSWORD@HOST`` part replaced by ``***``
    (what messages, logs and status show)."""
    return re.sub(r"(postgres(?:ql)?://[^:@/?#]+):[^@/?#]*@", r"\1:***@", uri)


def open_catalog(uri: str) -> Catalog:
    """A catalog by URI: a ``.sqlite`` path, or ``postgresql://...#NAME``."""
    if uri.startswith(("postgresql://", "postgres://")):
        url, _, name = uri.partition("#")
        return postgres_catalog(url, name or "default")
    return sqlite_catalog(uri)
