"""The checkpoints shipped in models/: small, reproducible, and the upgrade is worth it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nobackfill.data.world import WorldSpec, generate_world
from nobackfill.demo import run_demo
from nobackfill.encoders import load_encoder

MODELS = Path(__file__).resolve().parents[1] / "models"
PRESETS = ("world-old", "world-new", "world-newer")


def _shipped(name: str) -> Path:
    d = MODELS / name
    if not (d / "model.safetensors").is_file():
        pytest.skip(f"{d} not shipped")
    return d


@pytest.mark.parametrize("name", PRESETS)
def test_checkpoint_small_and_reproducible(name):
    d = _shipped(name)
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < 10 * 2**20, f"{d} is {size / 2**20:.1f} MB"
    recipe = json.loads((d / "recipe.json").read_text())
    assert recipe["command"].startswith(f"nobackfill train --preset {name} ")
    meta = json.loads((d / "nobackfill.json").read_text())
    assert load_encoder(d).space_id == meta["space_id"]


def test_dims_increase():
    dims = [load_encoder(_shipped(n)).embed_dim for n in PRESETS]
    assert dims == sorted(dims) and len(set(dims)) == 3


def test_new_beats_old_and_raw_is_near_chance(tmp_path):
    models = _shipped("world-new").parent
    _shipped("world-old")
    world = generate_world(tmp_path / "world", WorldSpec(n_train=600, n_val=0, n_test=300, langs=("en",)), workers=1,
                           progress=False)
    res = run_demo(world, models, tmp_path / "demo", progress=False, log=lambda m: None, limit=300)
    assert res["n_images"] == 300
    for d in ("t2i", "i2t"):
        assert res["new_new"][d]["R@1"] >= res["old_old"][d]["R@1"] + 0.15
        assert res["new_old_raw"][d]["R@1"] <= 0.05
    if (MODELS.parent / "upgrades" / "world-old-to-new" / "upgrade.json").is_file():
        # the shipped XBT upgrade: new queries against the OLD gallery beat old/old image->text
        # (the direction with room; see README for text->image) and switch off exactly
        assert res["xbt"]["i2t"]["R@1"] > res["old_old"]["i2t"]["R@1"] + 0.05
        assert res["xbt_onoff_max_abs_diff"] == 0.0
    # bridges fitted on 512 backfilled scenes, chosen without labels, beat old/old text -> image
    assert res["fitted"]["t2i"]["R@1"] > res["old_old"]["t2i"]["R@1"] + 0.1
    assert res["fitted_bridge"]["scenes"] == 512
    # the live upgrade with no bridge: bridges fitted from its own backfill as it advances, served
    # without labels, never below what the old model served (0 %)
    steps = res["live_upgrade_fitted"]["steps"]
    assert steps[0]["pairs"] == 0 and steps[-1]["fraction"] == 1.0 and not steps[0]["bridges"]
    for d in ("t2i", "i2t"):
        assert all(s[d] >= steps[0][d] - 0.005 for s in steps), [s[d] for s in steps]
    assert "t2i" in steps[-1]["bridges"] and steps[-1]["t2i"] > steps[0]["t2i"] + 0.15


UPGRADES = MODELS.parent / "upgrades"


def test_shipped_xbt_upgrade_targets_old_and_switches_off_exactly():
    """upgrades/world-old-to-new: small, its recipe re-creates it, it maps world-new into
    world-old's space, and switched off the new model is the original bit for bit."""
    import numpy as np

    from nobackfill.compat.upgrade import load_upgrade

    d = UPGRADES / "world-old-to-new"
    if not (d / "upgrade.json").is_file():
        pytest.skip(f"{d} not shipped")
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < 5 * 2**20
    meta = json.loads((d / "upgrade.json").read_text())
    assert meta["recipe"]["command"].startswith("nobackfill upgrade xbt --old models/world-old --new models/world-new")
    old, new = load_encoder(_shipped("world-old")), load_encoder(_shipped("world-new"))
    up = load_upgrade(d)
    assert (up.source_id, up.target_id) == (new.space_id, old.space_id)
    texts = ["a red circle", "two blue squares on grass"]
    ref = new.encode_texts(texts)
    upgraded = up.apply(load_encoder(_shipped("world-new")))
    assert upgraded.space_id == old.space_id and upgraded.encode_texts(texts).shape == (2, old.embed_dim)
    with upgraded.switched(False):
        assert np.array_equal(upgraded.encode_texts(texts), ref)


def test_shipped_multi30k_old_text_model():
    """models/m30k-old-text: the old text model of bench xbt-text, with its recipe and early-stopped
    validation score (>= 0.40 caption-to-caption R@1 on Multi30K task2 val, as the issue asks)."""
    d = MODELS / "m30k-old-text"
    if not (d / "model.safetensors").is_file():
        pytest.skip(f"{d} not shipped")
    recipe = json.loads((d / "recipe.json").read_text())
    assert recipe["command"].startswith("nobackfill train-text ")
    assert recipe["best_val_R@1"] >= 0.40
    enc = load_encoder(d)
    assert enc.space_id == json.loads((d / "nobackfill.json").read_text())["space_id"]
    assert enc.encode_texts(["a dog runs"]).shape == (1, 32)


def test_shipped_xbt_text_upgrade_maps_minilm_into_the_old_text_space():
    """upgrades/m30k-old-text-to-minilm: small, made by ``upgrade xbt-text``, source = the real
    all-MiniLM-L6-v2, target = models/m30k-old-text; loaded from disk it embeds texts into the
    old space and, switched off, is MiniLM bit for bit."""
    import numpy as np

    from nobackfill.compat.upgrade import TextUpgradedEncoder, load_upgrade
    from nobackfill.encoders.minilm import MiniLMTextEncoder

    d = UPGRADES / "m30k-old-text-to-minilm"
    if not (d / "upgrade.json").is_file():
        pytest.skip(f"{d} not shipped")
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < 5 * 2**20, f"{d} is {size / 2**20:.1f} MB"
    meta = json.loads((d / "upgrade.json").read_text())
    assert meta["kind"] == "xbt-text"
    assert meta["recipe"]["command"].startswith("nobackfill upgrade xbt-text --old models/m30k-old-text --new pretrained")
    new, old = MiniLMTextEncoder.pretrained(), load_encoder(MODELS / "m30k-old-text")
    up = load_upgrade(d)
    assert (up.source_id, up.target_id) == (new.space_id, old.space_id)
    texts = ["a dog runs through the snow", "two men play guitar on a stage"]
    ref = new.encode_texts(texts)
    upgraded = up.apply(MiniLMTextEncoder.pretrained())
    assert isinstance(upgraded, TextUpgradedEncoder) and upgraded.space_id == old.space_id
    assert upgraded.encode_texts(texts).shape == (2, old.embed_dim)
    with upgraded.switched(False):
        assert np.array_equal(upgraded.encode_texts(texts), ref)
