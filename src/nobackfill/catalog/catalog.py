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

The schema, the header and the SQL of rows live in :mod:`.catalog_schema`, the statements of a write
transaction in :mod:`.catalog_writer`; this module holds :class:`Catalog` and opens one (SQLite,
in memory, PostgreSQL), and is the one to import.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .._atomic import _crash_point
from .._atomic import fsync_dir as _fsync_dir
from .schema import (_ROW_COLS, CATALOG_FILE, PAGE, CatalogError, CatalogUnreachable, Row, _chunks, _create_tables,
                     _header, _index_upgrades, _row, _rows_by, catalog_error, check_collection_name, filter_sql,
                     one_line, redact, rows_by_key, unsourced_sql)
from .connections import KeptConnections
from .sqlite_connect import _sqlite_connect
from .writer import KEYED_PAGES_DOC, VECTORS_TS_DOC, Writer
from ..gallery.atomic_files import flock

__all__ = ["CATALOG_FILE", "PAGE", "Catalog", "CatalogError", "CatalogUnreachable", "Row", "check_collection_name",
           "filter_sql", "open_catalog"]

# importable from here as before the split (nobackfill modules use it)
_REEXPORTED = (unsourced_sql,)


class Catalog(KeptConnections):
    """A collection's catalog in SQLite or PostgreSQL (see the module doc). Thread-safe: one
    connection reads, one writes, each behind its own lock (:mod:`.connections`: one the server
    closed is replaced)."""

    def __init__(self, location: str, dialect: str, connect: Any, lock_dir: Path | None, schema: str = "") -> None:
        self.location = location
        self.dialect = dialect
        self._connect = connect
        self._lock_dir = lock_dir
        self._schema = schema
        self._indexed = False
        self._keyed = False  # this process checked that the serving pages hold keyed slots (KEYED_PAGES_DOC)
        self._read_conn: Any = None
        self._write_conn: Any = None
        self._in_read = False  # inside reading(): its statements are not run again on another connection
        self._rlock = threading.RLock()
        self._wlock = threading.RLock()
        #: an in-memory catalog (a plain gallery opened as a collection) calls this before its first
        #: write: it returns the real catalog, which this object becomes (see :func:`memory_catalog`)
        self.before_write: Any = None
        self.epoch = 0  # bumped when this object starts to stand for another database
        self._committed: threading.Event | None = None  # set by each commit while checkpoints run apart

    def __str__(self) -> str:
        return self.location

    # ------------------------------------------------------------------ connections
    def _sql(self, sql: str) -> str:
        return sql if self.dialect == "sqlite" else sql.replace("?", "%s")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Rows of one read statement (autocommit: the latest committed state); run again on a new
        connection where the server had closed the kept one, but not inside :meth:`reading` (its
        snapshot was that connection's)."""
        with self._rlock:
            try:
                return self._on("_read_conn", lambda c: c.execute(self._sql(sql), tuple(params)).fetchall(),
                                again=not self._in_read)[0]
            except Exception as e:
                self._drop_if_broken("_read_conn")
                raise self._error(e) from e

    @contextlib.contextmanager
    def reading(self) -> Iterator["Catalog"]:
        """One read transaction: the statements inside see one committed state."""
        with self._rlock:
            try:
                _, conn = self._on("_read_conn", lambda c: c.execute(
                    "BEGIN" if self.dialect == "sqlite" else "BEGIN ISOLATION LEVEL REPEATABLE READ"))
            except Exception as e:
                raise self._error(e) from e
            outer, self._in_read = self._in_read, True
            try:
                yield self
            except Exception as e:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                raise self._error(e) from e
            else:
                conn.execute("COMMIT")
            finally:
                self._in_read = outer

    @contextlib.contextmanager
    def writing(self) -> Iterator["Writer"]:
        """A write transaction, serialised with every other writer of this catalog (any process,
        any machine); committed when the block ends, rolled back if it raises."""
        if self.before_write is not None:
            self._become(self.before_write())
        with self._wlock:
            try:
                _, conn = self._on("_write_conn", self._begin)
            except Exception as e:
                if self._write_conn is not None:  # (a BEGIN that ran, then a refused lock: not left open)
                    with contextlib.suppress(Exception):
                        self._write_conn.execute("ROLLBACK")
                self._drop_if_broken("_write_conn")
                raise self._error(e) from e
            try:
                if not self._indexed:  # catalogs written before an index changed get it at their first write
                    for stmt in _index_upgrades(self.dialect):
                        conn.execute(stmt)
                    self._indexed = True
                w = Writer(self, conn)
                checked = self._keyed or w.fill_keyed_pages() or True  # an older catalog: with its first write
                yield w
                _crash_point("before")  # test-only kill points around the commit (see store._crash_point)
                conn.execute("COMMIT")
                self._keyed = checked
                if self._committed is not None:
                    self._committed.set()
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                raise
            _crash_point("after")

    @contextlib.contextmanager
    def checkpoints_apart(self) -> Iterator[None]:
        """While inside, this process's commits leave the checkpoints of SQLite's write-ahead log
        (copying committed pages into the database file, fsyncs included) to a thread of its own,
        woken by each commit: a bulk writer (an import's catalog worker) inserts its next rows
        meanwhile. A checkpoint never blocks a writer or a reader (PASSIVE) and one that falls behind
        only lets the log grow; the last one runs when the block ends, and commits checkpoint
        themselves again after it. Durability is unchanged: a commit is in the log either way.
        A no-op on PostgreSQL."""
        if self.dialect != "sqlite" or self._committed is not None or self.before_write is not None:
            yield
            return
        with self._wlock:
            if self._write_conn is None:
                self._write_conn = self._connect()
            self._write_conn.execute("PRAGMA wal_autocheckpoint = 0")
        woken, stop = threading.Event(), threading.Event()

        def checkpoint() -> None:
            conn = self._connect()
            try:
                while not stop.is_set():
                    woken.wait()
                    woken.clear()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            finally:
                conn.close()

        thread = threading.Thread(target=checkpoint, name="catalog-checkpoints", daemon=True)
        self._committed = woken
        thread.start()
        try:
            yield
        finally:
            stop.set()
            woken.set()
            thread.join()
            self._committed = None
            with self._wlock:
                if self._write_conn is not None:
                    self._write_conn.execute("PRAGMA wal_autocheckpoint = 1000")  # SQLite's default
                    self._write_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _begin(self, conn: Any) -> None:
        """Begin a write transaction on ``conn``: serialised on the header row."""
        if self.dialect == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn.execute("BEGIN")
            conn.execute("SELECT generation FROM header WHERE id = 1 FOR UPDATE")

    def _become(self, real: "Catalog") -> None:
        with self._rlock, self._wlock:
            self.close()
            self.location, self.dialect, self._connect = real.location, real.dialect, real._connect
            self._lock_dir, self._schema = real._lock_dir, real._schema
            self.before_write = None
            self._keeper = None
            self._keyed = False
            self.epoch += 1

    def _error(self, e: Exception) -> Exception:
        self._drop_if_broken("_read_conn")  # a server gone mid-call: the next call opens a new connection
        return catalog_error(e, self.location)

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
        """Whether the catalog holds a collection; :class:`CatalogUnreachable` where its database
        cannot be reached at all (not the same as no collection there)."""
        with self._rlock:
            try:
                if self.dialect != "sqlite":
                    self._reader()
            except Exception as e:  # a database server that does not answer (SQLite: a file, read below)
                # every line of it ("connection refused" is the first of psycopg's two), one line
                why = one_line(e) or type(e).__name__
                raise CatalogUnreachable(f"cannot reach the catalog {self.location} ({why}); is the database "
                                         "running, and are the address, database and user right?") from None
        try:
            return bool(self.query("SELECT count(*) FROM header")[0][0])
        except CatalogUnreachable:
            raise
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

    def rows_by_key(self, keys: Sequence[str]) -> list[Row]:
        """The live rows of item versions ``keys`` (:func:`~.schema.rows_by_key`)."""
        return rows_by_key(self.query, keys)

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

    def vectors_ts(self) -> int:
        """The largest vector-store timestamp any commit recorded (0: none;
        :meth:`~nobackfill.catalog.writer.Writer.stamp_vectors`)."""
        data = self.read_doc(VECTORS_TS_DOC)
        return int(data) if data else 0

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
    def held_elsewhere(self, name: str) -> bool:
        """Whether another holder has lock ``name`` now (a read: beside a SQLite catalog, a lock never
        taken has no file, and none is made; a plain gallery stays unwritten by ``status``)."""
        if self.dialect == "sqlite":
            assert self._lock_dir is not None
            if not (self._lock_dir / f".{name}-lock").exists():
                return False
        with self.lock(name, blocking=False) as taken:
            return not taken

    @contextlib.contextmanager
    def lock(self, name: str, blocking: bool = True) -> Iterator[bool]:
        """An exclusive named lock held by this process until the block ends (or the process dies):
        ``flock`` beside a SQLite catalog, a session advisory lock on PostgreSQL. Yields False when
        not taken (``blocking=False``)."""
        if self.dialect == "sqlite":
            assert self._lock_dir is not None
            with flock(self._lock_dir / f".{name}-lock", blocking=blocking) as taken:
                yield taken
            return
        conn, key, taken = self._connect(), f"nobackfill:{self._schema}:{name}", False
        try:
            if blocking:
                conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
                taken = True
            else:
                taken = bool(conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,))
                             .fetchone()[0])
            yield taken
        finally:  # unlocked now: a closed session's locks go only once its server process has ended
            if taken:
                with contextlib.suppress(Exception):
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
            conn.close()  # ends the session (a killed process's locks go with it)

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
        keyed = self.read_doc(KEYED_PAGES_DOC) is not None  # items served without a row have slots too
        served = self.query("SELECT space, modality, count(*) FROM items WHERE space IS NOT NULL"
                            + ("" if keyed else " AND pos IS NOT NULL") + " GROUP BY space, modality")
        want = {(s, m): int(n) for s, m, n in served}
        have: dict[tuple[str, str], int] = {}
        for space, modality, _page, data in self.pages(-1):
            have[(space, modality)] = have.get((space, modality), 0) + int(np.count_nonzero(np.frombuffer(data, np.int64)))
        for k in set(want) | set(have):
            if want.get(k, 0) != have.get(k, 0):
                problems.append(f"{self.location}: space {k[0]} serves {have.get(k, 0)} {k[1]} rows but "
                                f"{want.get(k, 0)} items name it")
        return problems


