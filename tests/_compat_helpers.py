"""Tiny CLIP encoders for the compat tests (untrained, built in well under a second)."""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from conftest import tiny_preset
from nobackfill.data.world import WorldSpec, make_item, world_corpus


@lru_cache(maxsize=1)
def _tokenizer():
    from nobackfill.encoders.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer(world_corpus(WorldSpec(), 400), 300, 40)


def tiny_encoder(dim: int = 32, seed: int = 0):
    """A fresh tiny world CLIP (``dim``-d embeddings); the same (dim, seed) gives the same weights."""
    from nobackfill.encoders.zoo import create_model, get_preset

    p = Path(tempfile.mkdtemp()) / f"tiny{dim}.toml"
    p.write_text(tiny_preset(dim=dim, steps=2))
    return create_model(get_preset(p), _tokenizer(), seed=seed)


def images(n: int = 6, split: str = "test") -> np.ndarray:
    return np.stack([make_item(0, split, i)[1] for i in range(n)])


def captions(n: int = 6) -> list[str]:
    return world_corpus(WorldSpec(), n, split="test")
