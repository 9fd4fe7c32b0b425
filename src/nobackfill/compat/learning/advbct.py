"""AdvBCT (Pan et al., CVPR 2023; the tutorial's AdvBCT slides):
``L = L_cls + lambda L_p2s + gamma L_adv``.

* ``L_adv``: a discriminator tells old embeddings (label 0) from new ones (label 1) with binary
  cross-entropy; the new embedding model receives the *reversed* gradient (gradient reversal), so
  one optimiser trains the discriminator to separate and the embedding to confuse them.
* ``L_p2s`` (boundary-aware point-to-set): with the old class centres and the old classes' *max*
  radii, a new feature is pulled inside its old class's boundary and closer to its own old centre
  than to any other old centre (the slide's two inequalities, with the sets summarised by centres).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import CompatMethod, MethodConfig, StepContext
from .lce import class_centres_and_radii, cosine_distance_to
from .registry import register


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


def grad_reverse(x: torch.Tensor) -> torch.Tensor:
    """Identity forward, negated gradient backward."""
    return _GradReverse.apply(x)


def point_to_set_loss(feats: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor,
                      radii: torch.Tensor) -> torch.Tensor:
    """``mean relu(d_i,y - r_y) + mean relu(d_i,y - min_{j != y} d_i,j)`` (cosine distances to the
    old centres)."""
    d = cosine_distance_to(feats, centres)
    own = d.gather(1, labels[:, None]).squeeze(1)
    others = d.scatter(1, labels[:, None], float("inf")).min(1).values
    return F.relu(own - radii[labels]).mean() + F.relu(own - others).mean()


def adversarial_loss(disc: nn.Module, new_feats: torch.Tensor, old_feats: torch.Tensor) -> torch.Tensor:
    """Discriminator BCE on old (0) and gradient-reversed new (1) embeddings."""
    logits = torch.cat([disc(old_feats.detach()), disc(grad_reverse(new_feats))]).squeeze(1)
    target = torch.cat([torch.zeros(len(old_feats)), torch.ones(len(new_feats))])
    return F.binary_cross_entropy_with_logits(logits, target)


@dataclass
class AdvBCTConfig(MethodConfig):
    p2s_weight: float = 1.0  # lambda
    adv_weight: float = 1.0  # gamma
    disc_hidden: int = 64
    positive = MethodConfig.positive + ("disc_hidden",)


@register
class AdvBCT(CompatMethod):
    """AdvBCT: classification + point-to-set boundary loss + adversarial (gradient-reversed) discriminator."""

    name = "advbct"
    Config = AdvBCTConfig

    def prepare(self, ctx: StepContext) -> None:
        if ctx.old is None:
            return
        with torch.no_grad():
            old_feats = ctx.old(ctx.train_x)
        self.centres, self.radii = class_centres_and_radii(old_feats, ctx.train_y, ctx.n_seen, reduce="max")
        torch.manual_seed(ctx.seed * 1000 + ctx.t + 500)
        dim = ctx.old.out_dim
        self.aux["disc"] = nn.Sequential(nn.Linear(dim, self.cfg.disc_hidden), nn.ReLU(),
                                         nn.Linear(self.cfg.disc_hidden, 1))

    def extra_loss(self, batch, feats, step):
        with torch.no_grad():
            old_feats = self.ctx.old(batch["x"])
        p2s = point_to_set_loss(feats, batch["y"], self.centres, self.radii)
        adv = adversarial_loss(self.aux["disc"], feats, old_feats)
        return (self.cfg.p2s_weight * p2s + self.cfg.adv_weight * adv,
                {"p2s": float(p2s.detach()), "adv": float(adv.detach())})
