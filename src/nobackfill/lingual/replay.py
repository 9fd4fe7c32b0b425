"""Rehearsal baselines of the CLL-CLIP paper (Yang et al. 2024, Reproducibility; buffer 8,000, reservoir
sampling):

* ``er``  (Chaudhry et al. 2019): Eq. 4 also on a replayed batch of earlier tasks' triplets;
* ``der`` (Buzzega et al. 2020): ``L + alpha L_KD`` with
  ``L_KD = 1/(2K) sum_k ||r^M_k - r^F_k||^2`` on the features ``r^M`` stored when the items
  entered the buffer (alpha 1).

The :class:`~.tasks.ReplayBuffer` (texts in JSON, features as tensors) survives a save.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .base import LingualMethod, register
from .losses import cross_lingual_loss
from .tasks import ReplayBuffer, Tensors


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
