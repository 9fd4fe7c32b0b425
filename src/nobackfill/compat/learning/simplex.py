"""Methods on the d-Simplex fixed classifier with pre-allocated classes (the tutorial's CoReS,
d-Simplex-HOC and continual-learning slides).

* **CoReS** (Biondi et al., TPAMI 2023): the classifier is the fixed d-Simplex of K pre-allocated
  classes (:func:`.base.simplex_vertices`); ``L_SCE`` is cross-entropy whose denominator runs over
  the ``K_t`` seen *and* the ``K - K_t`` pre-allocated future classes. Stationary class prototypes
  make successive models compatible. Cumulative data; each model is fine-tuned from the previous.
* **d-Simplex-HOC** (Biondi et al., CVPR 2024): ``L_HOC = lambda L_SCE + (1 - lambda) L_iNCE(phi_t,
  phi_{t-1})`` with ``L_iNCE = -sum_B log(Delta(phi_{t-1}(x_i), phi_t(x_i)) / sum_{j != i}
  Delta(phi_{t-1}(x_i), phi_t(x_j)))`` and ``Delta(a, b) = exp(rho cos(a, b))`` (the slide's form:
  the denominator leaves out the positive). Continual regime (new data + replay memory),
  fine-tuned from ``phi_{t-1}`` as in the slide's Proposition 1.
* **CL2R** / d-Simplex-FD (Biondi et al., ACM TOMM 2023): the d-Simplex classifier, a replay memory
  and feature distillation ``||phi_t(x) - phi_{t-1}(x)||^2`` on the memory samples. Continual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import CompatMethod, MethodConfig
from .registry import register


def hoc_info_nce(new_feats: torch.Tensor, old_feats: torch.Tensor, rho: float) -> torch.Tensor:
    """The slide's ``L_iNCE`` averaged over the batch: anchor ``phi_{t-1}(x_i)``, positive
    ``phi_t(x_i)``, the denominator over ``phi_t(x_j), j != i``."""
    sim = rho * F.normalize(old_feats, dim=1) @ F.normalize(new_feats, dim=1).t()
    eye = torch.eye(len(sim), dtype=torch.bool)
    neg = torch.logsumexp(sim.masked_fill(eye, float("-inf")), dim=1)
    return (neg - sim.diagonal()).mean()


def feature_distillation(new_feats: torch.Tensor, old_feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared L2 distance between new and old features over the masked (replay) samples."""
    if not mask.any():
        return new_feats.new_zeros(())
    return ((new_feats[mask] - old_feats[mask]) ** 2).sum(1).mean()


@register
class CoReS(CompatMethod):
    """CoReS: cross-entropy on the fixed d-Simplex with pre-allocated classes, fine-tuned per step."""

    name = "cores"
    fixed_simplex = True
    init_from_previous = True


@dataclass
class HOCConfig(MethodConfig):
    ce_weight: float = 0.5  # lambda of the convex combination
    rho: float = 10.0  # cosine scale of Delta
    positive = MethodConfig.positive + ("rho",)
    at_most_one = ("ce_weight",)


@register
class DSimplexHOC(CompatMethod):
    """d-Simplex-HOC: lambda L_SCE + (1 - lambda) L_iNCE(phi_t, phi_{t-1}), continual with replay."""

    name = "dsimplex-hoc"
    Config = HOCConfig
    fixed_simplex = True
    init_from_previous = True
    regime = "continual"

    def loss(self, batch, step):
        feats = self.model(batch["x"])
        ce = self.classification_loss(feats, batch["y"])
        if self.ctx.old is None:
            return ce, {"ce": float(ce.detach())}
        with torch.no_grad():
            old_feats = self.ctx.old(batch["x"])
        nce = hoc_info_nce(feats, old_feats, self.cfg.rho)
        lam = self.cfg.ce_weight
        return lam * ce + (1 - lam) * nce, {"ce": float(ce.detach()), "ince": float(nce.detach())}


@dataclass
class CL2RConfig(MethodConfig):
    distill_weight: float = 1.0


@register
class CL2R(CompatMethod):
    """CL2R (d-Simplex-FD): d-Simplex CE + feature distillation on replayed samples, continual."""

    name = "cl2r"
    Config = CL2RConfig
    fixed_simplex = True
    init_from_previous = True
    regime = "continual"

    def extra_loss(self, batch, feats, step):
        with torch.no_grad():
            old_feats = self.ctx.old(batch["x"])
        fd = feature_distillation(feats, old_feats, batch["replay"])
        return self.cfg.distill_weight * fd, {"fd": float(fd.detach())}
