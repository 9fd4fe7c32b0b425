"""How commands end and what they say when there is nothing to do (trials V and X)."""

from __future__ import annotations

import pytest
import typer

from nobackfill._interrupts import Terminated, interrupt_cause, terminated
from nobackfill.cli._collection_print import interrupt_report, print_backfill_run


class _Client:
    def status(self):
        return {"items": {"image": 2, "text": 3}, "backfill": {"done": 1, "total": 5}, "current": "s",
                "spaces": {"s": {"name": "m"}}}


@pytest.mark.parametrize("raised, code, said", [(KeyboardInterrupt, 130, "interrupted:"),
                                                (Terminated, 143, "interrupted (SIGTERM):")])
def test_an_add_or_backfill_interrupted_says_by_what_and_exits_accordingly(raised, code, said, capsys):
    """trial X: a SIGTERM of `collection add` / `backfill` / `upgrade` exited 130 as a Ctrl-C."""
    with pytest.raises(typer.Exit) as e:
        with interrupt_report(_Client(), "photos", "backfill"):
            raise raised()
    err = capsys.readouterr().err
    assert e.value.exit_code == code and said in err and "serves 1 of 5 items" in err


def test_a_sigterm_is_told_through_the_exceptions_raised_while_handling_it():
    try:
        try:
            raise Terminated()
        except KeyboardInterrupt:
            raise RuntimeError("during the tidy-up")
    except RuntimeError as e:
        assert terminated(e) and interrupt_cause(e) == "SIGTERM"
    assert interrupt_cause(KeyboardInterrupt()) == "Ctrl-C" and not terminated(None)


@pytest.mark.parametrize("st, said", [
    ({"done": 0, "total": 0, "fraction": 1.0, "committed": 0, "seconds": 0.1, "state": "done"}, "it holds no item"),
    ({"done": 30, "total": 30, "fraction": 1.0, "committed": 0, "seconds": 0.1, "state": "done"},
     "its current space serves every item already (30)"),
    ({"done": 0, "total": 0, "fraction": 1.0, "committed": 0, "seconds": 0.1, "state": "done", "no_source": 7},
     "7 item(s) of older spaces have no source"),
])
def test_a_backfill_with_nothing_to_do_says_why(st, said, capsys):
    print_backfill_run("photos", st, None)
    out = capsys.readouterr().out
    assert out.startswith("backfill of photos: nothing to backfill; ") and said in out and "0/0" not in out


def test_a_backfill_that_committed_says_what_it_did(capsys):
    print_backfill_run("photos", {"done": 30, "total": 30, "fraction": 1.0, "committed": 30, "seconds": 2.0,
                                  "state": "done", "stopped": "done"}, None)
    assert "30/30 items in the current space (100.0%); 30 committed in 2.0s, 15.0 items/s" in capsys.readouterr().out


def test_the_demo_refuses_a_folder_without_the_models_before_it_writes_a_world(tmp_path):
    from nobackfill.demo import run_demo

    with pytest.raises(FileNotFoundError, match="world-old: no model there"):
        run_demo(tmp_path / "world", tmp_path / "models", tmp_path / "out", log=lambda m: None)
    assert not (tmp_path / "world").exists()


@pytest.mark.parametrize("verbose", [False, True])
def test_our_warnings_are_said_as_warnings_on_the_command_line(verbose, capsys):
    """trial X: a warning of ours (a label given two values) printed as a bare line, unlike the
    command's own ``warning: ...`` lines; with ``-v`` it carries level and logger, as the libraries'."""
    import logging

    from nobackfill._logging import set_verbose

    try:
        set_verbose(verbose)
        logging.getLogger("nobackfill.data.folder").warning("captions.jsonl: 1 label(s) given other values")
    finally:
        set_verbose(False)
    err = capsys.readouterr().err
    said = "WARNING nobackfill.data.folder: " if verbose else "warning: "
    assert said + "captions.jsonl: 1 label(s) given other values" in err and err.count("label(s)") == 1, err


