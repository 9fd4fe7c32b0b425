"""The backfill on a Ray cluster (``engine="ray"``): the same job, order, shards and leases as the
local lease workers (:mod:`.backfill`), with the re-embedding done by Ray Data.

The driver (this process) claims a shard like any worker (:func:`~.backfill_commit.claim_shard`,
its lease tagged ``engine: ray`` and the actor count), reads the shard's pending items in the job's
order (best first) and streams them through a Ray Data pipeline: a CPU stage reads and decodes the
images (inside the embedding actors when they have no GPU: one process less per batch), an actor
pool embeds (the model loaded once per actor, ``num_gpus`` per actor when asked), and commit
actors commit each batch through :func:`~.backfill_commit.commit_batch`, the one commit the local
workers use. Ray retries tasks and restarts actors without limit (Ray Data's defaults for actor
pools), so a batch may be embedded and committed twice: exactly-once rests on that commit (vectors
keyed by item version, skipped when present; the catalog serving each version once; the lease and
the job's epoch checked under the backfill lock), never on Ray. The driver's death ends its actors;
its lease names its pid, so a rerun takes the shard over at once and goes on from the catalog.

Memory: the pipeline's object store use is capped (``object_store_mb``, Ray Data's resource
limit), each actor holds at most ``in_flight`` batches, and the driver reads the shard
``chunk`` items at a time. Ray is imported only here, only when this engine is chosen.

Joining a cluster: an address ``HOST:PORT`` (or ``ray://HOST:PORT``) is first dialled with a TCP
connect of a few seconds (:func:`ray_address_error`), when the options are made and again before
``ray.init``: where nothing answers, the run is refused at once, naming the address and how to
start a cluster there (``ray.init`` itself retries such an address for many minutes). ``ray.init``
then runs under a deadline (``RayOptions.join_s``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...collection.collection import Collection, Item
from ...encoders.base import encode
from ..backfill_commit import (Session, WorkerReport, commit_batch, finish_shard, gather, new_owner, next_shard,
                              shard_ids)
from ..backfill_fit import maybe_fit
from ..backfill_jobs import (DEFAULT_LEASE_S, BackfillError, BackfillJob, Pacer, _job_lock, _leases, _now, _renew, _swap,
                            record_unreadable)
from .ray_address import CLI_RETRY, PROBE_S, RayUnreachable, check_ray_address, own_ray, ray_address_error  # noqa: F401

__all__ = ["JOIN_S", "PROBE_S", "RAY_MISSING", "PoolLoader", "RayOptions", "RayUnreachable", "check_ray_address",
           "import_ray", "ray_address_error", "run_ray_worker"]

RAY_MISSING = "the ray backfill engine needs Ray Data: pip install 'nobackfill[ray]'"
#: seconds ``ray.init`` may take to join a cluster that answers (``RayOptions.join_s`` by default)
JOIN_S = 60.0
#: Ray's notes that are no failure of the run, shown only with ``nobackfill -v`` (set before Ray
#: starts its processes; a value the user set stays): a task retried on another actor after an
#: actor was ended, e.g. by a pause (``(raylet) Task ... submit failed ... killed by 'ray.kill'``,
#: printed on stdout)
_QUIET_ENV = {"RAY_enable_output_error_log_if_still_retry": "0"}


def import_ray() -> Any:
    """``ray`` with Ray Data, or a :class:`BackfillError` saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise BackfillError(f"{RAY_MISSING} ({e})") from None
    from ..._logging import tame_library_loggers

    tame_library_loggers(("ray",))  # Ray's handlers (its token-auth note, Ray Data's info lines) only with -v
    if not logging.getLogger("ray").isEnabledFor(logging.WARNING):  # not verbose (nobackfill -v)
        for var, value in _QUIET_ENV.items():
            os.environ.setdefault(var, value)  # read when this process's Ray core starts (ray.init)
    return ray


