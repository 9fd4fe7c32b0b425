"""Tests of nobackfill.encoders: the zoo, the CLIP dual encoder, tokenizer, preprocessing,
fingerprints, and loading a Hugging Face (openai-style) CLIP directory."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from nobackfill.config import ConfigError
from nobackfill.data.world import WorldSpec, make_item, world_corpus
from nobackfill.encoders import CLIPDualEncoder, create_model, get_preset, list_presets, load_encoder
from nobackfill.encoders.fingerprint import fingerprint
from nobackfill.encoders.preprocess import ImagePreprocessor
from nobackfill.encoders.tokenizer import BOS, EOS, PAD, train_bpe_tokenizer

WORLD_PRESETS = ("world-old", "world-new", "world-newer")
NON_LATIN = ("ένας κόκκινος κύκλος στα αριστερά", "красный круг слева", "左边有一个红色圆形")


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(world_corpus(WorldSpec(), 1500), vocab_size=400, max_length=40)


@pytest.fixture(scope="module")
def encoder(tokenizer) -> CLIPDualEncoder:
    return create_model("world-old", tokenizer, seed=0)


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return np.stack([make_item(0, "val", i)[1] for i in range(5)])


def _n_params(enc: CLIPDualEncoder) -> int:
    return sum(p.numel() for p in enc.model.parameters())


# ----------------------------------------------------------------------------- zoo
def test_presets_build(tokenizer) -> None:
    names = list_presets()
    assert set(WORLD_PRESETS) <= set(names)
    counts, dims = {}, {}
    for name in names:
        preset = get_preset(name)
        enc = create_model(name, tokenizer)
        assert enc.embed_dim == preset.model.embed_dim
        assert enc.model.config.vision_config.image_size == preset.model.image_size
        assert enc.meta["preset"] == name
        if name in WORLD_PRESETS:
            counts[name] = _n_params(enc)
            dims[name] = enc.embed_dim
    c = [counts[n] for n in WORLD_PRESETS]
    assert c[0] < c[1] < c[2], counts
    assert [dims[n] for n in WORLD_PRESETS] == [64, 128, 192]
    old = get_preset("world-old").train
    assert len(old.shapes) < 8 and len(old.colours) < 8


def test_preset_from_file(tmp_path, tokenizer) -> None:
    p = tmp_path / "mini.toml"
    p.write_text("[model]\nembed_dim = 16\nvision_width = 32\nvision_layers = 1\nvision_heads = 2\n"
                 "text_width = 32\ntext_layers = 1\ntext_heads = 2\npatch_size = 16\n[train]\nsteps = 3\n")
    preset = get_preset(p)
    assert preset.name == "mini" and preset.train.steps == 3 and preset.model.embed_dim == 16
    assert create_model(preset, tokenizer).embed_dim == 16


def test_seeded_init(tokenizer) -> None:
    a = create_model("world-old", tokenizer, seed=1).model.state_dict()
    b = create_model("world-old", tokenizer, seed=1).model.state_dict()
    c = create_model("world-old", tokenizer, seed=2).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_eos_id_2_refused(tokenizer) -> None:
    """transformers pools argmax(input_ids) instead of the EOS position when eos_token_id == 2."""
    assert tokenizer.eos_token_id != 2
    from nobackfill.encoders.zoo import clip_config

    class Fake:
        eos_token_id, bos_token_id, pad_token_id = 2, 1, 0

        def __len__(self):
            return 10

    with pytest.raises(ValueError, match="legacy"):
        clip_config(get_preset("world-old").model, Fake())


# ----------------------------------------------------------------------------- encoding
def test_outputs_normalised(encoder, pixels) -> None:
    img = encoder.encode_images(pixels)
    txt = encoder.encode_texts(["a red circle", "a blue square on the left", "有一个红色圆形"])
    assert img.shape == (5, 64) and txt.shape == (3, 64)
    assert img.dtype == np.float32 and txt.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(img, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(txt, axis=1), 1, atol=1e-5)
    assert encoder.encode_images([]).shape == (0, 64) and encoder.encode_texts([]).shape == (0, 64)
    # batching does not change results
    np.testing.assert_allclose(encoder.encode_images(pixels, batch_size=2), img, atol=1e-5)
    np.testing.assert_allclose(encoder.encode_texts(["a red circle", "x"], batch_size=1)[0], txt[0], atol=1e-5)
    with pytest.raises(TypeError):
        encoder.encode_texts("a red circle")


def test_image_input_kinds(encoder, pixels, tmp_path) -> None:
    paths = []
    for i, px in enumerate(pixels):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(px).save(paths[-1])
    ref = encoder.encode_images(pixels)  # uint8 batch array
    for inputs in ([Image.fromarray(p) for p in pixels], paths, [str(p) for p in paths], list(pixels),
                   [Image.fromarray(p).convert("RGBA") for p in pixels]):
        np.testing.assert_array_equal(encoder.encode_images(inputs), ref)
    with pytest.raises(ValueError, match="cannot read image"):
        encoder.encode_images([tmp_path / "missing.png"])


def test_other_sizes_are_resized(encoder, pixels) -> None:
    big = [Image.fromarray(p).resize((128, 96)) for p in pixels[:2]]
    out = encoder.encode_images(big)
    assert out.shape == (2, 64) and np.isfinite(out).all()
    batch = np.stack([np.asarray(b) for b in big])  # (2, 96, 128, 3) uint8 batch
    np.testing.assert_array_equal(encoder.encode_images(batch), out)


def test_text_pooling_uses_eos(encoder) -> None:
    """The text embedding is the projected EOS state (every word counts)."""
    texts = ["a red circle on the left, on a gray background", "a red circle on the right, on a gray background"]
    enc = encoder.tokenize(texts)
    with torch.inference_mode():
        hs = encoder.model.text_model(**enc).last_hidden_state
        eos = (enc["input_ids"] == encoder.tokenizer.eos_token_id).int().argmax(-1)
        want = torch.nn.functional.normalize(encoder.model.text_projection(hs[torch.arange(2), eos]), dim=-1)
    got = encoder.encode_texts(texts)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    assert not np.allclose(got[0], got[1], atol=1e-4)


def test_token_outputs(encoder, pixels) -> None:
    out = encoder.image_tokens(pixels[:3])
    n_patches = (64 // 16) ** 2
    assert out.tokens.shape == (3, n_patches, 64) and out.tokens.dtype == torch.float32
    assert out.mask.shape == (3, n_patches) and out.mask.dtype == torch.bool and out.mask.all()
    torch.testing.assert_close(out.tokens.norm(dim=-1), torch.ones(3, n_patches))

    texts = ["a red circle", "a large blue striped square at the top left, on a sky blue background"]
    ids = encoder.tokenize(texts)["input_ids"]
    t = encoder.text_tokens(texts)
    assert t.tokens.shape == (2, ids.shape[1], 64) and t.mask.shape == ids.shape
    tok = encoder.tokenizer
    for row, m in zip(ids, t.mask):
        content = [i for i in row.tolist() if i not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)]
        assert int(m.sum()) == len(content) > 0
        assert not m[0] and row[0] == tok.bos_token_id
        eos_pos = row.tolist().index(tok.eos_token_id)
        assert not m[eos_pos:].any() and m[1:eos_pos].all()
    assert t.mask[0].sum() < t.mask[1].sum()
    torch.testing.assert_close(t.tokens.norm(dim=-1), torch.ones(ids.shape))


# ----------------------------------------------------------------------------- space id
def test_space_id(encoder, tokenizer, tmp_path, pixels) -> None:
    sid = encoder.space_id
    assert sid.startswith("hf-clip-") and sid == encoder.space_id
    out = encoder.save(tmp_path / "m")
    meta = json.loads((out / "nobackfill.json").read_text())
    assert meta["space_id"] == sid and meta["embed_dim"] == 64
    back = load_encoder(out)
    assert isinstance(back, CLIPDualEncoder) and back.space_id == sid
    # same weights; loaded (mmap-ed, unaligned) tensors may take other SIMD paths: ~1e-8 differences
    np.testing.assert_allclose(back.encode_images(pixels), encoder.encode_images(pixels), atol=1e-6)
    np.testing.assert_allclose(back.encode_texts(["a red circle"]), encoder.encode_texts(["a red circle"]),
                               atol=1e-6)
    assert back.preprocessor == encoder.preprocessor
    assert create_model("world-old", tokenizer, seed=1).space_id != sid

    other = load_encoder(out)
    assert other.space_id == sid
    with torch.no_grad():
        other.model.visual_projection.weight[0, 0] += 1e-3
    assert other.space_id == sid  # cached until invalidated
    other.invalidate_space_id()
    assert other.space_id != sid


def test_save_over_existing_keeps_other_files(encoder, tmp_path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "train_log.jsonl").write_text("{}\n")
    encoder.save(d)
    encoder.save(d)
    assert (d / "train_log.jsonl").read_text() == "{}\n"
    assert (d / "config.json").is_file() and (d / "preprocessor_config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")], "temp dir left behind"
    assert load_encoder(d).space_id == encoder.space_id


def test_fingerprint_ignores_volatile_config() -> None:
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    a = fingerprint("k", {"a": 1, "transformers_version": "1"}, state)
    assert a == fingerprint("k", {"a": 1, "transformers_version": "2", "_name_or_path": "x"}, state)
    assert a != fingerprint("k", {"a": 2}, state)
    assert a != fingerprint("k", {"a": 1}, {"w": state["w"].reshape(3, 2)})
    assert a != fingerprint("k", {"a": 1}, {"w": state["w"].double()})
    assert a != fingerprint("k", {"a": 1}, state, extra={"vocab": [1]})


# ----------------------------------------------------------------------------- tokenizer
def test_tokenizer_bos_eos(tokenizer, encoder) -> None:
    assert tokenizer.bos_token == BOS and tokenizer.eos_token == EOS and tokenizer.pad_token == PAD
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    long = " ".join(["a large red striped circle at the top left"] * 20)
    enc = encoder.tokenize(["a red circle", long, "ring"])
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert ids.shape == (3, 40)  # truncated to max_length
    for row, m in zip(ids.tolist(), mask.tolist()):
        n = sum(m)
        assert row[0] == tokenizer.bos_token_id
        assert row[n - 1] == tokenizer.eos_token_id
        assert row.count(tokenizer.eos_token_id) == 1
        assert all(t == tokenizer.pad_token_id for t in row[n:])
    assert sum(mask[1].tolist()) == 40


def test_tokenizer_non_latin_round_trip(tokenizer) -> None:
    vocab_size = len(tokenizer)
    for text in NON_LATIN + ("a red circle", "Ein GROẞER Kreis"):
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
        assert all(isinstance(i, int) and 0 <= i < vocab_size for i in ids)
        assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True).strip() == text.lower()


def test_tokenizer_save_load(tokenizer, tmp_path) -> None:
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    texts = ["a red circle", *NON_LATIN]
    assert back(texts, padding=True)["input_ids"] == tokenizer(texts, padding=True)["input_ids"]
    assert back.get_vocab() == tokenizer.get_vocab()


# ----------------------------------------------------------------------------- preprocessing
def _hf_processor(**kw):
    """transformers' CLIPImageProcessor (its PIL backend when torchvision is not installed)."""
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import torchvision  # noqa: F401

            return transformers.CLIPImageProcessor(**kw)
        except ImportError:
            return transformers.CLIPImageProcessorPil(**kw)


