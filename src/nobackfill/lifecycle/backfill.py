"""Progressive backfill: re-embedding a collection's items into its current model's space while it
keeps serving queries, in an order chosen to gain the most first.

Online Backfilling (Seo et al., arXiv 2301.03767): during the backfill the backfilled part is
searched with the new query and the rest with an old-space query, and the two lists are merged, so
accuracy rises from the upgraded system's to the new model's without a window of worse results.
Here that is the collection's ordinary search: an item committed to the current space is served by
it (native route) and never by its old space again; its old vector stays until ``retire``.

FastFill (Jaeckle et al., ICLR 2023, arXiv 2303.04766): backfill in order of predicted uncertainty
instead of at random. Order ``uncertainty`` takes a random sample (5 %, at least 64 items), measures
how badly each sampled item is served *now*, through the collection's own routes, using the pairs
the collection holds (a caption's ``image_id``): an image's captions should find it first, an image
should find one of its captions first. The workers then backfill the sample first, like any other
items (the job's ``sample`` phase: it counts against a worker's ``limit`` and may take several
runs); once it is all committed, the worker that notices fits the head and writes the order of the
rest (phase ``order``). A small head ``h(v_old)`` (ridge regression on the old embedding, one per
old space and modality) learns that failure, and the remaining items go worst-predicted first. Where
the sample has no such pairs (uncaptioned images, text-only collections) the head learns FastFill's
own target instead, the transformation error ``1 - cos(psi(v_old), v_new)`` of a linear map ``psi``
from the old space to the new one, cross-fitted on the sample. Two structural rules complete the
order: modalities are interleaved in proportion (text->image search gains only from backfilled
images, image->text only from captions), and captions go one per image first (an image query is
answered once any of its captions is found).

The job lives in ``<collection>/backfill/``: ``job.json`` (target space, order, shards, state, phase),
``order.json`` (item ids in backfill order), ``sample.json`` (the uncertainty sample and its
measured failures), ``workers.json`` (how the last workers stopped), written atomically, and
``leases/shard-<i>.json``.
Item ``order[j]`` belongs to shard ``j % shards``; a worker holds a shard's lease (renewed every
batch, ``lease_s`` long) and a dead worker's shard is taken over when its lease expires, or at once
when the holder was a process of this host that no longer exists (a killed server). A batch is
committed atomically (one gallery chunk of the target space, rows already there skipped) after the
worker re-checks, under the backfill lock, that it still holds its lease: an item is committed at
most once, and a SIGKILL at any point loses only uncommitted work. A worker that stops for any
other reason (paused, limit, error, the job removed) hands its shard back at once, so a worker
started next (a resume, in this process or another) goes on without waiting out the lease; a worker
that finds every unfinished shard leased reports who holds them.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Callable

import numpy as np

from ..collection.collection import Collection
from ..catalog.plan import Plan
from .backfill_commit import (Session, WorkerReport, _all_shards_done, _finalize_order, _finish_if_done,  # noqa: F401
                              _record_stop, _sample_complete, claim_shard, commit_batch, finish_shard, gather,
                              hand_back, keys_of, new_owner, next_shard, shard_ids)
# the job store's and the orders' names stay importable from here (tests and other modules do)
from .backfill_jobs import (DEFAULT_LEASE_S, JOB_DIR, JOB_FILE, LEASE_DIR, ORDER_FILE, SAMPLE_FILE,  # noqa: F401
                            UNREADABLE_FILE, WORKERS_FILE, BackfillBusy, BackfillError, BackfillJob, _holder,
                            Pacer, lease_gone, _iso, _job_lock, _last_worker, _leases, _now, _order_ids, _parse_owner,
                            _read, _release, _renew, _stopped_workers, _take_shard, _write, backfill_running,
                            describe_holders, record_unreadable, unreadable_items, unreadable_note)
from .backfill_fit import first_maps_gap, maybe_fit, running_fit, sample_first  # noqa: F401
from .cluster.processes import follow_workers, join_workers, named_log, run_report, start_workers, stopped_with
from ..collection.ingest import encode_readable
from .backfill_order import (ORDERS, _encode, _held, _pending, _route_failure, _uncertainty_order,  # noqa: F401
                             one_read_time)

__all__ = ["ENGINES", "ORDERS", "BackfillBusy", "BackfillError", "BackfillJob", "BackfillSettingError", "WorkerReport",
           "backfill_running", "backfill_status", "cancel_backfill", "check_run_settings", "describe_holders",
           "pause_backfill", "retire_space", "run_backfill", "run_worker", "start_backfill"]


#: how the items are embedded: lease workers in processes of this machine, or a Ray Data pipeline
ENGINES = ("local", "ray")


# ----------------------------------------------------------------------------- job life cycle
def start_backfill(collection: Collection, encoder: Any, *, order: str = "uncertainty", shards: int = 1,
                   seed: int = 0, sample_fraction: float = 0.05, min_sample: int = 64, pool: Any = None,
                   log: Callable[[str], None] | None = None) -> BackfillJob:
    """Start (or return the unfinished, resumed) backfill of ``collection`` into its current space.
    Embeds nothing: with ``order="uncertainty"`` the sample is drawn and how it is served now is
    measured; the workers embed it first (see the module doc)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if int(shards) < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    say = log or (lambda _m: None)
    target = collection.current_space
    if encoder.space_id != target:
        raise BackfillError(f"the backfill embeds with the current model of {collection.path} (space {target}); "
                            f"the given model is in space {encoder.space_id}")
    with _job_lock(collection, log):
        job = BackfillJob.load(collection)
        if job is not None and job.target == target and job.state != "done":
            if job.state == "paused":
                job.state = "running"
                job.save(collection)
            return job
        pending = _pending(collection, target)
        if job is not None and job.target == target and not pending:  # done, and still: kept as it ran (trial AM)
            return job
        ids: list[str]
        n_sample, phase = 0, "order"
        if order == "sequential":
            ids = [it.id for it in pending]
        elif order == "random":
            ids = [pending[i].id for i in np.random.default_rng(seed).permutation(len(pending))]
        else:
            rng = np.random.default_rng(seed)
            n_sample = min(len(pending), max(int(min_sample), int(round(sample_fraction * len(pending)))))
            sample = [pending[i] for i in sorted(rng.choice(len(pending), n_sample, replace=False))] if n_sample else []
            # bridges fitted from the backfill: their scene sample (random images, then their captions) leads
            # the measured sample, so that the first fit has it (the ranked rest spreads captions apart)
            fit_ids, n_fit = sample_first(collection, pending, [it.id for it in pending], seed)
            if n_fit:
                by_id, head_ids = {it.id: it for it in pending}, set(fit_ids[:n_fit])
                sample = [by_id[i] for i in fit_ids[:n_fit]] + [it for it in sample if it.id not in head_ids]
                n_sample = len(sample)
            of_fit = f" (the bridge fit's sample of {n_fit} and {n_sample - n_fit} more)" if n_fit else ""
            if n_sample:
                say(f"uncertainty order: measuring how {n_sample} sampled items are served now{of_fit}; they are "
                    "backfilled first (they count against --limit), then the order of the rest is fitted")
            if pool is None:
                from ..search.models import ModelPool

                pool = ModelPool()
                pool.put(collection.space(target).model, encoder)
            labels = _route_failure(collection, pool, sample, collection.items())
            ids = [it.id for it in sample]
            _write(collection, SAMPLE_FILE, {"ids": ids, "labels": labels})
            phase = "sample" if n_sample else "order"
        if order != "uncertainty":  # (the uncertainty sample holds the fit sample already)
            ids, _ = sample_first(collection, pending, ids, seed)
        _write(collection, ORDER_FILE, ids)
        for name in [*collection.catalog.list_docs(f"{JOB_DIR}/{LEASE_DIR}/"), f"{JOB_DIR}/{WORKERS_FILE}"]:
            collection.catalog.delete_doc(name)
        job = BackfillJob(target=target, order=order, shards=int(shards), seed=seed, created=_iso(),
                          sample=n_sample, total=len(pending), phase=phase, epoch=uuid.uuid4().hex)
        job.save(collection)
        return job


