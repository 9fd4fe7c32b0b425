"""Shared test setup: the CPU is shared with training jobs, and nothing may reach the network."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "NOBACKFILL_CACHE" not in os.environ:  # records of loaded models, stored bridges: never the user's cache
    import atexit
    import functools
    import shutil
    import tempfile

    os.environ["NOBACKFILL_CACHE"] = tempfile.mkdtemp(prefix="nobackfill-test-cache-")
    atexit.register(functools.partial(shutil.rmtree, os.environ["NOBACKFILL_CACHE"], ignore_errors=True))


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


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th (from 0) of N shares of the test files, balanced by the seconds "
                          "each file took (tests/durations.json); scripts/test.sh runs two shares beside each other")


#: files that share a share (each starts a local Ray cluster: never two beside each other)
TOGETHER = (("test_backfill_ray.py", "test_ray_address.py"),)
#: the seconds of a test in a file tests/durations.json does not name
SECONDS_PER_TEST = 0.2


def shard_of_files(seconds: dict[str, float], shards: int) -> dict[str, int]:
    """Each file of ``seconds`` (its name -> its tests' seconds) given to one of ``shards`` shares:
    the heaviest first, each to the share with the fewest seconds so far (the files of a
    :data:`TOGETHER` group as one)."""
    groups: dict[str, list[str]] = {}
    for name in sorted(seconds):
        lead = next((g[0] for g in TOGETHER if name in g), name)
        groups.setdefault(lead, []).append(name)
    load = [0.0] * shards
    out: dict[str, int] = {}
    for lead, names in sorted(groups.items(), key=lambda kv: (-sum(seconds[n] for n in kv[1]), kv[0])):
        k = load.index(min(load))
        load[k] += sum(seconds[n] for n in names)
        out.update({n: k for n in names})
    return out


def _keep_shard(config, items) -> None:
    """``--shard K/N``: the items of the K-th share of the files (the others deselected)."""
    import json
    from pathlib import Path

    spec = config.getoption("--shard")
    if not spec:
        return
    k, _, n = spec.partition("/")
    k, n = int(k), int(n)
    if not 0 <= k < n:
        raise pytest.UsageError(f"--shard {spec}: K must be in 0..N-1")
    table = Path(__file__).with_name("durations.json")
    recorded = json.loads(table.read_text(encoding="utf-8")) if table.is_file() else {}
    seconds: dict[str, float] = {}
    for item in items:
        seconds[item.path.name] = seconds.get(item.path.name, 0.0) + SECONDS_PER_TEST
    seconds = {name: float(recorded.get(name, est)) for name, est in seconds.items()}
    share = shard_of_files(seconds, n)
    keep = [item for item in items if share[item.path.name] == k]
    config.hook.pytest_deselected(items=[item for item in items if share[item.path.name] != k])
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    """With ``--shard``, the items of one share (:func:`_keep_shard`). The tests that start Ray run last. Ray Data leaves threads in this process after
    ``ray.shutdown()`` (polling its metrics), and CPython 3.11.7 can fail a parse in one thread
    while another compiles ("SystemError: AST constructor recursion depth mismatch", seen once in
    ``np.load``'s header parse of a later test): no other test runs beside them."""
    _keep_shard(config, items)
    items.sort(key=lambda item: item.path.name == "test_backfill_ray.py")  # stable: the rest keep their order