@dataclass
class RayOptions:
    """How the Ray pipeline runs. ``address``: a running cluster (``HOST:PORT``, ``auto``,
    ``ray://...``), None: a Ray started for this run on this machine (``init``: its extra ``ray.init``
    arguments). An address ``HOST:PORT`` or ``ray://HOST:PORT`` must answer a TCP connect within
    :data:`PROBE_S` seconds when the options are made (else a :class:`RayUnreachable` saying how
    to start a cluster there: before any job is started or changed), and ``ray.init`` must return
    within ``join_s`` seconds (default :data:`JOIN_S`). ``actors`` embedding actors of
    ``cpus_per_actor`` / ``gpus_per_actor`` each, ``commit_actors`` committing; ``in_flight``
    batches queued per actor; ``object_store_mb`` caps the pipeline's object store use; ``chunk``:
    items the driver reads (and hands to one Ray Data execution) at a time."""

    address: str | None = None
    actors: int = 2
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    commit_actors: int = 1
    in_flight: int = 2
    object_store_mb: int | None = 512
    chunk: int = 50_000
    init: dict[str, Any] = field(default_factory=dict)
    join_s: float | None = None

    def __post_init__(self) -> None:
        if self.actors < 1 or self.commit_actors < 1 or self.in_flight < 1 or self.chunk < 1:
            raise ValueError("ray: actors, commit_actors, in_flight and chunk must be >= 1")
        if self.gpus_per_actor < 0 or self.cpus_per_actor < 0:
            raise ValueError("ray: gpus_per_actor and cpus_per_actor must be >= 0")
        if self.join_s is not None and not self.join_s > 0:
            raise ValueError("ray: join_s must be > 0")
        if self.address is not None and own_ray(self.address):
            self.address = None  # Ray's word for a Ray of this run's own: started as without an address
            # (trial AC: ray.init("local") in the joining thread ended the process, exit 1, without a word)
        check_ray_address(self.address)  # before anything is started: a run refused at once, not hung


class PoolLoader:
    """``load()`` of an actor: the model ``ref`` of space ``space_id``, loaded from its reference
    (a model directory every node reaches, or a named model) into the actor's own pool."""

    def __init__(self, ref: str, space_id: str) -> None:
        self.ref, self.space_id = ref, space_id

    def __call__(self) -> Any:
        from ...search.models import ModelPool

        return ModelPool().get(self.ref, self.space_id)


# ----------------------------------------------------------------------------- the stages
def _ragged(arrays: Sequence[np.ndarray]) -> np.ndarray:
    out = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):
        out[i] = a
    return out