def test_preprocess_resize_crop(pixels) -> None:
    pre = ImagePreprocessor(size=64, crop=64, mean=(0.5,) * 3, std=(0.25,) * 3)
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)  # 300 wide, 200 high
    assert pre.to_array(img).shape == (64, 64, 3)
    x = pre([Image.fromarray(img)])
    assert x.shape == (1, 3, 64, 64) and x.dtype == torch.float32
    # a 64x64 uint8 image is used as is
    x = pre(pixels[:1])
    torch.testing.assert_close(x[0], (torch.from_numpy(pixels[0]).permute(2, 0, 1).float() / 255 - 0.5) / 0.25)
    # a crop-sized image is still resized first when size > crop (as transformers does)
    pre2 = ImagePreprocessor(size=80, crop=64)
    manual = np.asarray(Image.fromarray(pixels[0]).resize((80, 80), Image.BICUBIC))[8:72, 8:72]
    np.testing.assert_array_equal(pre2.to_array(pixels[0]), manual)
    torch.testing.assert_close(pre2(pixels[:1]), ImagePreprocessor(size=64, crop=64)(manual[None]))
    torch.testing.assert_close(pre2([pixels[0]]), pre2(pixels[:1]))


def test_preprocessor_config_round_trip(tmp_path) -> None:
    pre = ImagePreprocessor(size=40, crop=32, mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6))
    pre.save(tmp_path)
    cfg = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert cfg["image_processor_type"] == "CLIPImageProcessor"
    assert cfg["size"] == {"shortest_edge": 40} and cfg["crop_size"] == {"height": 32, "width": 32}
    assert ImagePreprocessor.from_dir(tmp_path, 99) == pre
    assert ImagePreprocessor.from_dir(tmp_path / "none", 48) == ImagePreprocessor(size=48, crop=48)
    (tmp_path / "preprocessor_config.json").write_text("{bad")
    with pytest.raises(ValueError, match="invalid JSON"):
        ImagePreprocessor.from_dir(tmp_path, 32)


