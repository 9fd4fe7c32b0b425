"""The command line's exit: the objects of a finished command are moved out of the collector's reach
(``gc.freeze``), so the interpreter's exit does not traverse them (a second of a cold search)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import nobackfill.cli as cli


def test_main_freezes_the_collector_after_the_command_even_when_it_fails(monkeypatch):
    gc.unfreeze()
    try:
        monkeypatch.setattr(sys, "argv", ["nobackfill", "collection", "status", "/no/such/collection"])
        with pytest.raises(SystemExit) as e:
            cli.main()
        assert e.value.code != 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_frozen_exit_still_flushes_the_output_and_runs_exit_handlers(tmp_path):
    marker = tmp_path / "atexit"
    code = ("import atexit, sys\nfrom pathlib import Path\n"
            f"atexit.register(lambda: Path({str(marker)!r}).write_text('ran'))\n"
            "sys.argv = ['nobackfill', '--help']\nfrom nobackfill.cli import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "collection" in r.stdout
    assert marker.read_text() == "ran"
