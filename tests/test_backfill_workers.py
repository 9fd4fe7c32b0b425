"""`collection backfill --workers N`: the worker processes it starts embed alongside it, and stop
(their batch committed, their shard handed back, why recorded) once the command is gone, however it
went (before, a SIGKILL of the command left them embedding on their own until their shards were
done)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _cli_helpers import ok, world_collection
from nobackfill.collection.collection import Collection
from nobackfill.lifecycle.backfill import backfill_status
from nobackfill.lifecycle.cluster.processes import PARENT_GONE, parent_gone

MODELS = Path(__file__).resolve().parents[1] / "models"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(what, timeout: float, step: float = 0.2):
    end = time.time() + timeout
    while time.time() < end:
        if (got := what()):
            return got
        time.sleep(step)
    return what()


def test_a_process_with_no_multiprocessing_parent_is_never_told_to_stop():
    assert parent_gone()() is None


@pytest.mark.slow
def test_the_worker_processes_of_a_killed_backfill_command_stop_and_hand_their_shards_back(tmp_path):
    world_collection(tmp_path, "c", MODELS / "world-old", n_train=2, n_val=2, n_test=30)
    path = tmp_path / "c"
    ok("collection", "upgrade", path, "--model", MODELS / "world-new", "--no-fit-bridge")
    cmd = [sys.executable, "-c", "from nobackfill.cli import app; app()", "collection", "backfill", str(path),
           "--workers", "2", "--rate", "2", "--batch-size", "1", "--order", "sequential"]
    tmp = tmp_path / "tmp"  # the command's temporary files: the worker's report folder must not be left there
    tmp.mkdir()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        # both workers hold a shard: the command's own and the process it started
        st = _wait(lambda: (s := backfill_status(Collection.open(path)))["workers"] == 2 and s, 120)
        assert st, backfill_status(Collection.open(path))
        done_before = st["done"]
        child = [h["pid"] for h in st["holders"] if h["pid"] != proc.pid]
        assert len(child) == 1 and _alive(child[0]), st["holders"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _wait(lambda: not _alive(child[0]), 30), "the worker process outlived the command that started it"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    st = backfill_status(Collection.open(path))
    # the command's own shard waits out no lease either (a killed holder of this host frees it); the
    # worker process handed its shard back itself and said why it stopped
    assert st["workers"] == 0 and st["state"] != "done", st
    assert st["last_worker"]["pid"] == child[0] and st["last_worker"]["stopped"] == PARENT_GONE, st
    assert st["done"] >= done_before and not Collection.open(path).verify()
    assert not list(tmp.glob("nobackfill-workers-*")), list(tmp.rglob("*"))
    # a later run finishes the job
    ok("collection", "backfill", path, "--workers", "2")
    assert backfill_status(Collection.open(path))["state"] == "done"


def test_a_worker_process_tells_its_bridge_fits_on_the_stderr_it_shares(tmp_path, monkeypatch, capsys):
    """A worker process of ``--workers N`` runs ``run_worker`` with a ``log`` that writes its lines
    (the bridge fits it runs) to stderr, each naming its pid, beside the command's own output."""
    import json as _json

    import nobackfill.search.models as models
    from _collection_helpers import upgraded_collection
    from nobackfill.lifecycle.cluster import processes as backfill_workers

    c, _old, new, pool, _ = upgraded_collection(tmp_path, 4, 1)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    seen = {}

    class Rep:
        def as_dict(self):
            return {"done": True}

    def fake_run_worker(collection, enc, **kw):
        seen.update(kw)
        kw["log"]("fitting bridges on 8 backfilled pairs")
        return Rep()

    report = tmp_path / "report.json"
    backfill_workers._worker_main(fake_run_worker, str(c.path), c.space(c.current_space).model, {"batch_size": 4},
                                  str(report))
    assert seen["batch_size"] == 4 and seen["stop"]() is None and _json.loads(report.read_text()) == {"done": True}
    assert f"worker pid {os.getpid()}: fitting bridges on 8 backfilled pairs" in capsys.readouterr().err