def _decode(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The CPU stage: each image source read and decoded to RGB pixels (texts: no pixels)."""
    from PIL import Image

    pixels, bad = [], []
    for m, src in zip(batch["modality"], batch["src"]):
        why = ""
        if m == "image":
            try:
                with Image.open(str(src)) as im:
                    pixels.append(np.asarray(im.convert("RGB")))
            except (OSError, ValueError, SyntaxError) as e:  # a source gone or corrupt: named, not embedded
                why = f"{type(e).__name__}: cannot read image {src}: {e}"
                pixels.append(np.zeros((0, 0, 3), np.uint8))
        else:
            pixels.append(np.zeros((0, 0, 3), np.uint8))
        bad.append(why)
    return {**batch, "pixels": _ragged(pixels), "bad": np.array(bad, dtype=object)}


#: the embedding actors' clock and wait (a test replaces them)
_clock, _sleep = time.monotonic, time.sleep


class _Embed:
    """An embedding actor: the model loaded once (``load()``), each batch embedded per modality.
    ``rate``: its share of the run's cap in items per second; it waits after a batch that would put
    it ahead (from its first batch on), so the pipeline behind it commits no faster (the driver's
    own wait paces only its reading of results, not the actors)."""

    def __init__(self, load: Callable[[], Any], threads: int, decode: bool, rate: float | None = None) -> None:
        with contextlib.suppress(ImportError):
            import torch

            torch.set_num_threads(max(1, threads))
        self.encoder, self.decode = load(), decode
        self.rate, self.pacer = rate, None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.rate and self.pacer is None:  # from its first batch on (not from its model's load)
            self.pacer = Pacer(self.rate, clock=_clock)
        out = self._embed(batch)
        if self.pacer is not None and (wait := self.pacer.wait_after(len(batch["id"]))) > 0:
            _sleep(wait)
        return out

    def _embed(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from PIL import Image

        if self.decode:
            batch = _decode(batch)
        mods, n = batch["modality"], len(batch["id"])
        vecs: np.ndarray | None = None
        for m in ("image", "text"):
            idx = [i for i in range(n) if mods[i] == m and not batch["bad"][i]]
            if not idx:
                continue
            rows = ([Image.fromarray(np.asarray(batch["pixels"][i], np.uint8)) for i in idx] if m == "image"
                    else [str(batch["src"][i]) for i in idx])
            v = encode(self.encoder, m, rows)
            if vecs is None:
                vecs = np.zeros((n, v.shape[1]), np.float32)
            vecs[idx] = v
        if vecs is None:  # every source of the batch unreadable
            vecs = np.zeros((n, int(getattr(self.encoder, "embed_dim", 1))), np.float32)
        return {"modality": mods, "key": batch["key"], "sample": batch["sample"], "vec": vecs,
                "id": batch["id"], "bad": batch["bad"],
                "pid": np.full(n, os.getpid()), "node": np.array([_node_id()] * n), "rss_mb": np.full(n, _peak_mb())}


def _peak_mb() -> float:
    """This process's peak resident memory (MB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


class _Commit:
    """A commit actor: the collection opened once, each batch committed by
    :func:`~.backfill_commit.commit_batch`."""

    def __init__(self, uri: str, job: dict[str, Any], shard: int, owner: str, lease_s: float) -> None:
        self.collection = Collection.open(uri)
        self.job, self.shard, self.owner, self.lease_s = BackfillJob(**job), shard, owner, lease_s
        self.t0, self.done = time.time(), 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        mods, keys = batch["modality"], [str(k) for k in batch["key"]]
        bad = {str(batch["id"][i]): str(why) for i, why in enumerate(batch["bad"]) if why}
        record_unreadable(self.collection, self.job, bad)  # named in status; tried again by the next run
        ok = [i for i in range(len(keys)) if not batch["bad"][i]]
        by_mod = {m: [i for i in ok if mods[i] == m] for m in ("image", "text")}
        vecs = {m: np.asarray(batch["vec"][idx], np.float32) for m, idx in by_mod.items() if idx}
        sample = [(str(mods[i]), keys[i]) for i in ok if batch["sample"][i]]
        rate = (self.done + len(keys)) / max(time.time() - self.t0, 1e-6)
        status, n, n_sample = ("ok", 0, 0) if not ok else commit_batch(
            self.collection, self.job, self.shard, self.owner, self.lease_s, rate,
            {m: [keys[i] for i in idx] for m, idx in by_mod.items()}, vecs, sample)
        self.done += n
        return {"status": np.array([status]), "committed": np.array([n]), "sample": np.array([n_sample]),
                "items": np.array([len(keys)]), "unreadable": np.array([len(bad)]), "embedded_by": np.array([int(batch["pid"][0])]),
                "node": np.array([str(batch["node"][0])]), "rss_mb": np.array([float(np.max(batch["rss_mb"]))]),
                "commit_rss_mb": np.array([_peak_mb()])}


# ----------------------------------------------------------------------------- the driver
#: ``ray.init`` calls still running past their deadline (their threads), and the address of each
_late_joins: list[tuple[threading.Thread, str]] = []


def _start(ray: Any, opts: RayOptions) -> bool:
    """Connect to (or start) Ray; True if this call started it (then the run shuts it down). A
    cluster's address is dialled first (:func:`check_ray_address`) and joined within
    ``opts.join_s`` seconds."""
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
                          **opts.init}
    where = f"the Ray cluster at {opts.address}" if opts.address else "a local Ray"
    try:
        if not opts.address:  # a local start: Ray's own timeouts bound it
            ray.init(address=opts.address, **kw)
        else:
            check_ray_address(opts.address, outcome="nothing was committed by this run")
            _join(ray, opts.address, kw, opts.join_s or JOIN_S)
    except RayUnreachable:
        raise
    except (RuntimeError, ConnectionError, TimeoutError, OSError) as e:  # no cluster there, or a start that timed out
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ConnectionError(f"could not start or join {where} ({why}); nothing was committed by this run: run the "
                              "same command again (a start under load can time out)") from None
    return True


