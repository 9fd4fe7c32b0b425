"""Rehearsal baselines of the CLL-CLIP paper (Yang et al. 2024, Reproducibility; buffer 8,000, reservoir
sampling):

* ``er``  (Chaudhry et al. 2019): Eq. 4 also on a replayed batch of earlier tasks' triplets;
* ``der`` (Buzzega et al. 2020): ``L + alpha L_KD`` with
  ``L_KD = 1/(2K) sum_k ||r^M_k - r^F_k||^2`` on the features ``r^M`` stored when the items
  entered the buffer (alpha 1).

The :class:`ReplayBuffer` (texts in JSON, features as tensors) survives a save.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .base import LingualMethod, Tensors
from .losses import cross_lingual_loss
from .registry import register


@dataclass
class ReplayBuffer:
    """Reservoir buffer of earlier tasks' triplets (ER) and their stored features (DER)."""

    capacity: int
    foreign: list[str] = field(default_factory=list)
    english: list[np.ndarray] = field(default_factory=list)
    images: list[np.ndarray | None] = field(default_factory=list)
    stored: list[np.ndarray | None] = field(default_factory=list)
    seen: int = 0

    def add(self, task, english: np.ndarray, rng: np.random.Generator) -> list[int]:
        """Reservoir-sample the task's items; returns the slots written."""
        written = []
        for i in range(len(task.foreign)):
            slot = len(self.foreign) if len(self.foreign) < self.capacity else int(rng.integers(self.seen + 1))
            self.seen += 1
            if slot >= self.capacity:
                continue
            item = (task.foreign[i], english[i], None if task.images is None else task.images[i], None)
            if slot == len(self.foreign):
                for lst, v in zip((self.foreign, self.english, self.images, self.stored), item):
                    lst.append(v)
            else:
                self.foreign[slot], self.english[slot], self.images[slot], self.stored[slot] = item
            written.append(slot)
        return sorted(set(written))

    def __len__(self) -> int:
        return len(self.foreign)

    def to_state(self) -> tuple[Tensors, dict[str, Any]]:
        """Features as tensors (absent entries: a 0/1 mask), texts and counters as JSON."""
        tensors: Tensors = {}
        for key in ("english", "images", "stored"):
            rows = getattr(self, key)
            have = [r is not None for r in rows]
            if any(have):
                dim = next(r for r in rows if r is not None).shape[-1]
                tensors[key] = torch.from_numpy(np.stack([np.zeros(dim, np.float32) if r is None
                                                          else np.asarray(r, np.float32) for r in rows]))
                tensors[f"{key}_present"] = torch.tensor(have, dtype=torch.uint8)
        return tensors, {"capacity": self.capacity, "seen": self.seen, "foreign": list(self.foreign)}

    @classmethod
    def from_state(cls, tensors: Tensors, meta: dict[str, Any]) -> "ReplayBuffer":
        buf = cls(int(meta["capacity"]), list(meta["foreign"]), seen=int(meta["seen"]))
        for key in ("english", "images", "stored"):
            if key in tensors:
                have = tensors[f"{key}_present"].bool().tolist()
                setattr(buf, key, [r.numpy() if h else None for r, h in zip(tensors[key], have)])
            else:
                setattr(buf, key, [None] * len(buf.foreign))
        return buf


@register
class ExperienceReplay(LingualMethod):
    """``er``: Eq. 4 on the task's batch plus Eq. 4 on a replayed batch."""

    NAME = "er"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.buffer = ReplayBuffer(cfg.memory_size)
        self.rng = np.random.default_rng(cfg.seed)

    def replay(self) -> ReplayBuffer:
        return self.buffer

    def observe(self, trainer, batch, step: int) -> tuple[torch.Tensor | None, dict[str, float]]:
        if batch.replay is None:
            return None, {}
        r = batch.replay
        extra, _ = trainer.task_loss(r.english, r.foreign, r.images)
        return extra, {"L_replay": float(extra.detach())}

    def end_task(self, learner, task, english: np.ndarray, batches) -> None:
        self.buffer.add(task, english, self.rng)

    def state(self) -> tuple[Tensors, dict[str, Any]]:
        tensors, meta = self.buffer.to_state()
        meta["rng"] = self.rng.bit_generator.state
        return tensors, meta

    def load_state(self, encoder, tensors: Tensors, meta: dict[str, Any]) -> None:
        if meta:
            self.buffer = ReplayBuffer.from_state(tensors, meta)
            self.rng.bit_generator.state = meta["rng"]


@register
class DarkExperienceReplay(ExperienceReplay):
    """``der``: ``alpha L_KD`` between the replayed texts' current and stored features."""

    NAME = "der"

    def observe(self, trainer, batch, step: int) -> tuple[torch.Tensor | None, dict[str, float]]:
        if batch.replay is None:
            return None, {}
        from .methods import text_features

        kd = cross_lingual_loss(batch.replay_targets, text_features(trainer.encoder, batch.replay.foreign))
        return self.cfg.der_alpha * kd, {"L_kd": float(kd.detach())}

    def end_task(self, learner, task, english: np.ndarray, batches) -> None:
        slots = self.buffer.add(task, english, self.rng)
        if slots:
            with torch.no_grad():
                feats = learner.encoder.encode_texts([self.buffer.foreign[s] for s in slots])
            for s, f in zip(slots, feats):
                self.buffer.stored[s] = f


__all__ = ["ReplayBuffer", "ExperienceReplay", "DarkExperienceReplay"]