def pause_backfill(collection: Collection, paused: bool = True) -> BackfillJob:
    """Pause (workers stop after their batch and hand their shards back) or resume a backfill."""
    with _job_lock(collection):
        job = BackfillJob.load(collection)
        if job is None:
            raise BackfillError(f"no backfill in {collection.path}")
        if job.state != "done":
            job.state = "paused" if paused else "running"
            job.save(collection)
        return job


def cancel_backfill(collection: Collection) -> None:
    """Forget the backfill job (its order and leases); committed vectors stay and are served."""
    with _job_lock(collection):
        for name in [f"{JOB_DIR}/{JOB_FILE}", f"{JOB_DIR}/{ORDER_FILE}", f"{JOB_DIR}/{SAMPLE_FILE}",
                     f"{JOB_DIR}/{WORKERS_FILE}", f"{JOB_DIR}/{UNREADABLE_FILE}",
                     *collection.catalog.list_docs(f"{JOB_DIR}/{LEASE_DIR}/")]:
            collection.catalog.delete_doc(name)


def backfill_status(collection: Collection) -> dict[str, Any]:
    """``{"done", "total", "fraction", "order", "state", "rate", "eta_s", "workers", "holders", "engine",
    "actors", ...}``
    of the current space (done: live items it serves). ``state``: none | starting (no job yet, and a
    worker holds the backfill lock: it is drawing the order) | running (a live worker
    holds a shard) | idle (unfinished, but no worker runs: ``note`` and ``last_worker`` say why) |
    paused | done."""
    target = (st := collection.served_counts())["plan"].current  # Milvus: from the catalog alone
    mods = [m for m in ("image", "text") if collection.space(target).embeds(m)]
    skipped: dict[str, int] = {}  # no source, and not served by the target already (those count as done)
    for (space, m), n in collection.unsourced_counts().items():
        if space != target:
            skipped[m] = skipped.get(m, 0) + n
    per = {m: {"done": st["served"].get(target, {}).get(m, 0), "total": st["items"][m] - skipped.get(m, 0)}
           for m in mods}
    total = sum(v["total"] for v in per.values())
    done = sum(v["done"] for v in per.values())
    job = BackfillJob.load(collection)
    mine = job is not None and job.target == target
    out: dict[str, Any] = {"done": done, "total": total, "fraction": done / total if total else 1.0, "per_modality": per,
                           "order": job.order if mine else None,
                           "no_source": sum(skipped.values()),
                           "state": job.state if mine else "none", "target": target,
                           "shards": job.shards if mine else None}
    leases = _leases(collection) if job else {}
    now = _now()
    live = {s: v for s, v in leases.items() if v.get("expires", 0) > now and not v.get("done")
            and not lease_gone(collection, v)}
    out["workers"] = len(live)
    out["holders"] = [_holder(s, v) for s, v in sorted(live.items())]
    engines = sorted({str(v.get("engine", "local")) for v in live.values()})
    out["engine"] = "+".join(engines) if engines else None  # local | ray (| local+ray) while workers run
    out["actors"] = sum(int(v.get("actors", 1)) for v in live.values())  # embedding processes / Ray actors
    rates = [v.get("rate", 0.0) for v in live.values()]
    out["rate"] = float(sum(rates))
    out["eta_s"] = (total - done) / out["rate"] if out["rate"] > 0 else None
    if mine:
        out["phase"] = job.phase
        out["sample"] = job.sample
    bad = unreadable_items(collection, job if mine else None)
    out["unreadable"] = int(bad["count"])
    out["unreadable_items"] = dict(list(bad["named"].items())[:5])
    if not mine and _lock_held_elsewhere(collection):  # (trial W: "none" for a minute while it measured)
        out["state"], out["note"] = "starting", "a backfill is starting: a worker holds the backfill lock (the " \
            "uncertainty order measures how its sample is served now)"
    elif mine and job.state == "running" and done >= total and total:
        out["state"] = "done"
    elif mine and job.state == "running" and not live and _lock_held_elsewhere(collection):
        out["note"] = ("no shard is leased this moment: a worker holds the backfill lock (fitting the order "
                       "after the sample, or taking a shard)")
    elif mine and job.state == "running" and not live:
        out["state"] = "idle"
        last = _last_worker(collection, [v for v in leases.values() if not v.get("done") and v.get("owner")])
        out["last_worker"] = last
        why = (f"; the last one (pid {last['pid']} on {last['host']}) stopped at {last['at']}: {last['stopped']}"
               if last else "")
        out["note"] = (f"no worker is running{why}. Run `nobackfill collection backfill` or POST /v1/backfill/start "
                       "to go on")
    if out["state"] != "running":  # paused, idle or done: nothing commits, no rate to promise
        out["rate"], out["eta_s"] = 0.0, None
    fit = running_fit(collection) if mine else None
    if fit is not None:  # its worker commits nothing meanwhile (nor, in the uncertainty sample, do the others)
        host, pid = _parse_owner(str(fit.get("owner", "")))
        out["eta_s"] = None
        what = ("the last one, on every pair: the serving bridges stay until it swaps a better one in"
                if out["state"] == "done" else "the worker fitting it commits nothing until it ends"
                + ("; the other workers wait for it too, as the uncertainty order's sample must be in before the "
                   "rest is ordered" if job.phase == "sample" and job.shards > 1 else ""))
        out["note"] = ((out["note"] + ". ") if out.get("note") else "") + (
            f"a bridge fit on {fit['pairs']} pairs is running since {fit['since']} (pid {pid} on {host}; seconds "
            f"to a minute): {what}")
    if bad["count"]:
        first = ", ".join(f"{i} ({why})" for i, why in list(bad["named"].items())[:3])
        out["note"] = ((out["note"] + ". ") if out.get("note") else "") + (
            f"{bad['count']} item(s) could not be read and were left in the old space (first: {first}): restore "
            "or delete them, then run the backfill again to embed them")
    return out