def _join(ray: Any, address: str, kw: dict[str, Any], deadline_s: float) -> None:
    """``ray.init(address=address, **kw)`` in a thread of its own, waited for ``deadline_s``
    seconds: Ray retries a cluster that does not answer as one for many minutes, printing warnings.
    Past the deadline a :class:`RayUnreachable` says so; the call goes on in its thread (it cannot be
    stopped) and a later join in this process waits for it rather than starting another."""
    _late_joins[:] = [(t, a) for t, a in _late_joins if t.is_alive()]
    if _late_joins:
        t, was = _late_joins[0]
        t.join(deadline_s)
        if ray.is_initialized():
            return
        if t.is_alive():
            raise RayUnreachable(f"could not join the Ray cluster at {address}: an earlier ray.init (joining {was}) "
                                 "has still not returned; restart this process once a Ray cluster answers there")
    out: dict[str, BaseException] = {}

    def run() -> None:
        try:
            ray.init(address=address, **kw)
        except BaseException as e:  # told to the caller
            out["error"] = e

    t = threading.Thread(target=run, name="ray-init", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        _late_joins.append((t, address))
        raise RayUnreachable(
            f"could not join the Ray cluster at {address}: ray.init did not return within {deadline_s:g} s (something "
            "answers there, but no Ray cluster took this driver: is it the GCS port of a Ray head, `ray start --head "
            "--port PORT`? Ray dials 127.0.0.1 as this machine's own IP); nothing was committed by this run")
    if "error" in out:
        raise out["error"]


def _configure(ray: Any, opts: RayOptions) -> None:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    if opts.object_store_mb:
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
            object_store_memory=opts.object_store_mb * 2 ** 20)


def _tag_lease(collection: Collection, shard: int, owner: str, tags: dict[str, Any]) -> None:
    """Write ``tags`` (engine, actors) into ``owner``'s lease of ``shard``, for status."""
    with _job_lock(collection):
        raw, lease = _leases(collection, raw=True).get(shard, (None, None))
        if isinstance(lease, dict) and lease.get("owner") == owner:
            _swap(collection, shard, raw, {**lease, **tags})


class _Heartbeat:
    """Renews the driver's lease every ``lease_s / 3`` while the pipeline runs (the commits renew it
    too; before the first one, actors may take a while to load their model)."""

    def __init__(self, collection: Collection, shard: int, owner: str, lease_s: float,
                 rate: Callable[[], float]) -> None:
        self.lost, self._stop = False, threading.Event()
        self._args = (collection, shard, owner, lease_s, rate)
        self._thread = threading.Thread(target=self._run, name="backfill-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        collection, shard, owner, lease_s, rate = self._args
        while not self._stop.wait(lease_s / 3):
            with _job_lock(collection):
                if not _renew(collection, shard, owner, lease_s, rate()):
                    self.lost = True
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _pipeline(ray: Any, uri: str, load: Callable[[], Any], job: BackfillJob, shard: int, owner: str,
              items: list[Item], sample_ids: set[str], opts: RayOptions, batch_size: int, lease_s: float,
              rate: float | None = None) -> Any:
    """The Ray Data pipeline of ``items``: decode (CPU), embed (actor pool, ``rate`` items/s in all),
    commit (commit actors)."""
    rows = [{"id": it.id, "modality": it.modality, "key": it.key, "src": str(it.payload),
             "sample": it.id in sample_ids} for it in items]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, math.ceil(len(rows) / batch_size)))
    gpu = opts.gpus_per_actor > 0
    if gpu:  # a GPU actor should only embed: decoding runs in CPU tasks ahead of it
        ds = ds.map_batches(_decode, batch_size=batch_size, batch_format="numpy", num_cpus=1)
    ds = ds.map_batches(_Embed, fn_constructor_args=(load, int(max(1, opts.cpus_per_actor)), not gpu,
                                                     rate / opts.actors if rate else None),
                        batch_size=batch_size, batch_format="numpy",
                        compute=ray.data.ActorPoolStrategy(size=opts.actors, max_tasks_in_flight_per_actor=opts.in_flight),
                        num_cpus=opts.cpus_per_actor, **({"num_gpus": opts.gpus_per_actor} if gpu else {}))
    return ds.map_batches(_Commit, fn_constructor_args=(uri, dict(job.__dict__), shard, owner, lease_s),
                          batch_size=None, batch_format="numpy", num_cpus=0,
                          compute=ray.data.ActorPoolStrategy(size=opts.commit_actors,
                                                             max_tasks_in_flight_per_actor=opts.in_flight))


