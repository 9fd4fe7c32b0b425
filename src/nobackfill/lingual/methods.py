"""CLL-CLIP as a :class:`nobackfill.train.loop.Method` plug-in, with the continual-learning
baselines of the CLL-CLIP paper (seed 004, Sec. "Comparing Methods" and Reproducibility):

* ``cll_clip`` - train only the token embeddings with Eq. 4;
* ``oewc``     - + ``lambda/2 ||theta_t - theta*_{t-1}||^2_{gamma F*_{t-1}}`` (online EWC, diagonal Fisher);
* ``er``       - + Eq. 4 on a replayed batch of earlier tasks' triplets (reservoir memory);
* ``der``      - + ``alpha L_KD``, ``L_KD = 1/(2K) sum ||r^M_k - r^F_k||^2`` on stored features;
* ``lora``     - + a task-specific LoRA adapter on the text tower's k/v projections (peft; the
  language picks the adapter at inference, see :mod:`nobackfill.lingual.adapters`);
* ``prompt``   - + a task-specific soft prompt (prompt tuning: learnable vectors inserted after the
  first token; the language picks its prompt at inference, see :mod:`nobackfill.lingual.prompts`).

Each can run with TEIR (``teir=True``: initialisation and the row scales of Eq. 5-6, see
:mod:`nobackfill.lingual.teir`) or without (N(0, 0.02^2) rows, ``lambda = 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..train.loop import LoopConfig, Method, lr_factor
from .embeddings import freeze_all_but_token_embeddings
from .losses import cll_clip_loss, cross_lingual_loss
from .teir import RowScaledEmbedding

METHODS = ("cll_clip", "oewc", "er", "der", "lora", "prompt")


@dataclass
class LingualBatch:
    """One training batch of triplets ``(x^I, x^E, x^F)``: foreign texts, the frozen English
    features ``r^E`` and (when the data has images) the frozen image features ``r^I``; plus an
    optional replay batch (ER: triplets; DER: foreign texts with stored features ``r^M``)."""

    foreign: list[str]
    english: torch.Tensor
    images: torch.Tensor | None = None
    replay: "LingualBatch | None" = None
    replay_targets: torch.Tensor | None = None  # DER: r^M of the replayed foreign texts


def text_features(encoder, texts: Sequence[str]) -> torch.Tensor:
    """L2-normalised, differentiable text features ``r^F`` of the current model."""
    enc = encoder.tokenize(list(texts))
    return F.normalize(encoder.text_features(**enc), dim=-1)


class CLLCLIPMethod(Method):
    """One task of CLL-CLIP (any baseline of :data:`METHODS`); the model's text tower is frozen
    except its token embeddings (and ``extra_params``, e.g. adapters, when given)."""

    def __init__(self, encoder, scales: np.ndarray, loop: LoopConfig, *, method: str = "cll_clip",
                 teir: bool = False, gamma_cm: float, gamma_cl: float, temperature: float,
                 ewc: "OnlineEWC | None" = None, der_alpha: float = 1.0, scale_mode: str = "grad",
                 extra_params: Sequence[torch.nn.Parameter] = ()) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        self.name = f"{method}{'_teir' if teir else ''}"
        self.method = method
        self.encoder = encoder
        self.loop = loop
        self.weight = freeze_all_but_token_embeddings(encoder)
        self.extra = list(extra_params)
        for p in self.extra:
            p.requires_grad_(True)
        self.rows = RowScaledEmbedding(self.weight, scales, loop.weight_decay, mode=scale_mode)
        self.gamma_cm, self.gamma_cl, self.temperature = gamma_cm, gamma_cl, temperature
        self.ewc = ewc
        self.der_alpha = der_alpha

    def param_groups(self) -> list[dict]:
        groups = [{"params": [self.weight], "weight_decay": 0.0}]  # decay applied per row (Eq. 5)
        if self.extra:
            groups.append({"params": self.extra})
        return groups

    def loss(self, batch: LingualBatch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        self.rows.before_step()  # the loop calls loss() right before backward and the optimiser step
        kw = dict(gamma_cm=self.gamma_cm, gamma_cl=self.gamma_cl, temperature=self.temperature)
        loss, logs = cll_clip_loss(batch.english, text_features(self.encoder, batch.foreign), batch.images, **kw)
        if batch.replay is not None:
            r = batch.replay
            feats = text_features(self.encoder, r.foreign)
            if self.method == "der":
                kd = cross_lingual_loss(batch.replay_targets, feats)
                loss = loss + self.der_alpha * kd
                logs["L_kd"] = float(kd.detach())
            else:
                extra, _ = cll_clip_loss(r.english, feats, r.images, **kw)
                loss = loss + extra
                logs["L_replay"] = float(extra.detach())
        if self.ewc is not None:
            pen = self.ewc.penalty(self.weight)
            loss = loss + pen
            logs["L_ewc"] = float(pen.detach())
        return loss, logs

    def train_mode(self, training: bool) -> None:
        # the frozen tower runs deterministically (dropout off); only the embeddings learn
        self.encoder.model.eval()
        self.encoder.invalidate_space_id()

    def after_step(self, step: int) -> None:
        self.rows.after_step(self.loop.lr * lr_factor(step, self.loop))

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


class OnlineEWC:
    """Online EWC on the token embeddings (Schwarz et al. 2018; paper: gamma 1, lambda 1000):
    ``F* <- gamma F* + F_t`` after each task, penalty ``lambda/2 sum F* (theta - theta*)^2``."""

    def __init__(self, strength: float = 1000.0, gamma: float = 1.0) -> None:
        self.strength, self.gamma = float(strength), float(gamma)
        self.fisher: torch.Tensor | None = None
        self.anchor: torch.Tensor | None = None

    def penalty(self, weight: torch.Tensor) -> torch.Tensor:
        if self.fisher is None:
            return weight.sum() * 0.0
        n = self.anchor.shape[0]
        return 0.5 * self.strength * (self.fisher * (weight[:n] - self.anchor).pow(2)).sum()

    def consolidate(self, weight: torch.Tensor, grad_sq_batches: Callable[[], Any]) -> None:
        """Add this task's diagonal Fisher (mean squared gradients over ``grad_sq_batches()``,
        an iterable of losses) and anchor at the current weights."""
        fisher = torch.zeros_like(weight)
        n = 0
        for loss in grad_sq_batches():
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


__all__ = ["CLLCLIPMethod", "LingualBatch", "OnlineEWC", "text_features", "METHODS"]
