"""Every compatibility-learning method runs through the one training loop over T updates, and the
runner / data plumbing behaves (synthetic Gaussian classes: fast, no rendering)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nobackfill.compat.learning import (ClassData, ModelConfig, SequenceConfig, class_schedule, create_method,
                                        evaluate_sequence, method_names, run_method, train_sequence)
from nobackfill.compat.learning.data import ReplayMemory, StepBatches

ALL = ["baseline", "bct", "bt2", "lce", "advbct", "cores", "dsimplex-hoc", "cl2r", "psp", "lsp", "fd-kl", "fd-lm",
       "elodi", "muscle"]


def synthetic(n_pool: int = 6, n_open: int = 3, per_class: int = 12, dim: int = 8, seed: int = 0) -> ClassData:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_pool + n_open, dim)) * 3

    def draw(classes, n):
        y = np.repeat(np.asarray(classes), n)
        return (centres[y] + rng.normal(size=(len(y), dim))).astype(np.float32), y.astype(np.int64)

    tx, ty = draw(range(n_pool), per_class)
    ex, ey = draw(range(n_pool), 4)
    gx, gy = draw(range(n_pool, n_pool + n_open), 3)
    qx, qy = draw(range(n_pool, n_pool + n_open), 3)
    return ClassData(tx, ty, ex, ey, gx, gy, qx, qy, n_pool, list(range(n_pool + n_open)))


SMALL = ModelConfig(hidden=16, dim=9, n_classes=10)
FAST = SequenceConfig(steps=3, train_steps=3, batch_size=8, warmup=1, memory_per_class=2)


def test_registry_has_every_method():
    assert method_names() == ALL
    with pytest.raises(ValueError, match="unknown compatibility-learning method"):
        create_method("nope")
    with pytest.raises(ValueError, match="unknown option"):
        create_method("bct", not_an_option=1)


@pytest.mark.parametrize("name", ALL)
def test_method_runs_and_is_evaluated(name, tmp_path):
    data = synthetic()
    options = {"ensemble": 2} if name == "elodi" else {}
    method = create_method(name, model=SMALL, **options)
    models = train_sequence(method, data, FAST, tmp_path)
    assert len(models) == 3 and [m.n_seen for m in models] == class_schedule(6, 3)
    r = evaluate_sequence(method, models, data)
    c = np.array([[np.nan if v is None else v for v in row] for row in r["C"]])
    assert np.isfinite(c[np.tril_indices(3)]).all() and np.isnan(c[np.triu_indices(3, 1)]).all()
    assert 0 <= r["AC"] <= 1 and 0 <= r["ACA"] <= r["AA"] * 3 and r["flips"]["classification"]["n"] > 0
    for t in (1, 2, 3):  # the loop wrote its log and the export of every step
        assert (tmp_path / f"step{t}" / "train_log.jsonl").is_file()
        assert (tmp_path / f"step{t}" / "step_model.safetensors").is_file()
    for m in models:
        assert not any(p.requires_grad for p in m.parameters())


def test_extra_loss_is_active_after_the_first_step(tmp_path):
    data = synthetic()
    method = create_method("bct", model=SMALL)
    train_sequence(method, data, SequenceConfig(steps=2, train_steps=2, batch_size=8, warmup=1), tmp_path)
    import json

    logs = [json.loads(line) for line in (tmp_path / "step2" / "train_log.jsonl").read_text().splitlines()]
    assert "influence" in logs[-1] and logs[-1]["influence"] > 0
    first = [json.loads(line) for line in (tmp_path / "step1" / "train_log.jsonl").read_text().splitlines()]
    assert "influence" not in first[-1]


def test_bt2_grows_dimensions_and_lce_composes_mappings(tmp_path):
    data = synthetic()
    bt2 = create_method("bt2", model=SMALL, extra_dims=4)
    models = train_sequence(bt2, data, FAST, tmp_path / "bt2")
    assert [m.out_dim for m in models] == [9, 13, 17]
    lce = create_method("lce", model=SMALL)
    models = train_sequence(lce, data, FAST, tmp_path / "lce")
    x = torch.from_numpy(data.query_x)
    with torch.no_grad():
        direct = models[1].to_previous(models[2].to_previous(models[2](x)))
        assert torch.allclose(lce.query_features(models, 2, 0, x), direct)
        assert torch.allclose(lce.query_features(models, 2, 2, x), models[2](x))


def test_independent_vs_fine_tuned_initialisation(tmp_path):
    data = synthetic()
    cfg = SequenceConfig(steps=2, train_steps=1, batch_size=8, warmup=1, lr=1e-9)
    base = train_sequence(create_method("baseline", model=SMALL), data, cfg, tmp_path / "b")
    cores = train_sequence(create_method("cores", model=SMALL), data, cfg, tmp_path / "c")
    w = lambda m: m.body[0].weight
    assert not torch.allclose(w(base[0]), w(base[1]))  # a fresh model per step
    assert torch.allclose(w(cores[0]), w(cores[1]), atol=1e-6)  # fine-tuned from phi_{t-1} (lr ~ 0)
    assert torch.equal(cores[0].fixed_head, cores[1].fixed_head)  # the d-Simplex never moves


def test_replay_memory_and_batches():
    y = np.array([0, 0, 0, 1, 1, 2])
    mem = ReplayMemory(per_class=2, seed=0)
    mem.add_classes(y, range(0, 2))
    assert sorted(y[mem.indices].tolist()) == [0, 0, 1, 1]
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    b = StepBatches(x, y, np.array([5]), mem.indices, batch_size=4, seed=1)
    batch = b.batch(3)
    assert batch["replay"].tolist() == [False, False, True, True]
    assert batch["y"][:2].tolist() == [2, 2] and set(batch["y"][2:].tolist()) <= {0, 1}
    assert torch.equal(b.batch(3)["x"], batch["x"])  # deterministic


def test_continual_regime_trains_on_new_classes_plus_memory(tmp_path):
    data = synthetic()
    seen = {}
    method = create_method("cl2r", model=SMALL)
    orig = method.on_step_start

    def spy(ctx):
        seen[ctx.t] = sorted(set(ctx.train_y.tolist())), len(ctx.train_y)
        orig(ctx)

    method.on_step_start = spy
    train_sequence(method, data, SequenceConfig(steps=2, train_steps=1, batch_size=8, warmup=1, memory_per_class=2),
                   tmp_path)
    assert seen[0][0] == [0, 1, 2]
    assert seen[1][0] == [0, 1, 2, 3, 4, 5] and seen[1][1] == 3 * 12 + 3 * 2  # new data + memory


def test_class_schedule():
    assert class_schedule(48, 2) == [24, 48]
    assert class_schedule(48, 5) == [10, 20, 30, 39, 48]  # T equal tasks (the tutorial's split)
    assert class_schedule(48, 10, 0.125) == [6, 11, 16, 21, 26, 31, 36, 40, 44, 48]
    with pytest.raises(ValueError, match="later steps"):
        class_schedule(4, 5, 0.5)
    with pytest.raises(ValueError, match="equal|tasks"):
        class_schedule(4, 5)
    with pytest.raises(ValueError, match="first_fraction"):
        class_schedule(48, 2, 1.5)


def test_run_method_summary(tmp_path):
    r = run_method("psp", synthetic(), SequenceConfig(steps=2, train_steps=2, batch_size=8, warmup=1), tmp_path,
                   options={"regime": "continual"})
    assert r["method"] == "psp" and r["regime"] == "continual" and r["strict"] is True
    assert set(r) >= {"AC", "AA", "ACA", "C", "criterion", "flips", "test_accuracy"}


def test_psp_lsp_train_exactly_like_the_baseline(tmp_path):
    """The bench reuses the baseline's models for PSP / LSP (``trains_like``): the training is the same."""
    from nobackfill.compat.learning import method_class

    data = synthetic()
    base = train_sequence(create_method("baseline", model=SMALL), data, FAST, tmp_path / "b")
    for name in ("psp", "lsp"):
        assert method_class(name).trains_like == "baseline"
        own = train_sequence(create_method(name, model=SMALL), data, FAST, tmp_path / name)
        for a, b in zip(base, own):
            assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_epoch_budget_scales_with_the_step_size():
    cfg = SequenceConfig(epochs=2, batch_size=10)
    assert cfg.optimiser_steps(25) == 5 and cfg.optimiser_steps(50) == 10
    assert SequenceConfig(train_steps=7).optimiser_steps(1000) == 7
    assert cfg.loop_config(0, 50).steps == 10
