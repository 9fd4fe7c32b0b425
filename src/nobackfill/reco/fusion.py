"""Fusion models phi_image and phi_text of RECO (Sec. 3.2 of the RECO paper):

    v_bar = phi_image(v, KNN_t^{v->v}(v, M)),    t_bar = phi_text(t, KNN_v^{t->t}(t, M)).

:class:`TransformerFusion` is the paper's: a one-layer multi-head self-attention transformer
encoder over the sequence ``[original; retrieved_1..k]``, so the original embedding attends to all
retrieved elements; the refined embedding is read at the original's position and L2-normalised.
A learned token-type embedding tells the original from the retrieved items (they come from
different modalities under cross-modal fusion). :class:`MeanFusion` is the paper's "mean fusion"
ablation (no parameters): the normalised mean of ``[original; retrieved]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

FUSION_KINDS = ("transformer", "mean")


@dataclass
class FusionConfig:
    """Shape of one fusion model. ``heads`` must divide ``dim`` (paper: one layer, multi-head)."""

    dim: int
    kind: str = "transformer"
    heads: int = 4
    ff_mult: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FUSION_KINDS:
            raise ValueError(f"fusion kind must be one of {FUSION_KINDS}, got {self.kind!r}")
        if self.dim <= 0 or self.heads <= 0 or self.dim % self.heads:
            raise ValueError(f"fusion heads ({self.heads}) must divide dim ({self.dim})")

    def to_dict(self) -> dict:
        return asdict(self)


class TransformerFusion(nn.Module):
    """One pre-LN transformer encoder layer over ``[x; r_1..r_k]``; output at x's position."""

    def __init__(self, cfg: FusionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.type_embedding = nn.Parameter(torch.zeros(2, cfg.dim))  # 0: original, 1: retrieved
        self.layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, dim_feedforward=cfg.ff_mult * cfg.dim,
                                                dropout=cfg.dropout, activation="gelu", batch_first=True,
                                                norm_first=True)

    def forward(self, original: torch.Tensor, retrieved: torch.Tensor) -> torch.Tensor:
        """``original`` (B, d), ``retrieved`` (B, k, d) -> refined unit rows (B, d)."""
        if original.ndim != 2 or retrieved.ndim != 3 or retrieved.shape[0] != original.shape[0] \
                or retrieved.shape[2] != original.shape[1]:
            raise ValueError(f"fusion expects (B, d) and (B, k, d), got {tuple(original.shape)} and "
                             f"{tuple(retrieved.shape)}")
        seq = torch.cat([original[:, None] + self.type_embedding[0], retrieved + self.type_embedding[1]], dim=1)
        return F.normalize(self.layer(seq)[:, 0], dim=-1)


class MeanFusion(nn.Module):
    """The mean-fusion ablation: ``normalise(mean(original, r_1..r_k))`` (nothing to train)."""

    def __init__(self, cfg: FusionConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def forward(self, original: torch.Tensor, retrieved: torch.Tensor) -> torch.Tensor:
        seq = torch.cat([original[:, None], retrieved], dim=1)
        return F.normalize(seq.mean(dim=1), dim=-1)


def make_fusion(cfg: FusionConfig) -> nn.Module:
    return TransformerFusion(cfg) if cfg.kind == "transformer" else MeanFusion(cfg)
