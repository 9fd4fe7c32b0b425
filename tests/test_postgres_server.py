"""The PostgreSQL server of the tests (``nobackfill.testing.postgres_server``): it starts, answers on
127.0.0.1 only, gives each test its own database, and stops."""

from __future__ import annotations

import psycopg
import pytest

from nobackfill.testing.postgres_server import PostgresServerError, start_postgres


def test_server_answers_on_loopback(postgres_url):
    assert postgres_url.startswith("postgresql://nobackfill@127.0.0.1:")
    assert postgres_url.endswith("/nobackfill")
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("nobackfill", "nobackfill")
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)
        # the connection really is TCP to loopback, not the Unix socket
        assert conn.execute("SELECT host(inet_server_addr())").fetchone() == ("127.0.0.1",)


@pytest.fixture
def other_db(postgres_db):
    """A second fresh database in the same test (``postgres_db`` is one per test)."""
    import uuid

    base, _, _ = postgres_db.rpartition("/")
    name = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(f"{base}/nobackfill", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{base}/{name}"
    with psycopg.connect(f"{base}/nobackfill", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_databases_are_independent(postgres_db, other_db, postgres_url):
    assert postgres_db != other_db != postgres_url
    with psycopg.connect(postgres_db) as a:
        a.execute("CREATE TABLE t (x int)")
        a.execute("INSERT INTO t VALUES (1), (2)")
    with psycopg.connect(other_db) as b:
        assert b.execute("SELECT to_regclass('t')").fetchone() == (None,)
        b.execute("CREATE TABLE t (x int)")
        assert b.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with psycopg.connect(postgres_db) as a:
        assert a.execute("SELECT count(*) FROM t").fetchone() == (2,)


_seen: list[str] = []


@pytest.mark.parametrize("i", [0, 1])
def test_each_test_gets_a_fresh_database(postgres_db, i):
    assert postgres_db not in _seen
    _seen.append(postgres_db)
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        conn.execute("CREATE TABLE leftover (x int)")


def test_stop_stops_it(tmp_path):
    try:
        server = start_postgres(tmp_path / "second")
    except PostgresServerError as e:
        pytest.skip(f"no PostgreSQL server: {e}")
    try:
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
    assert not server.running
    assert not server.data_dir.joinpath("postmaster.pid").exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.url, connect_timeout=2)
    server.stop()  # again: nothing to do


def test_missing_binaries_are_named(tmp_path, monkeypatch):
    import nobackfill.testing.postgres_server as ps

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ps, "PG_LIB", tmp_path / "no-postgresql")
    with pytest.raises(PostgresServerError, match="initdb, pg_ctl, postgres"):
        start_postgres(tmp_path / "x")
