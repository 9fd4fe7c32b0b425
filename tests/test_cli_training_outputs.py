"""What the training commands do with their ``--out`` and with Ctrl-C.

``compat train``, ``upgrade procrustes``, ``upgrade xbt`` and ``late train`` refuse an ``--out`` that
holds a finished result (of any method) or other files, with one line and exit 2, before anything is
read or computed; a killed run's folder is taken (the loop resumes its checkpoint; compat train,
which keeps none, trains afresh). Ctrl-C (SIGINT) in a training loop is one line, exit 130: the step
reached and whether a rerun resumes from a checkpoint; the rerun does."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from nobackfill.cli import app
from nobackfill.train.checkpoint import load_state, save_state
from nobackfill.train.loop import LoopConfig, ResumeMismatch, TrainingInterrupted, check_output, train

from _loop_helpers import CyclicBatches, ToyMethod

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = ["--backbone", "pixels", "--n-render-train", "900", "--n-render-eval", "600", "--n-train-classes", "8",
        "--split", "val", "--steps", "2", "--epochs", "0", "--train-steps", "3", "--threads", "1"]


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_error(r, *parts: str) -> None:
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("error: --out "), r.output
    for p in parts:
        assert p in r.output, r.output


# ----------------------------------------------------------------------------- --out
def test_compat_train_refuses_a_finished_result_of_any_method(tmp_path) -> None:
    out, cache = tmp_path / "ct", tmp_path / "cache"
    r = _invoke("compat", "train", "--method", "bct", "--out", out, "--cache-dir", cache, *TINY)
    assert r.exit_code == 0, r.output
    before = (out / "result.json").read_text()
    cache_files = sorted(cache.iterdir())
    for method in ("lce", "bct"):  # another method's result, and the same command again
        r = _invoke("compat", "train", "--method", method, "--out", out, "--cache-dir", tmp_path / "cache2", *TINY)
        _one_error(r, f"--out {out}: holds a finished result of bct already (result.json)", "give a new folder",
                   "remove it")
        assert not (tmp_path / "cache2").exists()  # refused before any data was rendered or cached
    assert (out / "result.json").read_text() == before and json.loads(before)["method"] == "bct"
    assert sorted(cache.iterdir()) == cache_files
    # a killed run (step folders, no result yet) is trained afresh by the same command
    (out / "result.json").unlink()
    r = _invoke("compat", "train", "--method", "bct", "--out", out, "--cache-dir", cache, *TINY)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "result.json").read_text())["method"] == "bct"
    # a file, or a folder of other files
    (tmp_path / "f").write_text("x")
    _one_error(_invoke("compat", "train", "--method", "bct", "--out", tmp_path / "f", *TINY), "is a file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    _one_error(_invoke("compat", "train", "--method", "bct", "--out", tmp_path / "other", *TINY),
               "holds files already (notes.txt)")


def test_upgrade_procrustes_refuses_an_earlier_upgrade(tmp_path) -> None:
    """Refused before a model is loaded: the models named need not even exist."""
    out = tmp_path / "up"
    out.mkdir()
    (out / "upgrade.json").write_text(json.dumps({"kind": "xbt"}))
    r = _invoke("upgrade", "procrustes", "--old", tmp_path / "no-old", "--new", tmp_path / "no-new",
                "--text-corpus", tmp_path / "no-text", "--out", out)
    _one_error(r, "holds files already (upgrade.json)", "give a new or empty folder")
    assert json.loads((out / "upgrade.json").read_text()) == {"kind": "xbt"}
    model = tmp_path / "model"
    model.mkdir()
    (model / "nobackfill.json").write_text("{}")
    r = _invoke("upgrade", "procrustes", "--old", tmp_path / "no-old", "--new", model,
                "--text-corpus", tmp_path / "no-text", "--out", model)
    _one_error(r, "is the model this command starts from")


def test_upgrade_xbt_and_late_train_refuse_a_finished_output(tmp_path) -> None:
    up = tmp_path / "up"
    up.mkdir()
    (up / "upgrade.json").write_text(json.dumps({"kind": "procrustes"}))
    r = _invoke("upgrade", "xbt", "--old", tmp_path / "no-old", "--new", tmp_path / "no-new", "--text-corpus",
                tmp_path / "no-text", "--pairs", tmp_path / "no-pairs", "--out", up)
    _one_error(r, "holds a finished upgrade already (upgrade.json)")
    model = tmp_path / "model"
    model.mkdir()
    (model / "nobackfill.json").write_text("{}")
    r = _invoke("late", "train", "--kind", "global", "--world", tmp_path / "no-world", "--out", model)
    _one_error(r, "holds a finished model already (nobackfill.json)")  # not "no world.json": nothing read
    r = _invoke("train", "--preset", "world-old", "--data", tmp_path / "no-world", "--out", model)
    _one_error(r, "holds a finished model already (nobackfill.json)")
    r = _invoke("train-text", "--data", tmp_path / "no-m30k", "--out", model)
    _one_error(r, "holds a finished model already (nobackfill.json)")
    r = _invoke("upgrade", "xbt-text", "--old", tmp_path / "no-old", "--data", tmp_path / "no-m30k", "--out", up)
    _one_error(r, "holds a finished upgrade already (upgrade.json)")


def test_check_output_takes_a_killed_run_and_refuses_a_finished_one(tmp_path) -> None:
    xbt = dict(finished="upgrade.json", what="upgrade", also=("stage1",))
    check_output(tmp_path / "absent", **xbt)
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", **xbt)
    killed = tmp_path / "killed"  # stage 1 done, stage 2 killed before its first checkpoint
    (killed / "stage1").mkdir(parents=True)
    (killed / "stage1" / "upgrade.json").write_text("{}")
    (killed / "train_log.jsonl").write_text("")
    check_output(killed, **xbt)
    (killed / "upgrade.json").write_text("{}")  # exported, killed before its checkpoint was removed
    (killed / "checkpoint.safetensors").write_bytes(b"")
    check_output(killed, **xbt)
    (killed / "checkpoint.safetensors").unlink()
    with pytest.raises(ValueError, match=r"holds a finished upgrade already \(upgrade.json\)"):
        check_output(killed, **xbt)
    with pytest.raises(ValueError, match="is the model this command starts from"):
        check_output(killed / "stage1", **xbt, sources=(None, killed / "stage1"))
    steps = tmp_path / "steps"
    (steps / "step1").mkdir(parents=True)
    check_output(steps, finished="result.json", what="result", also=("step*",))
    (steps / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds files already \(model.safetensors\)"):
        check_output(steps, finished="result.json", what="result", also=("step*",))
    odd = tmp_path / "odd"  # a folder by a checkpoint's name: refused now, not at the first save
    (odd / "checkpoint.safetensors").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"checkpoint.safetensors there is not a file; remove it"):
        check_output(odd, finished=None)
    (odd / "checkpoint.safetensors").rmdir()
    (odd / "checkpoint.safetensors").symlink_to(odd / "nowhere")
    with pytest.raises(ValueError, match=r"checkpoint.safetensors there is not a file; remove it"):
        check_output(odd, finished=None)


# ----------------------------------------------------------------------------- the loop on Ctrl-C
_Toy = ToyMethod



class _SignalledWhileSaving(_Toy):
    """SIGINT arrives while the checkpoint at ``at`` is being written (its state is read then)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.steps = at, 0

    def loss(self, batch, step):
        self.steps = step + 1
        return super().loss(batch, step)

    def state_dict(self):
        if self.steps == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().state_dict()


