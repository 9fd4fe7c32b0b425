"""A Ray cluster address that does not answer (trial Z, finding 1): ``collection backfill --engine ray
--address HOST:PORT`` with nothing listening there hung for minutes in ``ray.init`` while Ray printed
warnings, and a server started with ``--ray-address HOST:PORT`` took ``POST /v1/backfill/start
{"engine": "ray"}`` and reported "running" forever. Now the address is dialled first (a TCP
connect of a few seconds): the command fails at once with one line naming the address and what to
do, changing nothing; the server refuses the start with 503; and where something answers but Ray
does not join it, ``ray.init`` runs under a deadline and the server's job ends with the error in
its status. No Ray cluster is started here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _collection_helpers import NEW_REF, OLD_REF, pool_with, related_pair, upgraded_collection
from nobackfill.collection.collection import Collection
from nobackfill.lifecycle.backfill import backfill_status
from nobackfill.lifecycle.backfill_jobs import BackfillJob

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listener():
    """``127.0.0.1:PORT`` where a gRPC server answers (as a Ray head does) but no Ray cluster runs."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def silent():
    """``127.0.0.1:PORT`` where something takes a TCP connection and says nothing (trial AA: ``ray.init``
    waited its whole deadline there)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def _state(c: Collection) -> tuple:
    """What a refused start must leave as it was: no job, nothing backfilled, the same generation."""
    c = Collection.open(c.path)
    st = backfill_status(c)
    return BackfillJob.load(c), st["state"], st["done"], c.catalog.generation()


class _HangingRay:
    """A ``ray`` whose ``init`` never returns until ``release`` is set (as Ray's does at an address
    where something answers that is no Ray cluster)."""

    def __init__(self) -> None:
        self.release, self.calls = threading.Event(), 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kw) -> None:
        self.calls += 1
        self.release.wait(60)
        raise ConnectionError("released")


# ----------------------------------------------------------------------------- the check itself
def test_an_address_is_said_not_to_answer_in_one_line_naming_it_and_what_to_do(listener):
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, RayUnreachable, ray_address_error

    port = free_port()
    t0 = time.monotonic()
    why = ray_address_error(f"127.0.0.1:{port}")
    assert why == (f"no Ray cluster answers at 127.0.0.1:{port} (connection refused): start one there "
                   f"(`ray start --head --node-ip-address 127.0.0.1 --port {port}`) or use --address auto for the "
                   "cluster `ray start` runs on this machine; nothing was changed")
    client = ray_address_error(f"ray://127.0.0.1:{port}")
    assert client.startswith(f"no Ray Client server answers at ray://127.0.0.1:{port} (connection refused)")
    assert f"ray start --head --ray-client-server-port {port}" in client
    assert "host no-such-host.invalid not found" in ray_address_error("no-such-host.invalid:6379")
    assert time.monotonic() - t0 < 10
    for answers in (listener, None, "local"):  # something listens; Ray starts its own (auto: below)
        assert ray_address_error(answers) is None
    with pytest.raises(RayUnreachable, match=f"no Ray cluster answers at 127.0.0.1:{port} "):
        RayOptions(address=f"127.0.0.1:{port}")  # refused when the options are made: before any job
    assert isinstance(RayUnreachable("x"), ConnectionError)
    assert RayOptions(address=listener).address == listener
    # trial AA: refused by Ray after the sample; trial AB: "", http:// and ray:// made the job, then Ray's errors
    for bad in ("127.0.0.1", "localhost", "127.0.0.1:notaport", "", " ", "http://127.0.0.1:8265", "ray://"):
        assert ray_address_error(bad).startswith(f"--address {bad!r}: not an address Ray takes: give HOST:PORT")


def test_auto_is_refused_where_no_cluster_runs_and_follows_the_address_ray_would_take(tmp_path, monkeypatch):
    """trial AB: ``--address auto`` with no Ray running made the backfill job, then failed in ray.init."""
    import nobackfill.lifecycle.cluster.ray_address as ra

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(ra, "_gcs_running", lambda: False)
    assert ra.ray_address_error("auto") == (
        "--address auto: no Ray cluster runs on this machine: start one (`ray start --head`), give HOST:PORT of "
        "another, or leave --address out for a Ray of this run's own; nothing was changed")
    port = free_port()
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")  # the last `ray start`, gone
    assert ra.ray_address_error("auto").startswith(f"no Ray cluster answers at 127.0.0.1:{port} (connection refused)")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1")  # Ray takes it before anything else
    assert "--address '127.0.0.1': not an address Ray takes" in ra.ray_address_error("auto")
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ra, "_gcs_running", lambda: True)  # a head of this machine: Ray joins it
    assert ra.ray_address_error("auto") is None and ra.ray_address_error("local") is None


def test_an_address_where_something_other_than_ray_answers_is_refused_at_once(silent):
    """A port that takes connections but is no gRPC server (a web server, a database, a port that says
    nothing) is refused in a few seconds, naming what answered: ``ray.init`` waited its deadline."""
    import http.server

    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, RayUnreachable, ray_address_error

    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        why = ray_address_error(silent, 1.0)
        assert why.startswith(f"{silent} is not a Ray cluster: something answers there but says nothing within 1 s "
                              "when a gRPC connection starts; give the address `ray start --head` printed"), why
        assert why.endswith("; nothing was changed")
        http_at = f"127.0.0.1:{web.server_address[1]}"
        assert "something answers there but does not answer in gRPC" in ray_address_error(http_at)
        assert ray_address_error(f"ray://{http_at}").startswith(f"ray://{http_at} is not a Ray Client server:")
        with pytest.raises(RayUnreachable, match="is not a Ray cluster"):
            RayOptions(address=http_at)
        assert time.monotonic() - t0 < 10
    finally:
        web.shutdown()
        web.server_close()


def test_a_join_that_does_not_return_fails_at_its_deadline_and_a_later_one_does_not_pile_up(listener, monkeypatch):
    import nobackfill.lifecycle.cluster.ray_backfill as br

    ray = _HangingRay()
    monkeypatch.setattr(br, "_late_joins", [])
    try:
        t0 = time.monotonic()
        with pytest.raises(br.RayUnreachable, match=f"could not join the Ray cluster at {listener}: ray.init did not "
                                                    "return within 0.3 s"):
            br._start(ray, br.RayOptions(address=listener, join_s=0.3))
        with pytest.raises(br.RayUnreachable, match=r"an earlier ray.init \(joining 127"):
            br._start(ray, br.RayOptions(address=listener, join_s=0.3))  # waits for the first, starts no second
        assert ray.calls == 1 and time.monotonic() - t0 < 10
    finally:
        ray.release.set()
    for t, _ in br._late_joins:
        t.join(10)
    with pytest.raises(br.RayUnreachable, match="no Ray cluster answers .*; nothing was committed by this run$"):
        br._start(ray, _options_at(f"127.0.0.1:{free_port()}"))  # checked again before ray.init
    assert ray.calls == 1


def _options_at(address: str):
    """RayOptions naming ``address`` without the check made when options are made (as options made
    while a cluster answered, used after it went away)."""
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions

    opts = RayOptions()
    opts.address = address
    return opts


# ----------------------------------------------------------------------------- the command line
def test_collection_backfill_at_an_address_nobody_listens_on_fails_at_once_and_changes_nothing(tmp_path):
    c, *_ = upgraded_collection(tmp_path, n_images=4)
    before = _state(c)
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "nobackfill.cli", "collection", "backfill", str(c.path), "--engine", "ray",
                        "--address", address, "--limit", "10"], capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and r.stdout.strip() == "", (r.stdout, r.stderr)
    assert lines[0].startswith(f"error: no Ray cluster answers at {address} (connection refused)"), lines
    assert f"ray start --head --node-ip-address 127.0.0.1 --port {address.rsplit(':', 1)[1]}" in lines[0]
    assert "--address auto" in lines[0] and lines[0].endswith("nothing was changed")
    assert took < 30, took  # (it hung until killed: 250 s)
    assert _state(c) == before and before[0] is None and before[1] == "none"


# ----------------------------------------------------------------------------- the server
def _api(c: Collection, address: str):
    from fastapi.testclient import TestClient

    from nobackfill.serve import KeyRing, ServeSettings, create_app

    old, new, _ = related_pair()
    keys = KeyRing({"read": ["r" * 24], "admin": ["a" * 24]})
    app = create_app(ServeSettings(collection=str(c.path), keys=keys, ray_address=address),
                     pool=pool_with((OLD_REF, old), (NEW_REF, new)))
    return TestClient(app), {"Authorization": "Bearer " + "a" * 24}


def test_post_backfill_start_with_engine_ray_at_an_address_nobody_listens_on_is_refused_at_once(tmp_path):
    c, *_ = upgraded_collection(tmp_path, n_images=4)
    before = _state(c)
    address = f"127.0.0.1:{free_port()}"
    api, auth = _api(c, address)
    for path in ("/v1/backfill/start", "/v1/backfill/resume"):
        t0 = time.monotonic()
        r = api.post(path, json={"engine": "ray", "order": "sequential"}, headers=auth)
        assert time.monotonic() - t0 < 10
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["field"] == "engine" and body["detail"].startswith(f"no Ray cluster answers at {address}"), body
        assert "restart this server with --ray-address auto" in body["detail"]
    st = api.get("/v1/status", headers=auth).json()["backfill"]
    assert st["state"] == "none" and st["worker"] == "idle" and st["error"] is None, st
    assert _state(c) == before
    r = api.post("/v1/backfill/start", json={"order": "sequential"}, headers=auth)  # the local engine: untouched
    assert r.status_code == 200, r.text
    api.app.state.service.client.worker.thread.join(timeout=120)
    assert api.get("/v1/status", headers=auth).json()["backfill"]["state"] == "done"


def test_a_server_whose_ray_join_does_not_return_ends_the_job_with_the_error_in_its_status(tmp_path, listener,
                                                                                        monkeypatch):
    """Something answers at the address but Ray never joins it: the start is taken (the check
    passed), and the worker thread's ``ray.init`` fails at its deadline: the status says why."""
    import nobackfill.lifecycle.cluster.ray_backfill as br

    c, *_ = upgraded_collection(tmp_path, n_images=4)
    ray = _HangingRay()
    monkeypatch.setattr(br, "import_ray", lambda: ray)
    monkeypatch.setattr(br, "JOIN_S", 0.5)
    monkeypatch.setattr(br, "_late_joins", [])
    api, auth = _api(c, listener)
    try:
        r = api.post("/v1/backfill/start", json={"engine": "ray", "order": "sequential"}, headers=auth)
        assert r.status_code == 200, r.text
        api.app.state.service.client.worker.thread.join(timeout=30)
        st = api.get("/v1/status", headers=auth).json()["backfill"]
    finally:
        ray.release.set()
    assert st["worker"] == "idle" and st["done"] == 0, st
    assert st["error"].startswith(f"RayUnreachable: could not join the Ray cluster at {listener}: ray.init did not "
                                  "return within 0.5 s"), st
    assert st["worker_stopped"].startswith("error: RayUnreachable"), st


