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
    world = generate_world(tmp_path / "world", WorldSpec(n_train=0, n_val=0, n_test=300, langs=("en",)), workers=1,
                           progress=False)
    res = run_demo(world, models, tmp_path / "demo", progress=False, log=lambda m: None, limit=300)
    assert res["n_images"] == 300
    for d in ("t2i", "i2t"):
        assert res["new_new"][d]["R@1"] >= res["old_old"][d]["R@1"] + 0.15
        assert res["new_old_raw"][d]["R@1"] <= 0.05
