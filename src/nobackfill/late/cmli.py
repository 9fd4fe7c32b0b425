"""Cross-modal late interaction (CMLI) after FILIP, the Target-CMLI paper ("Target Cross-Modal Late
Interaction"), Eq. 1-4.

For an image with patch tokens ``h_v,k`` (k = 1..N) and a text with word tokens ``h_w,j``
(j = 1..M), CLS / EOS / padding excluded through masks:

* Eq. 1: ``m_k^i2t = argmax_j h_v,k . h_w,j`` (best text token of each patch),
* Eq. 2: ``m_j^t2i = argmax_k h_v,k . h_w,j`` (best patch of each text token),
* Eq. 3: ``s^i2t = 1/N sum_k h_v,k . h_w,m_k^i2t``,
* Eq. 4: ``s^t2i = 1/M sum_j h_v,m_j^t2i . h_w,j``.

The two scores differ in general (the similarity is asymmetric). Image queries rank texts by
``s^i2t`` and text queries rank images by ``s^t2i`` (FILIP's contrastive logits).

Memory: scoring every image of a batch against every text needs ``B_img x B_txt x N x M``
token similarities (the seed's 6.58 GB example). :func:`cmli_scores` never builds that tensor:
it walks blocks of ``image_chunk`` images x ``text_chunk`` texts (optionally also ``token_chunk``
text tokens at a time, keeping running maxima over the token chunks), so its peak memory is
``image_chunk x text_chunk x N x min(M, token_chunk)`` floats whatever the batch size.
:func:`cmli_scores_naive` builds the whole tensor; it is kept as the baseline of the memory
benchmark. Both agree to float rounding (tests check 1e-5 against an independent loop).

Gradients flow through both (``torch.max`` with indices saves only the argmax indices for the
backward pass, not the similarity block), so :func:`cmli_scores` is also the training logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["CMLIScores", "cmli_scores", "cmli_scores_naive", "pair_scores", "best_patches",
           "project_tokens", "orthogonal_projection"]


@dataclass
class CMLIScores:
    """``i2t[a, b]`` (Eq. 3) and ``t2i[a, b]`` (Eq. 4) of image ``a`` and text ``b``."""

    i2t: torch.Tensor
    t2i: torch.Tensor


def _check(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor) -> None:
    if img.ndim != 3 or txt.ndim != 3:
        raise ValueError(f"token tensors must be (B, L, D); got images {tuple(img.shape)}, texts {tuple(txt.shape)}")
    if img.shape[-1] != txt.shape[-1]:
        raise ValueError(f"token dims differ: images {img.shape[-1]}, texts {txt.shape[-1]}")
    if tuple(img_mask.shape) != tuple(img.shape[:2]):
        raise ValueError(f"image mask shape {tuple(img_mask.shape)} != image tokens {tuple(img.shape[:2])}")
    if tuple(txt_mask.shape) != tuple(txt.shape[:2]):
        raise ValueError(f"text mask shape {tuple(txt_mask.shape)} != text tokens {tuple(txt.shape[:2])}")


def project_tokens(tokens: torch.Tensor, projection: torch.Tensor | None) -> torch.Tensor:
    """The optional low-dimensional shared space of the matching (FILIP, seed Sec. "Method":
    CMLI in 256-d): ``normalise(tokens @ projection)``; ``None`` keeps the tokens as they are."""
    if projection is None:
        return tokens
    if projection.ndim != 2 or projection.shape[0] != tokens.shape[-1]:
        raise ValueError(f"projection must be (D={tokens.shape[-1]}, d), got {tuple(projection.shape)}")
    return F.normalize(tokens @ projection.to(tokens.dtype), dim=-1)


def orthogonal_projection(dim: int, out_dim: int, seed: int = 0) -> torch.Tensor:
    """A seeded ``(dim, out_dim)`` matrix with orthonormal columns (a fixed shared projection)."""
    if not 0 < out_dim <= dim:
        raise ValueError(f"projection dim must be in 1..{dim}, got {out_dim}")
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, out_dim, generator=g))
    return q.contiguous()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean of ``values`` over ``dim`` where ``mask``; items without a valid token score 0."""
    w = mask.to(values.dtype)
    total = torch.where(mask, values, torch.zeros((), dtype=values.dtype)).sum(dim)
    return total / w.sum(dim).clamp(min=1.0)


