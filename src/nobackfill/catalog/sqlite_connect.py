"""Connections to a SQLite catalog (``catalog.sqlite``): WAL, its pragmas, and a read-only copy
(a snapshot, a read-only mount) read without writing beside it."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["_sqlite_connect"]


def _sqlite_connect(path: Path) -> Any:
    def connect() -> sqlite3.Connection:
        if not os.access(path.parent, os.W_OK) and path.is_file():  # a read-only copy (a snapshot, a RO mount)
            return _read_only(path)
        conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL: a commit survives a process kill
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA cache_size = -32768")  # up to 32 MiB of pages: bulk commits at millions of items
        return conn

    return connect


def _read_only(path: Path) -> sqlite3.Connection:
    """A connection that reads ``path`` in a directory this process cannot write (SQLite would make
    its ``-shm`` there): immutable when no write-ahead log is left beside it, else read-only through
    it; its writes fail as "readonly database", which the command line says in one line."""
    wal = path.with_name(path.name + "-wal")
    mode = "ro" if wal.is_file() and wal.stat().st_size else "ro&immutable=1"
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True, timeout=60.0, isolation_level=None,
                           check_same_thread=False)
