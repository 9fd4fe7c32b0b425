"""The backfill worker an in-process client runs in the background (the service's way): one thread
at a time, how it last stopped, and a stop that hands its shard back.

:class:`BackgroundWorker` runs ``one_run()`` (a :func:`~nobackfill.lifecycle.backfill.run_worker` or
its Ray driver, given :meth:`BackgroundWorker.stop_reason` as its ``stop``) in a daemon thread, again
while the job was resumed as the run stopped. :meth:`BackgroundWorker.stop` asks it to stop before its
next batch and waits for it: the worker then hands its shard back and records why it stopped (a
server's shutdown is not mistaken for a crash in ``collection status``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger("nobackfill.client")

__all__ = ["BackgroundWorker"]


class BackgroundWorker:
    """The client's background backfill worker: ``active`` (a thread runs, or is deciding whether to
    go on), ``error`` and ``stopped`` (why it last stopped), ``thread``, ``rate_cap`` (the items per
    second its run was capped at, None: none; a resume keeps it unless given another), ``run`` (the
    thread's number, from 1) and what it ``committed`` (the training sample's part: ``sample``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self.stopped: str | None = None
        self.active = False
        self.rate_cap: float | None = None
        self._stop_why: str | None = None
        self.run, self.committed, self.sample, self._live = 0, 0, 0, 0

    def progress(self, n: int) -> None:
        """A worker's ``progress``: ``n`` more items committed by the run now going (exact once it ends)."""
        self._live += n

    def stop_reason(self) -> str | None:
        """Why the running worker is to stop (None: go on); a worker's ``stop`` callable."""
        return self._stop_why

    def start(self, one_run: Callable[[], Any], resumed: Callable[[Any], bool], rate_cap: float | None = None) -> bool:
        """Run ``one_run()`` (capped at ``rate_cap`` items/s) in a new thread, again while
        ``resumed(report)`` (the job runs again after it stopped for a pause); False, and nothing
        started, when a worker is active already (it goes on at its own cap)."""
        with self.lock:
            if self.active:
                return False
            self.active, self.error, self.stopped, self._stop_why = True, None, None, None
            self.rate_cap = rate_cap
            self.run, self.committed, self.sample, self._live = self.run + 1, 0, 0, 0

        def work() -> None:
            try:
                while True:
                    rep = one_run()
                    with self.lock:
                        self.committed += getattr(rep, "committed", 0)  # (a run's WorkerReport)
                        self.sample += getattr(rep, "sample", 0)
                        self._live = 0
                        if self._stop_why is None and resumed(rep):
                            continue  # resumed (or started anew) while this worker was stopping
                        self.stopped, self.active = rep.reason(), False
                        return
            except Exception as e:  # reported by the status, never silent
                with self.lock:
                    self.error = f"{type(e).__name__}: {e}"
                    self.stopped, self.active = f"error: {self.error}", False
                log.exception("backfill worker failed")

        self.thread = threading.Thread(target=work, name="backfill", daemon=True)
        self.thread.start()
        return True

    def stop(self, why: str, timeout: float | None = None) -> bool:
        """Ask the running worker to stop (``why``: recorded as how it stopped) before its next batch,
        and wait up to ``timeout`` seconds for it (None: until it has); True once no worker runs."""
        self._stop_why = why
        thread = self.thread
        if thread is not None and thread.is_alive():
            thread.join(timeout)
        return not (thread is not None and thread.is_alive())

    def annotate(self, st: dict[str, Any]) -> dict[str, Any]:
        """``st`` (the job's status) with this worker: ``worker`` (running | idle), ``rate_cap`` (its
        run's, while it runs), ``worker_stopped`` (why it last stopped), ``error``, ``worker_run`` (its
        thread's number and what it committed so far: ``{run, committed, sample_committed}``)."""
        active = self.active
        st["worker"] = "running" if active else "idle"
        st["rate_cap"] = self.rate_cap if active else None
        if active and st["state"] == "idle":  # this worker is about to take a shard
            st["state"] = "running"
            st.pop("note", None)
            st.pop("last_worker", None)
        if self.error:
            st["error"] = self.error
        if self.stopped and not active:
            st["worker_stopped"] = self.stopped
        if self.run:
            st["worker_run"] = {"run": self.run, "committed": self.committed + self._live, "sample_committed": self.sample}
        return st
