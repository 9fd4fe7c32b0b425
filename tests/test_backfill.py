"""Progressive backfill: orders, resumability, leases, exactly-once under SIGKILL, search during the
backfill, retire."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, upgraded_collection
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items, text_item
from nobackfill.search import Searcher
from nobackfill.lifecycle.backfill import (
    BackfillError,
    backfill_status,
    pause_backfill,
    retire_space,
    run_backfill,
    run_worker,
    start_backfill,
)
from nobackfill.lifecycle.plan_changes import UpgradeRefused, upgrade_collection


def _upgraded(tmp_path: Path, n_images: int = 6, captions: int = 2):
    return upgraded_collection(tmp_path, n_images, captions)


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
    from nobackfill.lifecycle.verify import check_models  # (trial AL: "no item with a readable source")

    assert check_models(c, pool=pool)[old.space_id]["message"] == f"not checked: space {old.space_id} holds no item now"
    retire_space(c, old.space_id)
    assert not (c.path / c.space(old.space_id).dir).exists()
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
    snap = c.snapshot()  # each hit named as the catalog names it, in the space that serves it
    for h in hits:
        assert h.space == snap.serving_space(h.id) and h.metadata == snap.items[h.id].metadata
        assert h.route == ("native" if h.space == new.space_id else "bridge")


def test_a_search_of_two_spaces_names_its_hits_and_leaves_out_items_deleted_after_its_snapshot(tmp_path,
                                                                                               monkeypatch):
    """During a backfill a search names the hits of both spaces at once. A reader still on a
    snapshot from before a delete (the hit table, read after it, holds no record of the deleted
    items) leaves them out of whichever space served them; the other hits keep their names,
    metadata, spaces and routes, and the ranks close up."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    run_worker(c, new, batch_size=3, limit=7)
    snap = c.snapshot()
    texts = {i: it for i, it in snap.items.items() if it.modality == "text"}
    first_of = {}  # one text item served by each space
    for i in sorted(texts):
        first_of.setdefault(snap.serving_space(i), i)
    assert set(first_of) == {old.space_id, new.space_id}
    served_by = {i: snap.serving_space(i) for i in texts}
    victims = set(first_of.values())
    c.delete(sorted(victims))
    monkeypatch.setattr(c, "snapshot", lambda: snap)  # a reader still on the snapshot before the delete
    hits = Searcher(c, pool=pool).search(text="caption 0 of image 0 seed 0", k=50, target="text").hits
    assert len(hits) == len(texts) - 2 and not victims & {h.id for h in hits}
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)  # the raw merge
    for h in hits:
        assert h.space == served_by[h.id] and h.metadata == texts[h.id].metadata
        assert h.route == ("native" if h.space == new.space_id else "bridge")


def test_a_snapshot_of_stores_without_lasting_positions_is_one_committed_state(tmp_path, monkeypatch):
    """A store that numbers its rows per process (a Milvus collection) is mapped through the keys
    the catalog says each space serves. Those keys are read in the snapshot's own transaction: a
    backfill batch committed by another process while a reader builds its snapshot shows in the
    new space or still in the old one, never in neither (the reader's counts match its items)."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    run_worker(c, new, batch_size=3, limit=6)
    reader = Collection.open(c.path)
    for sid in (old.space_id, new.space_id):  # the local stores, read as a Milvus store is
        monkeypatch.setattr(reader.gallery(sid), "stable_positions", False, raising=False)
    real, moved = reader.catalog.query, []

    def query(sql, params=()):
        rows = real(sql, params)
        if sql.startswith("SELECT rid, key FROM items") and not moved:  # the first space's keys are read:
            moved.append(run_worker(c, new, batch_size=2, limit=2).committed)  # a batch lands meanwhile
        return rows

    monkeypatch.setattr(reader.catalog, "query", query)
    snap = reader.snapshot()
    assert moved == [2]
    counts = snap.counts()
    for m in ("image", "text"):
        assert sum(counts[sid][m] for sid in counts) == snap.item_count(m)
    assert counts[new.space_id]["image"] + counts[new.space_id]["text"] == 6  # the snapshot before the batch
    monkeypatch.setattr(reader.catalog, "query", real)
    reader._checked = float("-inf")  # (the reader asks the catalog again at once)
    after = reader.snapshot().counts()
    assert after[new.space_id]["image"] + after[new.space_id]["text"] == 8


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


def test_an_item_deleted_or_replaced_while_its_batch_embeds_leaves_no_vector_behind(tmp_path, monkeypatch):
    """Trial AD's D5: a delete landing while a batch embeds left the item's new vector stored (never
    served, yet a backfilled pair until retire). The commit now leaves out versions no longer live."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    texts = [it for it in c.items().values() if it.modality == "text"]
    deleted, replaced = texts[0], texts[1]
    embed, calls = new.encode_texts, []

    def embed_then_change(rows, **kw):
        out = embed(rows, **kw)
        if not calls:  # the first batch of texts: both items are in it (sequential, batch of all)
            calls.append(1)
            c.delete([deleted.id])
            add_items(c, new, [text_item("new words for it", id=replaced.id)], progress=False)
        return out

    monkeypatch.setattr(new, "encode_texts", embed_then_change)
    rep = run_worker(c, new, batch_size=100)
    assert calls and rep.stopped == "done"
    g = c.gallery(new.space_id)
    stored = set(g.ids("text"))
    assert deleted.key not in stored and replaced.key not in stored  # the old version of the replaced item
    live = c.items()
    assert deleted.id not in live and live[replaced.id].key in stored  # its new version: embedded later
    assert backfill_status(c)["done"] == backfill_status(c)["total"]
    assert not c.verify()
    retire_space(c, old.space_id)
    assert g.count("text") == len([it for it in c.items().values() if it.modality == "text"])


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