def _lock_held_elsewhere(collection: Collection) -> bool:
    """Another process (or thread) holds the backfill lock now: a live worker (a lock goes with its
    process), between two leases (trial H: status said idle while the uncertainty order was fitted)."""
    return collection.catalog.held_elsewhere(JOB_DIR)


def run_worker(collection: Collection, encoder: Any, *, batch_size: int = 64, rate: float | None = None,
               limit: int | None = None, lease_s: float = DEFAULT_LEASE_S, progress: Callable[[int], None] | None = None,
               owner: str | None = None, poll_s: float = 0.2,
               stop: Callable[[], str | None] | None = None, log: Callable[[str], None] | None = None) -> WorkerReport:
    """Backfill shards until none is left, ``limit`` items were embedded (the uncertainty sample
    included; a first batch may pass it: :func:`~.backfill_fit.first_maps_gap`), the job is paused
    or removed, every unfinished shard is leased by another worker, or ``stop()`` says why to stop
    (checked before each batch and while pacing; a worker process's: :func:`~.cluster.processes.parent_gone`).
    ``rate`` caps items per second for this worker; ``log`` hears of the bridge fits it runs
    (:func:`~.backfill_fit.maybe_fit`). Whatever stops it, it hands its shard back and records why; a
    SIGKILL leaves the lease to expire (or to be taken over at once on this host). While it holds a
    shard, its key lookups in the target's store read at the time it claimed it (``one_read_time``)."""
    owner = owner or new_owner()
    rep = WorkerReport(owner=owner)
    t_start = _now()
    pacer = Pacer(rate) if rate else None
    with Session(collection, rep) as s, contextlib.ExitStack() as read_time:
        while True:
            read_time.close()
            claimed = next_shard(collection, owner, lease_s, rep, limit, poll_s, log)
            if claimed is None:
                return rep
            job, s.shard = claimed
            # this shard's items are stored only by holders of its lease: by earlier ones before the
            # claim, and by this worker (it knows its own rows) while each commit finds the lease still
            # its own. So the target's key lookups while it holds the shard read at one time, taken
            # now (a Milvus store: no wait for the server's time tick per batch)
            read_time.enter_context(one_read_time(collection.gallery(job.target)))
            ids, sample_ids = shard_ids(collection, job, s.shard)
            pos, lost, gap = 0, False, first_maps_gap(collection, limit, log)
            while pos < len(ids):
                if limit is not None and rep.embedded >= limit:
                    rep.stopped = "limit"
                    return rep
                if stop is not None and (why := stop()):
                    rep.stopped = why
                    return rep
                cap = batch_size if limit is None else min(batch_size, limit - rep.embedded)
                cap, gap = max(cap, gap), 0  # (the merge maps' pairs at once: no batch merged on raw scores)
                batch, pos = gather(collection, job, ids, pos, cap)
                if not batch:
                    continue
                batch, vecs, bad = encode_readable(encoder, batch)
                if bad:  # a source gone or corrupt: named in status, served by the old space, tried next run
                    record_unreadable(collection, job, bad)
                    rep.unreadable += len(bad)
                    if not batch:
                        continue
                rep.embedded += len(batch)
                # the pace below keeps the run at ``rate`` on average; before its first wait the time
                # so far is the embedding alone, which would report a rate far above the cap
                cur_rate = (rep.committed + len(batch)) / max(_now() - t_start, 1e-6)
                cur_rate = min(cur_rate, float(rate)) if rate else cur_rate
                status, n, n_sample = commit_batch(collection, job, s.shard, owner, lease_s, cur_rate, keys_of(batch),
                                                   vecs, [(it.modality, it.key) for it in batch if it.id in sample_ids])
                if status == "lost":
                    lost = True
                    break
                if status != "ok":
                    rep.stopped = status
                    return rep
                rep.committed += n
                rep.sample += n_sample
                rep.batches += 1
                maybe_fit(collection, log=log)  # the first fit once the sample is in, then at each doubling
                if progress is not None:
                    progress(len(batch))
                if pacer is not None and not _pace(collection, job, s.shard, owner, lease_s, cur_rate,
                                                   pacer.wait_after(len(batch)), stop):
                    lost = True
                    break
            if lost:  # taken over after our lease expired: look for another shard
                s.shard = None
                continue
            finish_shard(collection, s.shard, owner, lease_s, log=log)
            s.shard = None


