"""Probability / Logit Simplex Projections (the tutorial's PSP and LSP slides): no extra loss,
mapping or architecture - models are trained independently with cross-entropy and index their
*outputs* instead of their penultimate features.

* PSP: the softmax over the model's ``C`` seen classes, centred on the simplex centre
  ``o = (1/C) sum e_i`` (``v = p - o``), zero-padded to the pool's class count (the slide's
  ``P = [V | 0]``) and L2-normalised at search time.
* LSP: the logits over the seen classes, centred (a shift of all logits leaves the prediction
  unchanged), zero-padded the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import CompatMethod, StepModel, masked_logits
from .registry import register


def softmax_simplex_features(logits: torch.Tensor, n_seen: int, n_total: int) -> torch.Tensor:
    """``softmax(z[:C]) - 1/C`` padded with zeros to ``n_total`` columns."""
    p = F.softmax(masked_logits(logits, n_seen), dim=1) - 1.0 / n_seen
    return F.pad(p, (0, n_total - n_seen))


def logit_simplex_features(logits: torch.Tensor, n_seen: int, n_total: int) -> torch.Tensor:
    """``z[:C] - mean(z[:C])`` padded with zeros to ``n_total`` columns."""
    z = masked_logits(logits, n_seen)
    return F.pad(z - z.mean(1, keepdim=True), (0, n_total - n_seen))


class _OutputFeatures(CompatMethod):
    """Independent cross-entropy training (as the baseline); ``output_features`` maps the seen-class
    logits to what is indexed."""

    trains_like = "baseline"

    @staticmethod
    def output_features(logits: torch.Tensor, n_seen: int, n_total: int) -> torch.Tensor:
        raise NotImplementedError

    def retrieval_features(self, model: StepModel, x: torch.Tensor) -> torch.Tensor:
        return self.output_features(model.logits(model(x)), model.n_seen, self.model_cfg.n_classes)


@register
class PSP(_OutputFeatures):
    """PSP: independent training; index centred softmax outputs (zero-padded to the pool)."""

    name = "psp"
    output_features = staticmethod(softmax_simplex_features)


@register
class LSP(_OutputFeatures):
    """LSP: independent training; index centred logits (zero-padded to the pool)."""

    name = "lsp"
    output_features = staticmethod(logit_simplex_features)
