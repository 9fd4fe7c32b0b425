"""What a milvus-lite collection prints (trial Z): its writes print our own lines only (milvus-lite's
in-process gRPC server logged each AllocTimestamp it does not implement with a traceback), a file
another process holds is one line saying so, and a backfill with ``--workers N`` runs one worker,
saying why, instead of losing the others to milvus-lite's lock."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from _collection_helpers import make_folder, upgraded_collection

MODELS = Path(__file__).resolve().parents[1] / "models"
IN_USE = ("is in use by another process (milvus-lite serves one process per file; use a Milvus server for several "
          "processes")


def _cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """``nobackfill ARGS`` in a process of its own, stdout and stderr apart."""
    argv = ["nobackfill", *map(str, args)]
    code = f"import sys\nsys.argv = {argv!r}\nfrom nobackfill.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def _quiet(r: subprocess.CompletedProcess) -> None:
    """Exit 0 and no library error or traceback on stderr."""
    assert r.returncode == 0, r.stderr[-3000:]
    assert "error:" not in r.stderr and "Traceback" not in r.stderr and "NotImplementedError" not in r.stderr, \
        r.stderr[-3000:]


@pytest.fixture(scope="module")
def lite(tmp_path_factory) -> SimpleNamespace:
    """A milvus-lite collection of the world models, made, filled, upgraded and backfilled with the
    CLI (``--workers 2``), each command checked to print no library error: its ``uri``, ``path`` and
    the ``backfill`` command's result."""
    root = tmp_path_factory.mktemp("lite")
    data = make_folder(root / "data", n_images=6, captions_per_image=2)
    uri = f"milvus-lite:{root}/x.db#x"
    _quiet(_cli("collection", "create", uri, "--model", MODELS / "world-old"))
    _quiet(_cli("collection", "add", uri, "--data", data))
    _quiet(_cli("collection", "upgrade", uri, "--model", MODELS / "world-new"))
    r = _cli("collection", "backfill", uri, "--workers", "2")
    _quiet(r)
    return SimpleNamespace(uri=uri, path=f"{root}/x.db", backfill=r)


def test_writes_to_a_milvus_lite_collection_print_no_library_errors(lite):
    """create, add, upgrade and backfill exit 0 with no ``error:`` and no traceback (trial Z: one per
    AllocTimestamp call, 39 in one backfill); the backfill ran every item on one worker, saying why."""
    r = lite.backfill
    assert "running 1 worker, not 2: milvus-lite serves one process per file; use a Milvus server for several " \
           "processes" in r.stderr, r.stderr
    assert "18/18 items in the current space" in r.stdout and "stopped" not in r.stdout + r.stderr, r.stdout


def test_a_milvus_lite_file_another_process_holds_is_one_line(lite):
    """A search while another process holds the file: exit 2 and one line naming the file and why
    (trial Z: 21 lines, two tracebacks, and "the Milvus server did not answer")."""
    uri, path = lite.uri, lite.path
    hold = ("import sys\nfrom pymilvus import MilvusClient\n"
            f"c = MilvusClient({path!r})\nprint('held', flush=True)\nsys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for args in (("collection", "search", uri, "--text", "a red circle"), ("verify", uri)):
            r = _cli(*args)  # (verify: it checked nothing, so no "problem" to --repair)
            assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr[-3000:])
            lines = r.stderr.strip().splitlines()
            assert lines == [f"error: the milvus-lite file {path} {IN_USE}, docs/milvus.md)"], r.stderr[-3000:]
        r = _cli("collection", "status", uri)  # the catalog alone: answered while the file is held
        assert r.returncode == 0 and "18/18" in r.stdout, r.stderr[-3000:]
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    r = _cli("collection", "search", uri, "--text", "a red circle")
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]


def test_a_backfill_of_milvus_lite_runs_one_worker_and_refuses_the_ray_engine(tmp_path):
    """``workers=2`` on milvus-lite: one worker, in this process (which holds the file), with a note;
    the ray engine (actors open the collection in processes of their own) is refused before anything
    starts."""
    from nobackfill.lifecycle.backfill import run_backfill

    c, old, new, pool, _ = upgraded_collection(tmp_path, n_images=4, captions=1, uri=f"milvus-lite:{tmp_path}/m.db#m")
    with pytest.raises(ValueError, match="the ray engine opens .* in processes of its own, and milvus-lite serves one "
                                         "process per file") as refused:
        run_backfill(c, new, engine="ray", pool=pool)
    assert refused.value.field == "engine"  # (the HTTP API's 422 names it)
    said: list[str] = []
    rep = run_backfill(c, new, workers=2, order="sequential", pool=pool, log=said.append)
    assert "running 1 worker, not 2: milvus-lite serves one process per file; use a Milvus server for several " \
           "processes" in said, said
    assert rep["state"] == "done" and rep["done"] == rep["total"] == 8, rep
    assert rep["workers_exit"] == [] and len(rep["worker_reports"]) == 1 and rep["committed"] == 8, rep


