"""Contrastive image-text pre-training of a CLIP dual encoder: symmetric InfoNCE with a learnable
temperature (CLIP; the L_c of Eq. 3-6 in the XBT paper)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..encoders.clip import CLIPDualEncoder
from .loop import Method


def info_nce(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE between row-aligned L2-normalised ``a`` and ``b``:
    ``(CE(s a b^T, I) + CE(s b a^T, I)) / 2`` with logit scale ``s = 1 / tau``."""
    logits = scale * a @ b.t()
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


class ContrastivePretraining(Method):
    """Train every weight of a :class:`CLIPDualEncoder` with symmetric InfoNCE.

    Batches are ``(pixels, captions)``: pixels uint8 ``(B, H, W, 3)`` (or any image inputs the
    encoder's preprocessor takes), captions a list of B strings.
    """

    name = "contrastive"

    def __init__(self, encoder: CLIPDualEncoder, max_logit_scale: float = 100.0, save_dtype: str = "float32") -> None:
        self.encoder = encoder
        self.save_dtype = save_dtype
        self.max_log_scale = float(np.log(max_logit_scale))

    def param_groups(self) -> list[dict]:
        decay, no_decay = [], []
        for n, p in self.encoder.model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 or "embedding" in n or n == "logit_scale" else decay).append(p)
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]

    def loss(self, batch: tuple[np.ndarray, Sequence[str]], step: int):
        pixels, captions = batch[0], batch[1]
        enc = self.encoder
        img = F.normalize(enc.image_features(enc.preprocessor(pixels)), dim=-1)
        txt = F.normalize(enc.text_features(**enc.tokenize(captions)), dim=-1)
        scale = enc.model.logit_scale.exp()
        loss = info_nce(img, txt, scale)
        return loss, {"temperature": float(1.0 / scale.item())}

    def train_mode(self, training: bool) -> None:
        self.encoder.model.train(training)
        self.encoder.invalidate_space_id()

    def after_step(self, step: int) -> None:
        with torch.no_grad():
            self.encoder.model.logit_scale.clamp_(0.0, self.max_log_scale)

    def state_dict(self) -> dict:
        return {"model": self.encoder.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.encoder.model.load_state_dict(state["model"])
        self.encoder.invalidate_space_id()

    def export(self, out: Path) -> None:
        self.encoder.invalidate_space_id()
        self.encoder.save(out, weights_dtype=self.save_dtype)
