"""The in-process client's background backfill worker (:mod:`nobackfill.client.worker`)."""

import threading
import time
from types import SimpleNamespace

from nobackfill.client.worker import BackgroundWorker


def _report(stopped):
    return SimpleNamespace(stopped=stopped, reason=lambda: stopped)


def test_stop_is_seen_by_the_run_and_recorded():
    w = BackgroundWorker()
    began = threading.Event()

    def one_run():
        began.set()
        while not (why := w.stop_reason()):
            time.sleep(0.01)
        return _report(why)

    assert w.start(one_run, resumed=lambda rep: True)  # a stop is never taken for a resume
    began.wait(5)
    assert not w.start(one_run, resumed=lambda rep: True)  # one worker at a time
    assert w.annotate({"state": "idle"})["state"] == "running"
    assert w.stop("the server stopped", timeout=5)
    st = w.annotate({"state": "idle"})
    assert st["worker"] == "idle" and st["worker_stopped"] == "the server stopped" and "error" not in st


def test_a_resumed_job_runs_again_and_a_failure_is_reported():
    w, runs = BackgroundWorker(), []

    def one_run():
        runs.append(1)
        if len(runs) == 3:
            raise RuntimeError("catalog gone")
        return _report("paused")

    w.start(one_run, resumed=lambda rep: rep.stopped == "paused")
    w.thread.join(5)
    st = w.annotate({"state": "idle"})
    assert len(runs) == 3 and st["error"] == "RuntimeError: catalog gone"
    assert st["worker_stopped"] == "error: RuntimeError: catalog gone"
    assert w.stop("closed", timeout=1)  # nothing runs: at once


def test_a_new_start_clears_an_earlier_stop():
    w = BackgroundWorker()
    w.stop("closed")
    w.start(lambda: _report(w.stop_reason() or "done"), resumed=lambda rep: False)
    w.thread.join(5)
    assert w.annotate({"state": "idle"})["worker_stopped"] == "done"