def test_ctrl_c_while_a_checkpoint_is_written_finishes_it_first(tmp_path) -> None:
    """The interrupt is held until the checkpoint is whole, then stops the run naming that checkpoint
    (it had ended in an error of the half-written zip file, with a traceback)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a test run may ignore it)
    try:
        cfg = LoopConfig(steps=20, lr=0.1, warmup=2, log_every=2, checkpoint_every=4, weight_decay=0.0)
        with pytest.raises(TrainingInterrupted) as e:
            train(_SignalledWhileSaving(at=8), CyclicBatches(), cfg, tmp_path / "a", progress=False)
        assert (e.value.step, e.value.checkpoint_step) == (8, 8)
        assert load_state(tmp_path / "a" / "checkpoint.safetensors")["step"] == 8
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, before)
    assert train(_Toy(), CyclicBatches(), cfg, tmp_path / "a", progress=False).steps == 20  # resumes from it


@pytest.mark.parametrize("damage", ["truncated", "not-a-checkpoint"])
def test_a_damaged_checkpoint_is_refused_naming_it(tmp_path, damage) -> None:
    """trial Y: a truncated checkpoint.pt ended `train` in torch's traceback (exit 1)."""
    cfg = LoopConfig(steps=20, lr=0.1, warmup=2, log_every=2, checkpoint_every=4, weight_decay=0.0)
    with pytest.raises(TrainingInterrupted):
        train(_Toy(interrupt_at=10), CyclicBatches(), cfg, tmp_path / "a", progress=False)
    ckpt = tmp_path / "a" / "checkpoint.safetensors"
    if damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    else:  # another safetensors file: weights, no run state
        save_file({"weights": torch.zeros(2)}, str(ckpt))
    kept = ckpt.read_bytes()
    said = "it is damaged" if damage == "truncated" else "not a checkpoint of this training loop"
    with pytest.raises(ResumeMismatch, match=rf"{re.escape(str(ckpt))}: .*{said}.*delete it to start afresh"):
        train(_Toy(), CyclicBatches(), cfg, tmp_path / "a", progress=False)
    assert ckpt.read_bytes() == kept  # left for the user to look at
    ckpt.unlink()
    assert train(_Toy(), CyclicBatches(), cfg, tmp_path / "a", progress=False).steps == 20


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickled_checkpoint_of_an_earlier_version_is_refused_unread(tmp_path, capsys) -> None:
    """Checkpoints were pickles read by ``torch.load(weights_only=False)``: one from elsewhere could
    run code on resume. They are now safetensors; an old ``checkpoint.pt`` is named, never loaded."""
    cfg = LoopConfig(steps=8, lr=0.1, warmup=2, log_every=2, checkpoint_every=4, weight_decay=0.0)
    out = tmp_path / "a"
    out.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"step": 4, "payload": _RunsCode(marker)}, out / "checkpoint.pt")
    check_output(out, finished=None)  # a killed run's folder: the command goes on, the loop says what it is
    with pytest.raises(ResumeMismatch, match=r"checkpoint.pt: a checkpoint of an earlier nobackfill, a pickle"):
        train(_Toy(), CyclicBatches(), cfg, out, progress=False)
    assert not marker.exists() and (out / "checkpoint.pt").is_file()
    (out / "checkpoint.pt").rename(tmp_path / "aside.pt")
    with pytest.raises(TrainingInterrupted):  # a checkpoint of this version beside it, and a kill's temporary file
        train(_Toy(interrupt_at=6), CyclicBatches(), cfg, out, progress=False)
    (tmp_path / "aside.pt").rename(out / "checkpoint.pt")
    (out / ".checkpoint.safetensors.0123456789ab").write_bytes(b"half")
    assert train(_Toy(), CyclicBatches(), cfg, out, progress=True).steps == 8
    assert "checkpoint.pt beside it is an earlier version's (a pickle): not read" in capsys.readouterr().err
    assert not marker.exists() and sorted(p.name for p in out.iterdir()) == ["train_log.jsonl", "w.pt"]


