"""CMLI scoring (the Target-CMLI paper, Eq. 1-4): the streamed implementation against an independent per-pair
loop, masks, projection, gradients, pair scores and Eq. 2 matches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nobackfill.late.cmli import (best_patches, cmli_scores, cmli_scores_naive, orthogonal_projection, pair_scores,
                                  project_tokens)


def reference_cmli(img, img_mask, txt, txt_mask):
    """Eq. 1-4 written out pair by pair with explicit argmax indices (float64)."""
    img, txt = img.double(), txt.double()
    i2t = torch.zeros(img.shape[0], txt.shape[0], dtype=torch.float64)
    t2i = torch.zeros_like(i2t)
    for a in range(img.shape[0]):
        patches = img[a][img_mask[a]]
        for b in range(txt.shape[0]):
            words = txt[b][txt_mask[b]]
            if len(patches) == 0 or len(words) == 0:
                continue  # no content tokens: score 0 by definition
            sim = patches @ words.T  # (N, M)
            m_i2t = sim.argmax(1)  # Eq. 1
            m_t2i = sim.argmax(0)  # Eq. 2
            i2t[a, b] = sum(patches[k] @ words[m_i2t[k]] for k in range(len(patches))) / len(patches)  # Eq. 3
            t2i[a, b] = sum(patches[m_t2i[j]] @ words[j] for j in range(len(words))) / len(words)  # Eq. 4
    return i2t, t2i


def _tokens(gen, b, n, d):
    return F.normalize(torch.randn(b, n, d, generator=gen), dim=-1)


@settings(max_examples=40, deadline=None)
@given(b_img=st.integers(1, 7), b_txt=st.integers(1, 7), n=st.integers(1, 6), m=st.integers(1, 6),
       d=st.integers(1, 8), image_chunk=st.integers(1, 8), text_chunk=st.integers(1, 8),
       token_chunk=st.one_of(st.none(), st.integers(1, 7)), seed=st.integers(0, 10_000), p_mask=st.floats(0.0, 0.9))
def test_streamed_and_naive_agree_with_reference(b_img, b_txt, n, m, d, image_chunk, text_chunk, token_chunk, seed,
                                                 p_mask) -> None:
    gen = torch.Generator().manual_seed(seed)
    img, txt = _tokens(gen, b_img, n, d), _tokens(gen, b_txt, m, d)
    img_mask = torch.rand(b_img, n, generator=gen) >= p_mask
    txt_mask = torch.rand(b_txt, m, generator=gen) >= p_mask
    ref_i2t, ref_t2i = reference_cmli(img, img_mask, txt, txt_mask)
    streamed = cmli_scores(img, img_mask, txt, txt_mask, image_chunk=image_chunk, text_chunk=text_chunk,
                           token_chunk=token_chunk)
    naive = cmli_scores_naive(img, img_mask, txt, txt_mask)
    for s in (streamed, naive):
        assert s.i2t.shape == s.t2i.shape == (b_img, b_txt)
        np.testing.assert_allclose(s.i2t.double(), ref_i2t, atol=1e-5)
        np.testing.assert_allclose(s.t2i.double(), ref_t2i, atol=1e-5)


def test_masked_tokens_do_not_matter() -> None:
    """Changing the values of masked (CLS / padding) tokens never changes a score."""
    gen = torch.Generator().manual_seed(0)
    img, txt = _tokens(gen, 3, 5, 4), _tokens(gen, 4, 6, 4)
    img_mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    txt_mask = torch.rand(4, 6, generator=gen) > 0.4
    txt_mask[:, 0] = True
    a = cmli_scores(img, img_mask, txt, txt_mask, image_chunk=2, text_chunk=3)
    img2, txt2 = img.clone(), txt.clone()
    img2[~img_mask] = 100.0  # would win every max if it were not masked
    txt2[~txt_mask] = 100.0
    b = cmli_scores(img2, img_mask, txt2, txt_mask, image_chunk=2, text_chunk=3)
    torch.testing.assert_close(a.i2t, b.i2t)
    torch.testing.assert_close(a.t2i, b.t2i)


def test_hand_computed_asymmetric_case() -> None:
    """Two patches, three words in 2-D: i2t and t2i differ (the similarity is asymmetric)."""
    img = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    txt = torch.tensor([[[1.0, 0.0], [0.6, 0.8], [0.8, 0.6]]])
    s = cmli_scores(img, torch.ones(1, 2, dtype=torch.bool), txt, torch.ones(1, 3, dtype=torch.bool))
    # patch 1 -> word 1 (1.0), patch 2 -> word 2 (0.8): i2t = 0.9
    # word 1 -> patch 1 (1.0), word 2 -> patch 2 (0.8), word 3 -> patch 1 (0.8): t2i = 2.6 / 3
    assert s.i2t.item() == pytest.approx(0.9)
    assert s.t2i.item() == pytest.approx(2.6 / 3)
    # masking word 1 out: i2t = (0.8 + 0.8) / 2, t2i = (0.8 + 0.8) / 2
    s2 = cmli_scores(img, torch.ones(1, 2, dtype=torch.bool), txt, torch.tensor([[False, True, True]]))
    assert s2.i2t.item() == pytest.approx(0.8) and s2.t2i.item() == pytest.approx(0.8)


def test_gradients_match_naive() -> None:
    gen = torch.Generator().manual_seed(3)
    img0, txt0 = _tokens(gen, 5, 4, 6), _tokens(gen, 6, 7, 6)
    img_mask, txt_mask = torch.rand(5, 4, generator=gen) > 0.2, torch.rand(6, 7, generator=gen) > 0.2
    grads = []
    for fn in (lambda a, b: cmli_scores(a, img_mask, b, txt_mask, image_chunk=2, text_chunk=4, token_chunk=3),
               lambda a, b: cmli_scores_naive(a, img_mask, b, txt_mask)):
        img, txt = img0.clone().requires_grad_(), txt0.clone().requires_grad_()
        s = fn(img, txt)
        (s.i2t.sum() + 3 * s.t2i.pow(2).sum()).backward()
        grads.append((img.grad, txt.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_projection_is_shared_and_renormalised() -> None:
    gen = torch.Generator().manual_seed(1)
    img, txt = _tokens(gen, 3, 4, 8), _tokens(gen, 2, 5, 8)
    im, tm = torch.ones(3, 4, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    p = orthogonal_projection(8, 3, seed=0)
    assert torch.allclose(p.T @ p, torch.eye(3), atol=1e-5)
    s = cmli_scores(img, im, txt, tm, projection=p)
    ref = reference_cmli(project_tokens(img, p), im, project_tokens(txt, p), tm)
    np.testing.assert_allclose(s.i2t.double(), ref[0], atol=1e-5)
    np.testing.assert_allclose(s.t2i.double(), ref[1], atol=1e-5)
    assert torch.allclose(project_tokens(img, p).norm(dim=-1), torch.ones(3, 4))
    with pytest.raises(ValueError, match="projection"):
        cmli_scores(img, im, txt, tm, projection=torch.zeros(5, 2))


def test_pair_scores_are_the_diagonal_and_best_patches_follow_eq2() -> None:
    gen = torch.Generator().manual_seed(2)
    img, txt = _tokens(gen, 4, 5, 6), _tokens(gen, 4, 3, 6)
    im, tm = torch.rand(4, 5, generator=gen) > 0.3, torch.ones(4, 3, dtype=torch.bool)
    im[:, 0] = True
    full = cmli_scores(img, im, txt, tm)
    pairs = pair_scores(img, im, txt, tm)
    torch.testing.assert_close(pairs.i2t, full.i2t.diagonal())
    torch.testing.assert_close(pairs.t2i, full.t2i.diagonal())
    idx, val = best_patches(img, im, txt)
    for b in range(4):
        for j in range(3):
            sims = [(img[b, k] @ txt[b, j]).item() if im[b, k] else -np.inf for k in range(5)]
            assert idx[b, j].item() == int(np.argmax(sims))
            assert val[b, j].item() == pytest.approx(max(sims), abs=1e-6)


def test_bad_inputs_name_the_problem() -> None:
    img, txt = torch.zeros(2, 3, 4), torch.zeros(2, 5, 4)
    im, tm = torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="token dims differ"):
        cmli_scores(img, im, torch.zeros(2, 5, 3), tm)
    with pytest.raises(ValueError, match="text mask shape"):
        cmli_scores(img, im, txt, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="chunk"):
        cmli_scores(img, im, txt, tm, image_chunk=0)
    with pytest.raises(ValueError, match="as many images as texts"):
        pair_scores(img, im, txt[:1], tm[:1])