def test_an_upgrade_to_a_model_that_cannot_embed_a_held_modality_is_refused(tmp_path):
    """A collection of images and captions upgraded to a text-only model would keep its images in the
    old space alone and lose them at retire: refused naming the model and the images, nothing changed.
    A collection already in that state (made before this check) cannot retire its last image space."""
    from _collection_helpers import HashEncoder

    old, _, _ = related_pair()
    text_only = HashEncoder(dim=old.embed_dim, salt=9, modalities=("text",), name="text-only")
    pool = pool_with((OLD_REF, old), ("/fake/models/text-only", text_only))
    data = make_folder(tmp_path / "data", n_images=4, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    plan = c.plan
    with pytest.raises(UpgradeRefused, match=r"embeds text only.*4 images it could not embed.*delete"):
        upgrade_collection(c, "/fake/models/text-only", pool=pool)
    assert c.plan == plan and len(c.plan.spaces) == 1
    # the state an earlier release let through: the text-only model current, the images in the old space
    entry = c.add_space(space_id=text_only.space_id, dim=text_only.embed_dim, model="/fake/models/text-only",
                        name="text-only", modalities=["text"])
    c.set_plan(lambda p: p.with_space(entry, current=True))
    run_backfill(c, text_only, order="sequential")
    with pytest.raises(BackfillError, match=r"only space that embeds images, and 4 images would be left with no vector"):
        retire_space(c, old.space_id)
    assert not c.space(old.space_id).retired and c.count("image") == 4


def test_uncertainty_order_backfills_a_sample_first_and_fits_a_head(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=20, captions=2)
    job = start_backfill(c, new, order="uncertainty", min_sample=20, sample_fraction=0.1)
    assert job.sample == 20 and job.phase == "sample" and backfill_status(c)["done"] == 0  # the workers embed it
    rep = run_worker(c, new, batch_size=8, limit=20)
    assert rep.committed == rep.sample == 20 and backfill_status(c)["done"] == 20
    rep = run_worker(c, new, batch_size=8)
    job = BackfillJob.load(c)
    assert job.phase == "order" and job.head and all(v["sample"] >= 8 for v in job.head.values())
    assert rep.sample == 0 and backfill_status(c)["fraction"] == 1.0


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

    from nobackfill.lifecycle.backfill import _write

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


def test_a_backfill_with_nothing_to_do_keeps_the_job_as_it_ran(tmp_path):
    """Trial AM: `collection backfill --order sequential` on a collection backfilled in random order
    said "nothing to backfill" and rewrote the job: status then named an order that never ran."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    run_backfill(c, new, order="random", batch_size=6)
    before = backfill_status(c)
    assert before["state"] == "done" and before["order"] == "random"
    for order in ("sequential", "uncertainty"):
        out = run_backfill(c, new, order=order, batch_size=6)
        assert out["committed"] == 0 and backfill_status(c) == before


def test_a_copy_taken_during_a_backfill_has_no_worker_and_its_shards_are_free(tmp_path):
    """Trial AK: after ``cp -r`` of a collection during its backfill, the copy's status said the
    original's worker ran on it (with an ETA), though nothing works on the copy. A lease names the
    place of the collection it was taken in; on this host one from another place is no live worker
    of this copy: status says so, and a worker of the copy takes the shard at once."""
    import shutil
    import socket

    from nobackfill.lifecycle.backfill import _write
    from nobackfill.lifecycle.backfill_jobs import place_of

    c, old, new, pool, data = _upgraded(tmp_path, n_images=12, captions=1)
    start_backfill(c, new, order="sequential", shards=1)
    live = {"owner": f"{socket.gethostname()}:{os.getpid()}:original", "expires": time.time() + 3600, "since": "",
            "rate": 5.0, "renewed": time.time(), "place": place_of(c)}
    _write(c, "leases/shard-0.json", live)
    assert backfill_status(Collection.open(c.path))["workers"] == 1
    copy = Collection.open(Path(shutil.copytree(c.path, tmp_path / "copy")))
    assert place_of(copy) != place_of(c) is not None
    st = backfill_status(copy)
    assert st["workers"] == 0 and st["state"] == "idle" and st["eta_s"] is None, st
    assert "copy of the collection" in st["last_worker"]["stopped"] and "copy of the collection" in st["note"]
    rep = run_worker(copy, new, batch_size=5, lease_s=3600)
    assert rep.committed == st["total"] and backfill_status(Collection.open(copy.path))["done"] == st["total"]
    assert backfill_status(Collection.open(c.path))["workers"] == 1  # the original's worker is still its own


def test_status_names_a_killed_worker_not_an_earlier_one_that_said_why(tmp_path):
    """Trial I: after a ``kill -9`` of a run, status said the last worker was an earlier run's, with
    that run's reason (paused). A worker killed since the last recorded stop left its lease
    unfinished: status names it, and says it stopped without a word."""
    import socket

    from nobackfill.lifecycle.backfill import _write

    c, old, new, pool, data = _upgraded(tmp_path, n_images=12, captions=1)
    start_backfill(c, new, order="sequential", shards=1)
    run_worker(Collection.open(c.path), new, batch_size=4, limit=4)  # records: stopped at its limit
    st = backfill_status(c)
    assert st["state"] == "idle" and st["last_worker"]["pid"] == os.getpid() and "limit" in st["last_worker"]["stopped"]
    pid = _child(lambda: time.sleep(60))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    now = time.time() + 1
    _write(c, "leases/shard-0.json", {"owner": f"{socket.gethostname()}:{pid}:ray-dead", "expires": now + 30,
                                      "since": "", "rate": 5.0, "renewed": now, "engine": "ray"})
    st = backfill_status(Collection.open(c.path))
    assert st["state"] == "idle" and st["workers"] == 0
    assert st["last_worker"]["pid"] == pid and "without saying why" in st["last_worker"]["stopped"], st
    assert f"pid {pid}" in st["note"] and "without saying why" in st["note"]
    # a stop recorded after it is the last one again
    run_worker(Collection.open(c.path), new, batch_size=4, limit=4)
    assert backfill_status(Collection.open(c.path))["last_worker"]["pid"] == os.getpid()


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


# ----------------------------------------------------------------------------- issue 24: limits, leases, pause/resume
import socket  # noqa: E402
import threading  # noqa: E402

from nobackfill.lifecycle.backfill import BackfillJob, cancel_backfill  # noqa: E402

HOST = socket.gethostname()


def _gated(new):
    """``new``'s encoder whose calls listed in ``hold`` (1-based) wait until :meth:`open` lets them
    go; ``fail_at``: the call that raises; ``only_thread``: count only the calls of that thread."""

    class Gated(type(new)):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self.n = 0
            self.hold: dict[int, threading.Event] = {}
            self.reached: dict[int, threading.Event] = {}
            self.fail_at: int | None = None
            self.only_thread: str | None = None
            self._lock = threading.Lock()

        def hold_calls(self, *ks: int) -> None:
            for k in ks:
                self.hold[k], self.reached[k] = threading.Event(), threading.Event()

        def open(self, k: int) -> None:
            self.hold[k].set()

        def wait_reached(self, k: int, timeout: float = 30) -> None:
            assert self.reached[k].wait(timeout), f"call {k} of the encoder never came"

        def _rows(self, datas, what):
            if self.only_thread and threading.current_thread().name != self.only_thread:
                return super()._rows(datas, what)
            with self._lock:
                self.n += 1
                k = self.n
            if k in self.hold:
                self.reached[k].set()
                assert self.hold[k].wait(30), f"call {k} was never let go"
            if k == self.fail_at:
                raise RuntimeError("the model ran out of memory")
            return super()._rows(datas, what)

    return Gated(new._dim, new._salt, base=new.base, mix=new.mix, name="new")


def _poll(cond, what: str, timeout: float = 60.0, every: float = 0.05):
    """``cond()`` once it is truthy; fails after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


@pytest.mark.parametrize("order,limit", [("uncertainty", 7), ("uncertainty", 0), ("uncertainty", 25),
                                         ("uncertainty", 100), ("random", 0), ("random", 9), ("sequential", 100)])
def test_limit_bounds_everything_embedded_the_uncertainty_sample_included(tmp_path, order, limit):
    """``limit`` bounds the items embedded, the uncertainty order's training sample included, and the
    report counts every one (the sample said as such); the next run goes on from there."""
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=12, captions=2)  # 36 items
    total = backfill_status(c)["total"]
    if order == "uncertainty":
        job = start_backfill(c, new, order=order, min_sample=20, sample_fraction=0.1, pool=pool)
        assert job.sample == 20 and job.phase == "sample" and backfill_status(c)["done"] == 0
    out = run_backfill(c, new, order=order, batch_size=4, limit=limit, pool=pool)
    want = min(limit, total)
    assert out["done"] == want and out["committed"] == want and out["embedded"] == want
    assert out["sample_committed"] == (min(limit, 20) if order == "uncertainty" else 0)
    assert out["stopped"] == ("done" if limit >= total else "limit")
    job = BackfillJob.load(c)
    if order == "uncertainty":
        assert (job.phase == "order") == (limit >= 20) and bool(job.head) == (limit >= 20)
    out = run_backfill(c, new, order=order, batch_size=4, pool=pool)  # the rest
    assert out["done"] == total and out["committed"] == total - want and out["stopped"] == "done"
    assert out["sample_committed"] == (20 - min(limit, 20) if order == "uncertainty" else 0)
    assert backfill_status(c)["state"] == "done" and not c.verify()


