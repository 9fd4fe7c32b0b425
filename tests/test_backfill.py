"""Progressive backfill: orders, resumability, leases, exactly-once under SIGKILL, search during the
backfill, retire."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, write_procrustes_upgrade
from nobackfill.index.collection import Collection
from nobackfill.index.ingest import add_items, folder_items, text_item
from nobackfill.search import Searcher
from nobackfill.search.backfill import (
    BackfillError,
    backfill_status,
    pause_backfill,
    retire_space,
    run_backfill,
    run_worker,
    start_backfill,
)
from nobackfill.search.plan import UpgradeRefused, upgrade_collection


def _upgraded(tmp_path: Path, n_images: int = 6, captions: int = 2):
    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=captions)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    return c, old, new, pool, data


def test_sequential_backfill_moves_every_item_and_search_answers_natively(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path)
    st = backfill_status(c)
    assert st["done"] == 0 and st["total"] == 18
    with pytest.raises(BackfillError, match="cannot retire"):
        retire_space(c, old.space_id)
    out = run_backfill(c, new, order="sequential", batch_size=4)
    assert out["done"] == out["total"] == 18 and out["fraction"] == 1.0
    hits = Searcher(c, pool=pool).search(text="caption 1 of image 2 seed 0", k=18, target="text").hits
    assert {h.route for h in hits} == {"native"} and len(hits) == 12
    retire_space(c, old.space_id)
    assert not (c.path / c.space(old.space_id)["dir"]).exists()
    assert Searcher(c, pool=pool).search(text="caption 1 of image 2 seed 0", k=1, target="text").hits[0].route == "native"
    assert not c.verify()


def test_limit_resumes_where_it_stopped_and_status_counts(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="random", seed=3)
    done = []
    for _ in range(5):
        rep = run_worker(c, new, batch_size=2, limit=4)
        done.append(backfill_status(c)["done"])
        assert rep.committed <= 4
    assert done == [4, 8, 12, 16, 18]
    assert backfill_status(c)["per_modality"] == {"image": {"done": 6, "total": 6}, "text": {"done": 12, "total": 12}}


def test_search_during_backfill_returns_each_item_once(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    run_worker(c, new, batch_size=3, limit=7)
    hits = Searcher(c, pool=pool).search(text="caption 0 of image 0 seed 0", k=50, target="text").hits
    assert len(hits) == 12 and len({h.id for h in hits}) == 12
    assert {h.route for h in hits} == {"native", "bridge"}
    assert sum(h.route == "native" for h in hits) == backfill_status(c)["per_modality"]["text"]["done"]


def test_adds_during_a_backfill_go_to_the_new_space_and_deletes_stay_deleted(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    add_items(c, new, [text_item("added during the backfill", id="late")], progress=False)
    victim = next(i for i, it in c.items().items() if it.modality == "text")
    c.delete([victim])
    run_worker(c, new, batch_size=5)
    snap = c.snapshot()
    assert victim not in snap.items and snap.serving_space("late") == new.space_id
    assert backfill_status(c)["done"] == backfill_status(c)["total"] == 18
    hits = Searcher(c, pool=pool).search(text="anything", k=100, target="text").hits
    assert victim not in {h.id for h in hits} and "late" in {h.id for h in hits}


def test_an_upgrade_during_a_backfill_is_refused(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    plan = c.plan
    with pytest.raises(UpgradeRefused, match="let it finish"):
        upgrade_collection(c, "/fake/models/newer", pool=pool)
    pause_backfill(c)
    assert backfill_status(c)["state"] == "paused"
    assert run_worker(c, new).stopped == "paused"
    with pytest.raises(UpgradeRefused):
        upgrade_collection(c, "/fake/models/newer", pool=pool)
    assert c.plan == plan


def test_uncertainty_order_backfills_a_sample_first_and_fits_a_head(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=20, captions=2)
    job = start_backfill(c, new, order="uncertainty", min_sample=20, sample_fraction=0.1)
    assert job.sample == 20 and backfill_status(c)["done"] == 20
    assert job.head and all(v["sample"] >= 8 for v in job.head.values())
    run_worker(c, new, batch_size=8)
    assert backfill_status(c)["fraction"] == 1.0


def _child(fn) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    return pid


@pytest.mark.slow
def test_a_killed_holders_lease_is_taken_over_at_once(tmp_path):
    """A restarted server must not wait out the lease of the process it replaced: a shard leased by a
    process of this host that has exited is free, whatever its expiry; a live holder's is not."""
    c, old, new, pool, data = _upgraded(tmp_path, n_images=12, captions=1)
    start_backfill(c, new, order="sequential", shards=1)
    pid = _child(lambda: time.sleep(60))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    import socket

    from nobackfill.search.backfill import _write

    dead = {"owner": f"{socket.gethostname()}:{pid}:dead", "expires": time.time() + 3600, "since": "", "rate": 0.0}
    _write(c, "leases/shard-0.json", dead)
    assert backfill_status(c)["workers"] == 0
    rep = run_worker(Collection.open(c.path), new, batch_size=5, lease_s=3600)
    total = backfill_status(c)["total"]
    assert rep.committed == total and backfill_status(Collection.open(c.path))["done"] == total
    live = dict(dead, owner=f"{socket.gethostname()}:{os.getpid()}:other-thread")
    start_backfill(c, new, order="sequential", shards=1)  # nothing left to do, but the lease is checked first
    _write(c, "leases/shard-0.json", live)
    assert backfill_status(Collection.open(c.path))["workers"] == 1


def test_sigkill_two_workers_at_random_times_loses_nothing_and_commits_nothing_twice(tmp_path):
    """>= 20 SIGKILLs of a 2-worker backfill; then the work is finished and compared with a clean
    full re-embed (same ids, vectors within 1e-6)."""
    rng = random.Random(0)
    c, old, new, pool, data = _upgraded(tmp_path, n_images=60, captions=2)
    start_backfill(c, new, order="random", shards=2, seed=1)
    total = backfill_status(c)["total"]
    kills = 0
    slow = type(new)  # a slower encoder widens the windows a kill can land in

    class Slow(slow):
        def _rows(self, datas, what):
            time.sleep(0.02 * len(datas))
            return super()._rows(datas, what)

    enc = Slow(new._dim, new._salt, base=new.base, mix=new.mix, name="new")
    while kills < 24 and backfill_status(c)["done"] < total:
        pids = [_child(lambda: run_worker(Collection.open(c.path), enc, batch_size=3, lease_s=0.3)) for _ in range(2)]
        time.sleep(rng.uniform(0.02, 0.15))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # a child that already exited is a zombie until reaped: no error
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            kills += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        time.sleep(0.35)  # the dead workers' leases expire
        assert not Collection.open(c.path).verify()
    assert kills >= 20
    time.sleep(0.35)
    run_worker(Collection.open(c.path), new, batch_size=7, lease_s=0.3)
    c = Collection.open(c.path)
    assert backfill_status(c)["done"] == total
    g = c.gallery(new.space_id)
    for m in ("image", "text"):
        keys = g.ids(m)
        assert len(keys) == len(set(keys))  # committed at most once
        live = {it.key: it for it in c.items().values() if it.modality == m}
        assert set(keys) == set(live)  # nothing lost, nothing extra
        vecs = np.asarray(g.vectors(m))
        clean = (new.encode_images([Path(live[k].payload) for k in keys]) if m == "image"
                 else new.encode_texts([live[k].payload for k in keys]))
        assert np.abs(vecs - clean).max() < 1e-6
