"""The backfill on Ray (``engine="ray"``): a two-node Ray cluster on 127.0.0.1 (one module-wide
``ray.cluster_utils.Cluster``), embedding actors SIGKILLed and a node removed mid-run, the commit
crashed right after its catalog transaction (the fail-point): every item committed exactly once,
vectors equal to the local engine's, a rerun changes nothing; on a directory collection and on a
PostgreSQL catalog. Also the shared commit's refusals, pause and limit, and that nothing imports
ray unless the engine is chosen."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _collection_helpers import NEW_REF, OLD_REF, milvus_server_location, pool_with, related_pair, upgraded_collection
from nobackfill.bench.backfill_engine import Delayed, FaultInjector, current_vectors
from nobackfill.collection.collection import Collection
from nobackfill.lifecycle.backfill import backfill_status, pause_backfill, run_backfill, start_backfill
from nobackfill.lifecycle.backfill_commit import FAILPOINT_ENV, WorkerReport, claim_shard, commit_batch, gather, keys_of
from nobackfill.lifecycle.backfill_jobs import BackfillJob
from nobackfill.lifecycle.backfill_order import _encode

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"
TOKENS = 2  # commits crashed by the fail-point per armed run


def _upgraded(root: Path, n_images: int = 6, captions: int = 2, uri: str | None = None):
    c, _old, new, _pool, _data = upgraded_collection(root, n_images, captions, uri)
    return c, new


def _vectors(c: Collection) -> dict[str, np.ndarray]:
    """Item id -> its vector in the current space; asserts every item has one, stored once."""
    got, twice = current_vectors(c)
    assert twice == 0 and len(got) == len(c.items()), (twice, len(got), len(c.items()))
    return got


# ----------------------------------------------------------------------------- without Ray
def test_the_shared_commit_refuses_a_stale_epoch_and_a_lost_lease_and_a_retry_adds_nothing(tmp_path):
    c, new = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    rep = WorkerReport(owner="h:1:a")
    job, shard = claim_shard(c, "h:1:a", 30.0, rep)
    batch, _ = gather(c, job, [it.id for it in c.items().values()], 0, 4)
    vecs = _encode(new, batch)
    stale = BackfillJob(**{**job.__dict__, "epoch": "another job"})
    assert commit_batch(c, stale, shard, "h:1:a", 30.0, 1.0, keys_of(batch), vecs) == ("job removed", 0, 0)
    assert commit_batch(c, job, shard, "h:1:b", 30.0, 1.0, keys_of(batch), vecs) == ("lost", 0, 0)
    assert backfill_status(c)["done"] == 0  # refused: nothing written
    assert commit_batch(c, job, shard, "h:1:a", 30.0, 1.0, keys_of(batch), vecs) == ("ok", 4, 0)
    assert commit_batch(c, job, shard, "h:1:a", 30.0, 1.0, keys_of(batch), vecs) == ("ok", 0, 0)  # a retry
    assert backfill_status(c)["done"] == 4
    pause_backfill(c)
    assert commit_batch(c, job, shard, "h:1:a", 30.0, 1.0, keys_of(batch), vecs)[0] == "paused"


def test_an_embedding_actor_keeps_to_its_share_of_the_rate(monkeypatch):
    """Each embedding actor waits after a batch that would put it ahead of ``rate`` (its share of the
    run's cap), from its first batch on: the pipeline behind it cannot commit faster. Before, only
    the driver waited, as it read results, and a run under ``--rate 50`` did 15,000 items in 30 s."""
    import nobackfill.lifecycle.cluster.ray_backfill as br

    _, new, _ = related_pair()
    clock = {"t": 100.0}
    waits: list[float] = []
    monkeypatch.setattr(br, "_clock", lambda: clock["t"])

    def sleep(s: float) -> None:
        waits.append(round(s, 6))
        clock["t"] += s

    monkeypatch.setattr(br, "_sleep", sleep)
    monkeypatch.setattr(br, "_node_id", lambda: "node")  # (Ray's runtime context would start a local Ray)
    actor = br._Embed(lambda: new, 1, False, rate=4.0)
    batch = {"id": np.array(["a", "b"]), "modality": np.array(["text", "text"]), "src": np.array(["one", "two"]),
             "key": np.array(["a@1", "b@1"]), "sample": np.array([False, False]), "bad": np.array(["", ""], dtype=object)}
    for spent in (0.1, 0.1, 2.0):  # each batch embedded in `spent` seconds
        real = actor._embed
        monkeypatch.setattr(actor, "_embed", lambda b, spent=spent, real=real: (clock.__setitem__("t", clock["t"] + spent),
                                                                                 real(b))[1])
        out = actor(batch)
        monkeypatch.setattr(actor, "_embed", real)
        assert out["vec"].shape[0] == 2
    # 2 items at 4/s: a batch is due every 0.5 s; the third took 2 s, so no wait after it
    assert waits == [0.4, 0.4], waits
    assert br._Embed(lambda: new, 1, False)(batch)["vec"].shape[0] == 2 and waits == [0.4, 0.4]  # no rate: no wait


def test_nothing_imports_ray_unless_the_engine_is_chosen_and_a_missing_ray_says_how_to_install(monkeypatch):
    code = ("import sys; import nobackfill.lifecycle.backfill, nobackfill.lifecycle.cluster.ray_backfill, "
            "nobackfill.client.local, nobackfill.cli.collection; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.stdout.strip() == "False"
    from nobackfill.lifecycle.backfill import BackfillError
    from nobackfill.lifecycle.cluster.ray_backfill import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(BackfillError, match=r"pip install 'nobackfill\[ray\]'"):
        import_ray()


# ----------------------------------------------------------------------------- on a Ray cluster
def start_cluster(cluster_class, node: dict, attempts: int = 2):
    """A head node and one worker node. Ray waits a fixed time for a raylet to register with the
    head, and for its GCS server to write its port file; on a loaded 2-core machine (a Milvus server
    beside the tests) each was once too short, so a start that times out is made again (``attempts``
    in all)."""
    for _ in range(attempts - 1):
        try:
            return _start_once(cluster_class, node)
        except Exception as e:
            if "timed out" not in str(e).lower():  # a raylet, or the GCS' port file (seen once under load)
                raise
    return _start_once(cluster_class, node)


def _start_once(cluster_class, node: dict):
    """The cluster, or, when its start fails, nothing left running: the cluster stopped and every
    process the start spawned killed (a raylet that never registered is no cluster's)."""
    import psutil

    before = {c.pid for c in psutil.Process().children(recursive=True)}
    cl = None
    try:
        cl = cluster_class(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        cl.add_node(**node)
        return cl
    except Exception:
        if cl is not None:
            cl.shutdown()
        for c in psutil.Process().children(recursive=True):
            if c.pid not in before:
                with contextlib.suppress(psutil.Error):
                    c.kill()
        raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes on this machine (one CPU each), connected; the fail-point armed per test by
    deleting its token files (``tokens``), which a crashing commit creates again."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    tokens = tmp_path_factory.mktemp("failpoint") / "crash"
    for i in range(TOKENS):
        Path(f"{tokens}.{i}").touch()  # disarmed
    env = {"PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), FAILPOINT_ENV: f"{tokens}:{TOKENS}",
           "RAY_AUTH_MODE": "disabled"}
    saved = {k: os.environ.get(k) for k in env if k != FAILPOINT_ENV}
    os.environ.update({k: v for k, v in env.items() if k != FAILPOINT_ENV})
    node = {"num_cpus": 1, "object_store_memory": 80 * 2 ** 20}
    cl = start_cluster(Cluster, node)
    ray.init(address=cl.address, runtime_env={"env_vars": env}, log_to_driver=False, configure_logging=False)
    cl.wait_for_nodes()
    try:
        yield cl, tokens, node
    finally:
        ray.shutdown()
        cl.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _fault_run(cluster, c: Collection, new, uri: str | None, twin: Collection, twin_new, kills: int,
               delay: float = 0.4):
    """The fault run: ``kills`` embedding actors SIGKILLed (each model call ``delay`` s slower, so that
    the actors still embed while batches commit), a node removed, commits crashed; then checked."""
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, run_ray_worker

    cl, tokens, node = cluster
    for i in range(TOKENS):
        Path(f"{tokens}.{i}").unlink()  # armed: the next TOKENS commits that store something crash
    start_backfill(c, new, order="sequential")
    faults = FaultInjector(cl, node, kills=kills, removals=1, remove_every=4, period_s=1.0)
    opts = RayOptions(actors=2, object_store_mb=64)
    with faults:  # a live embedding actor SIGKILLed every second until `kills`
        rep = run_ray_worker(c, Delayed(lambda: new, delay), uri=uri, options=opts, batch_size=8, on_batch=faults,
                             lease_s=60.0)
    assert rep.stopped == "done", rep.as_dict()
    assert faults.done["actor_kills"] == kills and faults.done["node_removals"] == 1, faults.done
    assert all(Path(f"{tokens}.{i}").exists() for i in range(TOKENS))  # the fail-point fired
    st = backfill_status(c)
    assert st["state"] == "done" and st["done"] == st["total"] == len(c.items())
    got = _vectors(c)  # each version stored once
    run_backfill(twin, twin_new, order="sequential", batch_size=8)  # the local engine on the same items
    want = _vectors(twin)
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[i], want[i]) for i in want)
    gen = c.catalog.generation()
    again = run_ray_worker(c, lambda: new, uri=uri, options=opts, batch_size=8)  # a rerun: nothing left
    start_backfill(c, new, order="sequential")
    again2 = run_ray_worker(c, lambda: new, uri=uri, options=opts, batch_size=8)
    assert again.committed == again2.committed == again2.embedded == 0
    assert c.catalog.generation() == gen and _vectors(c).keys() == got.keys()
    return rep


def test_ray_backfill_through_actor_kills_a_node_removal_and_a_crashed_commit_commits_each_item_once(
        cluster, tmp_path):
    c, new = _upgraded(tmp_path / "ray", n_images=80)
    twin, twin_new = _upgraded(tmp_path / "local", n_images=80)
    rep = _fault_run(cluster, c, new, None, twin, twin_new, kills=3)
    assert rep.engine == "ray" and rep.embedded >= 240


@pytest.mark.parametrize("vectors", ["directory", pytest.param("milvus-server", marks=pytest.mark.milvus_server)])
def test_ray_backfill_on_a_postgresql_catalog_through_faults(cluster, tmp_path, request, vectors):
    if vectors == "directory":
        uri = f"{tmp_path / 'shared'}?catalog={request.getfixturevalue('postgres_db')}#photos"
    else:  # vectors on the session's Milvus server (sh scripts/isolated.sh ... -m milvus_server)
        uri = milvus_server_location(request)
    c, new = _upgraded(tmp_path / "ray", n_images=50, uri=uri)
    twin, twin_new = _upgraded(tmp_path / "local", n_images=50)
    assert c.catalog.dialect == "postgresql"
    # a Milvus commit takes round trips: slower actors, so that they still embed while batches commit
    _fault_run(cluster, c, new, uri, twin, twin_new, kills=2, delay=0.4 if vectors == "directory" else 1.5)


def test_ray_backfill_pauses_and_stops_at_the_limit_like_the_local_workers(cluster, tmp_path):
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, run_ray_worker

    c, new = _upgraded(tmp_path, n_images=20)
    start_backfill(c, new, order="sequential")
    opts = RayOptions(actors=2)
    rep = run_ray_worker(c, lambda: new, options=opts, batch_size=5, limit=12)
    assert rep.stopped == "limit" and rep.embedded == 12 and backfill_status(c)["done"] == 12

    seen = []

    def pause(info):
        st = backfill_status(c)  # while the pipeline runs: its engine, actors and rate
        seen.append((st["engine"], st["actors"], st["workers"], st["holders"][0]["engine"]))
        pause_backfill(c)

    rep = run_ray_worker(c, lambda: new, options=opts, batch_size=4, on_batch=pause)
    st = backfill_status(c)
    assert rep.stopped == "paused" and st["state"] == "paused" and 12 < st["done"] < st["total"]
    assert rep.committed == st["done"] - 12  # what the pipeline had embedded after the pause: not committed
    assert seen[0] == ("ray", 2, 1, "ray")
    paused_at = st["done"]
    pause_backfill(c, paused=False)
    batches = []  # told to stop (a server's shutdown) after its first batch: the shard handed back, the stop said
    rep = run_ray_worker(c, lambda: new, options=opts, batch_size=4, on_batch=batches.append,
                         stop=lambda: "the server stopped" if batches else None)
    st = backfill_status(c)  # (the pipeline may have committed all of the rest in the block before the stop)
    assert rep.stopped == "the server stopped" and paused_at < st["done"] <= st["total"] and not st["holders"]
    assert st["last_worker"]["stopped"] == "the server stopped"


def test_ray_backfill_keeps_to_its_rate(cluster, tmp_path):
    """``rate`` caps the run's commits, as read in the catalog while it runs: from the first commit
    on, no faster than ``rate`` (plus what the actors embed before their first wait). Before, only
    the driver waited as it read results, while the pipeline committed everything at full speed."""
    import threading
    import time

    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, run_ray_worker

    c, new = _upgraded(tmp_path, n_images=10)
    start_backfill(c, new, order="sequential")
    total, rate, actors, batch = backfill_status(c)["total"], 3.0, 2, 4
    seen: list[tuple[float, int]] = []
    running = threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            seen.append((time.monotonic(), backfill_status(Collection.open(c.path))["done"]))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        rep = run_ray_worker(c, lambda: new, options=RayOptions(actors=actors), batch_size=batch, rate=rate)
    finally:
        running.clear()
        watcher.join()
    assert rep.stopped == "done" and backfill_status(c)["done"] == total == 30
    t1, d1 = next((t, d) for t, d in seen if d > 0)
    for t, d in seen:
        if t > t1:
            assert d - d1 <= rate * (t - t1) + (actors + 1) * batch, (t - t1, d - d1, seen)


def test_ray_backfill_names_an_unreadable_source_and_commits_the_rest(cluster, tmp_path):
    """As the local workers: an image file gone since it was added is named in status and left in
    the old space; everything else is committed."""
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, run_ray_worker

    c, new = _upgraded(tmp_path, n_images=8)
    gone = c.items()[sorted(i for i, it in c.items().items() if it.modality == "image")[2]]
    Path(gone.source["path"]).unlink()
    start_backfill(c, new, order="sequential")
    rep = run_ray_worker(c, lambda: new, options=RayOptions(actors=1), batch_size=4)
    st = backfill_status(c)
    assert rep.unreadable == 1 and st["unreadable"] == 1 and list(st["unreadable_items"]) == [gone.id], st
    assert st["done"] == st["total"] - 1 and st["state"] == "done"


def test_engine_ray_through_the_cli_and_post_backfill_start(cluster, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app
    from nobackfill.client.errors import InvalidRequest
    from nobackfill.client.local import LocalClient
    from nobackfill.client.remote import RemoteClient
    from nobackfill.serve import KeyRing, ServeSettings, create_app

    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    c, _ = _upgraded(tmp_path, n_images=10)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    monkeypatch.setattr(LocalClient, "_loader", lambda self: (lambda: new))  # the actors' stand-in model
    r = CliRunner().invoke(app, ["collection", "backfill", str(c.path), "--engine", "ray", "--actors", "1",
                                 "--address", cluster[0].address,  # (dialled first: it answers)
                                 "--order", "sequential", "--batch-size", "4", "--limit", "12"])
    assert r.exit_code == 0, r.output
    assert "12 committed" in r.output and "on ray" in r.output and backfill_status(c)["done"] == 12
    r = CliRunner().invoke(app, ["collection", "backfill", str(c.path), "--engine", "spark"])
    assert r.exit_code != 0 and "engine must be one of local, ray" in r.output

    keys = KeyRing({"read": ["r" * 24], "admin": ["a" * 24]})
    auth = {"Authorization": "Bearer " + "a" * 24}
    plain = TestClient(create_app(ServeSettings(collection=str(c.path), keys=keys), pool=pool))
    r = plain.post("/v1/backfill/start", json={"engine": "ray"}, headers=auth)
    assert r.status_code == 409 and "--ray-address" in r.json()["detail"] and r.json()["field"] == "engine"
    api = TestClient(create_app(ServeSettings(collection=str(c.path), keys=keys, ray_address="auto"), pool=pool))
    r = api.post("/v1/backfill/start", json={"engine": "ray", "order": "sequential", "actors": 1}, headers=auth)
    assert r.status_code == 200, r.text
    api.app.state.service.client.worker.thread.join(timeout=120)
    st = api.get("/v1/status", headers=auth).json()["backfill"]
    assert st["state"] == "done" and st["done"] == st["total"] == 30, st
    _vectors(c)
    with pytest.raises(InvalidRequest, match="--ray-address"):
        RemoteClient("http://127.0.0.1:9", api_key="k").backfill_start(engine="ray", ray_address="auto")


def test_the_bench_table_shows_every_engine_the_fault_run_and_the_memory():
    from nobackfill.bench.backfill_engine import format_markdown

    r = {"items": 100, "batch_size": 8, "actors": 2, "cores": 2, "load_average": {"before": [1.0], "after": [2.0]},
         "throughput": {"local_items_per_s": 200.0, "ray_items_per_s": 150.0, "ray_over_local": 0.75,
                        "ray_2_nodes_items_per_s": 100.0, "local_s": 0.5, "ray_s": 0.67, "ray_2_nodes_s": 1.0,
                        "ray_start_s": 3.0, "ray_first_batch_s": 0.4, "ray_overhead_per_batch_ms": 13.0, "batches": 13},
         "faults": {"actor_kills": 10, "node_removals": 2, "crashed_commits": 2, "committed": 100, "lost": 0,
                    "twice": 1, "vectors_identical": False, "batch_size": 4},
         "rss_mb": {"driver": 500.0, "actors": 600.0, "commit_actor": 200.0}}
    md = format_markdown(r)
    assert "| ray, 1 node | 150.0 | 0.67 | 0.75 |" in md and "| ray, 2 nodes (1 CPU each) | 100.0 | 1.0 | 0.50 |" in md
    assert "| 2 nodes, batch 4, model +0 s/call | 10 | 2 | 2 | 100 | 0 | 1 | NO |" in md  # a duplicate or a differing vector shows
    assert "13.0 ms" in md and "driver 500.0 MB" in md and "before [1.0]" in md


DRIVER = """
import sys
from nobackfill.bench.backfill_engine import Delayed
from nobackfill.collection.collection import Collection
from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, run_ray_worker
from _collection_helpers import related_pair
import ray
ray.init(address=sys.argv[2], log_to_driver=False, configure_logging=False)
new = related_pair()[1]
run_ray_worker(Collection.open(sys.argv[1]), Delayed(lambda: new, 0.3), options=RayOptions(actors=1), batch_size=4)
"""


def test_a_killed_ray_driver_loses_nothing_and_a_rerun_goes_on_from_the_catalog(cluster, tmp_path):
    import time

    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, run_ray_worker

    c, new = _upgraded(tmp_path, n_images=12)
    start_backfill(c, new, order="sequential")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(c.path), cluster[0].address], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while backfill_status(c)["done"] == 0 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert driver.poll() is None, "the driver ended before it was killed"
        assert backfill_status(c)["workers"] == 1 and backfill_status(c)["engine"] == "ray"
    finally:
        driver.kill()
        driver.wait()
    st = backfill_status(c)
    assert 0 < st["done"] < st["total"] == 36
    rep = run_ray_worker(c, lambda: new, options=RayOptions(actors=1), batch_size=8)  # takes the dead driver's shard
    assert rep.stopped == "done" and 0 < rep.committed <= 36 - st["done"]  # (vectors stored unserved: served)
    assert backfill_status(c)["done"] == 36
    _vectors(c)


def test_rays_own_log_lines_show_only_with_verbose():
    """Ray's loggers (its token-auth note at start, Ray Data's progress-bar warning and info lines)
    go through Python logging at our level: errors only, warnings with ``nobackfill -v``."""
    import logging

    from nobackfill._logging import set_verbose
    from nobackfill.lifecycle.cluster.ray_backfill import import_ray

    import_ray()
    try:
        for name in ("ray", "ray.data", "ray._private.authentication.authentication_token_setup"):
            lg = logging.getLogger(name)
            assert not lg.handlers and lg.getEffectiveLevel() == logging.ERROR, (name, lg.handlers)
        set_verbose(True)
        assert logging.getLogger("ray.data").getEffectiveLevel() == logging.WARNING
    finally:
        set_verbose(False)


def test_rays_retry_notes_show_only_with_verbose():
    """Ray's core tells the driver of each task it retries on another actor, e.g. after a pause ended
    the actors (trial Z: ``(raylet) Task MapWorker(MapBatches(_Embed)).submit failed ... killed by
    'ray.kill'``, on stdout): off unless ``nobackfill -v``, through the setting Ray reads when its
    core starts; a value the user set stays."""
    from nobackfill._logging import set_verbose
    from nobackfill.lifecycle.cluster.ray_backfill import import_ray

    var = "RAY_enable_output_error_log_if_still_retry"
    saved = os.environ.pop(var, None)
    try:
        set_verbose(True)
        import_ray()
        assert var not in os.environ  # -v: Ray's default (its notes shown)
        set_verbose(False)
        import_ray()
        assert os.environ[var] == "0"
        os.environ[var] = "1"  # the user's own
        import_ray()
        assert os.environ[var] == "1"
    finally:
        set_verbose(False)
        os.environ.pop(var, None)
        if saved is not None:
            os.environ[var] = saved