def test_a_limit_is_shared_out_over_workers_exactly():
    from nobackfill.lifecycle.backfill import _split

    assert _split(5, 2) == [3, 2] and _split(1, 3) == [1, 0, 0] and _split(None, 2) == [None, None]
    assert all(sum(_split(n, w)) == n for n in range(0, 20) for w in range(1, 5))


def test_a_collection_smaller_than_the_sample_is_reported_in_full(tmp_path):
    """45 items, limit 100: all 45 are the sample; the report says 45 committed, all of them the sample."""
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=15, captions=2)
    out = run_backfill(c, new, order="uncertainty", batch_size=8, limit=100, pool=pool)
    assert out["done"] == out["total"] == 45 and out["committed"] == 45 and out["sample_committed"] == 45
    assert out["stopped"] == "done"


def test_two_workers_share_the_uncertainty_sample_then_the_order(tmp_path):
    """With two shards, the sample is split between the workers; the worker done first waits for the
    other and both go on with the fitted order, nothing embedded twice."""
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=20, captions=2)
    start_backfill(c, new, order="uncertainty", shards=2, min_sample=20, sample_fraction=0.1, pool=pool)
    reps = [None, None]

    def work(i: int) -> None:
        reps[i] = run_worker(Collection.open(c.path), new, batch_size=3, lease_s=30)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert all(r is not None for r in reps) and "done" in {r.stopped for r in reps}, reps
    for r, other in zip(reps, reps[::-1]):  # the one done first may leave the last shard to the other
        assert r.stopped == "done" or (r.stopped == "no free shard" and [b["owner"] for b in r.busy] == [other.owner])
    assert sum(r.committed for r in reps) == 60 and sum(r.sample for r in reps) == 20
    assert BackfillJob.load(c).head and backfill_status(c)["state"] == "done"


