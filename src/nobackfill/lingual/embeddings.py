"""The expandable token embedding layer of CLL-CLIP (Fig. 2a of the CLL-CLIP paper, Yang et al. 2024) for
any Hugging Face text tower we ship: a CLIP text model (:class:`CLIPDualEncoder`) or a BERT-style
sentence encoder (:class:`MiniLMTextEncoder`).

Growing the vocabulary appends rows to the token embedding table; the rows of old ids are copied
bit for bit. Only the token embeddings are trainable (:func:`freeze_all_but_token_embeddings`): the
transformer, the position embeddings, the projections and the image tower stay frozen, so image
embeddings never change (no gallery backfill).
"""

from __future__ import annotations

import torch

from .vocab import MergedVocab

#: paper, Implementation Details: without TEIR new rows follow N(0, 0.02^2) (OpenCLIP)
PLAIN_INIT_STD = 0.02


def token_embedding(encoder) -> torch.nn.Embedding:
    """The token embedding table of ``encoder``'s text tower."""
    model = encoder.model
    text_model = getattr(model, "text_model", None)
    if text_model is not None and hasattr(text_model, "embeddings"):
        return text_model.embeddings.token_embedding
    return model.get_input_embeddings()


def _set_token_embedding(encoder, emb: torch.nn.Embedding) -> None:
    model = encoder.model
    text_model = getattr(model, "text_model", None)
    if text_model is not None and hasattr(text_model, "embeddings"):
        text_model.embeddings.token_embedding = emb
        configs = [model.config.text_config, text_model.config]
    else:
        model.set_input_embeddings(emb)
        configs = [model.config]
    for cfg in configs:
        cfg.vocab_size = emb.num_embeddings


def embedding_stats(weight: torch.Tensor) -> tuple[float, float]:
    """``(mu, sigma)`` of all entries of an embedding table (the N(mu_{t-1}, sigma_{t-1}^2) of
    TEIR's initialisation)."""
    w = weight.detach().double()
    return float(w.mean()), float(w.std())


@torch.no_grad()
def expand_token_embeddings(encoder, merged: MergedVocab, *, mean: float, std: float,
                            generator: torch.Generator | None = None) -> torch.Tensor:
    """Grow ``encoder``'s table to ``merged.size`` rows (new rows ~ N(mean, std^2)) and switch its
    tokenizer to ``merged.tokenizer``. Old rows are copied exactly. Returns the new rows."""
    n_old = token_embedding(encoder).weight.shape[0]
    if merged.old_size != n_old:
        raise ValueError(f"merged vocabulary starts new ids at {merged.old_size}, but the table has {n_old} rows")
    rows = append_token_rows(encoder, merged.size - n_old, mean=mean, std=std, generator=generator)
    encoder.tokenizer = merged.tokenizer
    encoder.invalidate_space_id()
    return rows


@torch.no_grad()
def append_token_rows(encoder, n_new: int, *, mean: float, std: float,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """Append ``n_new`` rows ~ N(mean, std^2) to ``encoder``'s token table (old rows copied
    exactly; the tokenizer is left alone, e.g. for soft-prompt rows). Returns the new rows; their
    ids are ``range(old height, old height + n_new)``."""
    old = token_embedding(encoder)
    n_old, dim = old.weight.shape
    emb = torch.nn.Embedding(n_old + n_new, dim, padding_idx=old.padding_idx, dtype=old.weight.dtype)
    emb.weight.copy_(torch.cat([old.weight, torch.zeros(n_new, dim, dtype=old.weight.dtype)]))
    new_rows = torch.randn(n_new, dim, generator=generator, dtype=torch.float64) * std + mean
    emb.weight[n_old:] = new_rows.to(old.weight.dtype)
    emb.weight.requires_grad_(old.weight.requires_grad)
    _set_token_embedding(encoder, emb)
    encoder.invalidate_space_id()
    return emb.weight[n_old:].detach().clone()


def freeze_all_but_token_embeddings(encoder) -> torch.nn.Parameter:
    """CLL-CLIP trains only the token embeddings (Sec. "CLL-CLIP"); returns that parameter."""
    encoder.model.requires_grad_(False)
    w = token_embedding(encoder).weight
    w.requires_grad_(True)
    return w


__all__ = ["token_embedding", "expand_token_embeddings", "append_token_rows", "freeze_all_but_token_embeddings",
           "embedding_stats", "PLAIN_INIT_STD"]
