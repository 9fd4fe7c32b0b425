"""Negative-flip reduction (the tutorial's "Third party-side compatibility" slides): the new model
should not get wrong what the old one got right.

* **Focal Distillation** (Positive-Congruent Training, Yan et al. CVPR 2021):
  ``L = L_CE + lambda F(x_i) D(new(x_i), q(x_i))`` with the filter
  ``F = alpha + beta 1(yhat_old(x_i) = y_i)``; FD-KL: ``D`` = tau-scaled KL to ``q = p_old(y|x)``
  (zero-padded over the classes the update adds, see :func:`focal_kl`); FD-LM: ``D`` = squared L2
  distance between the logits of the classes the old model knows (``q`` = old logits).
* **ELODI** (Zhao et al., TPAMI 2024): ``L_LDI(x) = sum_{k in K(x)} |z_k(x) - z_k^ens(x)|^p``, the
  logit difference to an ensemble of independently trained reference models on the top-``k``
  classes of the ensemble (where flips happen); ``L = L_CE + lambda L_LDI``. Every model of the
  sequence is trained this way (the old one too), so no old model is needed.
* **MUSCLE** (Echterhof et al., 2024): ``m_i = 1(argmax new_ref(x_i) != y_i)``; the compatible model
  is distilled towards the old model where the independently trained new reference is wrong and
  towards the reference where it is right: ``L = L_CE + lambda mean(m_i a_old + (1 - m_i) a_new)``
  with ``a = tau^2 KL(teacher || student)`` (the slide's masked KL).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import CompatMethod, MethodConfig, StepContext, kl_to_target, masked_logits
from .registry import register


def focal_weights(old_logits: torch.Tensor, labels: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """``alpha + beta 1(argmax old = y)`` per sample (labels the old model cannot know get alpha)."""
    return alpha + beta * (old_logits.argmax(1) == labels).float()


def focal_kl(new_logits: torch.Tensor, old_logits: torch.Tensor, labels: torch.Tensor, alpha: float,
             beta: float, tau: float) -> torch.Tensor:
    """FD-KL with classes added by the update (``old_logits``: the ``K_old`` old classes). For a sample
    of an old class the target is the old softmax zero-padded over the new classes, so probability
    the new model moves to a new class is penalised (PCT has no new classes; this is the natural
    extension); for a sample of a new class only the old classes' renormalised distribution is
    matched (the old model knows nothing of its class)."""
    k = old_logits.shape[1]
    old_logp = F.log_softmax(old_logits / tau, dim=1)
    full = tau * tau * (old_logp.exp() * (old_logp - F.log_softmax(new_logits / tau, dim=1)[:, :k])).sum(1)
    restricted = kl_to_target(new_logits[:, :k], old_logits, tau)
    d = torch.where(labels < k, full, restricted)
    return (focal_weights(old_logits, labels, alpha, beta) * d).mean()


def focal_logit_matching(new_logits: torch.Tensor, old_logits: torch.Tensor, labels: torch.Tensor,
                         alpha: float, beta: float) -> torch.Tensor:
    """FD-LM: ``F(x) * 1/2 ||z_new - z_old||^2`` over the old model's classes."""
    k = old_logits.shape[1]
    d = 0.5 * ((new_logits[:, :k] - old_logits) ** 2).sum(1)
    return (focal_weights(old_logits, labels, alpha, beta) * d).mean()


def logit_difference_inhibition(logits: torch.Tensor, ensemble_logits: torch.Tensor, top_k: int,
                                p: float = 2.0) -> torch.Tensor:
    """ELODI's LDI, mean over the batch of ``sum_{k in topk(ensemble)} |z_k - z_k^ens|^p``."""
    idx = ensemble_logits.topk(min(top_k, ensemble_logits.shape[1]), dim=1).indices
    diff = (logits.gather(1, idx) - ensemble_logits.gather(1, idx)).abs() ** p
    return diff.sum(1).mean()


