"""``nobackfill lingual learn`` / ``eval`` refuse bad input with one line, exit 2, before anything is
read or written: out-of-range settings (``--show-config`` too), a language repeated in ``--tasks``, a
finished model in ``--out`` (named as the training commands name it), ``--limit`` below 1, ``--split``
on a data folder without splits. A finished, failed or interrupted ``learn`` leaves no hidden work
folder beside ``--out``, and a failed or interrupted one no ``--out`` either. Tiny world, tiny CLIP."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from _cli_helpers import error_line, tiny_en_de_world
from _compat_helpers import tiny_encoder

runner = CliRunner()


def _app():
    from nobackfill.cli import app

    return app


_error_line = error_line


def _leftovers(out):
    """What a run left of ``--out`` and of its hidden work folder."""
    return [p.name for p in (out, out.parent / f".{out.name}.work") if p.exists()]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny en+de world, a tiny CLIP (English only) and that CLIP after learning de."""
    d = tmp_path_factory.mktemp("world")
    data = tiny_en_de_world(d)
    model = tiny_encoder().save(d / "tiny-clip")
    learned = d / "runs" / "tiny-de"
    r = runner.invoke(_app(), _learn(model, data, learned, d / "cache"))
    assert r.exit_code == 0, r.output
    return data, model, learned, d / "cache"


def _learn(model, data, out, cache, *extra, tasks="en,de"):
    return ["lingual", "learn", "--model", str(model), "--tasks", tasks, "--data", str(data), "--out", str(out),
            "--steps", "2", "--batch-size", "8", "--vocab-size", "400", "--cache-dir", str(cache), *extra]


