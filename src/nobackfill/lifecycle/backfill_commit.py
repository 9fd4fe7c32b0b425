"""What every backfill engine shares (:mod:`.backfill`'s lease workers, ``local``, and
:mod:`.cluster.ray_backfill`'s Ray Data pipeline, ``ray``): claiming a shard (:func:`claim_shard`), reading
the next pending items of it (:func:`gather`) and the one commit (:func:`commit_batch`).

The commit is what makes an item committed exactly once whatever runs it, however often: under the
backfill lock it checks that the job is still the one the batch was read for (its ``epoch``),
running, and that the caller's owner still holds the shard's lease (renewed by the same
compare-and-set); then the vectors go in first, keyed by the item's version (``Item.key``) in the
target space's store (a row already there is skipped), then one catalog transaction per modality
serves those versions from the target space (:meth:`Collection.put_vectors`). Versions no longer
live (an item deleted or replaced while its batch embedded) are left out at the commit: no vector
is stored for them, and no pair counted (:func:`live_part`). A retried or late
write (a Ray task run twice, a worker whose lease was taken over) therefore adds nothing: the
vectors are there and the catalog already serves them, or the check refuses it.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..collection.collection import Collection, Item
from .backfill_jobs import (JOB_DIR, LEASE_DIR, ORDER_FILE, SAMPLE_FILE, WORKERS_FILE, BackfillError, BackfillJob, _iso,
                            _job_lock, _leases, _now, _order_ids, _parse_owner, _read, _release, _renew, _stopped_workers,
                            _take_shard, _write, describe_holders, new_owner, unreadable_items)  # noqa: F401
from .backfill_fit import maybe_fit
from .backfill_order import _held, _pending, _uncertainty_order, one_read_time

__all__ = ["FAILPOINT_ENV", "WorkerReport", "claim_shard", "commit_batch", "finish_shard", "Session", "gather",
           "hand_back", "keys_of", "new_owner", "next_shard", "shard_ids"]

#: ``<path>:<n>``: the commit of a batch that stored something exits its process (``os._exit``)
#: right after the catalog transaction, at most ``n`` times over all processes (``<path>.<i>``
#: files are the tokens); the fault tests' fail-point
FAILPOINT_ENV = "NOBACKFILL_FAIL_AFTER_COMMIT"


@dataclass
class WorkerReport:
    """What one worker did: items ``embedded``, ``committed`` (of them ``sample``: the uncertainty
    order's training sample), why it ``stopped`` (done | limit | paused | no free shard | job
    removed | the collection was upgraded | error: ...) and, for no free shard, who holds them
    (``busy``). ``engine``: local | ray."""

    committed: int = 0
    batches: int = 0
    unreadable: int = 0  # items whose sources could not be read (left in the old space, named in status)
    shards: list[int] = field(default_factory=list)
    stopped: str = ""
    embedded: int = 0
    sample: int = 0
    busy: list[dict[str, Any]] = field(default_factory=list)
    owner: str = ""
    engine: str = "local"

    def reason(self) -> str:
        """``stopped`` in words (who holds the shards, for no free shard)."""
        if self.stopped == "no free shard" and self.busy:
            return (f"no free shard: another worker is doing the work ({describe_holders(self.busy)}); "
                    "nothing was left for this one")
        return self.stopped

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "reason": self.reason()}


def _record_stop(collection: Collection, rep: WorkerReport) -> None:
    """Remember how a worker stopped (``workers.json``, the last 16), for status."""
    host, pid = _parse_owner(rep.owner)
    with _job_lock(collection):
        if BackfillJob.load(collection) is None:
            return
        obj = _stopped_workers(collection)
        obj[rep.owner] = {"owner": rep.owner, "host": host, "pid": pid, "stopped": rep.reason(), "at": _iso(),
                          "t": _now(), "committed": rep.committed, "sample": rep.sample, "engine": rep.engine}
        keep = sorted(obj.values(), key=lambda v: v.get("t", 0.0))[-16:]
        _write(collection, WORKERS_FILE, {v["owner"]: v for v in keep})


class Session:
    """A worker's run (``with Session(collection, rep) as s``, ``s.shard`` the shard it holds): on
    leaving, whatever stopped it (an exception is recorded as ``error: ...`` and goes on), the shard
    is handed back and how it stopped recorded (:func:`hand_back`)."""

    def __init__(self, collection: Collection, rep: WorkerReport) -> None:
        self.collection, self.rep, self.shard = collection, rep, None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> bool:
        if isinstance(e, KeyboardInterrupt):
            from .._interrupts import terminated
            from .cluster.processes import INTERRUPTED, TERMINATED

            self.rep.stopped = TERMINATED if terminated(e) else INTERRUPTED
        elif e is not None:
            self.rep.stopped = f"error: {type(e).__name__}: {e}"
        hand_back(self.collection, self.rep, self.shard)
        return False


def hand_back(collection: Collection, rep: WorkerReport, shard: int | None) -> None:
    """Whatever stopped a worker: the shard it held handed back (free at once), how it stopped
    recorded (``backfill_status``); never raises."""
    with contextlib.suppress(Exception):
        if shard is not None:
            with _job_lock(collection):
                _release(collection, shard, rep.owner)
        _record_stop(collection, rep)


# ----------------------------------------------------------------------------- the job's phases
def _all_shards_done(collection: Collection, job: BackfillJob) -> bool:
    leases = _leases(collection)
    return len(leases) == job.shards and all(v.get("done") for v in leases.values())


def _sample_complete(collection: Collection, job: BackfillJob) -> bool:
    """Every live item of the training sample is committed (or every shard is done)."""
    if _all_shards_done(collection, job):
        return True
    obj = _read(collection, SAMPLE_FILE) or {}
    collection.refresh()  # which space serves each item: the catalog's (the store is not read)
    bad = set(unreadable_items(collection, job)["ids"])  # never committed this run: not waited for
    live = collection.serving([i for i in obj.get("ids", []) if i not in bad])
    return all(space == job.target for _, space in live.values())


def _finalize_order(collection: Collection, job: BackfillJob) -> BackfillJob:
    """The sample is in: fit the head, write sample + the rest as the order, free every shard
    (caller holds the backfill lock)."""
    obj = _read(collection, SAMPLE_FILE) or {}
    sample_ids = list(obj.get("ids", []))
    labels = {str(k): float(v) for k, v in (obj.get("labels") or {}).items()}
    items = collection.items()
    sample = [items[i] for i in sample_ids if i in items]
    pending = _pending(collection, job.target, items)
    rest, head = _uncertainty_order(collection, job.target, pending, sample, labels, job.seed)
    ids = sample_ids + rest
    _write(collection, ORDER_FILE, ids)
    for name in collection.catalog.list_docs(f"{JOB_DIR}/{LEASE_DIR}/"):
        collection.catalog.delete_doc(name)
    job.phase, job.head, job.sample, job.total = "order", head, len(sample_ids), len(ids)
    job.save(collection)
    return job


def _finish_if_done(collection: Collection) -> None:
    job = BackfillJob.load(collection)
    # (paused too: a pause that came after the last commit leaves nothing to resume; trial AE read
    # "181/181 [paused]", and a plain run was refused until --resume)
    if job is None or job.state not in ("running", "paused") or job.phase != "order":
        return
    if _all_shards_done(collection, job):
        bad = set(unreadable_items(collection, job)["ids"])  # tried again by the next run (a new job)
        if not [it for it in _pending(collection, job.target) if it.id not in bad]:
            job.state = "done"
            job.save(collection)


# ----------------------------------------------------------------------------- the engines' steps
def claim_shard(collection: Collection, owner: str, lease_s: float, rep: WorkerReport,
                poll_s: float = 0.2) -> tuple[BackfillJob, int] | None:
    """The job and a shard leased to ``owner``, or None with ``rep.stopped`` saying why not (the
    job done, paused, removed or upgraded past; every unfinished shard held by others: ``rep.busy``).
    Finishes the uncertainty order once its sample is in. No job at all before any work: an error."""
    while True:
        with _job_lock(collection):
            job = BackfillJob.load(collection)
            if job is None:
                if rep.batches or rep.shards:
                    rep.stopped = "job removed"
                    return None
                raise BackfillError(f"no backfill in {collection.path}: start one first")
            if job.target != collection.current_space:
                rep.stopped = "the collection was upgraded"
                return None
            if job.state != "running":
                rep.stopped = job.state
                return None
            if job.phase == "sample" and _sample_complete(collection, job):
                job = _finalize_order(collection, job)
            shard, busy = _take_shard(collection, job, owner, lease_s)
        if shard is not None:
            if shard not in rep.shards:
                rep.shards.append(shard)
            return job, shard
        if not busy:
            rep.stopped = "done"
            return None
        if job.phase == "sample" and job.shards > 1:  # every shard is free again once the sample is in
            time.sleep(poll_s)
            continue
        rep.stopped, rep.busy = "no free shard", busy
        return None


def next_shard(collection: Collection, owner: str, lease_s: float, rep: WorkerReport, limit: int | None,
               poll_s: float = 0.2, log: Callable[[str], None] | None = None) -> tuple[BackfillJob, int] | None:
    """:func:`claim_shard`, unless ``limit`` items were embedded already (then ``rep.stopped`` says so).
    A job found done runs the bridges' last fit if one is owed (``log`` hears of it): a fit cut short by
    a SIGTERM runs at the next start, which keeps the done job as it ran (trial AM)."""
    if limit is not None and rep.embedded >= limit:
        rep.stopped = "limit"
        return None
    claimed = claim_shard(collection, owner, lease_s, rep, poll_s)
    if claimed is None and rep.stopped == "done":
        maybe_fit(collection, final=None, log=log)
    return claimed


def shard_ids(collection: Collection, job: BackfillJob, shard: int) -> tuple[list[str], set[str]]:
    """The ids of ``shard`` in the job's order, and the uncertainty order's sample ids."""
    all_ids = _order_ids(collection)
    return all_ids[shard::job.shards], set(all_ids[:job.sample]) if job.order == "uncertainty" else set()


def gather(collection: Collection, job: BackfillJob, ids: Sequence[str], pos: int, cap: int) -> tuple[list[Item], int]:
    """Up to ``cap`` items of ``ids`` from ``pos`` on that the target space does not serve yet (one
    catalog read per window), and the position after them. Items whose vectors a killed worker
    stored before its catalog transaction are served now and left out (not embedded again)."""
    collection.refresh()
    batch: list[Item] = []
    while pos < len(ids) and len(batch) < cap:
        window = ids[pos:pos + cap - len(batch)]
        live = collection.serving(window)
        pos += len(window)
        batch += [live[i][0] for i in window if i in live and live[i][1] != job.target]
    if not batch:
        return batch, pos
    g = collection.store_for_lookup(job.target)
    have = _held(g, batch)
    for m in ("image", "text"):
        collection.serve_stored(job.target, m, [it.key for it in batch if it.modality == m and it.key in have[m]])
    return [it for it in batch if it.key not in have[it.modality]], pos


def _failpoint() -> None:
    """The fault tests' crash right after the catalog transaction (:data:`FAILPOINT_ENV`)."""
    spec = os.environ.get(FAILPOINT_ENV)
    if not spec:
        return
    path, _, n = spec.rpartition(":")
    for i in range(int(n or 0)):
        with contextlib.suppress(FileExistsError):
            os.close(os.open(f"{path}.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            os._exit(77)


def commit_batch(collection: Collection, job: BackfillJob, shard: int, owner: str, lease_s: float, rate: float,
                 keys: dict[str, list[str]], vecs: dict[str, np.ndarray],
                 sample_keys: Sequence[tuple[str, str]] = ()) -> tuple[str, int, int]:
    """Commit the vectors ``vecs[m]`` of the item versions ``keys[m]`` into ``job.target`` (see the
    module doc): ``(status, committed, sample committed)``; status ``ok``, ``lost`` (the lease is
    another owner's now: nothing written), or why the job stopped (its state, ``job removed``).
    ``sample_keys``: ``(modality, key)`` of the batch's items in the uncertainty sample."""
    with _job_lock(collection):
        now = BackfillJob.load(collection)
        if now is None or now.epoch != job.epoch or now.state != "running" or now.target != job.target:
            return (now.state if now is not None and now.epoch == job.epoch else "job removed"), 0, 0
        if not _renew(collection, shard, owner, lease_s, rate):
            return "lost", 0, 0
        keys, vecs = live_part(collection, keys, vecs)
        kept = {(m, k) for m, ks in keys.items() for k in ks}
        fresh, n = [mk for mk in sample_keys if tuple(mk) in kept], 0
        g = collection.gallery(job.target)
        # every worker's store of the target is made under this lock, so one read time serves the lookups
        # below (in run_worker, the one taken at the claim: its lease, renewed above, was its own since)
        with one_read_time(g):
            if fresh:  # which of them this batch commits (not another worker)
                g = collection.store_for_lookup(job.target)  # (a directory's store refreshed first)
                have = {m: set(g.positions(m, [k for mm, k in fresh if mm == m])) for m in ("image", "text")}
                fresh = [(m, k) for m, k in fresh if k not in have[m]]
            for m, v in vecs.items():
                n += collection.put_vectors(job.target, m, keys[m], v)
        if n:
            _failpoint()
    return "ok", n, len(fresh)


def live_part(collection: Collection, keys: dict[str, list[str]],
              vecs: dict[str, np.ndarray]) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    """The rows of ``keys`` / ``vecs`` whose item versions are still live in the catalog (one read):
    a batch embeds for seconds, and an item deleted or given new content meanwhile must not leave a
    vector behind (it would never be served, yet count as a backfilled pair until retire). A delete
    landing between this read and the store still can (the catalog and the vector store are two
    writes): one vector, never served, gone at retire."""
    live = {r.key for r in collection.catalog.rows_by_key([k for m in vecs for k in keys[m]])}
    out_keys: dict[str, list[str]] = {}
    out_vecs: dict[str, np.ndarray] = {}
    for m, v in vecs.items():
        rows = [i for i, k in enumerate(keys[m]) if k in live]
        if rows:
            out_keys[m], out_vecs[m] = [keys[m][i] for i in rows], np.asarray(v)[rows]
    return out_keys, out_vecs


def keys_of(batch: Sequence[Item]) -> dict[str, list[str]]:
    """Per modality, the version keys of ``batch`` (in :func:`~.backfill_order._encode`'s order)."""
    return {m: [it.key for it in batch if it.modality == m] for m in ("image", "text")}


def finish_shard(collection: Collection, shard: int, owner: str, lease_s: float,
                 log: Callable[[str], None] | None = None) -> None:
    """``owner`` went through ``shard``: it is done (the job too, if it was the last), and the
    fitted bridges get their last refit once the job is done (``log`` hears of it)."""
    with _job_lock(collection):
        _renew(collection, shard, owner, lease_s, 0.0, done=True)
        _finish_if_done(collection)
    maybe_fit(collection, final=None, log=log)
