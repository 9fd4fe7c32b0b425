"""Deterministic batch sources for the training loop (``batch(i)`` is a pure function of i)."""

from __future__ import annotations

import numpy as np

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .folder import PairDataset
from .world import WorldStream


class WorldBatches:
    """Fresh world scenes every step: ``(pixels uint8 (B,64,64,3), captions)``."""

    def __init__(self, stream: WorldStream) -> None:
        self.stream = stream

    def batch(self, index: int):
        pixels, captions, _ = self.stream.batch(index)
        return pixels, captions


class FolderBatches:
    """Image-caption pairs from a user data folder, reshuffled every epoch (seeded).

    Each batch holds distinct images, each with one of its captions (chosen per epoch)."""

    def __init__(self, data: "PairDataset", batch_size: int, seed: int = 0) -> None:
        if len(data) < batch_size:
            raise ValueError(f"{data.root}: {len(data)} images, fewer than batch size {batch_size}")
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.per_epoch = len(data) // batch_size
        self._caps_of = [[] for _ in range(len(data))]
        for c, i in enumerate(data.caption_image):
            self._caps_of[int(i)].append(c)
        self._paths = data.image_paths()

    def batch(self, index: int):
        epoch, k = divmod(index, self.per_epoch)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.data))
        idx = order[k * self.batch_size:(k + 1) * self.batch_size]
        caps = [self.data.captions[self._caps_of[i][int(rng.integers(len(self._caps_of[i])))]] for i in idx]
        return [self._paths[i] for i in idx], caps