def test_a_worker_that_finds_every_shard_taken_says_who_holds_it(tmp_path):
    """Of two workers on a one-shard job the second reports the first (pid, host), not a silent 0."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    enc = _gated(new)
    enc.hold_calls(1)
    start_backfill(c, new, order="sequential", shards=1)
    first = threading.Thread(target=lambda: run_worker(Collection.open(c.path), enc, batch_size=4))
    first.start()
    enc.wait_reached(1)  # the first worker holds shard 0
    out = run_backfill(Collection.open(c.path), new, order="sequential", batch_size=4)
    enc.open(1)
    first.join(60)
    assert out["committed"] == 0 and out["stopped"].startswith("no free shard")
    assert f"pid {os.getpid()} on {HOST}" in out["stopped"] and "another worker" in out["stopped"]
    assert out["busy"] == [{"shard": 0, "owner": out["busy"][0]["owner"], "host": HOST, "pid": os.getpid(),
                            "since": out["busy"][0]["since"], "rate": 0.0}]  # held, nothing committed yet
    assert backfill_status(c)["state"] == "done"


def test_pause_resume_pause_resume_through_the_library(tmp_path):
    """A paused worker hands its shard back: a new worker of the same process goes on at once, and
    again after a second pause; after a cancel a new job starts."""
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=10, captions=2)  # 30 items
    enc = _gated(new)
    start_backfill(c, new, order="sequential")
    for round_ in range(2):
        k = enc.n + 1
        enc.hold_calls(k)
        rep: list = []
        t = threading.Thread(target=lambda: rep.append(run_worker(Collection.open(c.path), enc, batch_size=4)))
        t.start()
        enc.wait_reached(k)
        pause_backfill(c)
        enc.open(k)
        t.join(60)
        assert rep[0].stopped == "paused" and backfill_status(c)["state"] == "paused"
        assert backfill_status(c)["workers"] == 0  # the shard was handed back
        pause_backfill(c, paused=False)
        rep2 = run_worker(Collection.open(c.path), enc, batch_size=4, limit=8)
        assert rep2.committed == 8 and rep2.stopped == "limit", rep2
    cancel_backfill(c)
    assert backfill_status(c)["state"] == "none"
    out = run_backfill(c, new, order="random", batch_size=4)
    assert out["done"] == out["total"] == 30 and out["stopped"] == "done"


def test_a_worker_that_fails_leaves_status_idle_with_the_reason(tmp_path):
    """A worker that dies of an error hands its shard back and status says so, never 'running'."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    enc = _gated(new)
    enc.fail_at = 3
    start_backfill(c, new, order="sequential")
    with pytest.raises(RuntimeError, match="out of memory"):
        run_worker(c, enc, batch_size=4)
    st = backfill_status(c)
    assert st["state"] == "idle" and st["workers"] == 0
    assert st["last_worker"]["pid"] == os.getpid() and "out of memory" in st["last_worker"]["stopped"]
    assert "out of memory" in st["note"] and "no worker" in st["note"]
    out = run_backfill(c, new, order="sequential", batch_size=4)  # a new worker takes the shard at once
    assert out["done"] == out["total"] and backfill_status(c)["state"] == "done"


# ----------------------------------------------------------------------------- through the CLI
def _words(text: str) -> str:
    """``text`` with its line wrapping undone."""
    return " ".join(text.split())


def _cli(monkeypatch, pool):
    """The CLI runner with the stand-in models of ``pool``."""
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app

    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    runner = CliRunner()
    return lambda *a: runner.invoke(app, [str(x) for x in a])


def test_cli_limit_counts_the_sample_and_a_busy_run_names_the_other_process(tmp_path, monkeypatch):
    c, old, new, pool, _ = _upgraded(tmp_path, n_images=15, captions=2)
    cli = _cli(monkeypatch, pool)
    r = cli("collection", "backfill", c.path, "--limit", 100, "--batch-size", 8)
    assert r.exit_code == 0, r.output
    assert "45 committed" in _words(r.output) and "45 of them the training sample" in _words(r.output)
    c2, old, new, pool, _ = _upgraded(tmp_path / "two")
    cli = _cli(monkeypatch, pool_with((OLD_REF, old), (NEW_REF, new)))
    start_backfill(c2, new, order="sequential", shards=1)
    pid = _child(lambda: time.sleep(60))  # a live process of this host holds the one shard
    try:
        from nobackfill.lifecycle.backfill import _write

        _write(c2, "leases/shard-0.json", {"owner": f"{HOST}:{pid}:cli", "expires": time.time() + 3600,
                                           "since": "2024-01-01T00:00:00+00:00", "rate": 0.0})
        r = cli("collection", "backfill", c2.path, "--order", "sequential")
        assert r.exit_code == 0, r.output
        out = _words(r.output)
        assert "another process is doing the work" in out and f"pid {pid} on {HOST}" in out
        assert "0 committed" not in out
        r = cli("collection", "status", c2.path)
        assert r.exit_code == 0 and f"pid {pid} on {HOST}" in _words(r.output), r.output
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_cli_status_says_when_no_worker_runs(tmp_path, monkeypatch):
    c, old, new, pool, _ = _upgraded(tmp_path)
    enc = _gated(new)
    enc.fail_at = 2
    start_backfill(c, new, order="sequential")
    with pytest.raises(RuntimeError):
        run_worker(c, enc, batch_size=4)
    r = _cli(monkeypatch, pool)("collection", "status", c.path)
    assert r.exit_code == 0, r.output
    out = _words(r.output)
    assert "[idle, order sequential]" in out and "out of memory" in out and "no worker is running" in out, out
    assert "running]" not in out


