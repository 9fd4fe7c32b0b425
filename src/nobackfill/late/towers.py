"""Differentiable global *and* token outputs of a CLIP dual encoder from one forward pass per tower
(training needs both; ``CLIPDualEncoder.image_tokens`` / ``text_tokens`` are the inference-only
versions and give the same token values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..encoders.clip import CLIPDualEncoder

__all__ = ["TowerOutputs", "encode_towers", "content_mask"]


@dataclass
class TowerOutputs:
    """Unit-norm global embeddings ``(B, D)`` and token embeddings ``(B, L, D)`` with content masks
    (image CLS and text BOS / EOS / padding excluded, the Target-CMLI paper, Sec. "CMLI")."""

    image: torch.Tensor | None
    image_tokens: torch.Tensor | None
    image_mask: torch.Tensor | None
    text: torch.Tensor | None
    text_tokens: torch.Tensor | None
    text_mask: torch.Tensor | None
    input_ids: torch.Tensor | None = None


def content_mask(tokenizer, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """True for word tokens: attended and not BOS / EOS / PAD."""
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for t in {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}:
        special |= input_ids == t
    return attention_mask.bool() & ~special


def encode_towers(encoder: CLIPDualEncoder, pixels=None, captions: Sequence[str] | None = None) -> TowerOutputs:
    """Global + token outputs of the image tower (if ``pixels``) and text tower (if ``captions``).

    Image: the pooled CLS through post-LayerNorm and the visual projection (global), the patch
    tokens through the same LayerNorm and projection (FILIP). Text: the EOS-pooled output through
    the text projection (global), every position through the same projection (tokens)."""
    m = encoder.model
    img = img_tok = img_mask = txt = txt_tok = txt_mask = ids = None
    if pixels is not None:
        out = m.vision_model(pixel_values=encoder.preprocessor(pixels))
        img = F.normalize(m.visual_projection(out.pooler_output), dim=-1)
        img_tok = F.normalize(m.visual_projection(m.vision_model.post_layernorm(out.last_hidden_state[:, 1:])), dim=-1)
        img_mask = torch.ones(img_tok.shape[:2], dtype=torch.bool)
    if captions is not None:
        enc = encoder.tokenize(captions)
        out = m.text_model(**enc)
        txt = F.normalize(m.text_projection(out.pooler_output), dim=-1)
        txt_tok = F.normalize(m.text_projection(out.last_hidden_state), dim=-1)
        ids = enc["input_ids"]
        txt_mask = content_mask(encoder.tokenizer, ids, enc["attention_mask"])
    return TowerOutputs(img, img_tok, img_mask, txt, txt_tok, txt_mask, ids)
