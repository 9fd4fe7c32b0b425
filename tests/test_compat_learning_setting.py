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
    assert "search-with-duplicates" not in r  # no rendering groups: it would repeat "search"


def test_junk_rule_applies_to_search_only_when_the_data_has_rendering_groups(tmp_path):
    import dataclasses

    from nobackfill.metrics.class_search import search_accuracy

    data = synthetic()
    method = create_method("baseline", model=SMALL)
    models = train_sequence(method, data, FAST, tmp_path)
    # every gallery item shares its query's group: the junk rule leaves only other classes -> 0
    grouped = dataclasses.replace(data, gallery_groups=np.zeros(len(data.gallery_y), np.int64),
                                  query_groups=np.zeros(len(data.query_y), np.int64))
    r = evaluate_sequence(method, models, grouped)
    assert np.allclose(np.nan_to_num(np.array(r["C"], float)), 0)
    plain = evaluate_sequence(method, models, data)
    assert r["search-with-duplicates"]["C"] == plain["C"]
    with torch.no_grad():
        g, q = models[0](torch.from_numpy(data.gallery_x)).numpy(), models[0](torch.from_numpy(data.query_x)).numpy()
    assert plain["C"][0][0] == pytest.approx(search_accuracy(q, g, data.query_y, data.gallery_y))
    assert plain["C"][0][0] > 0


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


def test_rendering_groups_are_the_main_objects_size_texture_and_background(tmp_path):
    from nobackfill.compat.learning import load_class_data
    from nobackfill.compat.learning.data import rendering_group
    from nobackfill.data.scene import BACKGROUNDS, SIZES, TEXTURES
    from nobackfill.data.world import make_item

    cfg = DataConfig(backbone="pixels", n_render_train=300, n_render_eval=300, n_train_classes=40,
                     eval_split="val", cache_dir=str(tmp_path))
    d = load_class_data(cfg, progress=False)
    singles = [s for s in (make_item(0, "val", i)[0] for i in range(300)) if len(s.objects) == 1]
    want = np.array([rendering_group(s) for s in singles])
    assert np.array_equal(d.gallery_groups, want[d.gallery_index])
    assert np.array_equal(d.query_groups, want[d.query_index])
    s = singles[0]
    size, texture, bg = SIZES.index(s.main.size), TEXTURES.index(s.main.texture), BACKGROUNDS.index(s.background)
    assert rendering_group(s) == (size * 4 + texture) * 4 + bg
    assert len(set(want)) > 10 and want.max() < 2 * 4 * 4


def test_a_stale_eval_cache_is_named_in_the_error(tmp_path):
    from nobackfill.compat.learning import load_class_data

    cfg = DataConfig(backbone="pixels", n_render_train=300, n_render_eval=300, n_train_classes=40,
                     eval_split="val", cache_dir=str(tmp_path))
    load_class_data(cfg, progress=False)
    (cached,) = tmp_path.glob("val_*.npz")
    z = dict(np.load(cached))
    np.savez(cached, x=z["x"][:-1], y=z["y"][:-1])  # one item short: not what the world renders
    with pytest.raises(ValueError, match="stale cache") as err:
        load_class_data(cfg, progress=False)
    assert str(tmp_path) in str(err.value)


# ---------------------------------------------------------------- image inputs: a CNN from pixels per step
def test_downsampled_images_average_blocks():
    from nobackfill.compat.learning.data import downsampled_images

    px = np.zeros((1, 64, 64, 3), np.uint8)
    px[0, :32, :32, 0] = 255  # top-left quarter red
    px[0, 0, 0, 1] = 255  # one green pixel
    out = downsampled_images(px, 2)
    assert out.shape == (1, 3, 2, 2) and out.dtype == np.float32
    assert out[0, 0].tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert out[0, 1, 0, 0] == pytest.approx(1 / (32 * 32)) and out[0, 1].sum() == pytest.approx(1 / 1024)


