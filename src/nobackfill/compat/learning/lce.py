"""LCE, Learning Compatible Embeddings (Meng et al., ICCV 2021; the tutorial's LCE slide):
``L_LCE = lambda_a L_a + lambda_b L_b + L_c`` with a learned mapping ``psi_t`` from the new space to
the previous one (backward mode: only queries are mapped; several updates compose the mappings).

* ``L_a`` (alignment): the batch class centres of the mapped new features align (cosine) with the
  old model's class centres (old features of the step's data; new classes get their old-feature
  means, as BCT's synthesised rows).
* ``L_b`` (boundary, point-to-set): a mapped feature further from its old class centre than the
  old class's mean radius is pulled inside it (more compact classes).
* ``L_c``: cross-entropy of the new model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .base import CompatMethod, MethodConfig, StepContext, StepModel, class_means
from .registry import register


def cosine_distance_to(feats: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """``(N, C)`` cosine distances ``1 - cos(f_i, c_j)``."""
    return 1.0 - F.normalize(feats, dim=1) @ F.normalize(centres, dim=1).t()


def class_centres_and_radii(feats: torch.Tensor, labels: torch.Tensor, n_classes: int,
                            reduce: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised class centres and each class's mean (or max) cosine distance to its centre."""
    centres = F.normalize(class_means(F.normalize(feats, dim=1), labels, n_classes), dim=1)
    d = cosine_distance_to(feats, centres).gather(1, labels[:, None]).squeeze(1)
    radii = torch.zeros(n_classes)
    for c in range(n_classes):
        dc = d[labels == c]
        if len(dc):
            radii[c] = dc.mean() if reduce == "mean" else dc.max()
    return centres, radii


def alignment_loss(mapped: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Mean over the batch's classes of ``1 - cos(mean_i psi(f_i), c_y)``."""
    present = torch.unique(labels)
    means = class_means(F.normalize(mapped, dim=1), labels, len(centres))[present]
    return (1.0 - F.cosine_similarity(means, centres[present], dim=1)).mean()


def boundary_loss(mapped: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor,
                  radii: torch.Tensor) -> torch.Tensor:
    """Mean of ``relu(d(psi(f_i), c_{y_i}) - r_{y_i})`` (cosine distance)."""
    d = cosine_distance_to(mapped, centres).gather(1, labels[:, None]).squeeze(1)
    return F.relu(d - radii[labels]).mean()


@dataclass
class LCEConfig(MethodConfig):
    alignment_weight: float = 1.0  # lambda_a
    boundary_weight: float = 1.0  # lambda_b


@register
class LCE(CompatMethod):
    """LCE with a linear mapping to the previous space, trained with the new model."""

    name = "lce"
    Config = LCEConfig

    def new_model(self, ctx: StepContext) -> StepModel:
        model = super().new_model(ctx)
        if ctx.old is not None:
            model.to_previous = nn.Linear(model.out_dim, ctx.old.out_dim, bias=False)
            with torch.no_grad():
                model.to_previous.weight.copy_(torch.eye(ctx.old.out_dim, model.out_dim))
        return model

    def prepare(self, ctx: StepContext) -> None:
        if ctx.old is None:
            return
        with torch.no_grad():
            old_feats = ctx.old(ctx.train_x)
        self.centres, self.radii = class_centres_and_radii(old_feats, ctx.train_y, ctx.n_seen)

    def extra_loss(self, batch, feats, step):
        mapped = self.model.to_previous(feats)
        la = alignment_loss(mapped, batch["y"], self.centres)
        lb = boundary_loss(mapped, batch["y"], self.centres, self.radii)
        return (self.cfg.alignment_weight * la + self.cfg.boundary_weight * lb,
                {"align": float(la.detach()), "boundary": float(lb.detach())})

    def query_features(self, models, t, k, x):
        """Compose the mappings ``psi_{k+1} o ... o psi_t`` to reach gallery model ``k``'s space."""
        f = models[t](x)
        for j in range(t, k, -1):
            f = models[j].to_previous(f)
        return f