def test_relayed_worker_lines_and_every_workers_commits_reach_the_command(tmp_path, monkeypatch, capsys):
    """trial W: with --workers 2 the bar counted only the command's own worker, and the workers'
    lines, written beside the bar, were erased by it. Relayed, a worker writes its lines to a file
    beside its report; :func:`follow_workers` says them through ``log`` and feeds ``progress`` with
    what the collection has committed, whoever committed it."""
    import json as _json
    import types

    import nobackfill.search.models as models
    from _collection_helpers import upgraded_collection
    from nobackfill.lifecycle.cluster import processes as backfill_workers

    c, _old, new, pool, _ = upgraded_collection(tmp_path, 4, 1)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)

    class Rep:
        def as_dict(self):
            return {"done": True}

    def fake_run_worker(collection, enc, **kw):
        kw["log"]("fitting bridges on 8 backfilled pairs")
        kw["log"]("  t2i: ensemble -> route bridge")
        return Rep()

    report = tmp_path / "worker-1.json"
    backfill_workers._worker_main(fake_run_worker, str(c.path), c.space(c.current_space).model, {"batch_size": 4},
                                  str(report), True)
    assert "fitting bridges" not in capsys.readouterr().err  # not on the terminal beside the bar
    done, said, advanced = [10], [], []
    proc = types.SimpleNamespace(pid=4242)
    with backfill_workers.follow_workers([(proc, report)], lambda: done[0], advanced.append, said.append,
                                         every_s=0.05):
        done[0] = 25  # another worker's commits
        time.sleep(0.3)
        done[0] = 31
    assert sum(advanced) == 21 and said == ["worker pid 4242: fitting bridges on 8 backfilled pairs",
                                            "worker pid 4242:   t2i: ensemble -> route bridge"]
    assert _json.loads(report.read_text()) == {"done": True}


def _worker_stops(path: Path) -> list[str]:
    """What each worker of the collection at ``path`` recorded as its stop, by owner."""
    from nobackfill.lifecycle.backfill_jobs import _stopped_workers

    return [v.get("stopped") for _, v in sorted(_stopped_workers(Collection.open(path)).items())]


@pytest.mark.slow
@pytest.mark.parametrize("group,sig", [(False, signal.SIGINT), (True, signal.SIGINT), (False, signal.SIGTERM)],
                         ids=["the-command", "its-process-group", "sigterm-of-the-command"])
def test_ctrl_c_stops_the_worker_processes_too_and_says_what_stays(tmp_path, group, sig):
    """Trial N: a SIGINT of `collection backfill --workers 2` printed "interrupted" and then waited
    for its worker process to finish the whole job (or ran on past a minute). Now the workers commit
    their batch, hand their shard back and record the interruption; the command says how far the
    backfill got and that the same command goes on. ``group``: a terminal's Ctrl-C, which reaches
    every process of the group (the workers leave it to the command). A SIGTERM of the command is
    recorded as such by its worker processes too (they had written "Ctrl-C")."""
    from nobackfill.lifecycle.cluster.processes import INTERRUPTED, TERMINATED

    world_collection(tmp_path, "c", MODELS / "world-old", n_train=2, n_val=2, n_test=30)
    path = tmp_path / "c"
    ok("collection", "upgrade", path, "--model", MODELS / "world-new", "--no-fit-bridge")
    cmd = [sys.executable, "-c", "from nobackfill.cli import main; main()", "collection", "backfill", str(path),
           "--workers", "2", "--rate", "2", "--batch-size", "1", "--order", "sequential"]
    # (a shell running the suite in the background ignores SIGINT, and its children inherit that: a
    # Python started so never gets a KeyboardInterrupt; a terminal's command has it by default)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        st = _wait(lambda: (s := backfill_status(Collection.open(path)))["workers"] == 2 and s, 120)
        assert st, backfill_status(Collection.open(path))
        child = [h["pid"] for h in st["holders"] if h["pid"] != proc.pid]
        (os.killpg if group else os.kill)(proc.pid, sig)
        out, err = proc.communicate(timeout=60)  # not the rest of the job at 2 items/s (~45 s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = " ".join((out + err).split())
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), text
    said = "interrupted: " if sig == signal.SIGINT else "interrupted (SIGTERM): "
    assert said + "the current space of" in text and "Run the same command again to go on" in text, text
    assert "Traceback" not in text, text
    assert _wait(lambda: not _alive(child[0]), 10)
    st = backfill_status(Collection.open(path))
    recorded = INTERRUPTED if sig == signal.SIGINT else TERMINATED
    assert st["workers"] == 0 and st["state"] != "done" and st["last_worker"]["stopped"] == recorded, st
    assert _worker_stops(path) == [recorded, recorded], _worker_stops(path)
    assert not Collection.open(path).verify()
    ok("collection", "backfill", path, "--workers", "2")
    assert backfill_status(Collection.open(path))["state"] == "done"