def test_preprocessor_matches_transformers(tmp_path, capsys) -> None:
    """Our Pillow/NumPy pipeline against transformers' CLIPImageProcessor reading our config
    file, and ours reading a config written by transformers."""
    from transformers import AutoImageProcessor

    rng = np.random.default_rng(1)
    square = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
    wide = Image.fromarray(rng.integers(0, 256, (200, 300, 3), dtype=np.uint8))
    odd = Image.fromarray(rng.integers(0, 256, (251, 333, 3), dtype=np.uint8))
    ours = ImagePreprocessor()  # openai CLIP: 224 / 224
    ours.save(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoImageProcessor.from_pretrained(tmp_path, local_files_only=True)
    diffs = {}
    for name, img in (("224x224", square), ("300x200", wide), ("333x251", odd)):
        want = hf(images=img, return_tensors="pt")["pixel_values"]
        got = ours([img])
        assert got.shape == want.shape == (1, 3, 224, 224)
        diffs[name] = float((got - want).abs().max())
    assert diffs["224x224"] < 1e-5, f"preprocess vs {type(hf).__name__}: max abs diff {diffs}"
    assert diffs["300x200"] < 0.1 and diffs["333x251"] < 0.1

    hf_dir = tmp_path / "hf"
    _hf_processor(size={"shortest_edge": 48}, crop_size={"height": 40, "width": 40},
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.2, 0.2, 0.2]).save_pretrained(hf_dir)
    read = ImagePreprocessor.from_dir(hf_dir, 224)
    assert read == ImagePreprocessor(size=48, crop=40, mean=(0.5,) * 3, std=(0.2,) * 3)
    hf2 = _hf_processor(size={"shortest_edge": 48}, crop_size={"height": 40, "width": 40},
                        image_mean=[0.5, 0.5, 0.5], image_std=[0.2, 0.2, 0.2])
    for img in (square, wide):
        want = hf2(images=img, return_tensors="pt")["pixel_values"]
        assert float((read([img]) - want).abs().max()) < 0.1