# ----------------------------------------------------------------------------- through the HTTP API
READ, ADMIN = "read-key-0123456789", "admin-key-0123456789"


@pytest.fixture
def served(tmp_path):
    """A TestClient over an upgraded 60-item collection whose new model is gated (:func:`_gated`)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from nobackfill.serve import KeyRing, ServeSettings, create_app

    c, old, new, _, _ = _upgraded(tmp_path, n_images=40, captions=2)  # 120 items: 4 batches of the server's 32
    enc = _gated(new)
    enc.only_thread = "backfill"  # the server's worker thread, not the queries of the uncertainty sample
    pool = pool_with((OLD_REF, old), (NEW_REF, enc))
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"read": [READ], "admin": [ADMIN]}))
    return TestClient(create_app(settings, pool=pool)), c, enc


def _api(api, path: str, body: dict | None = None) -> dict:
    r = api.post(path, json=body or {}, headers={"Authorization": f"Bearer {ADMIN}"}) if path != "/v1/status" else \
        api.get(path, headers={"Authorization": f"Bearer {READ}"})
    assert r.status_code == 200, r.text
    return r.json()


def _bf(api) -> dict:
    return _api(api, "/v1/status")["backfill"]


def _finished(api) -> bool:
    b = _bf(api)
    return b["fraction"] == 1.0 and b["worker"] == "idle"


def test_api_pause_then_resume_goes_on_at_once(served):
    api, c, enc = served
    enc.hold_calls(1, 5)
    _api(api, "/v1/backfill/start", {"order": "sequential"})
    for k in (1, 5):  # pause, let the blocked batch go, wait for the worker to stop; resume
        enc.wait_reached(k)
        assert _api(api, "/v1/backfill/pause")["state"] == "paused"
        enc.open(k)
        _poll(lambda: _bf(api)["worker"] == "idle", "the paused worker to stop")
        b = _bf(api)
        assert b["state"] == "paused" and b["workers"] == 0 and b["fraction"] < 1.0
        assert _api(api, "/v1/backfill/resume", {"order": "sequential"})["state"] in ("running", "idle")
    _poll(lambda: _finished(api), "the resumed backfill to finish")
    assert _bf(api)["state"] == "done" and not c.verify()


def test_api_resume_keeps_the_runs_rate_cap_unless_given_another(served):
    """Trial AG: a backfill started at rate 10 ran uncapped after a pause and a resume (resume had
    its own default, no cap); status shows the cap in force."""
    api, c, enc = served
    enc.hold_calls(1, 3)
    assert _api(api, "/v1/backfill/start", {"order": "sequential", "rate": 500.0})["rate_cap"] == 500.0
    for k, given, cap in ((1, {}, 500.0), (3, {"rate": 800.0}, 800.0)):
        enc.wait_reached(k)
        _api(api, "/v1/backfill/pause")
        enc.open(k)
        _poll(lambda: _bf(api)["worker"] == "idle", "the paused worker to stop")
        assert _bf(api)["rate_cap"] is None  # no worker runs
        assert _api(api, "/v1/backfill/resume", {"order": "sequential", **given})["rate_cap"] == cap
    _poll(lambda: _finished(api), "the resumed backfill to finish")
    assert _bf(api)["state"] == "done" and _bf(api)["rate_cap"] is None


def test_api_resume_before_the_paused_worker_stopped(served):
    """A resume while the paused worker is still in its batch: that worker goes on."""
    api, c, enc = served
    enc.hold_calls(1)
    _api(api, "/v1/backfill/start", {"order": "uncertainty"})
    enc.wait_reached(1)
    _api(api, "/v1/backfill/pause")
    _api(api, "/v1/backfill/resume", {"order": "uncertainty"})
    enc.open(1)
    _poll(lambda: _finished(api), "the backfill to finish")
    assert _bf(api)["state"] == "done"


def test_api_resume_after_cancel_starts_a_new_job(served):
    api, c, enc = served
    enc.hold_calls(1)
    _api(api, "/v1/backfill/start", {"order": "sequential"})
    enc.wait_reached(1)
    cancel_backfill(c)
    assert _bf(api)["state"] == "none"
    _api(api, "/v1/backfill/resume", {"order": "random"})  # the worker is still in its batch of the old job
    enc.open(1)
    _poll(lambda: _finished(api), "the new job to finish")
    assert _bf(api)["order"] == "random" and _bf(api)["state"] == "done"


def test_api_status_of_a_worker_that_gave_up(served):
    """A worker that fails, or finds every shard leased by another process, says so in /v1/status."""
    api, c, enc = served
    enc.fail_at = 2
    _api(api, "/v1/backfill/start", {"order": "sequential"})
    _poll(lambda: _bf(api)["worker"] == "idle", "the failing worker to stop")
    b = _bf(api)
    assert b["state"] == "idle" and "out of memory" in b["error"] and "out of memory" in b["note"]
    from nobackfill.lifecycle.backfill import _write

    pid = _child(lambda: time.sleep(60))
    try:
        _write(c, "leases/shard-0.json", {"owner": f"{HOST}:{pid}:other", "expires": time.time() + 3600,
                                          "since": "2024-01-01T00:00:00+00:00", "rate": 0.0})
        _api(api, "/v1/backfill/start", {"order": "sequential"})
        _poll(lambda: _bf(api)["worker"] == "idle", "the second worker to stop")
        b = _bf(api)
        assert b["state"] == "running" and b["workers"] == 1  # the other process works
        assert "no free shard" in b["worker_stopped"] and f"pid {pid} on {HOST}" in b["worker_stopped"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_very_slow_rate_keeps_its_lease_and_a_pause_ends_the_wait(tmp_path):
    from nobackfill.lifecycle.backfill_jobs import _leases

    c, old, new, _, _ = _upgraded(tmp_path, n_images=6)
    start_backfill(c, new, order="sequential")
    out: dict = {}

    def work():
        try:  # 1e-300 items/s: the wait after the first batch is far beyond any clock (it overflowed time.sleep)
            out["rep"] = run_worker(Collection.open(c.path), new, batch_size=4, rate=1e-300, lease_s=0.3)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            out["error"] = e

    t = threading.Thread(target=work)
    t.start()
    time.sleep(1.5)  # five leases long: the worker renewed its lease meanwhile
    leases = {s: v for s, v in _leases(c).items() if isinstance(v, dict) and v.get("owner")}
    assert leases and all(v["expires"] > time.time() for v in leases.values())
    pause_backfill(c)
    t.join(timeout=20)
    assert not t.is_alive() and "error" not in out, out
    assert out["rep"].stopped == "paused" and out["rep"].committed == 4


def test_a_plain_start_does_not_resume_an_operators_pause(served):
    """``POST /v1/backfill/start`` on a paused backfill is refused (409, naming the resume), as the
    CLI refuses a plain run: a pause holds until a resume."""
    api, c, enc = served
    enc.hold_calls(1)
    _api(api, "/v1/backfill/start", {"order": "sequential"})
    enc.wait_reached(1)
    _api(api, "/v1/backfill/pause")
    enc.open(1)
    _poll(lambda: _bf(api)["worker"] == "idle", "the paused worker to stop")
    done = _bf(api)["done"]
    r = api.post("/v1/backfill/start", json={"order": "sequential"}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 409 and "paused" in r.json()["detail"] and "/v1/backfill/resume" in r.json()["detail"]
    time.sleep(0.3)
    assert _bf(api)["state"] == "paused" and _bf(api)["done"] == done
    _api(api, "/v1/backfill/resume", {"order": "sequential"})
    _poll(lambda: _finished(api), "the resumed backfill to finish")


def test_run_settings_that_would_loop_or_do_nothing_are_refused_before_anything_is_touched(tmp_path):
    from typer.testing import CliRunner

    from nobackfill.cli import app
    from nobackfill.lifecycle.backfill import BackfillSettingError, check_run_settings

    for kw, field in (({"batch_size": 0}, "batch_size"), ({"workers": 0}, "workers"), ({"rate": -1.0}, "rate"),
                      ({"rate": 0}, "rate"), ({"rate": float("nan")}, "rate"), ({"limit": -1}, "limit"),
                      ({"batch_size": 2.5}, "batch_size")):
        with pytest.raises(BackfillSettingError) as e:
            check_run_settings(**kw)
        assert e.value.field == field
    c, old, new, pool, _ = _upgraded(tmp_path)
    for args in (["--batch-size", "0"], ["--workers", "0"], ["--rate", "-1"]):
        r = CliRunner().invoke(app, ["collection", "backfill", str(c.path), *args])
        assert r.exit_code == 2 and "must be" in r.output, (args, r.output)
    assert backfill_status(Collection.open(c.path))["state"] == "none"  # no job was made


def test_status_is_not_idle_while_a_worker_holds_the_backfill_lock_between_leases(tmp_path):
    """Trial H: while the worker that saw the sample in fitted the order (holding the backfill lock,
    no shard leased), status said idle, "no worker is running"; a held lock is a live worker."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    with _job_lock_held_by_another_thread(c):
        st = backfill_status(c)
        assert st["state"] == "running" and st["workers"] == 0 and "holds the backfill lock" in st["note"], st
    st = backfill_status(c)
    assert st["state"] == "idle" and "no worker is running" in st["note"]


