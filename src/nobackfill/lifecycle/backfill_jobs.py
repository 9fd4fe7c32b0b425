"""The backfill's job and lease store, reached through the collection's catalog: the job
(``backfill/job.json``), the order (``order.json``), the uncertainty sample (``sample.json``), how the
last workers stopped (``workers.json``) and one lease per shard (``leases/shard-<i>.json``), each a
catalog document written atomically; a lease changes only by compare-and-set
(:meth:`Catalog.swap_doc`), so two workers never hold one shard.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..collection.collection import Collection
from ..gallery.atomic_files import pid_alive

JOB_DIR = "backfill"
JOB_FILE = "job.json"
ORDER_FILE = "order.json"
SAMPLE_FILE = "sample.json"
WORKERS_FILE = "workers.json"
UNREADABLE_FILE = "unreadable.json"
#: how many unreadable items the document names (all are counted)
UNREADABLE_NAMED = 50
LEASE_DIR = "leases"
DEFAULT_LEASE_S = 30.0


class BackfillError(RuntimeError):
    """A backfill that cannot start or go on (named reason)."""


class BackfillBusy(BackfillError):
    """Every unfinished shard is leased by a live worker."""


def _now() -> float:
    return time.time()


class Pacer:
    """A worker's cap of ``rate`` items per second: :meth:`wait_after` a batch of ``n`` says how long
    to wait before the next. Time spent embedding nothing (a bridge fit, a wait for the uncertainty
    sample) is not banked beyond one batch, so a run never catches up in a burst above ``rate``
    (trial I: 148 items/s under ``--rate 50`` after each fit, with a cumulative schedule)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.clock, self.due = float(rate), clock, clock()

    def wait_after(self, n: int) -> float:
        """Seconds to wait after ``n`` items (counted as begun no earlier than their own budget ago)."""
        now, cost = self.clock(), n / self.rate
        self.due = max(self.due, now - cost) + cost
        return max(0.0, self.due - now)


def _iso(t: float | None = None) -> str:
    return datetime.fromtimestamp(t or _now(), timezone.utc).isoformat(timespec="seconds")


def _write(collection: Collection, name: str, obj: Any) -> None:
    collection.catalog.write_doc(f"{JOB_DIR}/{name}", json.dumps(obj, indent=1).encode())


def _read(collection: Collection, name: str) -> Any:
    return _parse(collection, name, collection.catalog.read_doc(f"{JOB_DIR}/{name}"))