# ----------------------------------------------------------------------------- learn: settings
@pytest.mark.parametrize("show", [False, True])
@pytest.mark.parametrize("args, says", [
    (["--lr", "-1"], "lr must be a finite number > 0, got -1"),
    (["--lr", "0"], "lr must be a finite number > 0, got 0"),
    (["--set", "lr=-1"], "lr must be a finite number > 0, got -1"),
    (["--set", "lr=1e999"], "lr must be a finite number > 0, got inf"),
    (["--set", "lr=nan"], "lr must be a finite number > 0, got nan"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--set", "steps=0"], "steps must be >= 1, got 0"),
    (["--vocab-size", "0"], "task_vocab_size must be >= 1, got 0"),
    (["--threads", "0"], "threads must be >= 1, got 0"),
    (["--set", "warmup_frac=2"], "warmup_frac must be in [0, 1], got 2"),
    (["--set", "weight_decay=-0.1"], "weight_decay must be a finite number >= 0, got -0.1"),
    # trial AL: -3 was blamed on the data ("no 'de' captions ..."), 0 trained on every image
    (["--train-images", "-3"], "--train-images must be >= 1, got -3 (leave it out to train on every train image)"),
    (["--train-images", "0"], "--train-images must be >= 1, got 0 (leave it out to train on every train image)"),
    (["--train-lines", "0"], "--train-lines must be >= 1, got 0 (leave it out to train on every line)"),
])
def test_learn_refuses_out_of_range_settings_before_anything(world, tmp_path, args, says, show):
    data, model, _, cache = world
    out = tmp_path / "bad"
    extra = [*args, *(["--show-config"] if show else [])]
    line = _error_line(runner.invoke(_app(), _learn(model, data, out, cache, *extra)))
    assert line.endswith(says), line
    assert _leftovers(out) == [] and list(tmp_path.iterdir()) == []  # no empty --out, no work folder


def test_the_config_checks_its_ranges():
    from nobackfill.lingual.learner import LEARN_DEFAULTS, CLLConfig

    assert LEARN_DEFAULTS.lr > 0 and CLLConfig().steps >= 1  # the defaults pass
    for bad in ({"lr": math.inf}, {"lr": -1e-3}, {"temperature": 0.0}, {"memory_size": -1}, {"seed": -1},
                {"gamma_cl": math.nan}, {"batch_size": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CLLConfig(**bad)


# ----------------------------------------------------------------------------- learn: --tasks, --out
def test_learn_refuses_a_repeated_language(world, tmp_path):
    data, model, learned, cache = world
    out = tmp_path / "dup"
    line = _error_line(runner.invoke(_app(), _learn(learned, data, out, cache, tasks="en,de,de,fr")))
    assert line == "error: --tasks en,de,de,fr: de given more than once"
    assert _leftovers(out) == []


def test_learn_leaves_no_work_folder_and_names_a_finished_model(world, tmp_path):
    data, model, learned, cache = world
    assert sorted(p.name for p in learned.parent.iterdir()) == ["tiny-de"]  # no .tiny-de.work beside it
    assert (learned / "nobackfill.json").is_file() and (learned / "lingual.json").is_file()
    line = _error_line(runner.invoke(_app(), _learn(model, data, learned, cache)))
    assert line == (f"error: --out {learned}: holds a finished model already (nobackfill.json); give a new folder, "
                    "or remove it first to train again")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    line = _error_line(runner.invoke(_app(), _learn(model, data, other, cache)))
    assert "holds files already (notes.txt)" in line
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_learn_into_an_empty_folder_works(world, tmp_path):
    data, model, _, cache = world
    out = tmp_path / "empty"
    out.mkdir()
    r = runner.invoke(_app(), _learn(model, data, out, cache))
    assert r.exit_code == 0, r.output
    assert (out / "lingual.json").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def _stop_training(monkeypatch, exc):
    """Make the training loop of ``lingual learn`` write a log in its folder, then raise ``exc(out)``."""
    import nobackfill.lingual.learner as learner

    def train(method, batches, cfg, out, **kw):
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_log.jsonl").write_text("{}\n")
        raise exc(out)

    monkeypatch.setattr(learner, "train", train)


def test_an_interrupted_learn_leaves_nothing_and_says_it_does_not_checkpoint(world, tmp_path, monkeypatch):
    from nobackfill.train.loop import TrainingInterrupted

    data, model, _, cache = world
    _stop_training(monkeypatch, lambda out: TrainingInterrupted("cll_clip_teir", 1, 2, out))
    out = tmp_path / "stopped"
    r = runner.invoke(_app(), _learn(model, data, out, cache))
    assert r.exit_code == 130, r.output
    assert "interrupted at step 1 of 2 (learning de); nothing was written: lingual learn does not checkpoint" \
        in " ".join(r.output.split())
    assert "no checkpoint yet" not in r.output
    assert _leftovers(out) == [] and list(tmp_path.iterdir()) == []


def test_a_failed_learn_leaves_nothing(world, tmp_path, monkeypatch):
    data, model, _, cache = world
    _stop_training(monkeypatch, lambda out: FloatingPointError("loss is nan"))
    out = tmp_path / "failed"
    r = runner.invoke(_app(), _learn(model, data, out, cache))
    assert r.exit_code != 0 and isinstance(r.exception, FloatingPointError)
    assert _leftovers(out) == [] and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- eval: --limit, --split
def _eval(model, data, cache, *extra):
    return ["lingual", "eval", "--model", str(model), "--data", str(data), "--cache-dir", str(cache), *extra]


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_eval_refuses_a_limit_below_one(world, limit):
    data, _, learned, cache = world
    line = _error_line(runner.invoke(_app(), _eval(learned, data, cache, "--langs", "en", "--limit", limit)))
    assert line == f"error: --limit must be >= 1, got {limit} (leave it out to evaluate everything)"


def test_eval_refuses_a_split_of_a_folder_without_splits(world):
    data, _, learned, cache = world
    flat = data / "test"  # its own captions.jsonl: no splits
    line = _error_line(runner.invoke(_app(), _eval(learned, flat, cache, "--langs", "en", "--split", "bogus")))
    assert line.startswith(f"error: --split bogus: {flat} is a data folder without splits"), line
    line = _error_line(runner.invoke(_app(), _eval(learned, data, cache, "--langs", "en", "--split", "bogus")))
    assert line.startswith(f"error: {data}: a world root with no split 'bogus' (its splits: "), line  # named
    r = runner.invoke(_app(), _eval(learned, flat, cache, "--langs", "en", "--limit", "2", "--json"))
    assert r.exit_code == 0, r.output  # without --split the folder is evaluated
    line = _error_line(runner.invoke(_app(), _eval(learned, flat, cache, "--langs", "en,de,en")))
    assert line == "error: --langs en,de,en: en given more than once"
