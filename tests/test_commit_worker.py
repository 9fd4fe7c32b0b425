"""An import whose catalog commits run in a worker process (:mod:`nobackfill.collection.commit_worker`):
the same collection as an import that commits in process, batches reported in order, errors of the
worker raised by the import, and SIGKILLs of the import or of its worker at any moment losing and
duplicating nothing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nobackfill.adopt.importing as importing
from nobackfill.gallery.atomic_files import AHEAD
from nobackfill.collection.collection import Collection
from nobackfill.collection.commit_worker import CommitWorker, CommitWorkerError
from nobackfill.adopt.importing import _stage_vectors, add_vectors, import_source
from nobackfill.adopt.sources import open_source

from _collection_helpers import OLD_REF, HashEncoder

HERE = Path(__file__).resolve().parent


def _data(folder: Path, n: int, enc: HashEncoder) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    texts = [f"caption number {i}" for i in range(n)]
    np.save(folder / "e.npy", enc.encode_texts(texts))
    (folder / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i:05d}", "text": t, "group": i % 7, "tag": [i % 2]})
                                            + "\n" for i, t in enumerate(texts)))
    return folder


def _source(folder: Path, batch_rows: int = 40):
    return open_source(f"npy:{folder / 'e.npy'}", table=folder / "t.jsonl", id_column="id", source_column="text",
                       modality="text", batch_rows=batch_rows)


def _state(path: Path) -> tuple[list, int]:
    """Every live row as stored (id, modality, key, source, metadata, serving space and row), and the
    store's row count."""
    c = Collection.open(path)
    rows = sorted((r.id, r.modality, r.key, json.dumps(r.source, sort_keys=True),
                   json.dumps(r.metadata, sort_keys=True),
                   r.space, r.pos) for r in c.catalog.rows())
    return rows, c.gallery(c.current_space).count("text")


def test_a_worker_import_stores_what_an_import_in_process_stores(tmp_path):
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", 250, enc)
    seen: dict[bool, list[int]] = {True: [], False: []}
    reports = {}
    for apart in (False, True):
        reports[apart] = import_source(tmp_path / f"c{apart}", _source(data), enc, model=OLD_REF, trust_model=True,
                                       progress=False, commit_process=apart, on_batch=seen[apart].append)
    assert seen[True] == seen[False] == list(range(1, 8))  # 250 rows in batches of 40: each reported once, in order
    assert reports[True].to_dict() | {"seconds": 0, "items_per_s": 0} == \
        reports[False].to_dict() | {"seconds": 0, "items_per_s": 0, "collection": str(tmp_path / "cTrue")}
    assert _state(tmp_path / "cTrue") == _state(tmp_path / "cFalse")
    assert reports[True].commit_worker_peak_rss_mb > 10 and reports[False].commit_worker_peak_rss_mb == 0
    c = Collection.open(tmp_path / "cTrue")
    assert len(c) == 250 and c.get("t00012").metadata == {"text": "caption number 12", "group": 5, "tag": [0]} and not c.verify()
    again = import_source(c, _source(data, 64), enc, model=OLD_REF, trust_model=True, progress=False,
                          commit_process=True)  # everything held: the worker's transactions find it unchanged
    assert (again.added, again.unchanged, again.stored) == (0, 250, 0)
    assert _state(tmp_path / "cTrue") == _state(tmp_path / "cFalse")


def test_placed_rows_commit_as_commit_rows_does_new_changed_and_unchanged_alike(tmp_path):
    enc = HashEncoder(16, "old")
    x = enc.encode_texts([f"t{i}" for i in range(8)])
    y = enc.encode_texts([f"other {i}" for i in range(8)])
    ids = [f"i{i}" for i in range(8)]
    twins = {}
    for how in ("rows", "placed"):
        c = Collection.create(tmp_path / how, space_id=enc.space_id, dim=16, model=OLD_REF)
        add_vectors(c, ids[:5], x[:5], modality="text", metadata=[{"n": i} for i in range(5)])
        batch = dict(modality="text", metadata=[{"n": i} for i in range(2, 8)], space_id=None, where="b")
        vecs = np.concatenate([x[2:4], y[4:5], x[5:8]])  # i2, i3 unchanged; i4 a new vector; i5..i7 new
        if how == "rows":
            r = add_vectors(c, ids[2:], vecs, **batch)
            assert (r.added, r.unchanged) == (4, 2)
        else:
            staged = _stage_vectors(c, ids[2:], vecs, sources=None, **batch)
            assert c.commit_placed_columns(staged.space, staged.columns()) == 4
        twins[how] = _state(tmp_path / how)
    assert twins["rows"] == twins["placed"]
    c = Collection.open(tmp_path / "placed")
    served = c.gallery(c.current_space).get_vectors("text", [c.get("i4").key, c.get("i2").key])
    assert len(c) == 8 and np.allclose(served, [y[4], x[2]], atol=1e-6) and not c.verify()