# ----------------------------------------------------------------------------- HF / openai-style CLIP
def _bytes_to_unicode() -> list[str]:
    """The byte -> unicode table of GPT-2 / CLIP byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


MERGES = ["r e", "re d</w>", "c i", "ci r", "cir c", "circ l", "circl e</w>", "a</w> re", "b l", "bl u",
          "blu e</w>", "s q", "sq u"]


@pytest.fixture(scope="module")
def openai_dir(tmp_path_factory) -> Path:
    """A tiny CLIP saved like ``openai/clip-vit-base-patch32``: model, CLIPTokenizer from a hand-made
    vocab.json + merges.txt, and a CLIPImageProcessor (32 / 32)."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    root = tmp_path_factory.mktemp("openai")
    src, out = root / "tok", root / "clip"
    src.mkdir()
    chars = _bytes_to_unicode()
    tokens = chars + [c + "</w>" for c in chars] + [m.replace(" ", "") for m in MERGES] \
        + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    (src / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (src / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n", encoding="utf-8")
    tok = CLIPTokenizer.from_pretrained(src, local_files_only=True, model_max_length=16)
    torch.manual_seed(0)
    # eos_token_id=2 as in the original openai configs (legacy argmax pooling: EOT is the largest id)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=2, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=24)
    CLIPModel(cfg).eval().save_pretrained(out)
    tok.save_pretrained(out)
    _hf_processor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


def test_openai_style_directory(openai_dir) -> None:
    from transformers import AutoTokenizer, CLIPModel

    enc = load_encoder(openai_dir)
    assert isinstance(enc, CLIPDualEncoder) and enc.embed_dim == 24
    assert enc.preprocessor.size == 32 and enc.preprocessor.crop == 32
    assert enc.max_length == 16 and enc.name == "clip"

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)) for _ in range(3)]
    texts = ["a red circle", "a blue square", "RED"]
    img, txt = enc.encode_images(images), enc.encode_texts(texts)
    assert img.shape == (3, 24) and txt.shape == (3, 24)

    ref = CLIPModel.from_pretrained(openai_dir, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(openai_dir, local_files_only=True)
    hf_pre = _hf_processor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    pv = hf_pre(images=images, return_tensors="pt")["pixel_values"]
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        # our preprocessing of the same images, fed through the reference model
        want_img = torch.nn.functional.normalize(ref.get_image_features(pixel_values=enc.preprocessor(images))
                                                 .pooler_output, dim=-1)
        hf_img = torch.nn.functional.normalize(ref.get_image_features(pixel_values=pv).pooler_output, dim=-1)
        want_txt = torch.nn.functional.normalize(
            ref.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            .pooler_output, dim=-1)
    np.testing.assert_allclose(img, want_img.numpy(), atol=1e-5)
    np.testing.assert_allclose(img, hf_img.numpy(), atol=1e-3)  # end to end vs transformers' processor
    np.testing.assert_allclose(txt, want_txt.numpy(), atol=1e-5)

    ids = enc.tokenize(texts)["input_ids"]
    assert ids[0, 0] == tok.bos_token_id
    assert (ids == tok.eos_token_id).any(dim=1).all()
    t = enc.text_tokens(texts)
    assert not t.mask[:, 0].any() and t.mask.any(dim=1).all()
    it = enc.image_tokens(images)
    assert it.tokens.shape == (3, 16, 24)


def test_openai_style_round_trip(openai_dir, tmp_path) -> None:
    enc = load_encoder(openai_dir)
    saved = enc.save(tmp_path / "copy")
    back = load_encoder(saved)
    assert back.space_id == enc.space_id
    images = [np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)]
    np.testing.assert_allclose(back.encode_images(images), enc.encode_images(images), atol=1e-6)