def test_a_checkpoint_round_trips_every_kind_of_run_state(tmp_path) -> None:
    shared = torch.arange(6.0)
    state = {"w": shared, "view": shared[::2], "again": shared, "empty": torch.zeros(0, 3),
             "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"params": [0], "betas": (0.9, 0.99),
                                                                                  "foreach": None}]},
             "numpy_rng": np.random.get_state(), "python_rng": random.getstate(), "nan": float("nan"),
             "marked": {"__tensor__": "not a tensor"}, "rng": torch.get_rng_state()}
    save_state(state, tmp_path / "c.safetensors")
    back = load_state(tmp_path / "c.safetensors")
    assert torch.equal(back["view"], torch.tensor([0.0, 2.0, 4.0])) and torch.equal(back["again"], shared)
    assert back["empty"].shape == (0, 3) and back["opt"]["state"][0]["step"].item() == 3.0
    assert back["opt"]["param_groups"][0]["betas"] == (0.9, 0.99) and back["marked"] == {"__tensor__": "not a tensor"}
    assert back["python_rng"] == random.getstate() and math.isnan(back["nan"])
    np.random.set_state(back["numpy_rng"])
    torch.set_rng_state(back["rng"])
    damaged = bytearray((tmp_path / "c.safetensors").read_bytes())
    damaged[-20] ^= 0x40  # one bit of a tensor (trial AB: resumed, then the loss was nan)
    (tmp_path / "c.safetensors").write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="do not match the checksum"):
        load_state(tmp_path / "c.safetensors")
    save_state({"step": 300, "w": torch.zeros(4)}, tmp_path / "s.safetensors")  # trial AC: the run state too
    raw = (tmp_path / "s.safetensors").read_bytes()
    assert b'"step\\": 300' in raw  # (the state's JSON, escaped inside the header's)
    (tmp_path / "s.safetensors").write_bytes(raw.replace(b'"step\\": 300', b'"step\\": 301'))
    with pytest.raises(ValueError, match="do not match the checksum"):
        load_state(tmp_path / "s.safetensors")
    with pytest.raises(TypeError, match="not object"):
        save_state({"x": object()}, tmp_path / "d.safetensors")
    assert not (tmp_path / "d.safetensors").exists()


