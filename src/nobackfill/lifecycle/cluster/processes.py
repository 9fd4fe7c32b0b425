"""The worker processes of a local backfill run (``run_backfill(workers=N)``: one worker runs in the
calling process, the other ``N - 1`` here, each loading the model itself).

A worker process stops when the process that started it is gone. A SIGKILL of the ``collection
backfill`` command (or of a server running it) leaves no time to tell its workers, and before they
went on alone until their shards were done, unseen by the person who killed the run. Now each one
watches its parent's sentinel (a pipe that closes when the parent exits, however it exits): the
worker finishes the batch in hand, commits it, hands its shard back (free at once for the next run)
and records ``stopped: "the process that started this worker exited"`` in ``backfill_status``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["INTERRUPTED", "PARENT_GONE", "TERMINATED", "follow_workers", "join_workers", "named_log", "parent_gone",
           "run_report", "start_workers", "stopped_with"]

#: how a worker process records that it stopped because the process that started it exited
PARENT_GONE = "the process that started this worker exited"
#: how a worker records that it stopped for a Ctrl-C (its own, or of the command that started it)
INTERRUPTED = "interrupted (Ctrl-C)"
#: how a worker records that it stopped for a SIGTERM (of the command it runs in or that started it, or its own)
TERMINATED = "interrupted (SIGTERM)"
#: how long an interrupted run waits for its worker processes to commit the batch in hand
STOP_WAIT_S = 120.0


def parent_gone(cause: Path | None = None) -> Callable[[], str | None]:
    """A check for :func:`~.backfill.run_worker`'s ``stop``: None while the process that started
    this one (``multiprocessing``'s parent) lives, :data:`PARENT_GONE` once it has exited, and after
    a SIGTERM what asked for it: the file ``cause`` holds ``"Ctrl-C"`` or ``"SIGTERM"`` when the
    command that started this worker stops it for its own interrupt (:func:`stopped_with`); a SIGTERM
    with no such file was sent to this worker alone (:data:`TERMINATED`). A thread waits on the
    parent's sentinel; in a process with no such parent the check is always None."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    parent = mp.parent_process()
    gone, asked = threading.Event(), threading.Event()
    if parent is not None:
        def watch() -> None:
            wait([parent.sentinel])
            gone.set()

        threading.Thread(target=watch, name="backfill-parent-watch", daemon=True).start()
        if threading.current_thread() is threading.main_thread():  # the parent's interrupt: SIGTERM from it
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the parent, which says
            signal.signal(signal.SIGTERM, lambda *_: asked.set())

    def stop() -> str | None:
        if gone.is_set():
            return PARENT_GONE
        if not asked.is_set():
            return None
        said = ""
        if cause is not None:
            with contextlib.suppress(OSError):
                said = cause.read_text(encoding="utf-8").strip()
        return INTERRUPTED if said == "Ctrl-C" else TERMINATED

    return stop


def _say(msg: str) -> None:
    """What a worker process has to say (the bridge fits it runs): a line on the stderr it shares
    with the command that started it, naming itself."""
    import sys

    print(f"worker pid {os.getpid()}: {msg}", file=sys.stderr, flush=True)


def named_log(log: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """``log`` with each line prefixed as a worker process's are (``worker pid P:``, this process's
    pid): with ``--workers N`` the command's own process is one of the N workers (trial AE: its fits
    printed bare, the other workers' named)."""
    if log is None:
        return None
    me = os.getpid()
    return lambda msg: log("\n".join(f"worker pid {me}: {line}" for line in str(msg).splitlines() or [""]))


def _say_to(path: Path) -> Callable[[str], None]:
    """What a worker process has to say, appended to ``path`` for the process that started it to
    show (:func:`follow_workers`); on stderr where the file cannot be written."""
    def say(msg: str) -> None:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(f"{line}\n" for line in str(msg).splitlines() or [""]))
        except OSError:
            _say(msg)

    return say


def _worker_main(run_worker: Callable[..., Any], path: str, model: str, kwargs: dict,
                 report: str, relay: bool = False) -> None:  # pragma: no cover - a child process
    stop = parent_gone(_cause_file(Path(report)))  # first: a Ctrl-C meant for the command is its to handle
    say = _say_to(_log_file(Path(report))) if relay else _say

    import torch

    from ...collection.collection import Collection
    from ...search.models import ModelPool

    torch.set_num_threads(1)
    try:
        c = Collection.open(path)
        enc = ModelPool().get(model, c.current_space)
        rep = run_worker(c, enc, stop=stop, log=say, **kwargs)
    except Exception as e:  # one line, as the command's own error (a catalog gone): no traceback of a child
        say(f"stopped: {e}" + ("" if "run the same command again" in str(e) else
                                 " (what was committed stays: run the same command again to go on)"))
        raise SystemExit(1) from None
    if stop() == PARENT_GONE:  # no one left to read the report: the folder goes (a killed command left one in /tmp)
        for left in (Path(report), _log_file(Path(report)), _cause_file(Path(report))):
            with contextlib.suppress(OSError):
                left.unlink()
        with contextlib.suppress(OSError):
            Path(report).parent.rmdir()
        return
    Path(report).write_text(json.dumps(rep.as_dict()))


def start_workers(run_worker: Callable[..., Any], path: Path, model: str, limits: list[int | None],
                  settings: dict[str, Any], relay: bool = False) -> list[tuple[Any, Path]]:
    """A spawned process per worker ``i`` of ``limits[1:]`` (worker 0 is the caller's) running
    ``run_worker`` (:func:`~.backfill.run_worker`, given so this module needs not import it) on the
    collection at ``path`` with ``model`` loaded, ``settings`` (batch size, rate, lease), its limit,
    ``stop=parent_gone()`` and its bridge fits told on stderr (``relay``: in a file beside its report, for
    :func:`follow_workers` to pass on); one with a limit of 0 is not started. Returns each process and the
    file its report will be in."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    tmp = Path(tempfile.mkdtemp(prefix="nobackfill-workers-"))
    procs = []
    for i in range(1, len(limits)):
        if limits[i] == 0:
            continue
        out = tmp / f"worker-{i}.json"
        p = ctx.Process(target=_worker_main,
                        args=(run_worker, str(path), model, {**settings, "limit": limits[i]}, str(out), relay))
        p.start()
        procs.append((p, out))
    if not procs:
        tmp.rmdir()
    return procs


@contextlib.contextmanager
def stopped_with(procs: list[tuple[Any, Path]], wait_s: float = STOP_WAIT_S,
                 log: Callable[[str], None] | None = None) -> Iterator[None]:
    """The caller's own worker runs in the block; if it leaves by an exception (a Ctrl-C), the
    processes of :func:`start_workers` are asked to stop (SIGTERM: each commits the batch in hand,
    hands its shard back, records :data:`INTERRUPTED` or :data:`TERMINATED` as the command was stopped), awaited up to ``wait_s`` and then killed,
    before the exception goes on (a process left running kept the command alive to the end). The
    wait is said (``log``): a worker fitting bridges finishes its fit first, up to a minute on a
    large model, and the command was silent meanwhile (trial W)."""
    try:
        yield
    except BaseException as e:
        from ..._interrupts import interrupt_cause

        alive = [(p, out) for p, out in procs if p.is_alive()]
        if alive and log is not None:
            log(f"stopping {len(alive)} worker process(es): each commits the batch in hand (one fitting bridges "
                f"ends its fit first); waiting up to {wait_s:.0f} s ...")
        for p, out in alive:  # what stopped the command, for each worker to record as its own stop
            with contextlib.suppress(OSError):
                _cause_file(out).write_text(interrupt_cause(e), encoding="utf-8")
            p.terminate()
        deadline = time.monotonic() + wait_s
        for p, _ in alive:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        join_workers(procs)
        raise


@contextlib.contextmanager
def follow_workers(procs: list[tuple[Any, Path]], done_now: Callable[[], int],
                   progress: Callable[[int], None] | None, log: Callable[[str], None] | None,
                   every_s: float = 1.0) -> Iterator[None]:
    """While the block runs (the caller's own worker), and once at its end, every ``every_s``
    seconds: feed ``progress`` with the items every worker committed since its last call, read from
    the collection (``done_now()``: the items the target serves), and pass each line a worker process
    wrote to its log file (:func:`start_workers` with ``relay``) to ``log``. The command's bar counted
    only its own worker's batches (it ended at 1,497 of 2,073 committed, and stood still while the
    others worked on), and the workers' lines, written to the terminal beside the bar, were erased
    by it (trial W). The block should wait for the processes before it ends (their last lines)."""
    if not procs or (progress is None and log is None):
        yield
        return
    seen, stop, read = [done_now() if progress is not None else 0], threading.Event(), {}

    def tick() -> None:
        if log is not None:
            for p, out in procs:
                said = _log_file(out)
                with contextlib.suppress(OSError):
                    with open(said, "rb") as f:
                        f.seek(read.get(said, 0))
                        data = f.read()
                    whole = data[:data.rfind(b"\n") + 1]  # whole lines only
                    read[said] = read.get(said, 0) + len(whole)
                    for line in whole.decode("utf-8", errors="replace").splitlines():
                        log(f"worker pid {p.pid}: {line}")
        if progress is not None:
            try:
                now = done_now()
            except Exception:  # a status read that failed: the next tick tries again
                return
            if now > seen[0]:
                progress(now - seen[0])
                seen[0] = now

    def watch() -> None:
        while not stop.wait(every_s):
            tick()

    thread = threading.Thread(target=watch, name="backfill-follow", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        tick()


def _log_file(report: Path) -> Path:
    """Where the worker process whose report goes to ``report`` writes its lines (when relayed)."""
    return report.with_suffix(".log")


def _cause_file(report: Path) -> Path:
    """Where the command tells the worker process whose report goes to ``report`` what stopped it."""
    return report.with_suffix(".stop")


def join_workers(procs: list[tuple[Any, Path]]) -> list[dict[str, Any]]:
    """Wait for the processes of :func:`start_workers`; their reports (one that left none is
    skipped), their folder removed."""
    reports = []
    for p, out in procs:
        p.join()
        with contextlib.suppress(OSError, ValueError):
            reports.append(json.loads(out.read_text()))
            out.unlink()
        for said in (_log_file(out), _cause_file(out)):
            with contextlib.suppress(OSError):
                said.unlink()
    if procs:
        with contextlib.suppress(OSError):
            procs[0][1].parent.rmdir()
    return reports


def run_report(st: dict[str, Any], rep: Any, reports: list[dict[str, Any]], procs: list[Any],
               t0: float) -> dict[str, Any]:
    """The status ``st`` after a run, plus what its workers did (``rep``: this process's report)."""
    done = st["state"] == "done"
    st.update({"committed": sum(r["committed"] for r in reports), "embedded": sum(r["embedded"] for r in reports),
               "sample_committed": sum(r["sample"] for r in reports), "seconds": round(time.time() - t0, 2),
               "stopped": "done" if done else rep.reason(),
               # who works on, where this process found every shard taken (its own workers have exited)
               "busy": st["holders"] if rep.stopped == "no free shard" and not done else [],
               "workers_exit": [p.exitcode for p, _ in procs], "worker_reports": reports, "engine": rep.engine})
    return st