# ----------------------------------------------------------------------------- with Ray itself
JOIN = """
import sys, time
from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, _start, import_ray
t0 = time.monotonic()
try:
    _start(import_ray(), RayOptions(address=sys.argv[1], join_s=float(sys.argv[2])))
except ConnectionError as e:
    print(f"{time.monotonic() - t0:.1f} {type(e).__name__}: {e}")
"""


def test_rays_own_join_of_an_address_that_is_no_cluster_is_bounded_and_the_process_exits(listener):
    """The real ``ray.init`` at an address where something answers that is no Ray cluster (it retries
    for many minutes): it fails at the deadline, and the process exits though Ray's call goes on in
    its thread."""
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": str(SRC), "RAY_AUTH_MODE": "disabled"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", JOIN, listener, "4"], capture_output=True, text=True, timeout=120,
                       env=env)
    took = time.monotonic() - t0
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"RayUnreachable: could not join the Ray cluster at {listener}: ray.init did not return within 4 s" \
        in r.stdout, (r.stdout, r.stderr)
    assert float(r.stdout.split()[0]) < 10 and took < 60, (r.stdout, took)


def test_local_is_a_ray_of_the_runs_own_and_a_server_refuses_it_and_a_malformed_address_at_start(tmp_path):
    """trial AC: ``--address local`` was passed to ray.init in the joining thread and the process ended,
    exit 1, without a word (a server: on the first start); ``serve --ray-address`` was not checked."""
    from typer.testing import CliRunner

    from nobackfill.cli import app
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions

    assert RayOptions(address="local").address is None and RayOptions(address=" local ").address is None
    keys = tmp_path / "keys.toml"
    keys.write_text('admin = ["' + "a" * 24 + '"]\n')
    for bad, said in (("local", "--ray-address local: a server joins a running Ray cluster"),
                      ("localhost", "--ray-address 'localhost': not an address Ray takes"),
                      ("http://127.0.0.1:8265", "not an address Ray takes")):
        r = CliRunner().invoke(app, ["serve", str(tmp_path / "none"), "--keys", str(keys), "--ray-address", bad])
        assert r.exit_code == 2 and said in " ".join(r.output.split()), r.output
    c, *_ = upgraded_collection(tmp_path / "c", n_images=4)
    api, auth = _api(c, "local")
    r = api.post("/v1/backfill/start", json={"engine": "ray"}, headers=auth)
    assert r.status_code == 409 and r.json()["field"] == "engine" and "--ray-address" in r.text, r.text
    assert _state(c)[0] is None