def test_the_loop_says_where_an_interrupted_run_stood(tmp_path) -> None:
    cfg = LoopConfig(steps=20, lr=0.1, warmup=2, log_every=2, checkpoint_every=4, weight_decay=0.0)
    with pytest.raises(TrainingInterrupted) as e:
        train(_Toy(interrupt_at=3), CyclicBatches(), cfg, tmp_path / "a", progress=False)
    assert (e.value.step, e.value.checkpoint) == (3, None)
    assert e.value.message() == "interrupted at step 3 of 20 (toy); no checkpoint yet: a rerun starts afresh"
    never = dataclasses.replace(cfg, checkpoint_every=10**9)  # compat train's runs keep none
    with pytest.raises(TrainingInterrupted) as e:
        train(_Toy(interrupt_at=3), CyclicBatches(), never, tmp_path / "never", progress=False)
    assert e.value.message() == "interrupted at step 3 of 20 (toy); this run keeps no checkpoint: a rerun starts afresh"
    with pytest.raises(KeyboardInterrupt) as e:  # still a KeyboardInterrupt for any caller
        train(_Toy(interrupt_at=10), CyclicBatches(), cfg, tmp_path / "b", progress=False)
    assert (e.value.step, e.value.checkpoint_step) == (10, 8)
    assert e.value.message() == (f"interrupted at step 10 of 20 (toy); the checkpoint at step 8 in {tmp_path / 'b'} "
                                 "resumes it: rerun the same command")
    with pytest.raises(TrainingInterrupted) as e:  # resumed from step 8, interrupted again before a checkpoint
        train(_Toy(interrupt_at=9), CyclicBatches(), cfg, tmp_path / "b", progress=False)
    assert (e.value.step, e.value.checkpoint_step) == (9, 8)
    other = type("_Other", (_Toy,), {"name": "other"})
    with pytest.raises(ResumeMismatch, match=r"written by a run of toy \(now other\)"):
        train(other(), CyclicBatches(), cfg, tmp_path / "b", progress=False)
    res = train(_Toy(), CyclicBatches(), cfg, tmp_path / "b", progress=False)
    assert res.steps == 20 and not (tmp_path / "b" / "checkpoint.safetensors").exists()