def test_image_backbone_config_is_checked():
    DataConfig(backbone="image32")
    for bad in ("image30", "imagex", "image32+randconv"):
        with pytest.raises(ValueError, match="image"):
            DataConfig(backbone=bad)


def test_image_backbone_loads_standardised_images(tmp_path):
    from nobackfill.compat.learning import load_class_data

    cfg = DataConfig(backbone="image8", n_render_train=300, n_render_eval=300, n_train_classes=40,
                     eval_split="val", cache_dir=str(tmp_path))
    d = load_class_data(cfg, progress=False)
    assert d.train_x.shape[1:] == (3, 8, 8) and d.gallery_x.shape[1:] == (3, 8, 8) and d.in_dim == (3, 8, 8)
    assert np.allclose(d.train_x.mean((0, 2, 3)), 0, atol=1e-4)  # per channel, on the training pool
    assert np.allclose(d.train_x.std((0, 2, 3)), 1, atol=1e-3)


def synthetic_images(seed: int = 0) -> ClassData:
    """Each class: a bright square at its own position on noise (3 x 8 x 8)."""
    rng = np.random.default_rng(seed)

    def draw(classes, n):
        y = np.repeat(np.asarray(classes), n)
        x = rng.normal(size=(len(y), 3, 8, 8)).astype(np.float32) * 0.3
        for i, c in enumerate(y):
            x[i, c % 3, 2 * (c // 3) % 8: 2 * (c // 3) % 8 + 2, 2 * c % 8: 2 * c % 8 + 2] += 3.0
        return x, y.astype(np.int64)

    tx, ty = draw(range(6), 12)
    ex, ey = draw(range(6), 4)
    gx, gy = draw(range(6, 9), 3)
    qx, qy = draw(range(6, 9), 3)
    return ClassData(tx, ty, ex, ey, gx, gy, qx, qy, 6, list(range(9)))


CNN = ModelConfig(hidden=16, dim=9, n_classes=10, conv_widths=(4, 8))


def test_step_model_is_a_cnn_on_images():
    model = StepModel((3, 8, 8), CNN)
    assert isinstance(model.body[0], torch.nn.Conv2d) and model.out_dim == 9
    model.eval()
    x = torch.randn(7, 3, 8, 8)
    with torch.no_grad():
        whole = model(x)
        model.inference_chunk = 3  # chunked inference gives the same features
        chunked = model(x)
    assert whole.shape == (7, 9) and torch.allclose(whole, chunked, atol=1e-6)


@pytest.mark.parametrize("name", ["baseline", "bct", "cores", "dsimplex-hoc"])
def test_cnn_methods_train_from_pixels(name, tmp_path):
    data = synthetic_images()
    method = create_method(name, model=CNN)
    models = train_sequence(method, data, SequenceConfig(steps=2, train_steps=4, batch_size=8, warmup=1,
                                                          memory_per_class=2), tmp_path)
    assert all(isinstance(m.body[0], torch.nn.Conv2d) for m in models)
    r = evaluate_sequence(method, models, data)
    assert np.isfinite(r["C"][1][0]) and 0 <= r["AA"] <= 1
    if name == "baseline":  # independent models: different weights
        assert not torch.allclose(models[0].body[0].weight, models[1].body[0].weight)


def test_open_set_of_unseen_shapes():
    from nobackfill.compat.learning.data import class_arrival_order
    from nobackfill.data.scene import SHAPES

    order = class_arrival_order(DataConfig(open_set="shapes"))
    assert sorted(order.tolist()) == list(range(64))
    pool, held = set(order[:48] % len(SHAPES)), set(order[48:] % len(SHAPES))
    assert len(held) == 2 and not pool & held  # two whole shapes, every colour, never trained on
    assert np.array_equal(class_arrival_order(DataConfig()), np.random.default_rng(0).permutation(64))
    with pytest.raises(ValueError, match="multiple"):
        DataConfig(open_set="shapes", n_train_classes=50)
    with pytest.raises(ValueError, match="open_set"):
        DataConfig(open_set="colours")
