"""The one atomic write (nobackfill._atomic) and the writers moved onto it."""

from __future__ import annotations

import os
import stat

import pytest

from nobackfill._atomic import atomic_write_bytes, atomic_write_text, write_atomically
from nobackfill.data.folder import CAPTIONS_FILE, DataFormatError, write_pairs
from nobackfill.train.loop import check_output


def test_a_failed_fill_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def fill(f):
        f.write(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_atomically(target, fill, tmp_prefix=".")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_a_fill_that_returns_false_writes_nothing(tmp_path):
    assert write_atomically(tmp_path / "f.bin", lambda f: False) is False
    assert not list(tmp_path.iterdir())
    assert write_atomically(tmp_path / "f.bin", lambda f: f.write(b"x") and None) is True
    assert (tmp_path / "f.bin").read_bytes() == b"x"


def test_the_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        atomic_write_bytes(tmp_path / "b.bin", [b"a", memoryview(b"b")], crash_points=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert (tmp_path / "b.bin").read_bytes() == b"ab"


def test_write_pairs_with_a_bad_record_keeps_the_old_captions(tmp_path):
    write_pairs(tmp_path, [{"image": "a.png", "caption": "a red square", "lang": "en"}])
    before = (tmp_path / CAPTIONS_FILE).read_text(encoding="utf-8")
    with pytest.raises(DataFormatError, match="record 2"):
        write_pairs(tmp_path, [{"image": "b.png", "caption": "ünïcode ok", "lang": "de"}, {"image": "c.png", "lang": "en"}])
    assert (tmp_path / CAPTIONS_FILE).read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [CAPTIONS_FILE]
    write_pairs(tmp_path, [{"image": "b.png", "caption": "ünïcode ok", "lang": "de"}])
    assert "ünïcode ok" in (tmp_path / CAPTIONS_FILE).read_text(encoding="utf-8")


def test_a_killed_checkpoint_write_leaves_a_folder_the_run_resumes_into(tmp_path):
    """What a kill during a checkpoint or log write leaves (their temporary files) is the run's own."""
    (tmp_path / "train_log.jsonl").write_text("")
    (tmp_path / ".checkpoint.pt.0123456789ab").write_bytes(b"partial")
    (tmp_path / ".train_log.jsonl.0123456789ab").write_bytes(b"partial")
    check_output(tmp_path, finished="model.safetensors")
    with pytest.raises(ValueError, match="holds files already"):
        check_output(tmp_path, finished="model.safetensors", resumable=False)
    (tmp_path / "other.txt").write_text("x")
    with pytest.raises(ValueError, match="other.txt"):
        check_output(tmp_path, finished="model.safetensors")


def test_a_file_where_a_folder_above_an_output_must_be_is_found(tmp_path):
    """trial AA: `index --out model.safetensors/g` read all its data before the write failed."""
    from nobackfill._atomic import file_above

    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    assert file_above(f / "g") == f and file_above(f / "a" / "b" / "c.json") == f
    assert file_above(tmp_path / "new" / "x.json") is None and file_above(tmp_path / "x.json") is None