@pytest.fixture
def started(monkeypatch) -> list[CommitWorker]:
    """The workers the imports of a test start, in order."""
    workers: list[CommitWorker] = []

    class Recorded(CommitWorker):
        def __init__(self, path, **kw):
            super().__init__(path, **kw)
            workers.append(self)

    monkeypatch.setattr(importing, "CommitWorker", Recorded)
    return workers


def test_large_sources_into_local_collections_commit_apart_by_default(tmp_path, monkeypatch, started):
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", 60, enc)
    import_source(tmp_path / "small", _source(data), enc, model=OLD_REF, trust_model=True, progress=False)
    assert started == []  # below the threshold: in process
    monkeypatch.setattr(importing, "COMMIT_APART_ROWS", 50)
    import_source(tmp_path / "large", _source(data), enc, model=OLD_REF, trust_model=True, progress=False)
    assert [w.path for w in started] == [str(tmp_path / "large")] and len(Collection.open(tmp_path / "large")) == 60


def test_a_worker_that_cannot_open_the_collection_fails_the_import_naming_why(tmp_path):
    worker = CommitWorker(tmp_path / "nothing-here")
    with pytest.raises(CommitWorkerError, match=r"nothing-here.*(exit status|not a collection|no collection)"):
        for _ in range(3):
            worker.submit("s", [["a"], ["text"], ["a#00"], ["{}"], ["{}"], [0]])
            time.sleep(0.5)
        worker.close()
    worker.abort()


def test_an_import_stopped_by_its_caller_stops_its_worker_and_finishes_when_run_again(tmp_path, started):
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", 1000, enc)

    def stop(n: int) -> None:
        if n == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_source(tmp_path / "c", _source(data), enc, model=OLD_REF, trust_model=True, progress=False,
                      commit_process=True, on_batch=stop)
    assert started[0]._proc.poll() is not None  # the worker was stopped with the import
    assert 80 <= len(Collection.open(tmp_path / "c")) <= 1000  # two batches committed, maybe more in flight
    rep = import_source(tmp_path / "c", _source(data), enc, model=OLD_REF, trust_model=True, progress=False,
                        commit_process=True)
    import_source(tmp_path / "ref", _source(data), enc, model=OLD_REF, trust_model=True, progress=False)
    assert rep.added + rep.unchanged == 1000 and _state(tmp_path / "c") == _state(tmp_path / "ref")


def test_a_store_that_fails_in_the_storing_thread_fails_the_import_with_its_error(tmp_path, monkeypatch, started):
    """Vectors are stored in a thread of the import while it checks the next batch: a failure there
    is raised by the import as it was, its worker is stopped, and what was committed stays (the
    same command again finishes the job)."""
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", 400, enc)
    real = importing._store_batch
    calls = []

    def failing(collection, staged, v, prepared=None):
        calls.append(len(staged.ids))
        if len(calls) == 3:
            raise OSError("disk full (a test)")
        real(collection, staged, v, prepared)

    monkeypatch.setattr(importing, "_store_batch", failing)
    with pytest.raises(OSError, match="disk full"):
        import_source(tmp_path / "c", _source(data), enc, model=OLD_REF, trust_model=True, progress=False,
                      commit_process=True)
    assert started[0]._proc.poll() is not None
    assert len(calls) == 3  # nothing stored after the failure
    assert len(Collection.open(tmp_path / "c")) <= 80  # at most the two batches stored before it
    monkeypatch.setattr(importing, "_store_batch", real)
    rep = import_source(tmp_path / "c", _source(data), enc, model=OLD_REF, trust_model=True, progress=False,
                        commit_process=True)
    import_source(tmp_path / "ref", _source(data), enc, model=OLD_REF, trust_model=True, progress=False)
    assert rep.added + rep.unchanged == 400 and _state(tmp_path / "c") == _state(tmp_path / "ref")


