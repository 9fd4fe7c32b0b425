"""Token store beside a gallery and CMLI re-ranking through the CLI (index --tokens, search --rerank)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _late_helpers import invoke, tiny_model, tiny_tokenizer, tiny_world
from nobackfill.gallery import Gallery, SpaceMismatchError
from nobackfill.gallery.tokens import NoTokensError, TokenStore, write_tokens
from nobackfill.gallery.types import CorruptGalleryError

# ----------------------------------------------------------------------------- token store
@pytest.fixture()
def gallery(tmp_path):
    g = Gallery.create(tmp_path / "g", space_id="space-a", dim=4, model="m")
    g.add("image", ["a", "b"], np.eye(4, dtype=np.float32)[:2], [{}, {}], space_id="space-a")
    return tmp_path / "g"


def test_token_store_roundtrip_ragged_float16(gallery):
    rng = np.random.default_rng(0)
    toks = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(1, 4)).astype(np.float32)]
    write_tokens(gallery, "image", ["a", "b"], toks, space_id="space-a", dtype="float16")
    store = TokenStore.open(gallery)
    assert store.count("image") == 2 and store.dtype == "float16" and not store.has("text")
    out, mask = store.get("image", ["b", "a"])
    assert out.shape == (2, 3, 4) and out.dtype == np.float32
    assert mask.tolist() == [[True, False, False], [True, True, True]]
    np.testing.assert_allclose(out[1], toks[0], atol=2e-3)  # float16 rounding
    np.testing.assert_array_equal(out[0, 1:], 0)
    with pytest.raises(NoTokensError, match="no stored image tokens for ids"):
        store.get("image", ["zzz"])
    with pytest.raises(NoTokensError, match="no text tokens"):
        store.get("text", ["a"])
    Gallery.open(gallery).verify().ok  # the gallery itself is untouched and still verifies


def test_token_store_refuses_other_space_and_detects_corruption(gallery):
    write_tokens(gallery, "image", ["a"], [np.ones((2, 4), np.float32)], space_id="space-a")
    with pytest.raises(SpaceMismatchError):
        write_tokens(gallery, "text", ["t"], [np.ones((2, 4), np.float32)], space_id="space-b")
    with pytest.raises(ValueError, match="stored tokens are 4-d"):
        write_tokens(gallery, "text", ["t"], [np.ones((2, 2), np.float32)], space_id="space-a")
    with pytest.raises(ValueError, match="no projection"):
        write_tokens(gallery, "text", ["t"], [np.ones((2, 4), np.float32)], space_id="space-a",
                     projection=np.eye(4, dtype=np.float32))
    f = gallery / "tokens" / "image.npz"
    f.write_bytes(f.read_bytes()[:-3] + b"xyz")
    with pytest.raises(CorruptGalleryError, match="sha256"):
        TokenStore.open(gallery).get("image", ["a"])
    with pytest.raises(NoTokensError, match="no token store"):
        TokenStore.open(gallery.parent)


# ----------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("late_rerank")
    tiny_world(root, n_val=0, n_test=24)
    enc = tiny_model(root, "tiny", 16, tiny_tokenizer())
    enc.save(root / "model")
    r = invoke("index", "--model", root / "model", "--data", root / "world", "--out", root / "g", "--tokens", "float16")
    assert r.exit_code == 0, r.output
    return root


def _fused_reference(root, query: str, k_first: int, weight: float, symmetric: bool = False):
    """global + weight * t2i (Eq. 4; or the mean of Eq. 3 and 4) of the first-stage top
    candidates, from the model directly."""
    from nobackfill.encoders import load_encoder
    from nobackfill.late.cmli import cmli_scores_naive

    enc = load_encoder(root / "model")
    g = Gallery.open(root / "g")
    q = enc.encode_texts([query])
    first = g.search("image", q, k=k_first, space_id=enc.space_id)
    paths = [m["path"] for m in g.metadata("image")]
    ids = g.ids("image")
    cands = [paths[ids.index(i)] for i in first.ids[0]]
    it, tt = enc.image_tokens(cands), enc.text_tokens([query])
    s = cmli_scores_naive(it.tokens, it.mask, tt.tokens, tt.mask)
    cmli = (0.5 * (s.i2t + s.t2i) if symmetric else s.t2i)[:, 0].numpy()
    return first.ids[0], first.scores[0] + weight * cmli


@pytest.mark.parametrize("rerank,weight", [("cmli", "1.0"), ("cmli", "inf"), ("cmli-sym", "2.0")])
def test_search_rerank_cmli_rescores_first_stage(setup, rerank, weight):
    query = "a large red circle on the left"
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "model", "--text", query, "--k", 5,
               "--rerank", rerank, "--rerank-k", 12, "--rerank-weight", weight, "--json")
    assert r.exit_code == 0, r.output
    hits = json.loads(r.stdout)["hits"]
    assert len(hits) == 5
    w = 1e6 if weight == "inf" else float(weight)
    ids, fused = _fused_reference(setup, query, 12, w, symmetric=rerank == "cmli-sym")
    order = np.argsort(-fused, kind="stable")
    assert [h["id"] for h in hits] == [ids[i] for i in order[:5]]
    if weight != "inf":
        np.testing.assert_allclose([h["score"] for h in hits], fused[order[:5]], atol=5e-3)  # float16 tokens


def test_search_rerank_image_query_and_errors(setup, tmp_path):
    img = setup / "world" / "test" / "images" / "000003.png"
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "model", "--image", img, "--k", 3,
               "--rerank", "cmli", "--rerank-k", 8, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["modality"] == "text" and len(json.loads(r.stdout)["hits"]) == 3
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "model", "--text", "a", "--rerank", "bm25")
    assert r.exit_code == 2 and "cmli" in r.output
    # a gallery indexed without --tokens: a clear error naming the option
    r = invoke("index", "--model", setup / "model", "--data", setup / "world", "--out", tmp_path / "plain")
    assert r.exit_code == 0, r.output
    r = invoke("search", "--gallery", tmp_path / "plain", "--model", setup / "model", "--text", "a red circle",
               "--rerank", "cmli")
    assert r.exit_code == 2 and "--tokens" in r.output


def test_index_tokens_projected(setup, tmp_path):
    r = invoke("index", "--model", setup / "model", "--data", setup / "world", "--out", tmp_path / "p",
               "--tokens", "float16", "--token-dim", 8)
    assert r.exit_code == 0, r.output
    store = TokenStore.open(tmp_path / "p")
    p = store.projection
    assert store.dim == 8 and p.shape == (16, 8)
    np.testing.assert_allclose(p.T @ p, np.eye(8), atol=1e-5)
    toks, mask = store.get("image", store.ids("image")[:2])
    np.testing.assert_allclose(np.linalg.norm(toks[mask], axis=-1), 1.0, atol=2e-3)
    r = invoke("search", "--gallery", tmp_path / "p", "--model", setup / "model", "--text", "a blue square",
               "--k", 2, "--rerank", "cmli", "--rerank-k", 6, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["hits"]) == 2
    assert torch.get_num_threads() >= 1


def test_eval_retrieval_rerank_scores_every_query_at_once(setup, tmp_path):
    """``eval retrieval --rerank``: its global row equals plain ``eval retrieval``; weight 0 changes
    nothing; a rerank_k of the whole gallery with CMLI only equals full CMLI ranking of a query."""
    base = ("eval", "retrieval", "--query-model", setup / "model", "--gallery-model", setup / "model",
            "--data", setup / "world")
    r = invoke(*base, "--json", tmp_path / "plain.json")
    assert r.exit_code == 0, r.output
    plain = json.loads((tmp_path / "plain.json").read_text())
    r = invoke(*base, "--rerank", "cmli", "--rerank-k", 8, "--rerank-weight", 0.0, "--json", tmp_path / "w0.json")
    assert r.exit_code == 0, r.output
    w0 = json.loads((tmp_path / "w0.json").read_text())
    for d in ("t2i", "i2t"):
        assert w0["global"][d]["R@1"] == pytest.approx(plain[d]["R@1"])
        assert w0["reranked"][d]["R@1"] == pytest.approx(w0["global"][d]["R@1"])
    r = invoke(*base, "--rerank", "cmli", "--rerank-k", 8, "--rerank-weight", "inf", "--json", tmp_path / "inf.json")
    assert r.exit_code == 0, r.output
    inf = json.loads((tmp_path / "inf.json").read_text())
    assert inf["reranked"] != inf["global"] and inf["rerank_k"] == 8
    r = invoke(*base[:5], setup / "other", *base[6:], "--rerank", "cmli")
    assert r.exit_code == 2 and "same" in r.output
    r = invoke(*base, "--rerank", "colbert")
    assert r.exit_code == 2 and "cmli" in r.output