def test_more_workers_than_the_jobs_shards_are_told_why_they_idle(tmp_path):
    c, old, new, pool, _ = _upgraded(tmp_path)
    run_backfill(c, new, order="sequential", limit=2, pool=pool)  # a job of 1 shard
    said: list[str] = []
    run_backfill(c, new, order="sequential", workers=2, limit=2, pool=pool, log=said.append)
    assert any("has 1 shard(s), set when it started" in m and "--cancel" in m for m in said), said


def test_a_runs_rate_is_shared_by_the_workers_that_can_hold_a_shard(tmp_path, monkeypatch):
    """``rate`` is the run's in all: split over the workers asked for, but a job of fewer shards
    runs fewer workers, and they get the whole of it (trial H: one worker at half the rate)."""
    import nobackfill.lifecycle.backfill as bf

    c, old, new, pool, _ = _upgraded(tmp_path)
    run_backfill(c, new, order="sequential", limit=2, pool=pool)  # a job of 1 shard
    rates: list[float | None] = []
    monkeypatch.setattr(bf, "start_workers", lambda run, path, model, limits, settings, relay=False: rates.append(settings["rate"])
                        or [])
    monkeypatch.setattr(bf, "run_worker", lambda *a, **kw: rates.append(kw["rate"]) or bf.WorkerReport(owner="x"))
    run_backfill(c, new, order="sequential", workers=2, rate=8.0, pool=pool)
    assert rates == [8.0, 8.0]
    bf.cancel_backfill(c)
    rates.clear()
    run_backfill(c, new, order="sequential", workers=2, rate=8.0, pool=pool)  # a new job of 2 shards
    assert rates == [4.0, 4.0]