@pytest.mark.parametrize("cmd, said", [
    (["eval", "retrieval", "--query-model", "m", "--gallery-model", "m"], "interrupted: nothing was written"),
    (["reco", "build-memory", "--model", "m", "--out", "{tmp}/mem"],
     "interrupted: what was embedded, if embedding had begun, stays in"),
])
def test_an_interrupt_before_a_loop_says_what_it_left(tmp_path, monkeypatch, cmd, said):
    """trial Y: a Ctrl-C of `eval compat` / `reco build-memory` before any loop printed a bare "interrupted"."""
    from typer.testing import CliRunner

    import nobackfill.evaluate as evaluate
    from nobackfill.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "load_eval_data", interrupted)
    args = [a.replace("{tmp}", str(tmp_path)) for a in cmd] + ["--data", str(tmp_path)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 130 and said in " ".join(r.output.split()), r.output
    r = CliRunner().invoke(app, ["collection", "status", str(tmp_path / "nope")])  # the next command: its own
    assert "what was embedded" not in r.output and "nothing was written" not in r.output


@pytest.mark.parametrize("signum, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_the_program_exits_ends_it_at_once_without_a_traceback(signum, code):
    """trial AB: a second Ctrl-C as ``train`` exited printed a traceback from torch's exit hook."""
    import subprocess
    import sys

    child = ("import os, signal, sys, time\nsys.argv = ['nobackfill', '--version']\n"
             "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # (as at a terminal; a suite in the
             # background of a shell runs with SIGINT ignored)
             "from nobackfill.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('exiting', flush=True)\n"
             f"os.kill(os.getpid(), signal.{signum})\ntime.sleep(10)\nprint('not ended')\n")
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == code and r.stdout.splitlines()[-1] == "exiting", (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["[bold]demo", "p:thumbs_up:", "con:x", "a[/]b"])
def test_names_print_as_written_not_as_markup_or_emoji(tmp_path, name, monkeypatch):
    """Trial AI D6: `collection create '[bold]demo'` printed "collection demo", 'p:thumbs_up:' an emoji
    (and '[/]' would raise rich's markup error): what a command prints names the collection as given,
    on stdout and in its errors on stderr, while the messages' own colours stay."""
    from pathlib import Path

    from typer.testing import CliRunner

    from nobackfill.cli import app

    monkeypatch.chdir(tmp_path)
    models = Path(__file__).resolve().parents[1] / "models"
    r = CliRunner().invoke(app, ["collection", "create", name, "--model", str(models / "world-old")])
    assert r.exit_code == 0 and f"collection {name}" in r.output and (tmp_path / name).is_dir(), r.output
    r = CliRunner().invoke(app, ["collection", "status", name])
    assert r.exit_code == 0 and f"collection {name}:" in r.output, r.output
    r = CliRunner().invoke(app, ["collection", "create", name, "--model", str(models / "world-old")])
    assert r.exit_code == 2 and name in r.output and "error:" in r.output, r.output


def test_the_consoles_print_text_as_written_unless_told_markup(capsys):
    from nobackfill.cli._common import console, results

    results.print("[bold]x :thumbs_up: [/]")
    console.print("[red]error:[/red] y", markup=True)
    out, err = capsys.readouterr()
    assert out.strip() == "[bold]x :thumbs_up: [/]" and err.strip() == "error: y"


def test_a_worker_that_did_its_share_while_another_holds_the_rest_says_so(capsys):
    """Trial AI D4: the process that committed half a 2-shard job said "none was left for this one"
    and advised --shards M, which it had been given."""
    busy = [{"pid": 7, "host": "vm", "shard": 0, "since": "T"}]
    base = {"done": 1195, "total": 1200, "fraction": 0.996, "seconds": 36.5, "busy": busy, "shards": 2}
    print_backfill_run("photos", {**base, "committed": 600}, None)
    out = capsys.readouterr().out
    assert "this process's share is done (600 committed in 36.5s" in out and "pid 7 on vm" in out
    assert "none was left" not in out and "--shards M" not in out
    print_backfill_run("photos", {**base, "committed": 0}, None)
    out = capsys.readouterr().out
    assert "none was left for this one" in out and "--shards M" in out


def test_status_names_a_skipped_direction_only_for_a_space_that_serves_items(capsys):
    """Trial AI D2: status asked for `--queries` ("no captions to hold out") for a space in between
    that held no item any more."""
    from nobackfill.cli._collection_print import print_fitted

    fitted = {"enabled": True, "fits": [{"pairs": 64, "skipped": {"empty/t2i": "no captions to hold out",
                                                                   "full/t2i": "too few pairs"}}], "next": 128}
    print_fitted(fitted, {"empty": {"image": 0, "text": 0}, "full": {"image": 3, "text": 0}})
    out = capsys.readouterr().out
    assert "-> space full: too few pairs" in out and "space empty" not in out


def test_an_upgrade_lists_only_the_routes_into_what_the_older_space_holds(capsys):
    """Trial AK D6: the upgrade of a collection of images alone listed i2t and t2t routes, into
    captions it does not have. Given status's spaces, the route lines are those into a modality the
    space holds, with one line naming the rest; without them (the route command) all are listed."""
    from nobackfill.cli._collection_print import print_routes

    route = {"route": "old-model", "w": None, "pinned": False, "calibrated": False, "calibration": {}}
    routes = {"old": {d: dict(route) for d in ("t2i", "i2i", "i2t", "t2t")}}
    print_routes(routes, {"old": {"image": 40, "text": 0}})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "  space old holds no texts: i2t, t2t not shown (they would answer nothing)", out
    assert [line.split(":")[0] for line in out[1:]] == ["  space old t2i", "  space old i2i"]
    print_routes(routes, {"old": {"image": 0, "text": 5}})
    out = capsys.readouterr().out
    assert "holds no images: t2i, i2i not shown" in out and "old t2t: old-model" in out and "old i2i:" not in out
    print_routes(routes)
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_the_index_line_of_a_milvus_collection_adopted_in_place():
    """Trial AL D1: `collection status` of a collection that adopted a Milvus collection in place
    failed with KeyError 'count': an adopted space's index says what it is, not how many vectors
    nobackfill stores (it stores none)."""
    from nobackfill.cli._collection_print import index_line

    adopted = {"image": {"in_use": "HNSW", "metric": "COSINE", "adopted": "products", "search_params": {"ef": 128}}}
    assert index_line(adopted, {"image": 300}) == ("the Milvus collection 'products' adopted in place (image vectors; "
                                                   "its own index HNSW, COSINE, ef 128)")
    own = {"image": {"backend": "milvus", "in_use": "HNSW", "count": 5}}
    assert index_line(own, {"image": 5}) == "milvus: HNSW over 5 stored image vectors"
