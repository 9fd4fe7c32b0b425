"""RECO (Iscen et al. 2023): fusion, memory (near-duplicates, self-exclusion), the loss, training, files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from _compat_helpers import tiny_encoder
from nobackfill.data.world import WorldSpec, generate_world
from nobackfill.evaluate import load_eval_data
from nobackfill.reco.fusion import FusionConfig, MeanFusion, TransformerFusion
from nobackfill.reco.memory import Memory, build_memory, find_removals, thumbnail_features
from nobackfill.reco.model import RecoModel, RecoSpec, load_reco
from nobackfill.reco.train import (PairEmbeddings, RecoBatches, RecoTrainConfig, reco_loss, retrieval_evaluator,
                                   train_reco)
from nobackfill.config import updated


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("reco-world")
    generate_world(root, WorldSpec(n_train=48, n_val=8, n_test=8, langs=("en",)), workers=1, progress=False)
    return root


@pytest.fixture(scope="module")
def encoder():
    return tiny_encoder(dim=16)


@pytest.fixture(scope="module")
def memory(world, encoder, tmp_path_factory):
    train = load_eval_data(world, "train")
    test = load_eval_data(world, "test")
    # the test split plus 3 train images: those 3 must be removed as test items (exact copies)
    return build_memory(encoder, train, tmp_path_factory.mktemp("mem") / "m",
                        exclude=[test, train.subset_images([0, 5, 9])], model_ref="tiny")


# ----------------------------------------------------------------------------- fusion
def test_transformer_fusion_shapes_and_unit_norm():
    torch.manual_seed(0)
    f = TransformerFusion(FusionConfig(dim=16, heads=4))
    out = f(torch.randn(5, 16), torch.randn(5, 3, 16))
    assert out.shape == (5, 16)
    assert torch.allclose(out.norm(dim=-1), torch.ones(5), atol=1e-5)
    # the output is read at the original's position: changing only the original changes it
    x, r = torch.randn(2, 16), torch.randn(2, 3, 16)
    assert not torch.allclose(f(x, r), f(x + 1.0, r))
    with pytest.raises(ValueError):
        f(torch.randn(5, 16), torch.randn(5, 3, 8))
    with pytest.raises(ValueError):
        FusionConfig(dim=10, heads=4)


def test_mean_fusion_is_normalised_mean():
    x = torch.tensor([[1.0, 0.0]])
    r = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])
    out = MeanFusion(FusionConfig(dim=2, kind="mean", heads=1))(x, r)
    expect = torch.tensor([[1 / 3, 2 / 3]]) / math.sqrt((1 / 3) ** 2 + (2 / 3) ** 2)
    assert torch.allclose(out, expect, atol=1e-6)


# ----------------------------------------------------------------------------- loss
def test_reco_loss_hand_computed():
    """Orthonormal pairs whose retrieved items equal themselves (mean fusion keeps them): every
    logit matrix is s * I, so each of the three NCE terms is log(1 + e^-s) (2 samples)."""
    spec = RecoSpec(space_id="s", dim=2, k=1, fusion=FusionConfig(dim=2, kind="mean", heads=1))
    model = RecoModel(spec, temperature=0.5)  # s = 2
    v = torch.eye(2)
    t = torch.eye(2)
    loss, logs = reco_loss(model, v, t, v[:, None], t[:, None])
    term = math.log(1 + math.exp(-2.0))
    assert loss.item() == pytest.approx(3 * term, rel=1e-5)
    assert logs["nce_both"] == pytest.approx(term, rel=1e-5)
    # swap the texts: positives are now orthogonal, each term log(1 + e^2)
    loss2, _ = reco_loss(model, v, t.flip(0), v[:, None], t.flip(0)[:, None])
    assert loss2.item() == pytest.approx(3 * math.log(1 + math.exp(2.0)), rel=1e-5)


# ----------------------------------------------------------------------------- memory
def test_find_removals_counts():
    mem = np.eye(4, dtype=np.float32)
    mem[3] = np.array([0.96, 0.28, 0, 0], np.float32)  # cosine 0.96 to e1
    ex = np.array([[1, 0, 0, 0]], np.float32)
    test, near, best = find_removals(mem, ["a", "b", "c", "d"], ex, ["b"], threshold=0.95)
    assert test.tolist() == [False, True, False, False]  # hash match
    assert near.tolist() == [True, False, False, True]  # e1 itself (1.0) and the 0.96 one
    assert best[2] == pytest.approx(0.0)
    with pytest.raises(ValueError):
        find_removals(mem, ["a"] * 4, ex, [], threshold=1.5)


def test_build_memory_removes_test_items_and_near_duplicates(memory, world):
    r = memory.removal
    train = load_eval_data(world, "train")
    test = load_eval_data(world, "test")
    assert r["test_items"] == 3
    # the near-duplicate count is what find_removals gives on the thumbnails
    ex_paths = test.image_paths() + [train.image_paths()[i] for i in (0, 5, 9)]
    thumbs, ex = thumbnail_features(train.image_paths()), thumbnail_features(ex_paths)
    hit = (thumbs @ ex.T).max(1) > 0.95
    hit[[0, 5, 9]] = False
    assert r["near_duplicates"] == int(hit.sum())
    assert r["kept_images"] == len(train) - 3 - r["near_duplicates"] == memory.gallery.count("image")
    assert "images/000000.png" not in memory.gallery.ids("image")
    assert memory.gallery.count("text") == r["kept_texts"]
    assert (memory.image_text >= 0).all() and memory.text_image.max() < memory.gallery.count("image")


def test_retrieval_modes_and_self_exclusion(memory):
    V, T = memory.vectors("image"), memory.vectors("text")
    n = V.shape[0]
    # without exclusion, an image's nearest memory image is itself (so exclusion matters)
    _, rows = memory.retrieve_rows(V, "image", 3, fuse="uni")
    assert (rows[:, 0] == np.arange(n)).all()
    _, rows = memory.retrieve_rows(V, "image", 3, fuse="uni", exclude_images=np.arange(n))
    assert not (rows == np.arange(n)[:, None]).any()
    mod, rows = memory.retrieve_rows(V, "image", 3, exclude_images=np.arange(n))  # cross fusion: texts
    assert mod == "text" and not (memory.text_image[rows] == np.arange(n)[:, None]).any()
    mod, rows = memory.retrieve_rows(T, "text", 3, exclude_images=memory.text_image)  # images of other pairs
    assert mod == "image" and not (rows == memory.text_image[:, None]).any()
    # cross-modal search: a text query searches memory images directly
    mod, rows = memory.retrieve_rows(T[:4], "text", 2, search="cross", fuse="uni")
    assert mod == "text" and rows.shape == (4, 2)
    assert memory.retrieve(V[:4], "image", 2).shape == (4, 2, V.shape[1])


def test_training_batches_exclude_own_pair(memory):
    spec = RecoSpec(space_id=memory.space_id, dim=memory.dim, k=4)
    pairs = PairEmbeddings.from_memory(memory)
    b = RecoBatches(memory, pairs, spec, batch_size=8, seed=0)
    assert b.img_mod == "text" and b.txt_mod == "image"
    assert not (memory.text_image[b.img_rows] == np.arange(len(b.img_rows))[:, None]).any()
    assert not (b.txt_rows == memory.text_image[:, None]).any()
    x, y = b.batch(3), b.batch(3)
    assert all(torch.equal(x[k], y[k]) for k in x)  # deterministic
    assert x["v_ret"].shape == (8, 4, memory.dim) and x["t"].shape == (8, memory.dim)
    img, cap = b.indices(0)
    assert len(set(img.tolist())) == 8 and (pairs.text_image[cap] == img).all()


def test_pairs_from_another_folder_find_their_memory_rows(memory, world):
    train = load_eval_data(world, "train")
    rows = memory.image_rows_by_hash(train.image_paths()[:12])
    ids = memory.gallery.ids("image")
    for i, r in enumerate(rows):
        if train.images[i] in ids:
            assert r == ids.index(train.images[i])
        else:  # removed from the memory (test item / near-duplicate)
            assert r == -1
    assert (rows[[0, 5, 9]] == -1).all()


# ----------------------------------------------------------------------------- training and files
def test_train_reco_roundtrip_and_frozen_inputs(memory, tmp_path):
    V0, T0 = memory.vectors("image").copy(), memory.vectors("text").copy()
    cfg = updated(RecoTrainConfig(), k=3, steps=6, batch_size=8, warmup=1, eval_every=3, threads=1)
    ev = retrieval_evaluator(memory, V0[:8], T0[:16], np.arange(16) // 2)
    model, res = train_reco(memory, tmp_path / "r", cfg, evaluate=ev, early_stop="score")
    assert res.steps <= 6 and (tmp_path / "r" / "reco.json").is_file()
    assert np.array_equal(memory.vectors("image"), V0) and np.array_equal(memory.vectors("text"), T0)
    q = T0[:5]
    out = model.refine(memory, q, "text")
    assert out.shape == q.shape and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    loaded, mem2 = load_reco(tmp_path / "r")
    assert np.allclose(loaded.refine(mem2, q, "text"), out, atol=1e-6)
    with pytest.raises(ValueError):
        model.refine(memory, np.zeros((2, memory.dim + 1), np.float32), "text")


def test_mean_fusion_trains_nothing(memory, tmp_path):
    model, res = train_reco(memory, tmp_path / "mean", RecoTrainConfig(k=2, fusion="mean", heads=1))
    assert res is None and not (tmp_path / "mean" / "fusion.safetensors").exists()
    loaded, _ = load_reco(tmp_path / "mean")
    v = memory.vectors("image")[:3]
    assert np.allclose(loaded.refine(memory, v, "image"), model.refine(memory, v, "image"))


def test_memory_open_errors(tmp_path):
    with pytest.raises(ValueError, match="memory.json"):
        Memory.open(tmp_path)
    with pytest.raises(FileNotFoundError, match="reco.json"):
        load_reco(tmp_path)