# --------------------------------------------------------------------------- SQLite


#: the page size of a new SQLite catalog (see :func:`create_sqlite`)
PAGE_BYTES = 16384


def sqlite_catalog(path: str | Path) -> Catalog:
    """The SQLite catalog at ``path`` (a ``catalog.sqlite`` file; its directory holds its locks)."""
    path = Path(path)
    return Catalog(str(path), "sqlite", _sqlite_connect(path), path.parent)


def create_sqlite(path: str | Path, header: Mapping[str, Any],
                  fill: Any = None) -> Catalog:
    """Create the SQLite catalog ``path`` atomically: built in a temporary file (``fill(writer)``
    may add rows in the same transaction), then renamed into place, so ``path`` exists only once
    it is whole."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    for stale in path.parent.glob(f".{path.name}.*.tmp*"):  # what a killed create left (trial T): no catalog
        stale.unlink(missing_ok=True)                      # there, so nothing else could be writing them
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            # 16 KiB pages (set before the first table; SQLite's default is 4 KiB): a bulk insert of
            # a million items takes about a tenth less CPU, and a scan of the items reads fewer pages
            conn.execute(f"PRAGMA page_size = {PAGE_BYTES}")
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
    schema = "nb_" + check_collection_name(name, lowercase=True)

    def connect() -> Any:
        conn = psycopg.connect(url, autocommit=True)
        conn.execute(f'SET search_path TO "{schema}"')
        return conn

    return Catalog(redact(f"{url}#{name}"), "postgresql", connect, None, schema=schema)


def open_catalog(uri: str) -> Catalog:
    """A catalog by URI: a ``.sqlite`` path, or ``postgresql://...#NAME``."""
    if uri.startswith(("postgresql://", "postgres://")):
        url, _, name = uri.partition("#")
        return postgres_catalog(url, name or "default")
    return sqlite_catalog(uri)
