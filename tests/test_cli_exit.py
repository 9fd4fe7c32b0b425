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


@pytest.mark.parametrize("argv, says", [
    (["collection", "status"], "error: Missing argument 'name'. (see 'nobackfill collection status --help')"),
    (["collection", "status", "c", "--json", "true"], "error: Got unexpected extra argument(s) (true)"),
    (["collection", "nope"], "error: No such command 'nope'. (see 'nobackfill collection --help')"),
    (["--no-such-flag"], "error: No such option: --no-such-flag"),
])
def test_a_usage_error_is_one_line_and_exit_2(argv, says):
    """A usage error reads like every other error: one line naming the command's --help, exit 2 (not
    click's framed panel with the usage above it)."""
    code = f"import sys\nsys.argv = ['nobackfill', *{argv!r}]\nfrom nobackfill.cli import main\nmain()\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith(says), r.stderr
    assert r.stdout == ""


def test_version_and_flags_without_a_value_in_the_help():
    r = subprocess.run([sys.executable, "-m", "nobackfill.cli", "--version"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("nobackfill ") and r.stdout.split()[1][0].isdigit(), r
    from typer.testing import CliRunner

    out = CliRunner().invoke(cli.app, ["collection", "add", "--help"], env={"COLUMNS": "100"}).stdout
    assert "--json" in out and "--skip-bad" in out and "--help" in out
    assert "<bool>" not in out  # a flag takes no value: `--json true` is refused
    assert "<path>" in out  # an option that takes one still says what


def test_an_error_in_the_librarys_words_names_the_commands_options():
    """The library's argument names in an error become the running command's options; a name the
    command does not have, or an ordinary word, stays as it is."""
    import typer
    from typer._click.core import Context

    from nobackfill.cli._common import in_flags

    root = typer.main.get_command(cli.app)
    backfill = root.commands["collection"].commands["backfill"]
    with Context(backfill, info_name="backfill"):
        assert in_flags("batch_size must be a whole number >= 1, got 0") == "--batch-size must be a whole number >= 1, got 0"
        assert in_flags("rate must be > 0") == "--rate must be > 0"
        assert in_flags("gpus_per_actor needs engine='ray'") == "--gpus-per-actor needs --engine ray"
        assert in_flags("fit_sample is wrong; the order of the rest") == "fit_sample is wrong; the order of the rest"
        assert in_flags("see /a/batch_size.json (batch_size=3)") == "see /a/batch_size.json (batch_size=3)"
        known = "--set: unknown field(s) ['nokey']; known: ['batch_size', 'k']"  # a config's keys stay keys
        assert in_flags(known) == known and in_flags("--set: batch_size must be >= 1") == "--set: batch_size must be >= 1"
        assert in_flags("keys: ['batch_size']") == "keys: ['batch_size']"
        assert in_flags("RecoTrainConfig: field 'loop': rate must be > 0") == "--rate must be > 0"  # the flag says it
        assert in_flags("Milvus: MilvusException: rate") == "Milvus: MilvusException: rate"
    assert in_flags("batch_size must be >= 1") == "batch_size must be >= 1"  # no command running: as it is


@pytest.mark.parametrize("error, says", [
    (OSError(28, "No space left on device", "c/spaces/s/chunks/image-00001.npz"), "the disk is full (c/spaces/s/"),
    ("sqlite", "the disk is full: nothing past the last commit was kept"),
    (OSError(30, "Read-only file system", "c/catalog.sqlite"), "cannot be written (c/catalog.sqlite)"),
])
def test_a_full_or_read_only_disk_is_one_line_not_a_traceback(tmp_path, monkeypatch, error, says):
    """trial T: a full disk made `collection add` and `backfill` print a 155-line traceback (exit 1)."""
    import sqlite3

    from typer.testing import CliRunner

    from nobackfill.client.local import LocalClient

    if error == "sqlite":
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            error = RuntimeError("catalog c: OperationalError")
            error.__cause__ = inner

    def full(*a, **kw):
        raise error

    monkeypatch.setattr(LocalClient, "status", full)
    r = CliRunner().invoke(cli.app, ["collection", "status", str(tmp_path)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and says in r.output, r.output


def test_a_text_only_model_asked_for_images_is_bad_input_not_a_traceback():
    """trial R: `eval retrieval` with a text-only model on image data printed a NotImplementedError
    traceback; the refusal is a ValueError too (one line, exit 2; 422 over HTTP)."""
    from pathlib import Path

    from nobackfill.client.errors import InvalidRequest, as_client_error
    from nobackfill.encoders import load_encoder
    from nobackfill.encoders.base import NoImageTower

    enc = load_encoder(Path(__file__).resolve().parents[1] / "models" / "m30k-old-text")
    with pytest.raises(NoImageTower, match="text-only encoder: it cannot embed images") as e:
        enc.encode_images([])
    assert isinstance(e.value, ValueError) and isinstance(e.value, NotImplementedError)
    assert isinstance(as_client_error(e.value), InvalidRequest)


def test_a_presets_model_fields_are_whole_numbers_above_0():
    from nobackfill.encoders.zoo import ModelSpec

    for bad in ({"embed_dim": -3}, {"text_layers": 0}, {"vocab_size": 1.5}):
        with pytest.raises(ValueError, match="every model field is a whole number >= 1"):
            ModelSpec(**bad)
    assert ModelSpec(embed_dim=64).embed_dim == 64


@pytest.mark.parametrize("flags, says", [(["--backend", "bogus"], "unknown index backend 'bogus'"),
                                         (["--tokens", "int8"], "--tokens must be one of float16, float32"),
                                         (["--token-dim", "16"], "--token-dim is for the token outputs")])
def test_index_checks_its_flags_before_it_writes_anything(tmp_path, flags, says):
    """trial R: a bad --backend or --tokens was refused after the data was read and the gallery
    folder made (one with vector chunks in it), which verify did not recognise."""
    from pathlib import Path

    from typer.testing import CliRunner

    root = Path(__file__).resolve().parents[1]
    r = CliRunner().invoke(cli.app, ["index", "--model", str(root / "models" / "world-old"), "--data",
                                     str(tmp_path / "no-data-needed"), "--out", str(tmp_path / "g"), *flags])
    assert r.exit_code == 2 and says in r.output and not (tmp_path / "g").exists(), r.output
