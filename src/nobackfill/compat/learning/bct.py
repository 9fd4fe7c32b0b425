"""BCT (Shen et al., CVPR 2020; the tutorial's BCT slide) and BT2 (its extension with extra
dimensions and a learnable basis transformation, the tutorial's BT^2 slide).

BCT: ``L = L(w_c, w_phi; T_new) + lambda L(w_c_old, w_phi; T_BCT)`` - the classification loss of the
new model plus the *influence loss*: the new features through the frozen old classifier. With
``T_BCT = T_new`` (our default, as in the slide's second option) the old classifier is extended with
*synthesised* rows for the new classes: the mean old-model feature of each new class's images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import CompatMethod, MethodConfig, StepContext, StepModel, class_means, classifier_logits
from .registry import register


def synthesised_classifier(old_weight: torch.Tensor, old_feats: torch.Tensor, labels: torch.Tensor,
                           n_prev: int, n_seen: int) -> torch.Tensor:
    """The frozen old classifier (``n_prev`` rows) extended with rows ``n_prev..n_seen-1``: the
    average old feature of each new class (BCT's synthesised classifier weights)."""
    means = class_means(old_feats, labels, n_seen)
    return torch.cat([old_weight[:n_prev], means[n_prev:n_seen]], 0).detach()


def influence_loss(feats: torch.Tensor, old_classifier: torch.Tensor, labels: torch.Tensor,
                   cosine_scale: float = 0.0) -> torch.Tensor:
    """Cross-entropy of the new features through the frozen (extended) old classifier (with the old
    model's logit form: ``f . w`` or ``s cos(f, w)``)."""
    return F.cross_entropy(classifier_logits(feats, old_classifier, cosine_scale), labels)


@dataclass
class BCTConfig(MethodConfig):
    influence_weight: float = 1.0  # lambda (BCT uses 1)


@register
class BCT(CompatMethod):
    """Backward-compatible training with an influence loss through the frozen old classifier."""

    name = "bct"
    Config = BCTConfig

    def prepare(self, ctx: StepContext) -> None:
        if ctx.old is None:
            return
        with torch.no_grad():
            old_feats = ctx.old(ctx.train_x)
        self.old_classifier = synthesised_classifier(ctx.old.weight(), old_feats, ctx.train_y, ctx.n_prev, ctx.n_seen)

    def compatible_part(self, feats: torch.Tensor) -> torch.Tensor:
        """The feature coordinates compared with the old model (all of them for BCT)."""
        return feats

    def extra_loss(self, batch, feats, step):
        inf = influence_loss(self.compatible_part(feats), self.old_classifier, batch["y"], self.ctx.old.cosine_scale)
        return self.cfg.influence_weight * inf, {"influence": float(inf.detach())}


@dataclass
class BT2Config(BCTConfig):
    extra_dims: int = 16  # dimensions added at every update


@register
class BT2(BCT):
    """BT^2: each update adds ``extra_dims`` dimensions and a learnable basis transformation ``B``
    (square, initialised to the identity) on top of the new body; the influence loss applies to the
    first ``dim_{t-1}`` coordinates of ``B h``, so the old-incompatible information can move to the
    orthogonal extra coordinates. Older galleries are compared by zero-padding them."""

    name = "bt2"
    Config = BT2Config

    def new_model(self, ctx: StepContext) -> StepModel:
        if ctx.old is None:
            return super().new_model(ctx)
        torch.manual_seed(ctx.seed * 1000 + ctx.t)
        dim = ctx.old.out_dim + self.cfg.extra_dims
        model = StepModel(ctx.in_dim, self.model_cfg, out_dim=dim)
        model.transform = nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            model.transform.weight.copy_(torch.eye(dim))
        return model

    def compatible_part(self, feats: torch.Tensor) -> torch.Tensor:
        return feats[:, : self.ctx.old.out_dim]
