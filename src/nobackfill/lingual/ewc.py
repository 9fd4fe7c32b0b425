"""``oewc``: online EWC on the token embeddings (Schwarz et al. 2018; the CLL-CLIP paper's
baseline, Yang et al. 2024, Reproducibility: lambda 1000, gamma 1): the loss becomes

    ``L + lambda/2 ||theta_t - theta*_{t-1}||^2_{gamma F*_{t-1}}``

with the diagonal Fisher ``F* <- gamma F* + F_t`` accumulated after every task (mean squared
gradients of Eq. 4 over ``ewc_batches`` batches) and ``theta*`` the table after the last task.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch

from .base import LingualMethod, Tensors, register
from .embeddings import token_embedding


@register
class OnlineEWC(LingualMethod):
    """The Fisher and anchor survive a save (``state``)."""

    NAME = "oewc"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.strength, self.gamma = float(cfg.ewc_strength), float(cfg.ewc_gamma)
        self.fisher: torch.Tensor | None = None
        self.anchor: torch.Tensor | None = None

    def penalty(self, weight: torch.Tensor) -> torch.Tensor:
        """``lambda/2 sum F* (theta - theta*)^2`` over the rows that existed at the last task."""
        if self.fisher is None:
            return weight.sum() * 0.0
        n = self.anchor.shape[0]
        return 0.5 * self.strength * (self.fisher * (weight[:n] - self.anchor).pow(2)).sum()

    def observe(self, trainer, batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        pen = self.penalty(trainer.weight)
        return pen, {"L_ewc": float(pen.detach())}

    def consolidate(self, weight: torch.Tensor, losses: Callable[[], Iterable[torch.Tensor]]) -> None:
        """Add this task's diagonal Fisher (mean squared gradients over ``losses()``) and anchor
        at the current weights."""
        fisher = torch.zeros_like(weight)
        n = 0
        for loss in losses():
            weight.grad = None
            loss.backward()
            fisher += weight.grad.detach().pow(2)
            n += 1
        weight.grad = None
        fisher /= max(n, 1)
        if self.fisher is not None:
            old = torch.zeros_like(fisher)
            old[:self.fisher.shape[0]] = self.fisher
            fisher = self.gamma * old + fisher
        self.fisher = fisher
        self.anchor = weight.detach().clone()

    def end_task(self, learner, task, english: np.ndarray, batches) -> None:
        enc = learner.encoder
        w = token_embedding(enc).weight
        trainer = learner.trainer(np.ones(w.shape[0]))
        n = min(self.cfg.ewc_batches, max(1, len(task.foreign) // batches.bs))

        def losses():
            for i in range(n):
                b = batches.batch(i)
                yield trainer.task_loss(b.english, b.foreign, b.images)[0]

        try:
            self.consolidate(w, losses)
        finally:
            trainer.close()
            enc.model.requires_grad_(False)

    def state(self) -> tuple[Tensors, dict[str, Any]]:
        if self.fisher is None:
            return {}, {}
        return {"fisher": self.fisher.contiguous(), "anchor": self.anchor.contiguous()}, {}

    def load_state(self, encoder, tensors: Tensors, meta: dict[str, Any]) -> None:
        self.fisher, self.anchor = tensors.get("fisher"), tensors.get("anchor")


__all__ = ["OnlineEWC"]
