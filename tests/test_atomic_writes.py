"""The one atomic write (nobackfill._atomic) and the writers moved onto it."""

from __future__ import annotations

import os
import signal
import stat
import time

import pytest

from nobackfill._atomic import atomic_write_bytes, atomic_write_text, write_atomically
from nobackfill._interrupts import Terminated, held_interrupts
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


class _InterruptedFile:
    """A file whose ``n``-th write is met by Ctrl-C / SIGTERM (as a signal arriving mid-write)."""

    def __init__(self, f, n: int, raised: type[KeyboardInterrupt]):
        self.f, self.n, self.raised = f, n, raised

    def write(self, data):
        self.n -= 1
        if self.n == 0:
            raise self.raised()
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, Terminated])
def test_an_interrupt_inside_torch_save_stays_the_interrupt_and_leaves_the_old_file(tmp_path, raised):
    """CI: SIGTERM inside a checkpoint's ``torch.save`` became torch's "unexpected pos" error on
    closing the half-written zip (exit 1 for 143)."""
    import torch

    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"old")
    state = {"w": torch.arange(50_000, dtype=torch.float32), "b": torch.ones(3)}
    with pytest.raises(raised) as e:
        write_atomically(target, lambda f: torch.save(state, _InterruptedFile(f, 4, raised)), tmp_prefix=".")
    assert type(e.value) is raised
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_signal_inside_held_interrupts_is_raised_when_the_block_ends(signum, raised):
    # (as the program has them; a suite run in the background of a shell ignores SIGINT)
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    before_term = signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(Terminated()))
    try:
        finished = []
        with pytest.raises(raised):
            with held_interrupts():
                os.kill(os.getpid(), signum)
                time.sleep(0.05)  # Python runs the handler between bytecodes: here it only records it
                finished.append(True)
        assert finished == [True]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before_int)
        signal.signal(signal.SIGTERM, before_term)


def test_held_interrupts_leaves_a_signal_python_does_not_handle_alone():
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with held_interrupts():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
