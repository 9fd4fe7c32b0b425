"""A collection shared by several machines: its vectors in a directory every machine reaches (or on
a Milvus server), its catalog (items, plan, serving rows, the backfill's job and leases) in
PostgreSQL.

Two processes with different working directories stand for two machines backfilling one collection
while either is SIGKILLed at random moments, or for one machine serving it over HTTP while another
backfills it; leases are taken over only once they expire or their holder (a process of this host)
is gone; an ``add`` SIGKILLed at random moments and restarted adds every item exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _collection_helpers import (NEW_REF, OLD_REF, make_folder, milvus_server_location, pool_with, related_pair,
                                write_procrustes_upgrade)
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items
from nobackfill.lifecycle.backfill import _read, _write, backfill_status, run_worker, start_backfill
from nobackfill.lifecycle.plan_changes import upgrade_collection

TESTS = Path(__file__).parent
HOST = socket.gethostname()


def _shared_uri(tmp_path: Path, postgres_db: str, name: str = "photos") -> str:
    """A local vectors directory + the PostgreSQL catalog ``name`` in the test's database."""
    return f"{tmp_path / 'shared'}?catalog={postgres_db}#{name}"


def _upgraded(tmp_path: Path, uri: str, n_images: int, captions: int):
    """A collection at ``uri`` holding a folder's items in the old space, upgraded to the new model
    (nothing backfilled yet)."""
    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=captions)
    c = Collection.create(uri, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    return c, old, new


class _Machine:
    """One "machine": a helper script run in its own working directory, restarted after each kill;
    its output goes to ``log`` (kept for the failure messages)."""

    def __init__(self, name: str, cwd: Path, args: list[str]) -> None:
        self.name, self.cwd, self.args = name, cwd, args
        cwd.mkdir(parents=True, exist_ok=True)
        self.log = cwd / "log.txt"
        self.proc: subprocess.Popen | None = None
        self.kill_at: float | None = None
        self.starts = 0

    def start(self, env: dict[str, str] | None = None) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([sys.executable, *self.args], cwd=self.cwd, stdout=out,
                                         stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.kill_at = None
        self.starts += 1

    def ready(self) -> bool:
        """The process has opened the collection (the helper wrote ``ready.<pid>``)."""
        return (self.cwd / f"ready.{self.proc.pid}").exists()

    def kill(self) -> bool:
        """SIGKILL it; True if the signal killed it (False: it had exited on its own)."""
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(30) == -signal.SIGKILL

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(api) -> bool:
    """The server answers its health check."""
    try:
        return bool(api.healthz()["ok"])
    except Exception:  # not listening yet
        return False


def _served_once(c: Collection) -> None:
    """Each live item is served by exactly one space (one consistent snapshot)."""
    st = c.status()
    for m in ("image", "text"):
        served = sum(s[m] for s in st["spaces"].values() if not s["retired"])
        assert served == st["items"][m], st
    assert st["unserved"] == 0, st


# ----------------------------------------------------------------------------- a. two machines, SIGKILLs
@pytest.mark.slow
@pytest.mark.parametrize("vectors", ["directory", pytest.param("milvus-server", marks=pytest.mark.milvus_server)])
def test_two_machines_backfill_one_collection_through_sigkills(tmp_path, postgres_db, request, vectors):
    """Two worker processes (two working directories, leases naming two hosts: neither can see
    whether the other's processes live) backfill one collection, 2 shards, while either is
    SIGKILLed at random moments (>= 20 kills, each restarted at once); then every live item is served
    by the new space exactly once, no key is stored twice in its store, nothing is lost, and the
    collection verifies. The vectors are in a directory both reach, or on a Milvus server (there a
    worker's first lookup after it claims a shard waits for the server's time tick: longer leases
    and lives, a slower rate)."""
    if vectors == "directory":  # per worker: batch, items a second, lease seconds
        uri, n_images, life, work = _shared_uri(tmp_path, postgres_db), 100, (0.05, 1.0), ["2", "10", "0.5"]
    else:  # 20 lives of at most 3 s at 4 items a second embed at most 240 of the 300 items
        uri, n_images, life, work = milvus_server_location(request), 100, (1.0, 3.0), ["2", "4", "1.5"]
    c, old, new = _upgraded(tmp_path, uri, n_images=n_images, captions=2)  # an image and two captions each
    before = {i: (it.modality, it.key) for i, it in c.items().items()}
    total = 3 * n_images
    assert len(before) == total
    start_backfill(c, new, order="random", shards=2, seed=7)
    assert backfill_status(c)["total"] == total
    # per worker: batches of 2, at most 10 items a second, leases of 0.5 s renewed every batch; a
    # worker lives 0.05-1 s after it opened the collection, so 20 lives embed at most ~250 items
    # (on the Milvus server: at most 4 items a second, lives of 1-3 s, leases of 1.5 s: at most 240 of
    # the 300 items; its first seconds connect to the server): the backfill
    # cannot be over before the 20th kill
    machines = [_Machine(name, tmp_path / name, [str(TESTS / "_shared_worker.py"), uri, name, *work])
                for name in ("machine-a", "machine-b")]
    rng = random.Random(0)
    kills, t0 = 0, time.monotonic()
    for m in machines:
        m.start()
    try:
        while kills < 20:
            assert time.monotonic() - t0 < 240, f"{kills} kills in 240 s"
            for m in machines:
                rc = m.proc.poll()
                assert rc is None, f"{m.name} exited ({rc}) before the 20th kill:\n{m.output()}"
                now = time.monotonic()
                if m.kill_at is None and m.ready():
                    m.kill_at = now + rng.uniform(*life)
                if m.kill_at is not None and now >= m.kill_at:
                    assert m.kill(), f"{m.name} had exited:\n{m.output()}"
                    kills += 1
                    if kills % 5 == 0:
                        _served_once(Collection.open(uri))
                    m.start()
            time.sleep(0.01)
        mid = backfill_status(Collection.open(uri))["done"]
        assert mid < total
        for m in machines:  # no more kills: both finish the job
            assert m.proc.wait(180) == 0, f"{m.name}:\n{m.output()}"
    finally:
        for m in machines:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait()
    t_kills = time.monotonic() - t0
    print(f"{kills} kills ({sum(m.starts for m in machines)} starts), {mid}/{total} backfilled at the 20th kill, "
          f"{t_kills:.1f} s")

    c = Collection.open(uri)
    st = backfill_status(c)
    assert st["done"] == st["total"] == total and st["state"] == "done", st
    assert st["per_modality"] == {"image": {"done": n_images, "total": n_images},
                                  "text": {"done": 2 * n_images, "total": 2 * n_images}}
    status = c.status()
    assert status["catalog"] == "postgresql" and status["unserved"] == 0
    assert {m: status["spaces"][new.space_id][m] for m in ("image", "text")} == {"image": n_images,
                                                                                "text": 2 * n_images}
    assert {m: status["spaces"][old.space_id][m] for m in ("image", "text")} == {"image": 0, "text": 0}
    assert {i: (it.modality, it.key) for i, it in c.items().items()} == before  # nothing lost, keys kept
    g = c.gallery(new.space_id)
    snap = c.snapshot()
    for m in ("image", "text"):
        keys = g.ids(m)
        assert len(keys) == len(set(keys))  # no vector key stored twice
        assert set(keys) == {k for mod, k in before.values() if mod == m}
        served = [i for i in snap.views(m)[new.space_id].item_ids if i is not None]
        assert len(served) == len(set(served)) == sum(mod == m for mod, _ in before.values())  # each exactly once
    assert not c.verify()


@pytest.mark.slow
@pytest.mark.parametrize("vectors", ["directory", pytest.param("milvus-server", marks=pytest.mark.milvus_server)])
def test_one_machine_serves_while_another_backfills(tmp_path, postgres_db, request, vectors):
    """One process serves the collection over HTTP while another, in its own working directory,
    backfills it: every answer during the backfill holds every image exactly once (moved or not
    yet), both routes appear while it runs, and the server answers natively once it is over."""
    pytest.importorskip("fastapi")
    from nobackfill.client import Client

    if vectors == "directory":
        uri, work = _shared_uri(tmp_path, postgres_db), ["2", "20", "5"]
    else:
        uri, work = milvus_server_location(request), ["2", "4", "10"]  # ~9 s for the 36 items
    n_images = 12
    c, old, new = _upgraded(tmp_path, uri, n_images=n_images, captions=2)
    start_backfill(c, new, order="random", seed=3)
    key, port = "shared-read-key-0123", _free_port()
    server = _Machine("server", tmp_path / "server", [str(TESTS / "_shared_server.py"), uri, str(port), key])
    worker = _Machine("worker", tmp_path / "worker", [str(TESTS / "_shared_worker.py"), uri, "worker", *work])
    server.start()
    try:
        api = Client(f"http://127.0.0.1:{port}", key, timeout=60)
        deadline = time.monotonic() + 120
        while not _answers(api):
            assert time.monotonic() < deadline and server.proc.poll() is None, server.output()
            time.sleep(0.2)
        routes: list[tuple[str, ...]] = []
        worker.start()
        while worker.proc.poll() is None:
            hits = api.search(text="caption 0 of image 0 seed 0", k=50, target="image").hits
            ids = [h.id for h in hits]
            assert len(ids) == len(set(ids)) == n_images, ids  # none missing, none twice
            routes.append(tuple(sorted({h.route for h in hits})))
        assert worker.proc.wait() == 0, worker.output()
        assert ("bridge", "native") in routes, routes  # answered from both spaces while it ran
        print(f"{len(routes)} searches during the backfill, {routes.count(('bridge', 'native'))} from both spaces")
        hits = api.search(text="caption 0 of image 0 seed 0", k=50, target="image").hits
        assert len(hits) == n_images and {h.route for h in hits} == {"native"}
    finally:
        server.kill()
    assert backfill_status(Collection.open(uri))["state"] == "done"


# ----------------------------------------------------------------------------- b. lease takeover
def _dead_pid() -> int:
    """The pid of a process of this host that has exited (and was reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_a_lease_is_taken_over_only_after_expiry_or_once_its_holder_is_gone(tmp_path, request, catalog):
    """Shard 0 leased by a process of another host (not expired), shard 1 by a dead process of this
    host, shard 2 by a live one: a worker takes shard 1 at once and reports 'no free shard' naming
    the holders of 0 and 2; once the live holder is killed, shard 2 is taken at once; shard 0 only
    after its lease expired."""
    uri = (str(tmp_path / "shared") if catalog == "sqlite"
           else _shared_uri(tmp_path, request.getfixturevalue("postgres_db")))
    c, old, new = _upgraded(tmp_path, uri, n_images=8, captions=2)  # 24 items, 8 per shard
    start_backfill(c, new, order="sequential", shards=3)
    order = _read(c, "order.json")
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        expires = time.time() + 5.0
        other = {"owner": "otherhost:12345:abcd", "expires": expires, "since": "2024-01-01T00:00:00+00:00", "rate": 1.0}
        _write(c, "leases/shard-0.json", other)
        _write(c, "leases/shard-1.json", {"owner": f"{HOST}:{dead}:gone", "expires": time.time() + 3600,
                                          "since": "2024-01-01T00:00:00+00:00", "rate": 1.0})
        _write(c, "leases/shard-2.json", {"owner": f"{HOST}:{live.pid}:alive", "expires": time.time() + 3600,
                                          "since": "2024-01-01T00:00:00+00:00", "rate": 1.0})
        st = backfill_status(Collection.open(uri))
        assert st["workers"] == 2 and [(h["shard"], h["host"], h["pid"]) for h in st["holders"]] == \
            [(0, "otherhost", 12345), (2, HOST, live.pid)]

        rep = run_worker(Collection.open(uri), new, batch_size=3)  # the dead holder's shard at once
        assert rep.shards == [1] and rep.committed == len(order[1::3]) == 8
        assert rep.stopped == "no free shard", rep
        assert [(b["shard"], b["owner"]) for b in rep.busy] == [(0, "otherhost:12345:abcd"),
                                                               (2, f"{HOST}:{live.pid}:alive")]
        assert "pid 12345 on otherhost" in rep.reason() and f"pid {live.pid} on {HOST}" in rep.reason()
        assert _read(c, "leases/shard-0.json") == other  # untouched

        live.kill()
        live.wait()
        rep = run_worker(Collection.open(uri), new, batch_size=3)  # its holder is gone: at once
        assert rep.shards == [2] and rep.committed == 8 and rep.stopped == "no free shard", rep
        assert [b["owner"] for b in rep.busy] == ["otherhost:12345:abcd"] and "pid 12345 on otherhost" in rep.reason()
        assert time.time() < expires, "too slow: the other host's lease expired before it was checked"
        assert _read(c, "leases/shard-0.json") == other
        assert backfill_status(Collection.open(uri))["done"] == 16

        time.sleep(max(0.0, expires - time.time()) + 0.05)
        rep = run_worker(Collection.open(uri), new, batch_size=3)  # expired: taken
        assert rep.shards == [0] and rep.committed == 8 and rep.stopped == "done", rep
        assert _read(c, "leases/shard-0.json")["owner"] == rep.owner
        c = Collection.open(uri)
        st = backfill_status(c)
        assert st["state"] == "done" and st["done"] == st["total"] == 24
        assert not c.verify()
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()


# ----------------------------------------------------------------------------- c. add, SIGKILLs
@pytest.mark.slow
def test_add_killed_at_random_moments_into_a_shared_catalog_adds_each_item_once(tmp_path, postgres_db):
    """An ``add`` of 200 items (chunks of 4, a slow model) into a PostgreSQL-catalog collection,
    SIGKILLed at random moments 8 times and restarted each time, then at its 1st, 2nd, ... atomic
    write until one kill lands between storing a chunk's vectors and committing its catalog
    transaction, then run to the end: every item is there once with its key, each key stored once
    (the stored chunk is recovered, not embedded again), and the collection verifies after every
    kill."""
    sys.path.insert(0, str(TESTS))
    from _shared_adder import items

    uri = _shared_uri(tmp_path, postgres_db)
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", n_images=20, captions_per_image=2)  # 60 items
    want = {it.id: (it.modality, it.key) for it in items(data, 140)}
    assert len(want) == 200
    Collection.create(uri, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    adder = _Machine("adder", tmp_path / "adder", [str(TESTS / "_shared_adder.py"), uri, str(data), "140"])
    rng = random.Random(1)
    kills, counts, t0 = 0, [0], time.monotonic()
    try:
        while kills < 8:
            adder.start()
            while not adder.ready():
                assert adder.proc.poll() is None, f"the adder exited before it was ready:\n{adder.output()}"
                assert time.monotonic() - t0 < 180
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.5))
            assert adder.kill(), f"the adder finished before the kill:\n{adder.output()}"
            kills += 1
            c = Collection.open(uri)
            assert not c.verify()
            counts.append(c.count())
            assert counts[-1] >= counts[-2]
        assert counts[-1] < 200
        # a kill with a chunk's vectors stored and its catalog transaction not committed: the n-th
        # atomic write of a life (store._crash_point), for the first n that leaves such vectors
        for n in range(1, 16):
            adder.start({"NOBACKFILL_TEST_KILL_AT_WRITE": str(n)})
            assert adder.proc.wait(60) == -signal.SIGKILL, adder.output()
            kills += 1
            c = Collection.open(uri)
            assert not c.verify()
            counts.append(c.count())
            g = c.gallery(c.current_space)
            if g.count("image") + g.count("text") > counts[-1]:
                break
        else:
            pytest.fail("no kill point between a chunk's vectors and its catalog commit")
        adder.start()  # the restart that finishes
        assert adder.proc.wait(120) == 0, adder.output()
    finally:
        if adder.proc is not None and adder.proc.poll() is None:
            adder.proc.kill()
            adder.proc.wait()
    rep = json.loads(adder.output().strip().splitlines()[-1])
    print(f"{kills} kills, items after each: {counts[1:]}, recovered {rep['recovered']}, "
          f"{time.monotonic() - t0:.1f} s")
    assert rep["added"] + rep["recovered"] + rep["unchanged"] == 200 and rep["unchanged"] == counts[-1], rep
    assert rep["recovered"] >= 1, rep

    c = Collection.open(uri)
    assert c.count() == 200 and c.count("image") == 20 and c.count("text") == 180
    assert {i: (it.modality, it.key) for i, it in c.items().items()} == want
    g = c.gallery(c.current_space)
    for m in ("image", "text"):
        keys = g.ids(m)
        assert len(keys) == len(set(keys)) and set(keys) == {k for mod, k in want.values() if mod == m}
    _served_once(c)
    assert not c.verify()


def test_a_bulk_insert_into_a_postgresql_catalog_goes_in_by_copy_in_order(tmp_path, postgres_db):
    """Many rows at once (an import's chunk) go into PostgreSQL by COPY: their rids ascend in the
    order given, ``new_ids_only`` leaves out the ids already live (their rid None), and every row
    holds what was given."""
    from nobackfill.catalog import writer
    from nobackfill.gallery.atomic_files import _now

    n = writer.COPY_AT + 500
    c = Collection.create(f"{tmp_path / 'c'}?catalog={postgres_db}#bulk", space_id="s", dim=4, model="m",
                          modalities=["text"])

    def rows(ids):
        return [(i, "text", i, json.dumps({"text": f"t {i}"}), json.dumps({"i": i})) for i in ids]

    first = [f"a{j:05d}" for j in range(n)]
    with c.catalog.writing() as w:
        rids = w.insert(rows(first), new_ids_only=True)
        w.finish(_now())
    assert rids == list(range(rids[0], rids[0] + n))
    second = [f"{'a' if j % 2 else 'b'}{j:05d}" for j in range(n)]  # every other id already live
    with c.catalog.writing() as w:
        again = w.insert(rows(second), new_ids_only=True)
        w.finish(_now())
    fresh = [r for r in again if r is not None]
    assert [r is None for r in again] == [i.startswith("a") for i in second]
    assert fresh == sorted(fresh) and fresh[0] > rids[-1]
    got = c.catalog.rows_by_id(second[:6])
    assert [(got[i].id, got[i].metadata["i"], got[i].source["text"]) for i in second[:6]] == \
        [(i, i, f"t {i}") for i in second[:6]]
    assert Collection.open(f"{tmp_path / 'c'}?catalog={postgres_db}#bulk").count("text") == n + (n + 1) // 2