def run_ray_worker(collection: Collection, load: Callable[[], Any], *, uri: str | None = None,
                   options: RayOptions | None = None, batch_size: int = 64, rate: float | None = None,
                   limit: int | None = None, lease_s: float = DEFAULT_LEASE_S,
                   progress: Callable[[int], None] | None = None, owner: str | None = None,
                   on_batch: Callable[[dict[str, Any]], None] | None = None,
                   log: Callable[[str], None] | None = None,
                   stop: Callable[[], str | None] | None = None) -> WorkerReport:
    """:func:`~.backfill.run_worker` with the embedding on Ray (see the module doc): shards until
    none is left, ``limit`` items were embedded, the job is paused or removed, or ``stop()`` says why
    to stop (checked between the pipeline's batches) (``rate``: items per
    second in all, each embedding actor keeping to its share; ``log`` hears of the bridge fits this
    driver runs). ``load()`` returns
    the current model (run once in each actor; pickled to them); ``uri``: how actors open the
    collection (default: its path). ``on_batch``: told of each committed batch (its ``status``,
    ``committed``, ``items``, ``embedded_by`` pid, ``node``, the embedding actor's and the
    commit actor's peak RSS ``rss_mb``, ``commit_rss_mb``)."""
    ray = import_ray()
    opts = options or RayOptions()
    owner = owner or new_owner("ray-")
    rep = WorkerReport(owner=owner, engine="ray")
    started = _start(ray, opts)
    _configure(ray, opts)
    t0 = _now()
    try:
        with Session(collection, rep) as s:
            while True:
                claimed = next_shard(collection, owner, lease_s, rep, limit, log=log)
                if claimed is None:
                    return rep
                job, s.shard = claimed
                _tag_lease(collection, s.shard, owner, {"engine": "ray", "actors": opts.actors})
                ids, sample_ids = shard_ids(collection, job, s.shard)
                pos, status = 0, "ok"
                while pos < len(ids) and status == "ok":
                    left = opts.chunk if limit is None else min(opts.chunk, limit - rep.embedded)
                    if left <= 0:
                        break
                    items, pos = gather(collection, job, ids, pos, left)
                    if items:
                        status = _run(ray, collection, load, job, s.shard, owner, items, sample_ids, opts, batch_size,
                                      lease_s, rep, rate, t0, progress, on_batch, uri, log, stop)
                if status == "lost":  # taken over after our lease expired: look for another shard
                    s.shard = None
                    continue
                if status != "ok":
                    rep.stopped = status
                    return rep
                if pos < len(ids):
                    continue  # the limit: said at the top
                finish_shard(collection, s.shard, owner, lease_s, log=log)
                s.shard = None
    finally:
        if started:
            ray.shutdown()


def _run(ray: Any, collection: Collection, load: Callable[[], Any], job: BackfillJob, shard: int, owner: str,
         items: list[Item], sample_ids: set[str], opts: RayOptions, batch_size: int, lease_s: float,
         rep: WorkerReport, rate: float | None, t0: float, progress: Callable[[int], None] | None,
         on_batch: Callable[[dict[str, Any]], None] | None, uri: str | None,
         log: Callable[[str], None] | None = None, stop: Callable[[], str | None] | None = None) -> str:
    """One pipeline over ``items``, followed batch by batch: ``ok``, ``lost`` or why the job (or
    ``stop()``) stopped it."""
    ds = _pipeline(ray, uri or str(collection.path), load, job, shard, owner, items, sample_ids, opts, batch_size,
                   lease_s, rate)
    beat = _Heartbeat(collection, shard, owner, lease_s, lambda: rep.committed / max(_now() - t0, 1e-6))
    try:
        for out in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0):
            for j in range(len(out["status"])):
                info = {k: (v[j].item() if hasattr(v[j], "item") else v[j]) for k, v in out.items()}
                if info["status"] != "ok":
                    return str(info["status"])
                rep.embedded += int(info["items"])
                rep.committed += int(info["committed"])
                rep.sample += int(info["sample"])
                rep.unreadable += int(info["unreadable"])
                rep.batches += 1
                if on_batch is not None:
                    on_batch(info)
                if progress is not None:
                    progress(int(info["items"]))
            maybe_fit(collection, log=log)
            if beat.lost:
                return "lost"
            if stop is not None and (why := stop()):
                return why
        return "lost" if beat.lost else "ok"
    finally:
        beat.stop()
