"""Adapters (LoRA via peft, vision prompts, LayerNorm copies), on/off exactness, base weights
frozen, and the upgrade directory round trip (tiny CLIPs)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from _compat_helpers import captions, images, tiny_encoder
from nobackfill.compat.adapters import AdapterConfig, Adapters, trainable_names
from nobackfill.compat.data import Pairs
from nobackfill.compat.direct import train_direct
from nobackfill.compat.phi import Projection
from nobackfill.compat.upgrade import load_upgrade, space_info
from nobackfill.compat.xbt import XBTConfig, train_xbt
from nobackfill.gallery.types import SpaceMismatchError
from nobackfill.config import updated

LORA_RE = re.compile(r"^(vision|text)_model\.encoder\.layers\.(\d+)\.self_attn\.(q|k|v|out)_proj\.lora_[AB]\.default\.weight$")
LN_RE = re.compile(r"^(vision|text)_model\..*\.tuned_(weight|bias)$")


def _pairs(n: int = 16) -> Pairs:
    return Pairs(images(n, "train"), captions(n))


def test_xbt_trainable_set_is_exactly_the_papers():
    enc = tiny_encoder()
    n_ln = sum(isinstance(m, torch.nn.LayerNorm) for m in enc.model.modules())
    n_layers = enc.model.config.vision_config.num_hidden_layers + enc.model.config.text_config.num_hidden_layers
    ad = Adapters(enc.model, AdapterConfig())
    names = trainable_names(enc.model)
    lora = {n for n in names if LORA_RE.match(n)}
    ln = {n for n in names if LN_RE.match(n)}
    assert lora and len(lora) == n_layers * 4 * 2  # q, k, v, out; A and B; every layer of both towers
    assert len(ln) == 2 * n_ln  # a tuned copy of every LayerNorm of both towers
    assert names == lora | ln | {"nobackfill_vision_prompts.prompts"}
    prompts = enc.model.nobackfill_vision_prompts.prompts
    assert prompts.shape == (10, enc.model.config.vision_config.hidden_size)  # 10 prompts, vision only
    cfg = ad.lora_config
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (16, 16, 0.1)
    # the stage-2 method adds phi's LayerNorms only (App. A.2) and gives prompts 100x the lr
    up_enc = tiny_encoder()
    phi = Projection(32, 16)
    from nobackfill.compat.upgrade import new_upgraded_encoder
    from nobackfill.compat.xbt import XBTTraining

    up = new_upgraded_encoder(up_enc, phi, {"space_id": "old", "name": "", "embed_dim": 16}, AdapterConfig())
    groups = XBTTraining(up, XBTConfig()).param_groups()
    assert [g.get("lr_scale", 1.0) for g in groups] == [1.0, 100.0]
    assert {id(p) for p in groups[1]["params"]} == {id(up.adapters.prompts.prompts)}
    phi_trainable = {n for n, p in phi.named_parameters() if p.requires_grad}
    assert phi_trainable == {"net.1.weight", "net.1.bias", "net.4.weight", "net.4.bias"}


def test_baseline_trainable_sets():
    enc = tiny_encoder()
    Adapters(enc.model, AdapterConfig.lora_only())
    names = trainable_names(enc.model)
    assert names and all(LORA_RE.match(n) for n in names)
    enc = tiny_encoder()
    Adapters(enc.model, AdapterConfig.base())
    names = trainable_names(enc.model)
    assert {n for n in names if not LORA_RE.match(n)} == {"nobackfill_vision_prompts.prompts"}


def test_on_off_exact_and_base_weights_never_change(tmp_path):
    ref = tiny_encoder(seed=1)
    new = tiny_encoder(seed=1)
    original = {k: v.clone() for k, v in new.model.state_dict().items()}
    imgs, caps = images(5), captions(5)
    ref_i, ref_t = ref.encode_images(imgs), ref.encode_texts(caps)
    cfg = updated(XBTConfig(), steps=3, batch_size=8, lr=1e-2, warmup=0)
    up, _ = train_xbt(new, Projection(32, 16), _pairs(), cfg, tmp_path / "up",
                      target={"space_id": "old-space", "name": "old", "embed_dim": 16})
    base = up.adapters.base_state_dict()
    assert base.keys() == original.keys()
    assert all(torch.equal(base[k], original[k]) for k in original)  # base weights untouched
    on_i = up.encode_images(imgs)
    assert on_i.shape == (5, 16) and up.space_id == "old-space"
    with up.switched(False):
        assert up.space_id == ref.space_id and up.embed_dim == 32
        assert np.abs(up.encode_images(imgs) - ref_i).max() == 0.0
        assert np.abs(up.encode_texts(caps) - ref_t).max() == 0.0
    # with the upgrade on, the adapted model differs from the original (before phi)
    with up.adapters.switched(True), torch.no_grad():
        v = up.base.image_features(up.preprocessor(imgs))
    with up.adapters.switched(False), torch.no_grad():
        v0 = up.base.image_features(up.preprocessor(imgs))
    assert not torch.equal(v, v0)


def test_upgrade_round_trip_and_source_check(tmp_path):
    new = tiny_encoder(seed=2)
    cfg = updated(XBTConfig(), steps=2, batch_size=8, lr=1e-2, warmup=0)
    up, _ = train_xbt(new, Projection(32, 16), _pairs(), cfg, tmp_path / "up",
                      target={"space_id": "old-space", "name": "old", "embed_dim": 16})
    imgs, caps = images(4), captions(4)
    on_i, on_t = up.encode_images(imgs), up.encode_texts(caps)
    man = json.loads((tmp_path / "up" / "upgrade.json").read_text())
    assert man["kind"] == "xbt" and man["target"]["space_id"] == "old-space"
    assert man["source"]["space_id"] == up.source
    for f in ("adapter_model.safetensors", "adapter_config.json", "phi.safetensors", "phi_config.json"):
        assert (tmp_path / "up" / f).is_file()
    assert json.loads((tmp_path / "up" / "adapter_config.json").read_text())["r"] == 16
    u = load_upgrade(tmp_path / "up")
    fresh = tiny_encoder(seed=2)
    ref_i = fresh.encode_images(imgs)
    up2 = u.apply(fresh)
    assert np.array_equal(up2.encode_images(imgs), on_i) and np.array_equal(up2.encode_texts(caps), on_t)
    up2.enabled = False
    assert np.abs(up2.encode_images(imgs) - ref_i).max() == 0.0
    with pytest.raises(SpaceMismatchError):
        u.apply(tiny_encoder(seed=3))  # another new model
    with pytest.raises(FileNotFoundError, match="not an upgrade directory"):
        load_upgrade(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope: no such directory"):  # trial Z: said as a model's is
        load_upgrade(tmp_path / "nope")


def test_direct_modes_and_full_tune_export(tmp_path):
    old = tiny_encoder(dim=16, seed=5)
    for mode, kind in (("lora", "direct-lora"), ("base", "direct-base"), ("full", "direct-full")):
        new = tiny_encoder(seed=6)
        before = {k: v.clone() for k, v in new.model.state_dict().items()}
        up, res = train_direct(new, old, _pairs(), mode, updated(XBTConfig(), steps=2, batch_size=8, warmup=0),
                               tmp_path / mode)
        assert np.isfinite(res.last_loss)
        assert load_upgrade(tmp_path / mode).kind == kind
        if mode == "full":
            after = new.model.state_dict()
            assert any(not torch.equal(before[k], after[k]) for k in before)  # Full-tune changes the model
            assert (tmp_path / mode / "encoder" / "config.json").is_file()
        else:
            assert all(torch.equal(before[k], up.adapters.base_state_dict()[k]) for k in before)


def test_merged_upgrade_equals_the_switchable_one_and_refuses_to_switch_off():
    """Serving merges LoRA and the tuned LayerNorms into a copy of the model (prompts kept)."""
    from pathlib import Path

    from nobackfill.compat.upgrade import load_upgrade
    from nobackfill.encoders import load_encoder

    root = Path(__file__).resolve().parents[1]
    up = load_upgrade(root / "upgrades" / "world-old-to-new").apply(load_encoder(root / "models" / "world-new"))
    merged = up.merged()
    texts = ["a red circle on the left", "two small blue squares"]
    images = [np.random.default_rng(i).integers(0, 255, (64, 64, 3), dtype=np.uint8) for i in range(2)]
    assert np.abs(up.encode_texts(texts) - merged.encode_texts(texts)).max() < 1e-5
    assert np.abs(up.encode_images(images) - merged.encode_images(images)).max() < 1e-5
    assert merged.space_id == up.space_id
    with up.switched(False):  # the original keeps its adapters (and can still be switched off)
        assert up.encode_texts(texts).shape[1] == 128 != merged.encode_texts(texts).shape[1]
    with pytest.raises(ValueError, match="cannot be switched off"):
        with merged.switched(False):
            pass


def test_an_xbt_resume_on_other_pairs_is_refused_naming_the_data(tmp_path, monkeypatch):
    """trial AB: a training resumed on other data trained on both without a word."""
    from nobackfill.compat.xbt import XBTTraining
    from nobackfill.train.loop import ResumeMismatch, TrainingInterrupted

    cfg = updated(XBTConfig(), steps=6, batch_size=8, lr=1e-2, warmup=0, checkpoint_every=2)
    target = {"space_id": "old-space", "name": "old", "embed_dim": 16}
    loss = XBTTraining.loss

    def stop_at_3(self, batch, step):
        if step == 3:
            raise KeyboardInterrupt
        return loss(self, batch, step)

    with monkeypatch.context() as m:
        m.setattr(XBTTraining, "loss", stop_at_3)
        with pytest.raises(TrainingInterrupted):
            train_xbt(tiny_encoder(seed=1), Projection(32, 16), _pairs(), cfg, tmp_path / "up", target=target,
                      data=tmp_path / "pairs_a", corpus=tmp_path / "corpus_a")
    other = Pairs(images(16, "val"), captions(16))
    with pytest.raises(ResumeMismatch, match=r"was written by a run with data '.*pairs_a' \(now '.*pairs_b'\), "
                                             r"data contents '[0-9a-f]{16}' \(now '[0-9a-f]{16}'\)"):
        train_xbt(tiny_encoder(seed=1), Projection(32, 16), other, cfg, tmp_path / "up", target=target,
                  data=tmp_path / "pairs_b")
    with pytest.raises(ResumeMismatch, match=r"with data contents '[0-9a-f]{16}' \(now '[0-9a-f]{16}'\)"):
        train_xbt(tiny_encoder(seed=1), Projection(32, 16), other, cfg, tmp_path / "up", target=target)
    other_phi = Projection(32, 16)  # stage 1 trained again on another --text-corpus (trial AF: resumed)
    with torch.no_grad():
        next(other_phi.parameters()).add_(0.01)
    with pytest.raises(ResumeMismatch, match=r"with text corpus '.*corpus_a' \(now '.*corpus_b'\), stage 1 \(phi\) "
                                             r"'[0-9a-f]{16}' \(now '[0-9a-f]{16}'\)"):
        train_xbt(tiny_encoder(seed=1), other_phi, _pairs(), cfg, tmp_path / "up", target=target,
                  data=tmp_path / "pairs_a", corpus=tmp_path / "corpus_b")
    # the same pairs read from elsewhere (a copy, a moved folder) resume
    _, res = train_xbt(tiny_encoder(seed=1), Projection(32, 16), _pairs(), cfg, tmp_path / "up", target=target,
                       data=tmp_path / "pairs_moved")
    assert res.steps == 6 and [r["step"] for r in res.history][-1] == 6
