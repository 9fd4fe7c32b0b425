"""Shared test setup: the CPU is shared with training jobs, and nothing may reach the network."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "NOBACKFILL_CACHE" not in os.environ:  # records of loaded models, stored bridges: never the user's cache
    import tempfile

    os.environ["NOBACKFILL_CACHE"] = tempfile.mkdtemp(prefix="nobackfill-test-cache-")


@pytest.fixture(autouse=True, scope="session")
def _single_thread_offline():
    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    yield


#: a tiny world CLIP preset (seconds to train); format with dim and steps
TINY_PRESET = """
[model]
embed_dim = {dim}
image_size = 64
patch_size = 16
vision_width = 32
vision_layers = 1
vision_heads = 2
text_width = 32
text_layers = 1
text_heads = 2
max_length = 40
vocab_size = 300

[train]
steps = {steps}
batch_size = 16
lr = 0.001
warmup = 2
"""


def tiny_preset(dim: int = 32, steps: int = 12) -> str:
    """TOML text of :data:`TINY_PRESET`."""
    return TINY_PRESET.format(dim=dim, steps=steps)


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory):
    """A real Milvus standalone server (pip package ``milvus``) for the whole session, in a fresh
    base directory; ``HOST:PORT`` of its proxy. Skipped, saying why, when it cannot start."""
    from nobackfill.testing.milvus_server import MilvusServerError, start_server

    try:
        server = start_server(tmp_path_factory.mktemp("milvus-server"))
    except MilvusServerError as e:
        pytest.skip(f"no Milvus server: {e}")
    yield server.address
    server.stop()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    """A real PostgreSQL server (``initdb`` + ``postgres`` of the system; run as ``nobody`` when we
    are root) for the whole session, on 127.0.0.1; the
    :class:`~nobackfill.testing.postgres_server.RunningPostgres`. Skipped, saying why, when it cannot
    start (no PostgreSQL binaries installed)."""
    from nobackfill.testing.postgres_server import PostgresServerError, start_postgres

    try:
        server = start_postgres(tmp_path_factory.mktemp("postgres-server"))
    except PostgresServerError as e:
        pytest.skip(f"no PostgreSQL server: {e}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server):
    """``postgresql://nobackfill@127.0.0.1:PORT/nobackfill`` of the session's server (superuser
    ``nobackfill``, trust authentication). Tests share this database: use ``postgres_db`` for one
    of a test's own."""
    return postgres_server.url


@pytest.fixture
def postgres_db(postgres_server):
    """A fresh, empty database on the session's server for one test (``t_<uuid>``), dropped after
    it; its URL."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.url_for(name)
    try:
        with psycopg.connect(postgres_server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:
        pass


def pytest_collection_modifyitems(config, items):
    """The tests that start Ray run last. Ray Data leaves threads in this process after
    ``ray.shutdown()`` (polling its metrics), and CPython 3.11.7 can fail a parse in one thread
    while another compiles ("SystemError: AST constructor recursion depth mismatch", seen once in
    ``np.load``'s header parse of a later test): no other test runs beside them."""
    items.sort(key=lambda item: item.path.name == "test_backfill_ray.py")  # stable: the rest keep their order