def muscle_masked_kl(logits: torch.Tensor, old_logits: torch.Tensor, ref_logits: torch.Tensor,
                     labels: torch.Tensor, tau: float) -> torch.Tensor:
    """MUSCLE's ``mean(m a_old + (1 - m) a_new)``; ``old_logits`` cover the old classes,
    ``ref_logits`` the new reference's (= the student's) classes."""
    m = (ref_logits.argmax(1) != labels).float()
    a_old = kl_to_target(logits[:, : old_logits.shape[1]], old_logits, tau)
    a_new = kl_to_target(logits[:, : ref_logits.shape[1]], ref_logits, tau)
    return (m * a_old + (1 - m) * a_new).mean()


class _OldLogits(CompatMethod):
    """Shared: the frozen old model's logits on its own classes."""

    def old_logits(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.ctx.old.seen_logits(x)

    def new_logits(self, feats: torch.Tensor) -> torch.Tensor:
        return masked_logits(self.model.logits(feats), self.ctx.n_seen)


@dataclass
class FocalConfig(MethodConfig):
    weight: float = 1.0  # lambda
    alpha: float = 1.0
    beta: float = 5.0  # PCT's focal weight
    tau: float = 1.0  # FD-KL temperature
    positive = MethodConfig.positive + ("tau",)


@register
class FocalDistillationKL(_OldLogits):
    """FD-KL: CE + focal-weighted tau-scaled KL to the old model's softmax on the old classes."""

    name = "fd-kl"
    Config = FocalConfig
    reduces_flips = True

    def extra_loss(self, batch, feats, step):
        d = focal_kl(self.new_logits(feats), self.old_logits(batch["x"]), batch["y"], self.cfg.alpha,
                     self.cfg.beta, self.cfg.tau)
        return self.cfg.weight * d, {"fd": float(d.detach())}


@register
class FocalDistillationLM(_OldLogits):
    """FD-LM: CE + focal-weighted squared L2 distance to the old model's logits on the old classes."""

    name = "fd-lm"
    Config = FocalConfig
    reduces_flips = True

    def extra_loss(self, batch, feats, step):
        d = focal_logit_matching(self.new_logits(feats), self.old_logits(batch["x"]), batch["y"],
                                 self.cfg.alpha, self.cfg.beta)
        return self.cfg.weight * d, {"fd": float(d.detach())}


@dataclass
class ELODIConfig(MethodConfig):
    weight: float = 1.0  # lambda
    ensemble: int = 3  # reference models
    top_k: int = 10
    p: float = 2.0
    positive = MethodConfig.positive + ("ensemble", "top_k", "p")


@register
class ELODI(_OldLogits):
    """ELODI: CE + logit difference inhibition towards an ensemble of independent references."""

    name = "elodi"
    Config = ELODIConfig
    reduces_flips = True
    needs_old = False

    def prepare(self, ctx: StepContext) -> None:
        self.references = [ctx.extra["train_reference"](i) for i in range(self.cfg.ensemble)]

    def extra_loss(self, batch, feats, step):
        with torch.no_grad():
            ens = torch.stack([r.seen_logits(batch["x"]) for r in self.references]).mean(0)
        ldi = logit_difference_inhibition(self.new_logits(feats), ens, self.cfg.top_k, self.cfg.p)
        return self.cfg.weight * ldi, {"ldi": float(ldi.detach())}


@dataclass
class MuscleConfig(MethodConfig):
    weight: float = 1.0
    tau: float = 1.0
    positive = MethodConfig.positive + ("tau",)


@register
class MUSCLE(_OldLogits):
    """MUSCLE: CE + KL to the old model where the new reference errs, to the reference elsewhere."""

    name = "muscle"
    Config = MuscleConfig
    reduces_flips = True

    def prepare(self, ctx: StepContext) -> None:
        if ctx.old is not None:
            self.reference = ctx.extra["train_reference"](0)

    def extra_loss(self, batch, feats, step):
        with torch.no_grad():
            ref = self.reference.seen_logits(batch["x"])
        kl = muscle_masked_kl(self.new_logits(feats), self.old_logits(batch["x"]), ref, batch["y"], self.cfg.tau)
        return self.cfg.weight * kl, {"masked_kl": float(kl.detach())}