def test_with_worker_processes_the_commands_own_worker_names_its_lines_as_they_do(tmp_path, monkeypatch):
    """Trial AE: with --workers 2 the fits of the command's own worker printed bare, the worker
    processes' prefixed ``worker pid P:``; each worker's lines are named, this process's too."""
    import types

    import nobackfill.lifecycle.backfill as bf

    c, old, new, pool, _ = _upgraded(tmp_path)
    proc = types.SimpleNamespace(pid=4242, join=lambda: None)
    monkeypatch.setattr(bf, "start_workers", lambda *a, **kw: [(proc, tmp_path / "w.json")])
    monkeypatch.setattr(bf, "follow_workers", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setattr(bf, "stopped_with", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setattr(bf, "join_workers", lambda procs: [])
    monkeypatch.setattr(bf, "run_report", lambda *a: {})
    monkeypatch.setattr(bf, "run_worker", lambda *a, **kw: kw["log"]("fitting bridges on 8 backfilled pairs\n  t2i: x")
                        or bf.WorkerReport(owner="x"))
    said: list[str] = []
    bf.run_backfill(c, new, order="sequential", workers=2, pool=pool, log=said.append)
    me = f"worker pid {os.getpid()}: "
    assert said[-1] == f"{me}fitting bridges on 8 backfilled pairs\n{me}  t2i: x", said
    said.clear()
    bf.cancel_backfill(c)
    monkeypatch.setattr(bf, "start_workers", lambda *a, **kw: [])
    bf.run_backfill(c, new, order="sequential", workers=1, pool=pool, log=said.append)  # alone: bare, as before
    assert said[-1] == "fitting bridges on 8 backfilled pairs\n  t2i: x", said


@pytest.mark.parametrize("order", ["sequential", "uncertainty"])
def test_an_unreadable_source_is_named_and_the_backfill_goes_on(tmp_path, order):
    """An image file gone (or corrupt) after it was added: the backfill embeds everything else, names
    the item in status (it stays served by the old space), retire still refuses, and the next run
    embeds it once its file is back. Before, every run stopped at that batch, for good."""
    c, old, new, pool, data = _upgraded(tmp_path)
    images = sorted(i for i, it in c.items().items() if it.modality == "image")
    gone, broken = c.items()[images[1]], c.items()[images[4]]
    kept = {p: Path(p).read_bytes() for p in (gone.source["path"], broken.source["path"])}
    Path(gone.source["path"]).unlink()
    Path(broken.source["path"]).write_bytes(b"not an image")
    out = run_backfill(c, new, order=order, batch_size=4)
    st = backfill_status(c)
    assert st["state"] == "done" and st["done"] == 16 and st["total"] == 18 and st["unreadable"] == 2, st
    assert set(st["unreadable_items"]) == {gone.id, broken.id} and "could not be read" in st["note"]
    assert "ImageReadError" in st["unreadable_items"][gone.id] or "No such file" in st["unreadable_items"][gone.id]
    assert out["done"] == 16
    served = c.serving(list(c.items()))
    assert served[gone.id][1] == old.space_id and served[broken.id][1] == old.space_id  # still searchable
    with pytest.raises(BackfillError, match="cannot retire"):
        retire_space(c, old.space_id)
    if order == "uncertainty":  # one deleted: no longer named (trial AL: status named items deleted since)
        c.delete([gone.id])
        st = backfill_status(Collection.open(c.path))
        assert st["unreadable"] == 1 and set(st["unreadable_items"]) == {broken.id} and gone.id not in st["note"], st
    for p, b in kept.items():
        Path(p).write_bytes(b)
    if order == "sequential":  # a cancelled job takes its list of unreadable items with it
        from nobackfill.lifecycle.backfill import cancel_backfill

        cancel_backfill(c)
        assert backfill_status(c)["unreadable"] == 0 and c.catalog.read_doc("backfill/unreadable.json") is None
    run_backfill(c, new, order=order, batch_size=4)
    st = backfill_status(c)
    assert st["state"] == "done" and st["done"] == st["total"] == 18 - (order == "uncertainty") and st["unreadable"] == 0, st
    retire_space(c, old.space_id)


def test_the_rate_cap_banks_no_idle_time():
    """A run that embedded nothing for a while (a bridge fit) goes on at its rate, not in a burst
    that catches up (trial I: 148 items/s under --rate 50 after each fit); no stretch of batches
    goes faster than the rate, save the first batch after the pause."""
    from nobackfill.lifecycle.backfill_jobs import Pacer

    clock = {"t": 0.0}
    pacer = Pacer(10.0, clock=lambda: clock["t"])
    waits = []
    for spent in (0.1, 0.1, 20.0, 0.1, 0.1, 0.1):  # 10 items a batch; the third batch took 20 s (a fit)
        clock["t"] += spent
        waits.append(round(pacer.wait_after(10), 6))
        clock["t"] += waits[-1]
    assert waits == [0.9, 0.9, 0.0, 0.9, 0.9, 0.9], waits  # a cumulative schedule: 0, 0, 0, 0, 0, 0.8


def test_a_paused_backfill_promises_no_rate(tmp_path):
    """Trial I: a paused job showed ``ETA 100s at 12.5 items/s``."""
    import threading

    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    t = threading.Thread(target=run_worker, args=(Collection.open(c.path), new), kwargs={"batch_size": 2, "rate": 4.0})
    t.start()
    while backfill_status(c)["done"] < 4:
        time.sleep(0.05)
    pause_backfill(c)
    st = backfill_status(c)
    t.join()
    assert st["state"] == "paused" and st["rate"] == 0.0 and st["eta_s"] is None, st


def test_a_capped_rate_is_reported_as_the_cap_not_the_embedding_speed(tmp_path):
    """Under ``rate``, status reports at most the cap (and an ETA from it) from the first batch on;
    the tester saw 396 items/s and an ETA of 0.9 s for a run capped at 3 items/s."""
    import threading

    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    seen: list[tuple[float, float | None, int, int, float]] = []
    t = threading.Thread(target=run_worker, args=(Collection.open(c.path), new), kwargs={"batch_size": 4, "rate": 6.0})
    t.start()
    while t.is_alive():
        st = backfill_status(c)
        if st["workers"] and st["done"] and st["state"] == "running":  # (done: no rate, no ETA)
            seen.append((st["rate"], st["eta_s"], st["done"], st["total"], st["holders"][0]["rate"]))
        time.sleep(0.05)
    t.join()
    assert seen and backfill_status(c)["done"] == 18
    for rate, eta, done, total, worker_rate in seen:
        assert 0 < rate <= 6.0 + 1e-9 and (eta is None or eta >= (total - done) / 6.0 - 1e-9), seen
        # each worker's own items/s too (trial H: the lines of a running backfill read 0.0 items/s)
        assert worker_rate == rate, seen


def test_a_runs_summary_gives_the_rate_of_what_it_committed(capsys):
    """Trial I: ``128 committed in 6.5s, 29.8 items/s (paused)``: the rate counted batches a pause
    left embedded but not committed. The summary's numbers now agree with each other."""
    from nobackfill.cli._collection_print import print_backfill_run

    print_backfill_run("photos", {"done": 128, "total": 300, "fraction": 128 / 300, "committed": 128, "embedded": 192,
                                  "seconds": 6.4, "stopped": "paused"}, None)
    out = " ".join(capsys.readouterr().out.split())
    assert "128 committed in 6.4s, 20.0 items/s (paused)" in out, out


def test_a_route_to_a_retired_space_is_refused(tmp_path):
    """Trial K: pinning a route on a retired space answered 200 and pinned nothing."""
    from nobackfill.lifecycle.plan_changes import RouteRefused, pin_route

    c, old, new, pool, _ = _upgraded(tmp_path)
    run_backfill(c, new, order="sequential", batch_size=8)
    retire_space(c, old.space_id)
    gen = Collection.open(c.path).generation
    with pytest.raises(RouteRefused, match="is retired"):
        pin_route(Collection.open(c.path), old.space_id, "t2i", "bridge")
    assert Collection.open(c.path).generation == gen


def test_status_says_starting_while_a_worker_draws_the_order(tmp_path):
    """trial W: for the minute a new backfill measured its uncertainty sample, status said "none"."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    assert backfill_status(c)["state"] == "none"
    with _job_lock_held_by_another_thread(c):
        st = backfill_status(Collection.open(c.path))
        assert st["state"] == "starting" and "a backfill is starting" in st["note"]
    assert backfill_status(c)["state"] == "none"


@contextlib.contextmanager
def _job_lock_held_by_another_thread(c):
    """The backfill lock of ``c`` held by another thread (as a worker drawing the order holds it) while
    the block runs."""
    from nobackfill.lifecycle.backfill_jobs import JOB_DIR

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with Collection.open(c.path).catalog.lock(JOB_DIR):
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        t.join()


def test_a_pause_after_the_last_commit_leaves_the_job_done(tmp_path):
    """Trial AE: a pause that came as the last batch committed left "18/18 [paused]", and a plain
    run was refused until --resume: nothing was left to resume."""
    c, old, new, pool, _ = _upgraded(tmp_path)
    start_backfill(c, new, order="sequential")
    seen = []

    def pause_at_the_end(n):
        seen.append(n)
        if sum(seen) == 18:
            pause_backfill(c)

    out = run_backfill(c, new, order="sequential", batch_size=4, progress=pause_at_the_end)
    assert sum(seen) == 18 and out["state"] == "done" and backfill_status(c)["state"] == "done"
    again = run_backfill(c, new, order="sequential", batch_size=4)  # not refused: nothing to do
    assert again["committed"] == 0 and again["state"] == "done"
