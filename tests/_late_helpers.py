"""Shared setup of the late-interaction tests: a tiny English world on disk, a tiny tokenizer, tiny
model presets."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from nobackfill.cli import app

from conftest import tiny_preset

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def tiny_world(root: Path, n_val: int, n_test: int) -> Path:
    """``root/world``: English, one caption per image, no train split."""
    r = invoke("world", "--out", root / "world", "--n-train", 0, "--n-val", n_val, "--n-test", n_test,
               "--langs", "en", "--captions-per-image", 1, "--workers", 1)
    assert r.exit_code == 0, r.output
    return root / "world"


def tiny_tokenizer():
    from nobackfill.data.world import WorldSpec, world_corpus
    from nobackfill.encoders.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer(world_corpus(WorldSpec(), 500), 300, 40)


def tiny_model(root: Path, name: str, dim: int, tokenizer, seed: int = 0):
    """A fresh (untrained) tiny CLIP of width ``dim``; its preset is written to ``root/name.toml``."""
    from nobackfill.encoders import create_model, get_preset

    (root / f"{name}.toml").write_text(tiny_preset(dim=dim))
    return create_model(get_preset(root / f"{name}.toml"), tokenizer, seed=seed)
