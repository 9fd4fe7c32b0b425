"""Tests of the training loop, contrastive pre-training and ``train_preset`` (tiny models)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nobackfill.data.world import WorldSpec, generate_world
from nobackfill.encoders import load_encoder
from nobackfill.train.contrastive import info_nce
from nobackfill.train.checkpoint import load_state
from nobackfill.train.loop import LoopConfig, ResumeMismatch, lr_factor, train
from nobackfill.train.world_model import train_preset

from _loop_helpers import CyclicBatches, ToyMethod
from conftest import tiny_preset

SRC = Path(__file__).resolve().parents[1] / "src"

PRESET = tiny_preset(dim=32, steps=12)

#: run train_preset in a child that SIGKILLs itself when the loop writes its second checkpoint
#: (so the first one, at step 4, is on disk and the log already has lines past it)
KILL_CHILD = r"""
import os, signal, sys
import torch
torch.set_num_threads(1)
import nobackfill.train.loop as loop
from nobackfill.train.world_model import train_preset

_save, calls = loop.save_state, [0]

def save(obj, path):
    calls[0] += 1
    if calls[0] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    _save(obj, path)

loop.save_state = save
preset, data, out = sys.argv[1:4]
train_preset(preset, data, out, eval_size=16, progress=False, checkpoint_every=4, log_every=2)
sys.exit("training finished although it should have been killed")
"""


def _state(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_encoder(model_dir).model.state_dict()


def _assert_same_weights(a: Path, b: Path) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, different[:5]


def _log_steps(model_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (model_dir / "train_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train")
    preset = root / "tiny.toml"
    preset.write_text(PRESET)
    world = root / "world"
    world.mkdir()
    (world / "world.json").write_text(json.dumps(dataclasses.asdict(WorldSpec())))
    return {"root": root, "preset": preset, "world": world}


@pytest.fixture(scope="module")
def reference(setup) -> Path:
    """An uninterrupted run (seed 0)."""
    out = setup["root"] / "ref"
    result = train_preset(setup["preset"], setup["world"], out, eval_size=16, progress=False, command="test")
    assert result.steps == 12 and math.isfinite(result.last_loss)
    return out


# ----------------------------------------------------------------------------- pieces
def test_info_nce_by_hand() -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    s = 2.0
    # s * a @ b.T, by hand: row i of a against row j of b
    logits = [[s * 0.6, s * 1.0], [s * 0.8, s * 0.0]]

    def ce(row, target):
        return -row[target] + math.log(sum(math.exp(x) for x in row))

    rows = (ce(logits[0], 0) + ce(logits[1], 1)) / 2
    cols = (ce([logits[0][0], logits[1][0]], 0) + ce([logits[0][1], logits[1][1]], 1)) / 2
    want = 0.5 * (rows + cols)
    got = info_nce(a, b, s)
    assert got.shape == () and abs(float(got) - want) < 1e-6
    assert abs(float(info_nce(a, b, torch.tensor(s))) - want) < 1e-6
    # symmetric in its two arguments; perfectly aligned pairs with a large scale give ~0 loss
    assert abs(float(info_nce(b, a, s)) - want) < 1e-6
    assert float(info_nce(a, a, 100.0)) < 1e-6


def test_lr_factor_shape() -> None:
    cfg = LoopConfig(steps=100, warmup=10)
    f = [lr_factor(i, cfg) for i in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(x < y for x, y in zip(f[:9], f[1:10]))  # linear warm-up
    assert f[10] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(f[10:], f[11:]))  # cosine decay
    assert f[55] == pytest.approx(0.5)
    assert 0 < f[99] < 0.01 and lr_factor(100, cfg) == pytest.approx(0.0) and lr_factor(500, cfg) == 0.0
    const = LoopConfig(steps=100, warmup=10, schedule="constant")
    assert lr_factor(5, const) == pytest.approx(0.6) and lr_factor(50, const) == lr_factor(99, const) == 1.0
    assert lr_factor(0, LoopConfig(steps=10, warmup=0)) == 1.0
    with pytest.raises(ValueError, match="steps"):
        LoopConfig(steps=0)
    with pytest.raises(ValueError, match="schedule"):
        LoopConfig(schedule="linear")


def _Quadratic(nan_at: int | None = None) -> ToyMethod:
    """The toy method with its group's lr scaled by 2 (checked in the log's lr)."""
    return ToyMethod(nan_at=nan_at, lr_scale=2.0)


def test_loop_toy_method(tmp_path) -> None:
    cfg = LoopConfig(steps=10, lr=0.1, warmup=2, log_every=3, checkpoint_every=4, weight_decay=0.0)
    res = train(_Quadratic(), CyclicBatches(), cfg, tmp_path, progress=False)
    assert [r["step"] for r in res.history] == [3, 6, 9, 10] == _log_steps(tmp_path)
    assert res.history[-1]["lr"] == pytest.approx(0.2 * lr_factor(9, cfg))  # lr_scale applied
    assert (tmp_path / "w.pt").is_file() and not (tmp_path / "checkpoint.safetensors").exists()
    with pytest.raises(FloatingPointError, match="step 2"):
        train(_Quadratic(nan_at=2), CyclicBatches(), cfg, tmp_path / "nan", progress=False)


def test_a_checkpoint_of_other_settings_is_refused_and_a_rerun_log_starts_afresh(tmp_path, capsys) -> None:
    """Resuming with another seed or lr would train on with the old ones (the optimiser's state)
    while the new ones were recorded: refused, naming them. Same settings: resumed, and said so.
    A finished output trained again logs its own run only."""
    from nobackfill.train.loop import ResumeMismatch

    cfg = LoopConfig(steps=8, lr=0.1, warmup=2, log_every=2, checkpoint_every=4, weight_decay=0.0)
    train(_Quadratic(), CyclicBatches(), cfg, tmp_path / "a", progress=False)
    assert _log_steps(tmp_path / "a") == [2, 4, 6, 8]
    train(_Quadratic(), CyclicBatches(), cfg, tmp_path / "a", progress=False)  # no checkpoint left: from step 0
    assert _log_steps(tmp_path / "a") == [2, 4, 6, 8]  # not appended to the first run's
    other = dataclasses.replace(cfg, seed=3, lr=0.5)
    with pytest.raises(FloatingPointError):  # a run of other settings stopped after its checkpoint at step 4
        train(_Quadratic(nan_at=5), CyclicBatches(), other, tmp_path / "b", progress=False)
    with pytest.raises(ResumeMismatch, match=r"with lr 0.5 \(now 0.1\), seed 3 \(now 0\)"):
        train(_Quadratic(), CyclicBatches(), cfg, tmp_path / "b", progress=False)
    logs = dataclasses.replace(other, log_every=1)  # how often it logs does not change what is trained
    res = train(_Quadratic(), CyclicBatches(), logs, tmp_path / "b", progress=True)
    assert res.steps == 8 and "from step 4 of 8" in capsys.readouterr().err


# ----------------------------------------------------------------------------- train_preset
def test_train_preset_writes_model_dir(reference, setup) -> None:
    enc = load_encoder(reference)
    assert enc.embed_dim == 32 and enc.meta["name"] == "ref"
    assert (reference / "recipe.json").is_file() and (reference / "train_log.jsonl").is_file()
    assert not (reference / "checkpoint.safetensors").exists()
    recipe = json.loads((reference / "recipe.json").read_text())
    assert recipe["preset"] == "tiny" and recipe["loop"]["steps"] == 12 and recipe["command"] == "test"
    assert recipe["world"]["seed"] == 0 and recipe["model"]["vocab_size"] == 300
    assert "eval/t2i_R@1" in recipe["final_eval"]
    log = [json.loads(x) for x in (reference / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 12 and "eval/i2t_R@1" in log[-1] and math.isfinite(log[-1]["loss"])
    px = np.zeros((2, 64, 64, 3), np.uint8)
    assert enc.encode_images(px).shape == (2, 32)
    assert enc.encode_texts(["a red circle"]).shape == (1, 32)
    assert len(enc.tokenizer) <= 300


def test_train_preset_reproducible(reference, setup) -> None:
    again = setup["root"] / "again"
    train_preset(setup["preset"], setup["world"], again, eval_size=16, progress=False)
    _assert_same_weights(reference, again)
    assert load_encoder(again).space_id == load_encoder(reference).space_id
    ref_log = [json.loads(x) for x in (reference / "train_log.jsonl").read_text().splitlines()]
    new_log = [json.loads(x) for x in (again / "train_log.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in ref_log] == [r["loss"] for r in new_log]


def test_train_preset_exact_resume_after_kill(reference, setup) -> None:
    out = setup["root"] / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", KILL_CHILD, str(setup["preset"]), str(setup["world"]), str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (out / "checkpoint.safetensors").is_file() and not (out / "config.json").exists()
    assert load_state(out / "checkpoint.safetensors")["step"] == 4
    assert _log_steps(out) == [2, 4, 6, 8]  # logged past the checkpoint before the kill

    other = setup["root"] / "world-seed-7"  # trial AB: a rerun on other data resumed and trained on both
    other.mkdir()
    (other / "world.json").write_text(json.dumps(dataclasses.asdict(WorldSpec(seed=7))))
    kept = (out / "checkpoint.safetensors").read_bytes()
    with pytest.raises(ResumeMismatch, match=rf"was written by a run with data '{re.escape(str(setup['world']))}' "
                                             rf"\(now '{re.escape(str(other))}'\), data contents '[0-9a-f]+' \(now"):
        train_preset(setup["preset"], other, out, eval_size=16, progress=False, checkpoint_every=4, log_every=2)
    assert (out / "checkpoint.safetensors").read_bytes() == kept

    moved = setup["root"] / "world-moved"  # the same world elsewhere resumes (trial AC: a copy was refused)
    shutil.copytree(setup["world"], moved)
    result = train_preset(setup["preset"], moved, out, eval_size=16, progress=False,
                          checkpoint_every=4, log_every=2)
    assert result.steps == 12 and not (out / "checkpoint.safetensors").exists()
    _assert_same_weights(reference, out)
    assert load_encoder(out).space_id == load_encoder(reference).space_id
    assert _log_steps(out) == [2, 4, 6, 8, 10, 12]  # steps 6 and 8 not logged twice
    assert [r["step"] for r in result.history] == [2, 4, 6, 8, 10, 12]
    ref_last = json.loads((reference / "train_log.jsonl").read_text().splitlines()[-1])
    assert result.history[-1]["loss"] == ref_last["loss"]


def test_train_preset_user_folder(setup) -> None:
    """A user-format folder (no world.json): folder batches, English captions, small val split."""
    data = generate_world(setup["root"] / "user", WorldSpec(seed=5, n_train=40, n_val=10, n_test=0,
                                                            langs=("en", "de"), captions_per_image=2),
                          workers=1, progress=False)
    (data / "world.json").unlink()
    out = setup["root"] / "user-model"
    result = train_preset(setup["preset"], data, out, steps=5, progress=False)  # eval_size 500 > 10 images
    assert result.steps == 5 and math.isfinite(result.last_loss)
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["world"] is None and recipe["loop"]["steps"] == 5
    assert "eval/t2i_R@1" in result.history[-1]
    assert load_encoder(out).encode_texts(["a red circle"]).shape == (1, 32)
    assert recipe["eval_on"] == f"the first 10 images of {data / 'val'}"


def test_a_folder_without_val_says_its_eval_is_on_training_images(setup, caplog) -> None:
    """trial Y: a folder with no val/ was evaluated on its first training images, said nowhere."""
    data = generate_world(setup["root"] / "flat", WorldSpec(seed=7, n_train=24, n_val=0, n_test=0, langs=("en",),
                                                            captions_per_image=1), workers=1, progress=False)
    flat = data / "train"
    out = setup["root"] / "flat-model"
    with caplog.at_level("WARNING", logger="nobackfill.train.world_model"):
        train_preset(setup["preset"], flat, out, steps=2, progress=False)
    said = f"the first 24 training images ({flat} has no val/ folder: not held out)"
    assert json.loads((out / "recipe.json").read_text())["eval_on"] == said and said in caplog.text


def test_train_preset_world_folder_without_stream(setup) -> None:
    """A generated world trained from its files (``stream=False``)."""
    data = generate_world(setup["root"] / "files", WorldSpec(seed=6, n_train=32, n_val=8, n_test=0,
                                                             langs=("en",), captions_per_image=1),
                          workers=1, progress=False)
    out = setup["root"] / "files-model"
    result = train_preset(setup["preset"], data, out, steps=3, stream=False, eval_size=8, progress=False)
    assert result.steps == 3 and (out / "config.json").is_file()
    assert json.loads((out / "recipe.json").read_text())["world"]["seed"] == 6


def test_a_resume_with_other_run_settings_or_another_model_is_refused(tmp_path) -> None:
    """What the caller records as the run's settings (batch size, data, model shape) must match
    the checkpoint's, as the loop settings must; a checkpoint of another model's shapes is one
    ResumeMismatch, not a load error; the checkpoint interval may change."""
    from nobackfill.train.loop import ResumeMismatch

    cfg = LoopConfig(steps=8, lr=0.1, warmup=2, log_every=2, checkpoint_every=4, weight_decay=0.0)
    first = ToyMethod(nan_at=5)
    first.run_settings = {"batch_size": 16, "model": {"layers": 2}}
    with pytest.raises(FloatingPointError):  # stopped after its checkpoint at step 4
        train(first, CyclicBatches(), cfg, tmp_path / "a", progress=False)
    other = ToyMethod()
    other.run_settings = {"batch_size": 32, "model": {"layers": 3}}
    with pytest.raises(ResumeMismatch, match=r"with batch_size 16 \(now 32\), model.layers 2 \(now 3\)"):
        train(other, CyclicBatches(), cfg, tmp_path / "a", progress=False)
    wider = ToyMethod()
    wider.w = torch.nn.Parameter(torch.zeros(5))
    wider.run_settings = dict(first.run_settings)
    with pytest.raises(ResumeMismatch, match="holds a model that is not this run's"):
        train(wider, CyclicBatches(), cfg, tmp_path / "a", progress=False)
    same = ToyMethod()
    same.run_settings = dict(first.run_settings)
    res = train(same, CyclicBatches(), dataclasses.replace(cfg, checkpoint_every=3), tmp_path / "a", progress=False)
    assert res.steps == 8


def test_loop_and_recipe_values_a_run_cannot_use_are_refused_when_built() -> None:
    from nobackfill.encoders.zoo import RecipeSpec

    for bad in (dict(lr=float("inf")), dict(lr=0.0), dict(lr=-1.0), dict(weight_decay=float("nan")),
                dict(grad_clip=-1.0), dict(warmup=-1)):
        with pytest.raises(ValueError, match="must be"):
            LoopConfig(**bad)
    for bad in (dict(batch_size=0), dict(lr=1e999), dict(save_dtype="int4"), dict(steps=0)):
        with pytest.raises(ValueError, match="must be"):
            RecipeSpec(**bad)
