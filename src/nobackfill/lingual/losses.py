"""CLL-CLIP's training objectives (Eq. 2-4 of the CLL-CLIP paper, Yang et al. 2024)."""

from __future__ import annotations

import torch

from ..train.contrastive import info_nce

#: Eq. 4 weights chosen by the paper on validation AR (Implementation Details)
PAPER_GAMMA_CM = 0.01
PAPER_GAMMA_CL = 1.0
#: initial temperature of L_cm (OpenCLIP)
PAPER_TEMPERATURE = 0.07


def cross_modal_loss(image_feats: torch.Tensor, foreign_feats: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. 2: ``L_cm = (InfoNCE^{I->F} + InfoNCE^{F->I}) / 2`` over L2-normalised, row-aligned
    features (cosine similarity / temperature)."""
    return info_nce(image_feats, foreign_feats, 1.0 / temperature)


def cross_lingual_loss(english_feats: torch.Tensor, foreign_feats: torch.Tensor) -> torch.Tensor:
    """Eq. 3: ``L_cl = 1/(2K) sum_k ||r^E_k - r^F_k||^2``."""
    if english_feats.shape != foreign_feats.shape:
        raise ValueError(f"feature shapes differ: {tuple(english_feats.shape)} vs {tuple(foreign_feats.shape)}")
    return 0.5 * (english_feats - foreign_feats).pow(2).sum(-1).mean()


def cll_clip_loss(english_feats: torch.Tensor, foreign_feats: torch.Tensor, image_feats: torch.Tensor | None = None,
                  *, gamma_cm: float = PAPER_GAMMA_CM, gamma_cl: float = PAPER_GAMMA_CL,
                  temperature: float = PAPER_TEMPERATURE) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 4: ``L = gamma_1 L_cm + gamma_2 L_cl``; without images (Multi30K) ``L_cm`` is left out."""
    l_cl = cross_lingual_loss(english_feats, foreign_feats)
    logs = {"L_cl": float(l_cl.detach())}
    loss = gamma_cl * l_cl
    if image_feats is not None and gamma_cm:
        l_cm = cross_modal_loss(image_feats, foreign_feats, temperature)
        logs["L_cm"] = float(l_cm.detach())
        loss = loss + gamma_cm * l_cm
    return loss, logs


__all__ = ["cross_modal_loss", "cross_lingual_loss", "cll_clip_loss", "PAPER_GAMMA_CM", "PAPER_GAMMA_CL",
           "PAPER_TEMPERATURE"]