def _parse(collection: Collection, name: str, data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError as e:
        raise BackfillError(f"{collection.storage}/{JOB_DIR}/{name}: unreadable ({e}); cancel the backfill "
                            "(`collection backfill --cancel`) and start it again") from e


@dataclass
class BackfillJob:
    """The persisted state of a backfill (``<collection>/backfill/job.json``)."""

    target: str
    order: str
    shards: int
    seed: int = 0
    state: str = "running"  # running | paused | done
    created: str = ""
    sample: int = 0  # the uncertainty order's training sample: the first ``sample`` ids of the order
    head: dict[str, Any] = field(default_factory=dict)
    total: int = 0
    phase: str = "order"  # sample (the training sample is being embedded; the order holds it alone) | order
    epoch: str = ""  # new for each job started: a commit read for another job (cancelled, restarted) is refused

    @classmethod
    def load(cls, collection: Collection) -> "BackfillJob | None":
        obj = _read(collection, JOB_FILE)
        if obj is None:
            return None
        try:
            return cls(**obj)
        except TypeError as e:
            raise BackfillError(f"{collection.storage}/{JOB_DIR}/{JOB_FILE}: {e}") from e

    def save(self, collection: Collection) -> None:
        _write(collection, JOB_FILE, self.__dict__)


@contextlib.contextmanager
def _job_lock(collection: Collection, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """The backfill lock; ``say`` is told when another process holds it (then this one waits)."""
    if say is not None:
        with collection.catalog.lock(JOB_DIR, blocking=False) as taken:
            if taken:
                yield
                return
        say("another worker (another process?) is starting or changing the backfill of this collection; "
            "waiting for it ...")
    with collection.catalog.lock(JOB_DIR):
        yield


def _order_ids(collection: Collection) -> list[str]:
    obj = _read(collection, ORDER_FILE)
    if not isinstance(obj, list):
        raise BackfillError(f"{collection.storage}/{JOB_DIR}/{ORDER_FILE}: missing or damaged; cancel the backfill "
                            "(`collection backfill --cancel`) and start it again")
    return obj


def _parse_owner(owner: str) -> tuple[str, int | None]:
    """``host:pid:tag`` -> (host, pid)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host, int(pid) if pid.isdigit() else None


def describe_holders(holders: Sequence[dict[str, Any]]) -> str:
    """``pid 12 on host-a (shard 0, since ...)``, joined; a holder in this process is said so."""
    me = (socket.gethostname(), os.getpid())
    out = []
    for h in holders:
        who = f"pid {h.get('pid')} on {h.get('host')}"
        if (h.get("host"), h.get("pid")) == me:
            who += " (this process)"
        out.append(f"{who}, shard {h.get('shard')} since {h.get('since') or '?'}")
    return "; ".join(out)


def _holder(shard: int, lease: dict[str, Any]) -> dict[str, Any]:
    host, pid = _parse_owner(str(lease.get("owner", "")))
    out = {"shard": shard, "owner": lease.get("owner"), "host": host, "pid": pid, "since": lease.get("since"),
           "rate": float(lease.get("rate", 0.0))}  # items/s at its last commit (0.0 before its first)
    if "engine" in lease:  # a Ray driver's lease: its engine and actors
        out.update({"engine": lease["engine"], "actors": lease.get("actors")})
    return out


def _leases(collection: Collection, raw: bool = False) -> dict[int, Any]:
    """Shard -> lease (with ``raw``: ``(stored bytes, lease)``, for a compare-and-set)."""
    out: dict[int, Any] = {}
    for name in collection.catalog.list_docs(f"{JOB_DIR}/{LEASE_DIR}/shard-"):
        data = collection.catalog.read_doc(name)
        obj = _parse(collection, name[len(JOB_DIR) + 1:], data)
        if isinstance(obj, dict):
            out[int(Path(name).stem.split("-")[1])] = (data, obj) if raw else obj
    return out


def _stopped_workers(collection: Collection) -> dict[str, dict[str, Any]]:
    """``workers.json`` by owner (empty where missing or damaged: it is only for status)."""
    try:
        obj = _read(collection, WORKERS_FILE)
    except BackfillError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _last_worker(collection: Collection, dead: Sequence[dict[str, Any]] = ()) -> dict[str, Any] | None:
    """The worker that stopped last: the last one that recorded why (``workers.json``), or one that
    stopped without a word since, whose lease in ``dead`` is left unfinished (a ``kill -9``, a
    machine gone, a catalog gone under it: trial I saw status name an earlier run's worker and its
    reason instead; trial Q a worker that had found no free shard, not the one that held it)."""
    obj = _stopped_workers(collection)
    last = max(obj.values(), key=lambda v: v.get("t", 0.0)) if obj else None
    for lease in dead:
        t = float(lease.get("renewed") or lease.get("expires", 0.0) - DEFAULT_LEASE_S)
        idle = last is not None and str(last.get("stopped", "")).startswith("no free shard")  # says nothing of the work
        if (t > (last or {}).get("t", 0.0) or idle) and lease.get("owner") not in obj:
            host, pid = _parse_owner(str(lease.get("owner", "")))
            copied = _taken_elsewhere(collection, lease)
            last = {"owner": lease.get("owner"), "host": host, "pid": pid, "at": _iso(t), "t": t,
                    "stopped": "its lease came with a copy of the collection taken while it worked on the original "
                               "(no worker ran on this copy)" if copied else
                               "it stopped without saying why (killed, its machine gone, or the catalog unreachable "
                               "as it stopped): its lease was left unfinished", "engine": lease.get("engine", "local")}
    return last


def backfill_running(collection: Collection) -> BackfillJob | None:
    """The job if a backfill into the current space is unfinished (running or paused)."""
    job = BackfillJob.load(collection)
    if job is None or job.target != collection.current_space or job.state == "done":
        return None
    return job


# ----------------------------------------------------------------------------- workers
def new_owner(tag: str = "") -> str:
    """A worker's lease owner: ``host:pid:tag`` (a process of this host that exits frees its shards)."""
    return f"{socket.gethostname()}:{os.getpid()}:{tag}{uuid.uuid4().hex[:8]}"


def place_of(collection: Collection) -> str | None:
    """Where ``collection`` lies on this host: the ``device:inode`` of its SQLite catalog's folder
    (None for a catalog on a server), written into the leases and fits its workers take, so that
    one copied with the collection (``cp -r`` during a backfill: trial AK) is told from a worker of
    this copy."""
    if collection.catalog.dialect != "sqlite":
        return None
    try:
        st = os.stat(Path(collection.catalog.location).parent)
    except (OSError, ValueError):
        return None
    return f"{st.st_dev}:{st.st_ino}"


def _holder_gone(owner: str) -> bool:
    """``owner`` (``host:pid:tag``) names a process of this host that has exited."""
    host, pid = _parse_owner(owner)
    return host == socket.gethostname() and pid is not None and not pid_alive(pid)


def _taken_elsewhere(collection: Collection, lease: dict[str, Any]) -> bool:
    """``lease`` (or fit) was taken by a process of this host in another copy of ``collection``."""
    if lease.get("place") is None or _parse_owner(str(lease.get("owner", "")))[0] != socket.gethostname():
        return False
    return lease["place"] != place_of(collection)


def lease_gone(collection: Collection, lease: dict[str, Any]) -> bool:
    """The holder of ``lease`` (or fit) of ``collection`` has exited or works on another copy of it."""
    return _holder_gone(str(lease.get("owner", ""))) or _taken_elsewhere(collection, lease)


def _take_shard(collection: Collection, job: BackfillJob, owner: str,
                lease_s: float) -> tuple[int | None, list[dict[str, Any]]]:
    """A shard nobody holds (or whose holder's lease expired), leased to ``owner``; else None and the
    live holders of the unfinished shards (none: every shard is done)."""
    leases = _leases(collection, raw=True)
    now = _now()
    busy = []
    for s in range(job.shards):
        raw, lease = leases.get(s, (None, None))
        if lease is None or (not lease.get("done") and (lease.get("expires", 0) <= now or lease.get("owner") == owner
                                                        or lease_gone(collection, lease))):
            new = {"owner": owner, "expires": now + lease_s, "since": _iso(now), "rate": 0.0, "renewed": now,
                   **({"place": place} if (place := place_of(collection)) else {})}
            if _swap(collection, s, raw, new):
                return s, []
            lease = _leases(collection).get(s)  # taken by another worker meanwhile
        if lease is not None and not lease.get("done"):
            busy.append(_holder(s, lease))
    return None, busy


def _swap(collection: Collection, shard: int, raw: bytes | None, lease: dict[str, Any]) -> bool:
    """Compare-and-set of a shard's lease: written only if it still is ``raw`` (None: absent)."""
    return collection.catalog.swap_doc(f"{JOB_DIR}/{LEASE_DIR}/shard-{shard}.json", raw,
                                       json.dumps(lease, indent=1).encode())


def _renew(collection: Collection, shard: int, owner: str, lease_s: float, rate: float, done: bool = False) -> bool:
    """Extend ``owner``'s lease of ``shard`` (compare-and-set); False if it is not ``owner``'s any more."""
    raw, lease = _leases(collection, raw=True).get(shard, (None, None))
    if not isinstance(lease, dict) or lease.get("owner") != owner:
        return False
    now = _now()
    return _swap(collection, shard, raw, {**lease, "expires": now + lease_s, "rate": rate, "done": done, "renewed": now})


def _release(collection: Collection, shard: int, owner: str) -> None:
    """Hand ``owner``'s lease of ``shard`` back (free at once; done stays done)."""
    raw, lease = _leases(collection, raw=True).get(shard, (None, None))
    if isinstance(lease, dict) and lease.get("owner") == owner:
        _swap(collection, shard, raw, {**lease, "expires": 0.0, "rate": 0.0})


def record_unreadable(collection: Collection, job: "BackfillJob", bad: dict[str, str]) -> None:
    """Add ``bad`` (id -> why its source could not be read) to this job's unreadable items
    (``unreadable.json``, counted in full, the first :data:`UNREADABLE_NAMED` named), under the
    backfill lock; a document of another job (an earlier run) is started afresh."""
    if not bad:
        return
    with _job_lock(collection):
        obj = _read(collection, UNREADABLE_FILE) or {}
        if obj.get("epoch") != job.epoch:
            obj = {"epoch": job.epoch, "ids": [], "count": 0, "named": {}}
        seen = set(obj["ids"])
        new = [i for i in bad if i not in seen]
        obj["ids"] += new
        obj["count"] = len(obj["ids"])
        for i in new:
            if len(obj["named"]) < UNREADABLE_NAMED:
                obj["named"][i] = bad[i]
        _write(collection, UNREADABLE_FILE, obj)


def unreadable_note(collection: Collection, ids: Sequence[str]) -> tuple[int, str]:
    """How many of ``ids`` the current job could not read, and a note saying so and what to do
    (empty for none): running the backfill again does not embed them while their files are bad."""
    bad = unreadable_items(collection, BackfillJob.load(collection))
    named = set(bad["ids"])
    unread = [i for i in ids if i in named]
    if not unread:
        return 0, ""
    return len(unread), (f"; {len(unread)} of them the backfill could not read (a file missing or corrupt, e.g. "
                         f"{unread[0]!r}: {bad['named'].get(unread[0], 'unreadable')}): restore their files and run "
                         "it again, or delete them (`nobackfill collection delete`)")


def unreadable_items(collection: Collection, job: "BackfillJob | None") -> dict[str, Any]:
    """This job's unreadable items that still wait for it, live and not served by its target:
    ``{"ids": [...], "count": n, "named": {id: why}}`` (empty for none; trial AL: status named items
    deleted since, or retired with their space)."""
    obj = _read(collection, UNREADABLE_FILE) if job is not None else None
    if not obj or obj.get("epoch") != job.epoch:
        return {"ids": [], "count": 0, "named": {}}
    live = collection.serving(obj["ids"])
    ids = [i for i in obj["ids"] if i in live and live[i][1] != job.target]
    keep = set(ids)
    return {**obj, "ids": ids, "count": len(ids), "named": {i: w for i, w in obj["named"].items() if i in keep}}
