"""CLL-CLIP as a :class:`nobackfill.train.loop.Method`: the one training loop trains a task's
token embeddings (and a method's own parameters) on Eq. 4 of the CLL-CLIP paper (Yang et al. 2024),

    ``L = gamma_1 L_cm + gamma_2 L_cl``                                        (Eq. 4)

plus whatever the task's :class:`~.base.LingualMethod` adds in ``observe`` (EWC penalty, replay,
key matching). TEIR's row scales (Eq. 5-6, :class:`~.teir.RowScaledEmbedding`) act through the
loop's hooks: ``before_backward`` takes the snapshot of the rows whose step is rescaled and
``after_step`` rescales the step and applies the per-row weight decay - never inside ``loss()``.
The baselines themselves are plug-ins, by name: :mod:`nobackfill.lingual.registry`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..train.loop import LoopConfig, Method, lr_factor
from .embeddings import freeze_all_but_token_embeddings
from .losses import cll_clip_loss
from .tasks import LingualBatch
from .teir import RowScaledEmbedding

if TYPE_CHECKING:  # pragma: no cover
    from .base import LingualMethod


def text_features(encoder, texts: Sequence[str]) -> torch.Tensor:
    """L2-normalised, differentiable text features ``r^F`` of the current model."""
    enc = encoder.tokenize(list(texts))
    return F.normalize(encoder.text_features(**enc), dim=-1)


class CLLCLIPMethod(Method):
    """One task of CLL-CLIP: the text tower is frozen except its token embeddings and the
    parameters of the ``plugin`` (a :class:`~.base.LingualMethod`; None: plain CLL-CLIP)."""

    def __init__(self, encoder, scales: np.ndarray, loop: LoopConfig, *, plugin: "LingualMethod | None" = None,
                 teir: bool = False, gamma_cm: float, gamma_cl: float, temperature: float, scale_mode: str = "grad",
                 extra_params: Sequence[torch.nn.Parameter] = ()) -> None:
        self.plugin = plugin
        self.name = f"{plugin.NAME if plugin is not None else 'cll_clip'}{'_teir' if teir else ''}"
        self.encoder = encoder
        self.loop = loop
        self.weight = freeze_all_but_token_embeddings(encoder)
        self.extra = list(extra_params)
        for p in self.extra:
            p.requires_grad_(True)
        self.rows = RowScaledEmbedding(self.weight, scales, loop.weight_decay, mode=scale_mode)
        self.gamma_cm, self.gamma_cl, self.temperature = gamma_cm, gamma_cl, temperature

    def param_groups(self) -> list[dict]:
        groups = [{"params": [self.weight], "weight_decay": 0.0}]  # decay applied per row (Eq. 5)
        if self.extra:
            groups.append({"params": self.extra})
        return groups

    def task_loss(self, english: torch.Tensor, foreign: Sequence[str],
                  images: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Eq. 4 on one set of triplets."""
        return cll_clip_loss(english, text_features(self.encoder, foreign), images, gamma_cm=self.gamma_cm,
                             gamma_cl=self.gamma_cl, temperature=self.temperature)

    def loss(self, batch: LingualBatch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        loss, logs = self.task_loss(batch.english, batch.foreign, batch.images)
        if self.plugin is not None:
            extra, more = self.plugin.observe(self, batch, step)
            if extra is not None:
                loss = loss + extra
            logs.update(more)
        return loss, logs

    def before_backward(self, step: int) -> None:
        self.rows.before_step()  # TEIR, mode "update": remember the rows whose step Eq. 5 rescales

    def after_step(self, step: int) -> None:
        self.rows.after_step(self.loop.lr * lr_factor(step, self.loop))

    def train_mode(self, training: bool) -> None:
        # the frozen tower runs deterministically (dropout off); only the embeddings learn
        self.encoder.model.eval()
        self.encoder.invalidate_space_id()

    def state_dict(self) -> dict:
        return {"weight": self.weight.detach().clone(), "extra": [p.detach().clone() for p in self.extra]}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.weight.copy_(state["weight"])
            for p, v in zip(self.extra, state["extra"]):
                p.copy_(v)
        self.encoder.invalidate_space_id()

    def export(self, out: Path) -> None:  # the learner saves the model after the whole sequence
        pass

    def close(self) -> None:
        self.rows.remove()


__all__ = ["CLLCLIPMethod", "LingualBatch", "text_features"]