def test_ctrl_c_outside_a_loop_is_one_line_too(tmp_path, monkeypatch) -> None:
    """Before the loop (reading the world): "interrupted", exit 130, no traceback; in the loop: its line."""
    import nobackfill.data.world as world

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(world, "load_world_spec", interrupted)
    r = _invoke("late", "train", "--kind", "global", "--out", tmp_path / "m")
    assert r.exit_code == 130 and r.output.strip() == "interrupted", r.output
    import nobackfill.late.world as late_world

    def in_the_loop(*a, **kw):
        raise TrainingInterrupted("cmli-contrastive", 7, 9, tmp_path / "m", tmp_path / "m" / "checkpoint.safetensors", 5)

    monkeypatch.setattr(world, "load_world_spec", lambda *a: object())
    monkeypatch.setattr(late_world, "train_world_method", in_the_loop)
    monkeypatch.setattr("nobackfill.encoders.load_encoder", lambda *a: SimpleNamespace(tokenizer=None))
    r = _invoke("late", "train", "--kind", "cmli", "--out", tmp_path / "m")
    assert r.exit_code == 130, r.output
    assert r.output.strip() == (f"interrupted at step 7 of 9 (cmli-contrastive); the checkpoint at step 5 in "
                                f"{tmp_path / 'm'} resumes it: rerun the same command"), r.output


# ----------------------------------------------------------------------------- SIGINT, end to end
@pytest.fixture(scope="module")
def late_setup(tmp_path_factory) -> dict:
    from nobackfill.data.world import WorldSpec

    from _late_helpers import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("sigint")
    tok = tiny_tokenizer()
    tiny_model(root, "student", 16, tok)
    tiny_model(root, "teacher", 16, tok, seed=1).save(root / "teacher-model")
    (root / "world").mkdir()
    (root / "world" / "world.json").write_text(json.dumps(dataclasses.asdict(WorldSpec())))
    return {"root": root}


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "nobackfill.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            # SIGINT as at a terminal, even when this test runs with it ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt(p: subprocess.Popen, ready, timeout: float = 120.0, sig: int = signal.SIGINT) -> tuple[int, str]:
    t0 = time.time()
    while not ready() and p.poll() is None and time.time() - t0 < timeout:
        time.sleep(0.1)
    assert p.poll() is None, f"the run ended before it was interrupted:\n{p.communicate()[1][-3000:]}"
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    return p.returncode, err


def _late_train_args(root: Path, out: Path) -> list[str]:
    """A `late train` that would run for ever, checkpointing every 5 steps."""
    return ["late", "train", "--kind", "global", "--world", str(root / "world"), "--preset", str(root / "student.toml"),
            "--teacher", str(root / "teacher-model"), "--steps", "100000", "--batch-size", "4", "--threads", "1",
            "--set", "loop.checkpoint_every=5", "--out", str(out)]


def test_ctrl_c_in_late_train_says_where_it_stood_and_the_rerun_resumes(late_setup) -> None:
    root = late_setup["root"]
    out = root / "run"
    args = _late_train_args(root, out)
    ckpt = out / "checkpoint.safetensors"
    code, err = _interrupt(_start(args), ckpt.is_file)
    assert code == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    m = re.fullmatch(r"interrupted at step (\d+) of 100000 \(contrastive\); the checkpoint at step (\d+) in (.+) "
                     r"resumes it: rerun the same command", err.strip())
    assert m and m.group(3) == str(out), err
    step, saved = int(m.group(1)), int(m.group(2))
    assert saved % 5 == 0 and 5 <= saved <= step
    assert load_state(ckpt)["step"] == saved
    # the same command again resumes from that checkpoint (and is refused nothing)
    first = ckpt.stat().st_mtime_ns
    code, err = _interrupt(_start(args), lambda: ckpt.stat().st_mtime_ns != first)
    assert code == 130, err
    assert f"resuming contrastive in {out} from step {saved} of 100000 (its checkpoint)" in err, err
    m = re.search(r"interrupted at step (\d+) of 100000 \(contrastive\); the checkpoint at step (\d+)", err)
    assert m and int(m.group(2)) > saved, err


