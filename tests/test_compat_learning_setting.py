"""The compatibility-learning setting's knobs added for the tutorial's protocol: pair verification
accuracy (the M of the tutorial's CoReS / BCT table), per-step backbone upgrades (input masks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nobackfill.compat.learning import (ClassData, DataConfig, ModelConfig, SequenceConfig, create_method,
                                        evaluate_sequence, train_sequence)
from nobackfill.compat.learning.base import StepModel
from nobackfill.metrics.class_search import best_threshold_accuracy, verification_accuracy, verification_pairs

from test_compat_learning_methods import FAST, SMALL, synthetic


def test_best_threshold_hand_computed():
    thr, acc = best_threshold_accuracy(np.array([0.1, 0.2, 0.3, 0.4]), np.array([True, True, False, False]))
    assert thr == pytest.approx(0.25) and acc == 1.0
    # alternating: calling the first 1 (or 3) pairs "same" is right 3 times out of 4; the first wins
    thr, acc = best_threshold_accuracy(np.array([0.1, 0.2, 0.3, 0.4]), np.array([True, False, True, False]))
    assert thr == pytest.approx(0.15) and acc == 0.75
    thr, acc = best_threshold_accuracy(np.array([0.1, 0.2]), np.array([False, False]))
    assert thr == -np.inf and acc == 1.0  # nothing is "same"


def test_verification_pairs_are_balanced_and_labelled():
    ql, gl = np.array([0, 0, 1, 2]), np.array([0, 1, 1, 2, 2])
    i, j, same = verification_pairs(ql, gl, n_pairs=50, seed=3)
    assert len(i) == 100 and same.sum() == 50
    assert np.array_equal(ql[i] == gl[j], same)
    i2, j2, _ = verification_pairs(ql, gl, n_pairs=50, seed=3)
    assert np.array_equal(i, i2) and np.array_equal(j, j2)  # the same pairs for every C[t, k]
    with pytest.raises(ValueError, match="different-class"):
        verification_pairs([0, 0], [0], n_pairs=5)


def test_verification_accuracy_perfect_and_chance():
    labels = np.repeat(np.arange(4), 5)
    onehot = np.eye(4, dtype=np.float32)[labels]  # same class: distance 0, different: 2
    assert verification_accuracy(onehot, onehot * 3.0, labels, labels, n_pairs=300) == 1.0
    const = np.ones((20, 4), np.float32)  # every distance 0: no threshold helps -> balanced chance
    assert verification_accuracy(const, const, labels, labels, n_pairs=300) == pytest.approx(0.5)


def test_input_mask_hides_columns():
    model = StepModel(4, ModelConfig(hidden=8, dim=3, n_classes=5))
    x = torch.randn(6, 4)
    model.set_input_mask(torch.tensor([1.0, 1.0, 0.0, 0.0]))
    y = x.clone()
    y[:, 2:] = torch.randn(6, 2)
    assert torch.allclose(model(x), model(y))
    model.set_input_mask(None)
    assert not torch.allclose(model(x), model(y))


def _two_part_data() -> ClassData:
    d = synthetic(dim=8)
    d.part_dims = [("a", 5), ("b", 3)]
    d.step_backbones = [["a"], ["a", "b"]]
    return d


def test_class_data_input_mask_per_step():
    d = _two_part_data()
    assert d.input_mask(0).tolist() == [1.0] * 5 + [0.0] * 3
    assert d.input_mask(1) is None and d.input_mask(5) is None  # later steps repeat the last entry (all parts)
    d.step_backbones = None
    assert d.input_mask(0) is None


def test_backbone_upgrade_reaches_the_step_models(tmp_path):
    d = _two_part_data()
    for name in ("baseline", "cores"):  # fresh and fine-tuned models
        models = train_sequence(create_method(name, model=SMALL), d, FAST, tmp_path / name)
        x = torch.from_numpy(d.query_x)
        y = x.clone()
        y[:, 5:] += 10.0
        assert torch.allclose(models[0](x), models[0](y))  # step 1 never sees part b
        assert not torch.allclose(models[1](x), models[1](y))  # the upgrade does


def test_step_backbones_config_is_checked():
    DataConfig(backbone="randconv+pixels", step_backbones="randconv,randconv+pixels")
    with pytest.raises(ValueError, match="step_backbones"):
        DataConfig(backbone="randconv", step_backbones="pixels")


def test_evaluation_reports_both_metrics(tmp_path):
    data = synthetic()
    method = create_method("bct", model=SMALL)
    models = train_sequence(method, data, FAST, tmp_path)
    r = evaluate_sequence(method, models, data)
    assert r["metric"] == "search" and set(r["verification"]) == {"C", "AC", "AA", "ACA"}
    v = evaluate_sequence(method, models, data, metric="verification")
    assert v["C"] == r["verification"]["C"] and v["search"]["C"] == r["C"]
    with pytest.raises(ValueError, match="metric"):
        SequenceConfig(metric="recall")


def test_neighbour_agreement_hand_computed():
    from nobackfill.metrics.class_search import neighbour_agreement

    gallery = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    query = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]], np.float32)  # nearest: 0, 1, 0
    assert neighbour_agreement(query, gallery, ["sky", "sky", "grass"], ["sky", "grass"]) == pytest.approx(1 / 3)


def test_gallery_and_query_rows_point_at_the_cached_items(tmp_path):
    from nobackfill.compat.learning import load_class_data

    cfg = DataConfig(backbone="pixels", n_render_train=300, n_render_eval=300, n_train_classes=40,
                     eval_split="val", cache_dir=str(tmp_path))
    d = load_class_data(cfg, progress=False)
    z = np.load(tmp_path / "pixels_val_0_300.npz")
    arrival = np.argsort(d.class_order)  # world class id -> arrival position
    assert np.array_equal(arrival[z["y"][d.gallery_index]], d.gallery_y)
    assert np.array_equal(arrival[z["y"][d.query_index]], d.query_y)
    assert not set(d.gallery_index) & set(d.query_index)