def _neg_bias(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """0 where ``mask`` else -inf (added to similarities so a max never picks a masked token)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def _block_scores(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
                  token_chunk: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of ``a`` images x ``b`` texts; builds at most ``a x N x b x token_chunk`` similarities."""
    a, n, d = img.shape
    b, m, _ = txt.shape
    flat_img = img.reshape(a * n, d)
    img_bias = _neg_bias(img_mask, img.dtype)
    step = m if not token_chunk else int(token_chunk)
    best_tok = None  # running max over text tokens of each patch: (a, n, b)
    t2i_sum = torch.zeros(a, b, dtype=img.dtype, device=img.device)
    for s in range(0, m, step):
        t, tm = txt[:, s:s + step], txt_mask[:, s:s + step]
        w = t.shape[1]
        sim = (flat_img @ t.reshape(b * w, d).t()).view(a, n, b, w)
        # one -inf bias serves both maxima: rows of invalid patches / columns of invalid tokens
        # are -inf, and the means below only read valid rows / columns. In-place adds keep the
        # peak at one block and save nothing for the backward pass.
        sim.add_(img_bias[:, :, None, None]).add_(_neg_bias(tm, img.dtype)[None, None])
        tok_max = sim.max(dim=3).values  # Eq. 1 within this token chunk: (a, n, b)
        best_tok = tok_max if best_tok is None else torch.maximum(best_tok, tok_max)
        patch_max = sim.max(dim=1).values  # Eq. 2: (a, b, w)
        t2i_sum = t2i_sum + torch.where(tm[None], patch_max, torch.zeros((), dtype=sim.dtype)).sum(-1)
        del sim
    # Eq. 3: mean over valid patches of the best token (texts without tokens give -inf -> 0)
    has_tok = txt_mask.any(1)
    best_tok = torch.where(has_tok[None, None, :], best_tok, torch.zeros((), dtype=img.dtype))
    i2t = _masked_mean(best_tok, img_mask[:, :, None], dim=1)
    # Eq. 4: mean over valid text tokens of the best patch (images without patches give 0)
    t2i = t2i_sum / txt_mask.sum(1).clamp(min=1).to(img.dtype)[None, :]
    t2i = torch.where(img_mask.any(1)[:, None], t2i, torch.zeros((), dtype=img.dtype))
    return i2t, t2i


def cmli_scores(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor, *,
                image_chunk: int = 32, text_chunk: int = 32, token_chunk: int | None = None,
                projection: torch.Tensor | None = None) -> CMLIScores:
    """CMLI scores (Eq. 1-4) of every image against every text, streamed in blocks.

    ``img`` ``(B_img, N, D)`` and ``txt`` ``(B_txt, M, D)`` are token embeddings (cosine = dot
    product for unit rows), ``img_mask`` / ``txt_mask`` bool with True for content tokens.
    ``projection`` ``(D, d)`` matches in a shared low-dimensional space (re-normalised).
    Peak extra memory: ``image_chunk x text_chunk x N x min(M, token_chunk)`` floats.
    """
    _check(img, img_mask, txt, txt_mask)
    if image_chunk < 1 or text_chunk < 1 or (token_chunk is not None and token_chunk < 1):
        raise ValueError("image_chunk, text_chunk and token_chunk must be >= 1")
    img, txt = project_tokens(img, projection), project_tokens(txt, projection)
    img_mask, txt_mask = img_mask.bool(), txt_mask.bool()
    rows_i2t, rows_t2i = [], []
    for a in range(0, img.shape[0], image_chunk):
        cols_i2t, cols_t2i = [], []
        for b in range(0, txt.shape[0], text_chunk):
            i2t, t2i = _block_scores(img[a:a + image_chunk], img_mask[a:a + image_chunk],
                                     txt[b:b + text_chunk], txt_mask[b:b + text_chunk], token_chunk)
            cols_i2t.append(i2t)
            cols_t2i.append(t2i)
        rows_i2t.append(torch.cat(cols_i2t, 1))
        rows_t2i.append(torch.cat(cols_t2i, 1))
    if not rows_i2t:
        empty = img.new_zeros((0, txt.shape[0]))
        return CMLIScores(empty, empty.clone())
    return CMLIScores(torch.cat(rows_i2t, 0), torch.cat(rows_t2i, 0))


def cmli_scores_naive(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor,
                      txt_mask: torch.Tensor, projection: torch.Tensor | None = None) -> CMLIScores:
    """Eq. 1-4 by materialising the whole ``(B_img, B_txt, N, M)`` similarity tensor (the memory
    baseline of ``bench late``; use :func:`cmli_scores`)."""
    _check(img, img_mask, txt, txt_mask)
    img, txt = project_tokens(img, projection), project_tokens(txt, projection)
    img_mask, txt_mask = img_mask.bool(), txt_mask.bool()
    sim = torch.einsum("and,bmd->abnm", img, txt)
    valid = img_mask[:, None, :, None] & txt_mask[None, :, None, :]
    sim = sim.masked_fill(~valid, float("-inf"))
    zero = torch.zeros((), dtype=sim.dtype)
    best_tok = torch.where(txt_mask.any(1)[None, :, None], sim.max(dim=3).values, zero)  # (a, b, n)
    i2t = _masked_mean(best_tok, img_mask[:, None, :], dim=2)
    best_patch = sim.max(dim=2).values  # (a, b, m)
    t2i = torch.where(txt_mask[None], best_patch, zero).sum(-1) / txt_mask.sum(1).clamp(min=1).to(sim.dtype)
    t2i = torch.where(img_mask.any(1)[:, None], t2i, zero)
    return CMLIScores(i2t, t2i)


def pair_scores(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
                projection: torch.Tensor | None = None) -> CMLIScores:
    """Eq. 3-4 for row-aligned pairs only (image ``i`` with text ``i``): ``i2t``, ``t2i`` of shape
    ``(B,)``. This is the positive-pairs-only computation that makes Target-CMLI cheap."""
    _check(img, img_mask, txt, txt_mask)
    if img.shape[0] != txt.shape[0]:
        raise ValueError(f"pair_scores needs as many images as texts, got {img.shape[0]} and {txt.shape[0]}")
    img, txt = project_tokens(img, projection), project_tokens(txt, projection)
    img_mask, txt_mask = img_mask.bool(), txt_mask.bool()
    sim = torch.einsum("bnd,bmd->bnm", img, txt)
    sim = sim.masked_fill(~(img_mask[:, :, None] & txt_mask[:, None, :]), float("-inf"))
    zero = torch.zeros((), dtype=sim.dtype)
    best_tok = torch.where(txt_mask.any(1)[:, None], sim.max(dim=2).values, zero)
    i2t = _masked_mean(best_tok, img_mask, dim=1)
    best_patch = torch.where(img_mask.any(1)[:, None], sim.max(dim=1).values, zero)
    t2i = _masked_mean(best_patch, txt_mask, dim=1)
    return CMLIScores(i2t, t2i)


def best_patches(img: torch.Tensor, img_mask: torch.Tensor, txt: torch.Tensor,
                 projection: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2 for row-aligned pairs: ``(index, similarity)`` of the best valid patch of every text
    token, each ``(B, M)`` (computed without gradients; the match is a hard argmax)."""
    with torch.no_grad():
        pi, pt = project_tokens(img, projection), project_tokens(txt, projection)
        sim = torch.einsum("bnd,bmd->bmn", pi, pt).masked_fill(~img_mask.bool()[:, None, :], float("-inf"))
        best = sim.max(dim=2)
    return best.indices, best.values