def test_load_encoder_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="missing: no such directory"):
        load_encoder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: not a model directory .no config.json."):
        load_encoder(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON") as exc:
        load_encoder(bad)
    assert "config.json" in str(exc.value)
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        load_encoder(bad)
    (bad / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json"):
        load_encoder(bad)
    with pytest.raises(ConfigError):
        get_preset("no-such-preset")


def test_float16_storage_round_trip(tokenizer, tmp_path, pixels) -> None:
    """Stored as float16 (half the bytes), reloaded as float32, identical to the saved model."""
    enc = create_model("world-old", tokenizer, seed=3)
    full = enc.save(tmp_path / "f32")
    enc.save(tmp_path / "f16", weights_dtype="float16")
    assert (tmp_path / "f16" / "model.safetensors").stat().st_size < 0.6 * (full / "model.safetensors").stat().st_size
    back = load_encoder(tmp_path / "f16")
    assert next(back.model.parameters()).dtype == torch.float32
    assert back.space_id == enc.space_id
    np.testing.assert_array_equal(back.encode_images(pixels), enc.encode_images(pixels))
    with pytest.raises(ValueError, match="weights_dtype"):
        enc.save(tmp_path / "bad", weights_dtype="int8")


def test_a_model_directory_without_its_tokenizer_files_is_refused_naming_them(tmp_path) -> None:
    """trial W: config.json + weights alone loaded a 2-token tokenizer, and every text embedded alike."""
    import shutil

    from nobackfill.encoders import TokenizerMissing

    shipped = Path(__file__).resolve().parents[1] / "models" / "world-old"
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(shipped / name, bare / name)
    with pytest.raises(TokenizerMissing, match=r"holds 2 tokens for a text tower of \d+ \(it holds no tokenizer "
                                                r"file\): copy the tokenizer files with the weights"):
        load_encoder(bare)
    shutil.copy(shipped / "tokenizer_config.json", bare / "tokenizer_config.json")
    with pytest.raises(TokenizerMissing, match="its tokenizer cannot be read \\(it holds tokenizer_config.json"):
        load_encoder(bare)
    shutil.copy(shipped / "tokenizer.json", bare / "tokenizer.json")
    v = load_encoder(bare).encode_texts(["a red circle", "a blue square"])
    assert float(v[0] @ v[1]) < 0.999  # two texts, two vectors


def test_a_text_tower_larger_than_its_tokenizer_loads(tmp_path) -> None:
    """`bench serve`'s B/32-sized tower holds 1,000 token rows for the world tokenizer's 391 (as a
    padded embedding table does): refused as a missing tokenizer, which broke the benchmark."""
    from transformers import AutoTokenizer, CLIPConfig, CLIPModel

    from nobackfill.encoders.clip import CLIPDualEncoder

    shipped = Path(__file__).resolve().parents[1] / "models" / "world-old"
    tok = AutoTokenizer.from_pretrained(shipped, local_files_only=True)
    cfg = CLIPConfig(text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "vocab_size": 1000, "eos_token_id": tok.eos_token_id,
                                  "bos_token_id": tok.bos_token_id, "pad_token_id": tok.pad_token_id},
                     vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                    "num_attention_heads": 2, "image_size": 32, "patch_size": 16}, projection_dim=8)
    CLIPDualEncoder(CLIPModel(cfg), tok, meta={"name": "padded"}).save(tmp_path / "padded")
    assert len(tok) < 1000 // 2
    assert load_encoder(tmp_path / "padded").encode_texts(["a red circle"]).shape == (1, 8)