def test_json_on_stdout_is_strict_as_the_files_are(capsys) -> None:
    """``--json`` on stdout writes an undefined metric (NaN) as null, as ``--out FILE`` does; a parser
    that follows RFC 8259 reads it (it had printed ``NaN``)."""
    from nobackfill.cli._common import emit_json

    emit_json({"rel_NFR": float("nan"), "rows": [1.5, float("inf")], "ok": 2}, True)
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON")) == \
        {"rel_NFR": None, "rows": [1.5, None], "ok": 2}


def test_upgrade_xbt_reads_its_pairs_before_stage_1_trains(tmp_path, monkeypatch) -> None:
    """Too few image-caption pairs is found before stage 1's minutes of training, not after."""
    from nobackfill.compat import data as compat_data
    from nobackfill.compat import xbt

    calls = []
    monkeypatch.setattr(xbt, "pretrain_phi", lambda *a, **k: calls.append("stage 1"))

    def too_few(path, n=None, lang="en"):
        raise ValueError(f"{path}: only 40 image-caption pairs, asked for {n}")

    monkeypatch.setattr(compat_data, "load_pair_source", too_few)
    root = Path(__file__).resolve().parents[1] / "models"
    with pytest.raises(ValueError, match="only 40 image-caption pairs, asked for 64"):
        xbt.upgrade_xbt(root / "world-old", root / "world-new", tmp_path / "corpus", tmp_path / "pairs",
                        tmp_path / "out", dataclasses.replace(xbt.XBTUpgradeConfig(), n_pairs=64))
    assert calls == []


def test_sigterm_ends_a_training_as_ctrl_c_does_with_exit_143(late_setup) -> None:
    """trial V: SIGTERM (timeout, kill, systemd) ended a run without a word and left what Ctrl-C tidies."""
    out = late_setup["root"] / "run-term"
    code, err = _interrupt(_start(_late_train_args(late_setup["root"], out)), (out / "checkpoint.safetensors").is_file,
                           sig=signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert re.fullmatch(r"interrupted at step \d+ of 100000 \(contrastive\); the checkpoint at step \d+ in .+ "
                        r"resumes it: rerun the same command \(SIGTERM\)", err.strip()), err


def test_a_diverging_training_is_one_line_naming_the_step_and_what_to_change(late_setup, tmp_path) -> None:
    """trial AB: ``train --set train.lr=1e6`` ended in a traceback of FloatingPointError (exit 1)."""
    root = late_setup["root"]
    r = _invoke("late", "train", "--kind", "global", "--world", root / "world", "--preset", root / "student.toml",
                "--steps", "30", "--batch-size", "4", "--threads", "1", "--set", "lr=1e9",
                "--set", "loop.checkpoint_every=1", "--out", tmp_path / "run")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    said = " ".join(r.output.split())
    assert said.startswith("error: contrastive: the loss is nan at step "), said
    assert "the training diverged; try a lower learning rate" in said, said
    assert "has these settings: delete it (or give another --out) to train with others" in said, said


def test_late_train_kd_refuses_a_teacher_without_an_image_tower(late_setup, tmp_path) -> None:
    """trial AL: ``late train --kind kd --teacher models/m30k-old-text`` ended in a traceback
    (AttributeError: 'BertConfig' object has no attribute 'vision_config')."""
    root, text_only = late_setup["root"], Path(__file__).resolve().parents[1] / "models" / "m30k-old-text"
    r = _invoke("late", "train", "--kind", "kd", "--world", root / "world", "--preset", root / "student.toml",
                "--teacher", text_only, "--steps", "2", "--batch-size", "4", "--out", tmp_path / "kd")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    said = " ".join(r.output.split())
    assert said.startswith(f"error: {text_only}: the model embeds only text (it has no image tower)"), said
    assert not (tmp_path / "kd").exists()