def test_a_bad_row_in_a_later_batch_stops_the_import_and_its_worker_naming_the_row(tmp_path, started):
    """The reader refuses a row (a modality that is neither image nor text: a repeated id is refused
    before anything is committed) while earlier batches are being stored and committed: the import
    raises the reader's error (not the stopped worker's), saying what stayed, the worker is
    stopped, and the batches before the bad row are all that was committed."""
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", 400, enc)
    lines = [json.dumps({**json.loads(x), "modality": "video" if i == 250 else "text"}) + "\n"
             for i, x in enumerate((data / "t.jsonl").read_text().splitlines())]
    (data / "t.jsonl").write_text("".join(lines))
    with pytest.raises(ValueError, match=r"row 251: column 'modality' must be .*(items or more\) were committed|"
                                         r"any batch of .* stays there).* run the same command again"):
        import_source(tmp_path / "c", _source(data), enc, model=OLD_REF, trust_model=True, progress=False,
                      commit_process=True)
    assert started[0]._proc.poll() is not None
    c = Collection.open(tmp_path / "c")
    assert len(c) <= 240 and all(int(i.id[1:]) < 240 for i in c.items().values()) and not c.verify()


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the worker through /proc")
def test_sigkills_of_the_import_or_of_its_worker_lose_and_duplicate_nothing(tmp_path):
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", 3000, enc)
    target = tmp_path / "c"
    rng = random.Random(7)
    cmd = [sys.executable, str(HERE / "_import_kill_helper.py"), str(data), str(target)]
    kills = rounds = 0
    while kills < 6 and rounds < 15:
        rounds += 1
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and proc.poll() is None and time.monotonic() < deadline:
            kids = _children(proc.pid)  # wait until the worker runs, then let some batches through
            if kids:
                time.sleep(rng.uniform(0.0, 0.6))
                victim = kids[0] if rounds % 2 else proc.pid  # the worker, or the import
            else:
                time.sleep(0.02)
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:  # it had finished already
                pass
        proc.wait(timeout=60)
        for kid in _children(proc.pid):
            os.kill(kid, signal.SIGKILL)
    assert kills >= 6
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    import_source(tmp_path / "ref", _source(data), enc, model=OLD_REF, trust_model=True, progress=False)
    rows, stored = _state(target)
    ref_rows, _ = _state(tmp_path / "ref")
    assert [r[:5] for r in rows] == [r[:5] for r in ref_rows]  # every item once, as the source says
    assert stored == len({r[2] for r in rows}) == 3000  # no vector stored twice
    c = Collection.open(target)
    assert not c.verify()
    assert not list((c.gallery(c.current_space).path / AHEAD).glob("*"))  # the killed runs' files written ahead: swept
    hit = c.gallery(c.current_space).get_vectors("text", [rows[5][2]])
    assert np.allclose(hit[0], enc.encode_texts(["caption number 5"])[0], atol=1e-6)


def test_a_batch_is_six_columns_of_one_length(tmp_path):
    worker = CommitWorker(tmp_path / "nothing-here")
    try:
        with pytest.raises(ValueError, match="six columns of one length"):
            worker.submit("s", [["a"], ["text"], ["a#00"], ["{}"], ["{}"]])
        with pytest.raises(ValueError, match="six columns of one length"):
            worker.submit("s", [["a", "b"], ["text"], ["a#00"], ["{}"], ["{}"], [0]])
    finally:
        worker.abort()


def test_a_killed_worker_is_one_collection_error_not_a_pipe_traceback(tmp_path):
    """Trial AH: the OOM killer's SIGKILL of the worker made the import print two tracebacks
    (BrokenPipeError, then CommitWorkerError during its handling), exit 1. The error is the worker's
    alone, a CollectionError: a command says it in one line."""
    from nobackfill.catalog.items import CollectionError
    from nobackfill.cli._common import user_errors

    enc = HashEncoder(16, "a")
    c = Collection.create(tmp_path / "c", space_id=enc.space_id, dim=16, model=OLD_REF)
    worker = CommitWorker(c.path)
    try:
        worker._proc.kill()
        worker._proc.wait()
        with pytest.raises(CommitWorkerError, match=r"ended \(exit status -9\) after 0 of 0 batches") as got:
            for _ in range(50):  # (the pipe's buffer takes the first frames)
                worker.submit("s", [["a"] * 2000, ["text"] * 2000, ["a#00"] * 2000, ["{}"] * 2000, ["{}"] * 2000,
                                    [0] * 2000])
        assert isinstance(got.value, CollectionError) and isinstance(got.value, user_errors())
        assert got.value.__context__ is None and got.value.__cause__ is None
    finally:
        worker.abort()