def test_milvus_lite_is_not_asked_for_timestamps_and_a_server_that_lacks_them_is_asked_once():
    from nobackfill.milvus.connection import alloc_ts

    class Conn:
        def __init__(self, answer):
            self.answer, self.calls = answer, 0

        def alloc_timestamp(self, context=None):
            self.calls += 1
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    class Client:
        def __init__(self, answer):
            self.conn = Conn(answer)

        def _get_connection(self):
            return self.conn

        def _generate_call_context(self):
            return None

    lite = Client(123)
    lite._nobackfill_embedded = True
    assert alloc_ts(lite) == 0 and lite.conn.calls == 0  # milvus-lite does not implement it: never called
    for answer in (NotImplementedError("Method not implemented!"), Exception("StatusCode.UNIMPLEMENTED"), 0):
        old = Client(answer)
        assert alloc_ts(old) == 0 and alloc_ts(old) == 0 and old.conn.calls == 1, answer
    server = Client(42)
    assert alloc_ts(server) == 42 and alloc_ts(server) == 42 and server.conn.calls == 2
    gone = Client(ConnectionError("Fail connecting to server"))  # not answering is not "not implemented"
    assert alloc_ts(gone) == 0 and alloc_ts(gone) == 0 and gone.conn.calls == 2


def test_the_server_side_loggers_of_milvus_lite_are_quiet_unless_verbose(monkeypatch):
    """grpc (its server logs a failed call with a traceback) and milvus_lite at CRITICAL, as pymilvus;
    with ``-v``, warnings of every library."""
    from nobackfill import _logging

    monkeypatch.setattr(_logging, "_verbose", False)
    assert {n: _logging._level(n) for n in ("grpc", "milvus_lite", "pymilvus")} == dict.fromkeys(
        ("grpc", "milvus_lite", "pymilvus"), logging.CRITICAL)
    assert "grpc" in _logging.LIBRARY_LOGGERS and "milvus_lite" in _logging.LIBRARY_LOGGERS
    monkeypatch.setattr(_logging, "_verbose", True)
    assert _logging._level("grpc") == logging.WARNING


def test_a_served_ray_backfill_of_milvus_lite_is_refused_before_a_job_starts(tmp_path):
    """``POST /v1/backfill/start {"engine": "ray"}`` on a milvus-lite collection was taken and failed
    later in the worker thread; it is refused at once (422 naming ``engine``), as the in-process
    client's non-waiting start and resume are, and no job is made."""
    from concurrent import futures

    import grpc
    from fastapi.testclient import TestClient

    from _collection_helpers import NEW_REF, OLD_REF, pool_with, related_pair
    from nobackfill.lifecycle.backfill_jobs import BackfillJob
    from nobackfill.serve import KeyRing, ServeSettings, create_app

    uri = f"milvus-lite:{tmp_path}/m.db#m"
    upgraded_collection(tmp_path, n_images=4, captions=1, uri=uri)
    head = grpc.server(futures.ThreadPoolExecutor(1))  # answers as a Ray head would: the address check passes
    address = f"127.0.0.1:{head.add_insecure_port('127.0.0.1:0')}"
    head.start()
    with socket.socket() as s:  # (trial AB: with an address nobody answers, 503 "start a Ray cluster" came first)
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    old, new, _ = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    try:
        for ray_address in (dead, address, None):  # (None: a 409 "start it with --ray-address" came first)
            app = create_app(ServeSettings(collection=uri, keys=KeyRing({"admin": ["a" * 24]}),
                                           ray_address=ray_address, uploads=tmp_path / "uploads"), pool=pool)
            with TestClient(app) as api:
                for path in ("/v1/backfill/start", "/v1/backfill/resume"):
                    r = api.post(path, json={"engine": "ray"}, headers={"Authorization": "Bearer " + "a" * 24})
                    assert r.status_code == 422, r.text
                    assert r.json()["field"] == "engine" and "milvus-lite serves one process per file" in r.text
        with TestClient(app) as api:
            client = app.state.service.client
            assert BackfillJob.load(client.collection) is None and not client.worker.active
            for call in (client.backfill_start, client.backfill_resume):
                with pytest.raises(ValueError, match="the ray engine opens .* in processes of its own"):
                    call(engine="ray", ray_address=address)
            assert BackfillJob.load(client.collection) is None
    finally:
        head.stop(None)