def _pace(collection: Collection, job: Any, shard: int, owner: str, lease_s: float, rate: float, wait: float,
          stop: Callable[[], str | None] | None = None) -> bool:
    """Wait ``wait`` seconds (a worker's rate cap) in slices of at most a third of its lease, renewing
    the lease of ``shard`` after each, so a slow rate never loses it; back early once ``job`` is no
    longer running (paused, cancelled: the next commit says so) or, within a second, once ``stop()``
    says to stop (the batch loop then does). False if the lease was lost."""
    end = _now() + max(0.0, float(wait))
    while (left := end - _now()) > 0:
        slice_end = _now() + min(left, max(lease_s / 3, 0.01))
        while (rest := slice_end - _now()) > 0:
            if stop is not None and stop():
                return True
            time.sleep(min(rest, 1.0))
        if not _renew(collection, shard, owner, lease_s, rate):
            return False
        now = BackfillJob.load(collection)
        if now is None or now.epoch != job.epoch or now.state != "running":
            return True
    return True


def _split(limit: int | None, workers: int) -> list[int | None]:
    """``limit`` shared out over ``workers`` (summing to it exactly)."""
    if limit is None:
        return [None] * workers
    return [limit // workers + (i < limit % workers) for i in range(workers)]


class BackfillSettingError(ValueError):
    """A backfill run's setting refused (``field`` names it, as the HTTP API does)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_run_settings(*, workers: int = 1, batch_size: int = 64, rate: float | None = None,
                       limit: int | None = None, shards: int | None = None) -> None:
    """Refuse, before anything is touched, what would make a run loop or do nothing: ``workers``,
    ``batch_size`` (and ``shards`` if given) whole numbers >= 1, ``rate`` (items per second) > 0 and
    finite, ``limit`` a whole number >= 0."""
    def whole(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not whole(workers) or workers < 1:
        raise BackfillSettingError("workers", f"workers must be a whole number >= 1, got {workers!r}")
    if not whole(batch_size) or batch_size < 1:
        raise BackfillSettingError("batch_size", f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0
                             or rate == float("inf")):
        raise BackfillSettingError("rate", f"rate must be a number of items per second > 0, got {rate!r}")
    if limit is not None and (not whole(limit) or limit < 0):
        raise BackfillSettingError("limit", f"limit must be a whole number >= 0, got {limit!r}")
    if shards is not None and (not whole(shards) or shards < 1):
        raise BackfillSettingError("shards", f"shards must be a whole number >= 1, got {shards!r}")


def run_backfill(collection: Collection, encoder: Any, *, order: str = "uncertainty", workers: int = 1,
                 batch_size: int = 64, rate: float | None = None, limit: int | None = None,
                 lease_s: float = DEFAULT_LEASE_S, seed: int = 0, progress: Callable[[int], None] | None = None,
                 pool: Any = None, log: Callable[[str], None] | None = None, engine: str = "local",
                 ray: Any = None, load: Callable[[], Any] | None = None, uri: str | None = None,
                 shards: int | None = None) -> dict[str, Any]:
    """Start (or resume) the backfill and run ``workers`` workers until it is done, paused or ``limit`` items were
    embedded, the uncertainty order's training sample included (``rate``: items per second in all). One worker runs in
    this process; more run as processes (each loads the model). The status, plus what these workers did: ``committed``
    (of it ``sample_committed``), ``embedded``, ``stopped`` (in words; for no free shard, who holds the shards),
    ``busy``. ``engine="ray"``: this process drives a Ray Data pipeline instead (:mod:`.cluster.ray_backfill`; ``ray``
    its :class:`~.cluster.ray_backfill.RayOptions`, ``load()`` the model in each actor, default ``encoder`` itself,
    pickled; ``uri`` how the actors open the collection); ``workers`` shards the job then. ``shards``: a new job's
    shards (default ``workers``): more, for workers of other machines to share."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    check_run_settings(workers=workers, batch_size=batch_size, rate=rate, limit=limit, shards=shards)
    workers = collection.storage.backfill_workers(workers, engine, log)  # milvus-lite: 1, in this process
    job = start_backfill(collection, encoder, order=order, shards=max(shards or workers, 1), seed=seed, pool=pool,
                         log=log)
    if engine == "local" and workers > job.shards and log is not None:
        log(f"the backfill job has {job.shards} shard(s), set when it started: {job.shards} worker(s) of the "
            f"{workers} asked for can take one, and they share the rate asked for, if any (cancel it with --cancel "
            "and start again for more; what was committed stays)")
    t0 = time.time()
    # ``rate`` is the run's, in all: shared by the workers that can hold a shard (a job made with
    # fewer shards than the workers asked for runs fewer; trial H saw one worker at half the rate)
    per_rate = rate / max(1, min(workers, job.shards)) if rate else None
    limits, procs = _split(limit, max(workers, 1)), []
    if engine == "ray":
        from .cluster.ray_backfill import run_ray_worker

        rep = run_ray_worker(collection, load or _Given(encoder), uri=uri, options=ray, batch_size=batch_size,
                             rate=rate, limit=limit, lease_s=lease_s, progress=progress, log=log)
        return run_report(backfill_status(collection), rep, [rep.as_dict()], [], t0)
    if workers > 1:  # the others in processes of their own, each stopping once this process is gone
        procs = start_workers(run_worker, collection.path, collection.space(job.target).model, limits,
                              {"batch_size": batch_size, "rate": per_rate, "lease_s": lease_s}, relay=log is not None)
    # with worker processes the progress is every worker's, read from the collection, and their lines are said here
    with follow_workers(procs, lambda: backfill_status(collection)["done"], progress, log):
        with stopped_with(procs, log=log):  # a Ctrl-C here stops the worker processes too (each after its batch)
            rep = run_worker(collection, encoder, batch_size=batch_size, rate=per_rate, limit=limits[0],
                             lease_s=lease_s, progress=None if procs else progress, log=named_log(log) if procs else log)
            for p, _ in procs:  # (their last lines and batches, before the end of the block reads them)
                p.join()
    return run_report(backfill_status(collection), rep, [rep.as_dict(), *join_workers(procs)], procs, t0)


class _Given:
    """``load()`` of the ray engine that returns the encoder it was made with (pickled to each actor)."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder

    def __call__(self) -> Any:
        return self.encoder


# ----------------------------------------------------------------------------- retire
def _refuse_losing_a_modality(collection: Collection, space_id: str) -> None:
    """Refuse to retire ``space_id`` where it is the only space left that embeds a modality the
    collection holds items of (a collection upgraded to a text-only model keeps its images there)."""
    others = [s for s in collection.plan.spaces if s.space_id != space_id and not s.retired]
    for m in collection.space(space_id).modalities:
        n = collection.count(m) if not any(m in s.modalities for s in others) else 0
        if n:
            raise BackfillError(f"cannot retire space {space_id} of {collection.path}: it is the only space that "
                                f"embeds {m}s, and {n} {m}{'s' if n != 1 else ''} would be left with no vector (the "
                                f"current model embeds {' and '.join(collection.space(collection.current_space).modalities)}"
                                f" only); delete them first if that is what you want")


def retire_space(collection: Collection, space_id: str, *, drop_unsourced: bool = False) -> Plan:
    """Drop an old space (its vectors and every version of the bridges fitted into it): refused while
    any live item that the current model can embed has no vector in the current space, and for the
    current space itself. Items the space serves that have no source (imported from urls, say) would
    be lost: refused while there are any, unless ``drop_unsourced``, which deletes them first
    (:func:`unsourced_to_drop` counts them)."""

    if space_id == collection.current_space:
        raise BackfillError(f"space {space_id} is the current model's; it cannot be retired")
    with collection.catalog.lock(f"{JOB_DIR}/fit", blocking=False) as taken:  # a fit writes bridges into it
        if not taken:
            raise BackfillError(f"cannot retire space {space_id} of {collection.path} now: a bridge fit is running "
                                "(the backfill's last one, or a refit); retry when `collection status` shows it done")
        return _retire(collection, space_id, drop_unsourced)


def _retire(collection: Collection, space_id: str, drop_unsourced: bool) -> Plan:
    entry = collection.space(space_id)
    _refuse_losing_a_modality(collection, space_id)
    left = _pending(collection, collection.current_space)
    orphans = collection.unsourced_ids(space_id)
    if left:  # (with the items without a source too: trial AM met them only after deleting these)
        unread, why = unreadable_note(collection, [it.id for it in left])
        why += f"; {len(orphans)} more have no source (--drop-unsourced deletes them with it)" if orphans else ""
        run = "" if unread == len(left) else " (run `nobackfill collection backfill`)"
        raise BackfillError(f"cannot retire space {space_id} of {collection.path}: {len(left)} item(s) have no vector "
                            f"in the current space yet{run}{why}")
    if orphans and not drop_unsourced:
        raise BackfillError(f"cannot retire space {space_id} of {collection.path}: {len(orphans)} item(s) it serves "
                            "have no source to embed them again from (imported without one), so retiring it would "
                            "lose them; pass --drop-unsourced to delete them with it")
    if orphans:
        collection.delete(orphans, missing_ok=True)

    def commit(p: Plan) -> Plan:
        if _pending(collection, p.current):
            raise BackfillError(f"cannot retire space {space_id}: items were added meanwhile without a vector in "
                                "the current space")
        return p.retire(space_id)

    plan = collection.set_plan(commit)
    collection.storage.drop_space(entry.dir)
    from ..compat.fitted.stored import collection_cache, drop_stored

    drop_stored(collection.catalog, f"fitted-{space_id}-", collection_cache(collection))  # every version
    return plan
