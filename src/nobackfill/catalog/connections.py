"""The two connections a :class:`~nobackfill.catalog.catalog.Catalog` keeps (``_read_conn`` for its
reads, ``_write_conn`` for its write transactions), made on first use, and what is done when the
server closed one (a PostgreSQL restart, ``pg_terminate_backend``, a network cut): the next call
notices, forgets it, and runs on a new one, once, where that is safe (a read outside a read
transaction, or the statement that begins a transaction: nothing of it ran). A new connection that
fails too (the database is down) is the error (trial Z: a serve answered its first call after a
PostgreSQL restart with 503 although the database was up again)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

__all__ = ["KeptConnections"]


class KeptConnections:
    """The kept connections of a catalog (a mixin of :class:`~nobackfill.catalog.catalog.Catalog`,
    whose ``_connect()`` makes one and whose ``dialect`` names the database)."""

    dialect: str
    _connect: Any
    _read_conn: Any = None
    _write_conn: Any = None

    def _reader(self) -> Any:
        if self._read_conn is None:
            self._read_conn = self._connect()
        return self._read_conn

    def _on(self, attr: str, first: Callable[[Any], Any], again: bool = True) -> tuple[Any, Any]:
        """``(first(conn), conn)`` on the kept connection ``attr`` (made if there is none). Where
        ``first`` failed because the server had closed a connection kept from an earlier call, on a
        new one, once (``again``: ``first`` changes nothing when run twice: a read, or a ``BEGIN``)."""
        for retry in (again, False):
            kept = getattr(self, attr)
            try:
                if kept is None:
                    setattr(self, attr, self._connect())
                conn = getattr(self, attr)
                return first(conn), conn
            except Exception:
                if retry and self._lost(kept, attr):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _lost(self, kept: Any, attr: str) -> bool:
        """Whether ``kept``, a connection held before the failed call (not one the call made), was
        closed by the server; if so it is closed here and forgotten."""
        if kept is None or self.dialect == "sqlite" or not _dead(kept):
            return False
        with contextlib.suppress(Exception):
            kept.close()
        if getattr(self, attr) is kept:
            setattr(self, attr, None)
        return True

    def _drop_if_broken(self, attr: str) -> None:
        """Forget a connection the server closed (a restart, a network cut): the next call opens a
        new one instead of failing for ever."""
        if _dead(getattr(self, attr)):
            setattr(self, attr, None)

    def close(self) -> None:
        for conn in (self._read_conn, self._write_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
        self._read_conn = self._write_conn = None


def _dead(conn: Any) -> bool:
    """Whether ``conn`` is closed, or broken by the server's side (psycopg notes it at the failed call)."""
    return conn is not None and bool(getattr(conn, "closed", False) or getattr(conn, "broken", False))
