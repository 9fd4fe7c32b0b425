"""Status names the worker a backfill stopped on: a worker that held a shard and vanished without a
word (a catalog gone under it, a kill) over one that stopped at once because it found no free shard
(trial Q named the idle one, even when it stopped after the other's last renewal)."""

from __future__ import annotations

from unittest import mock

from nobackfill.lifecycle import backfill_jobs


def test_a_vanished_shard_holder_is_named_over_a_worker_that_found_no_free_shard():
    idle = {"owner": "vm:2:ab", "host": "vm", "pid": 2, "t": 200.0, "stopped": "no free shard: another worker is "
            "doing the work (pid 1 on vm)"}
    held = {"owner": "vm:1:cd", "renewed": 150.0, "shard": 0}
    with mock.patch.object(backfill_jobs, "_stopped_workers", return_value={idle["owner"]: idle}):
        last = backfill_jobs._last_worker(None, [held])
        assert last["pid"] == 1 and "without saying why" in last["stopped"]
        assert backfill_jobs._last_worker(None, [])["pid"] == 2  # no lease left unfinished: the idle one it is
    done = {**idle, "stopped": "done"}
    with mock.patch.object(backfill_jobs, "_stopped_workers", return_value={done["owner"]: done}):
        assert backfill_jobs._last_worker(None, [held])["pid"] == 2  # a later stop that says why stays the last


def test_a_worker_process_that_fails_says_one_line_not_a_traceback(tmp_path, capsys):
    import pytest

    from nobackfill.lifecycle.cluster.processes import _worker_main

    with pytest.raises(SystemExit) as e:
        _worker_main(lambda *a, **kw: None, str(tmp_path / "gone"), "m", {}, str(tmp_path / "report.json"))
    assert e.value.code == 1 and not (tmp_path / "report.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("worker pid ") and "gone is not a collection" in err[0], err
    assert err[0].endswith("run the same command again to go on)")


def test_a_job_started_with_more_shards_than_workers_is_done_by_one_worker_and_shared_by_more(tmp_path):
    """``shards`` (``--shards``): the first run sets the job's shards apart from its workers, so workers
    started later (other machines) find free ones; a worker alone goes through every shard."""
    import pytest

    from _collection_helpers import upgraded_collection
    from nobackfill.lifecycle.backfill import BackfillJob, BackfillSettingError, backfill_status, run_backfill

    c, old, new, pool, _ = upgraded_collection(tmp_path, n_images=6, captions=2)
    with pytest.raises(BackfillSettingError, match="shards must be a whole number >= 1"):
        run_backfill(c, new, shards=0, pool=pool)
    first = run_backfill(c, new, order="sequential", shards=3, limit=4, batch_size=2, pool=pool)
    assert BackfillJob.load(c).shards == 3 and first["shards"] == 3 and first["committed"] == 4
    second = run_backfill(c, new, order="sequential", shards=5, batch_size=2, pool=pool)  # a job's shards stay
    assert BackfillJob.load(c).shards == 3 and backfill_status(c)["state"] == "done"
    assert first["committed"] + second["committed"] == backfill_status(c)["total"] == 18


def test_shards_over_http_are_the_servers_own():
    import pytest

    from nobackfill.client import InvalidRequest
    from nobackfill.client.remote import RemoteClient

    with pytest.raises(InvalidRequest, match="shards"):
        RemoteClient("http://127.0.0.1:9", api_key="k").backfill_start(shards=2, wait=True)


def test_status_says_when_a_bridge_fit_past_its_threshold_did_not_run(tmp_path, monkeypatch):
    """trial Q: PostgreSQL stopped during a bridge fit; status went on saying "next at 288 pairs" with
    296 backfilled, and nothing of the fit that did not run."""
    from _collection_helpers import upgraded_collection
    from nobackfill.lifecycle import backfill_fit

    c, *_ = upgraded_collection(tmp_path, n_images=6, captions=2)
    state = {"target": c.current_space, "next": 4, "fits": [], "fraction": 0.01, "min": 1, "max": 10}
    monkeypatch.setattr(backfill_fit, "fit_state", lambda collection: dict(state))
    monkeypatch.setattr(backfill_fit, "_served_count", lambda collection, target: 6)
    monkeypatch.setattr(backfill_fit, "running_fit", lambda collection, st=None: None)
    assert backfill_fit.fit_summary(c)["overdue"] is True
    monkeypatch.setattr(backfill_fit, "running_fit", lambda collection, st=None: {"pairs": 6})
    assert backfill_fit.fit_summary(c)["overdue"] is False  # it is running
    monkeypatch.setattr(backfill_fit, "running_fit", lambda collection, st=None: None)
    monkeypatch.setattr(backfill_fit, "_served_count", lambda collection, target: 3)
    assert backfill_fit.fit_summary(c)["overdue"] is False  # not due yet


def test_the_status_line_of_a_fit_that_did_not_run(capsys):
    from nobackfill.cli._collection_print import print_fitted

    print_fitted({"enabled": True, "serving": [], "fits": [{"pairs": 144}], "next": 288, "overdue": True})
    out = " ".join(capsys.readouterr().out.split())
    assert "next at 288 backfilled pairs" in out and "the fit due at 288 pairs has not run" in out
