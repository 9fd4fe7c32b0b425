"""Hand-computed cases for every loss of the compatibility-learning methods (Biondi et al.'s tutorial)."""

from __future__ import annotations

import math

import pytest
import torch

from nobackfill.compat.learning.advbct import adversarial_loss, grad_reverse, point_to_set_loss
from nobackfill.compat.learning.base import class_means, classifier_logits, kl_to_target, simplex_vertices
from nobackfill.compat.learning.bct import influence_loss, synthesised_classifier
from nobackfill.compat.learning.flips import (focal_kl, focal_logit_matching, focal_weights,
                                              logit_difference_inhibition, muscle_masked_kl)
from nobackfill.compat.learning.lce import alignment_loss, boundary_loss
from nobackfill.compat.learning.simplex import feature_distillation, hoc_info_nce
from nobackfill.compat.learning.softmax_features import logit_simplex_features, softmax_simplex_features

T = torch.tensor


@pytest.mark.parametrize("k", [2, 3, 4, 10])
def test_simplex_vertices_regular_and_unit(k):
    w = simplex_vertices(k).double()
    assert w.shape == (k, k - 1)
    assert torch.allclose(w.norm(dim=1), torch.ones(k, dtype=torch.float64), atol=1e-6)
    cos = w @ w.t()
    off = cos[~torch.eye(k, dtype=torch.bool)]
    assert torch.allclose(off, torch.full_like(off, -1.0 / (k - 1)), atol=1e-6)


def test_classifier_logits_linear_and_cosine():
    f, w = T([[3.0, 4.0]]), T([[1.0, 0.0], [0.0, 2.0]])
    assert torch.allclose(classifier_logits(f, w), T([[3.0, 8.0]]))
    assert torch.allclose(classifier_logits(f, w, 10.0), T([[6.0, 8.0]]))


def test_bct_synthesised_rows_and_influence_loss():
    old_w = T([[1.0, 0.0], [9.0, 9.0]])  # second row belongs to no class yet: dropped (n_prev = 1)
    feats, labels = T([[5.0, 5.0], [0.0, 2.0], [0.0, 4.0]]), T([0, 1, 1])
    w = synthesised_classifier(old_w, feats, labels, n_prev=1, n_seen=2)
    assert torch.allclose(w, T([[1.0, 0.0], [0.0, 3.0]]))
    # CE of logits (1, 0) at class 0 = log(1 + e^-1)
    loss = influence_loss(T([[1.0, 0.0]]), T([[1.0, 0.0], [0.0, 1.0]]), T([0]))
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)


def test_class_means_zero_for_missing_class():
    m = class_means(T([[2.0], [4.0]]), T([0, 0]), 2)
    assert torch.allclose(m, T([[3.0], [0.0]]))


def test_lce_alignment_and_boundary():
    centres = torch.nn.functional.normalize(T([[1.0, 0.0]]), dim=1)
    la = alignment_loss(T([[1.0, 0.0], [0.0, 1.0]]), T([0, 0]), centres)
    assert la.item() == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-6)
    lb = boundary_loss(T([[0.0, 1.0]]), T([0]), centres, T([0.25]))
    assert lb.item() == pytest.approx(0.75, abs=1e-6)
    assert boundary_loss(T([[1.0, 0.1]]), T([0]), centres, T([0.25])).item() == 0.0


def test_advbct_point_to_set_and_adversarial():
    centres, radii = T([[0.0, 1.0], [1.0, 0.0]]), T([0.5, 0.5])
    # own centre at distance 1 (radius 0.5 -> 0.5), the other centre at 0 (-> 1)
    assert point_to_set_loss(T([[1.0, 0.0]]), T([0]), centres, radii).item() == pytest.approx(1.5, abs=1e-6)
    disc = torch.nn.Linear(2, 1)
    torch.nn.init.zeros_(disc.weight), torch.nn.init.zeros_(disc.bias)
    loss = adversarial_loss(disc, T([[1.0, 2.0]]), T([[3.0, 4.0]]))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)


def test_grad_reverse_negates_gradient():
    x = T([1.0, 2.0]).requires_grad_(True)
    (grad_reverse(x) * T([3.0, 5.0])).sum().backward()
    assert torch.allclose(x.grad, T([-3.0, -5.0]))


def test_hoc_info_nce_hand_computed():
    e = T([[1.0, 0.0], [0.0, 1.0]])
    # positive cos 1, one negative with cos 0: log(e^0) - rho * 1
    assert hoc_info_nce(e, e, rho=2.0).item() == pytest.approx(-2.0, abs=1e-6)
    e3 = T([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    a = math.log(1 + math.exp(-1)) - 1  # negatives cos (0, -1)
    b = math.log(2) - 1  # negatives cos (0, 0)
    assert hoc_info_nce(e3, e3, rho=1.0).item() == pytest.approx((2 * a + b) / 3, abs=1e-6)


def test_feature_distillation_on_replay_only():
    new, old = T([[1.0, 1.0], [5.0, 5.0]]), torch.zeros(2, 2)
    assert feature_distillation(new, old, T([True, False])).item() == pytest.approx(2.0)
    assert feature_distillation(new, old, T([False, False])).item() == 0.0


def test_focal_distillation_lm_and_kl():
    new, old = T([[2.0, 0.0, 5.0]]), T([[1.0, 0.0]])
    assert focal_weights(old, T([0]), 1.0, 5.0).item() == 6.0
    # old correct -> weight 6; 1/2 * ((2-1)^2 + 0^2) = 0.5
    assert focal_logit_matching(new, old, T([0]), 1.0, 5.0).item() == pytest.approx(3.0)
    # a new-class sample (y = 2): weight alpha = 1; KL([.5,.5] || [.75,.25]) on the old classes only
    kl = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    val = focal_kl(T([[math.log(3.0), 0.0, 9.0]]), T([[0.0, 0.0]]), T([2]), 1.0, 5.0, 1.0)
    assert val.item() == pytest.approx(kl, abs=1e-6)
    # an old-class sample the old model gets wrong (argmax of a tie is 0, y = 1): weight alpha; the
    # target [.5, .5, 0] against the full new softmax [3, 1, 4] / 8
    full = 0.5 * math.log(0.5 / (3 / 8)) + 0.5 * math.log(0.5 / (1 / 8))
    val = focal_kl(T([[math.log(3.0), 0.0, math.log(4.0)]]), T([[0.0, 0.0]]), T([1]), 1.0, 5.0, 1.0)
    assert val.item() == pytest.approx(full, abs=1e-6)
    # tau^2 scaling: at tau = 2 the logits are halved
    p, q = [0.5, 0.5], [math.sqrt(3) / (1 + math.sqrt(3)), 1 / (1 + math.sqrt(3))]
    kl2 = 4 * sum(a * math.log(a / b) for a, b in zip(p, q))
    assert kl_to_target(T([[math.log(3.0), 0.0]]), T([[0.0, 0.0]]), 2.0).item() == pytest.approx(kl2, abs=1e-6)


def test_elodi_ldi_top_k():
    logits = T([[1.0, 2.0, 3.0]])
    assert logit_difference_inhibition(logits, T([[0.0, 1.0, 5.0]]), top_k=1).item() == pytest.approx(4.0)
    assert logit_difference_inhibition(logits, T([[0.0, 1.0, 5.0]]), top_k=2).item() == pytest.approx(5.0)
    assert logit_difference_inhibition(logits, T([[0.0, 1.0, 5.0]]), top_k=1, p=1.0).item() == pytest.approx(2.0)


def test_muscle_masked_kl_switches_teacher():
    student, old, ref = T([[0.0, 0.0]]), T([[0.0]]), T([[2.0, 0.0]])
    p = [math.exp(2) / (1 + math.exp(2)), 1 / (1 + math.exp(2))]
    kl_ref = sum(a * math.log(a / 0.5) for a in p)
    # reference right (y = 0): distil from the reference
    assert muscle_masked_kl(student, old, ref, T([0]), 1.0).item() == pytest.approx(kl_ref, abs=1e-6)
    # reference wrong (y = 1): distil from the old model (one class -> KL 0)
    assert muscle_masked_kl(student, old, ref, T([1]), 1.0).item() == pytest.approx(0.0, abs=1e-6)


def test_psp_and_lsp_features():
    psp = softmax_simplex_features(T([[math.log(3.0), 0.0, 7.0]]), n_seen=2, n_total=4)
    assert torch.allclose(psp, T([[0.25, -0.25, 0.0, 0.0]]), atol=1e-6)
    lsp = logit_simplex_features(T([[3.0, 1.0, 7.0]]), n_seen=2, n_total=4)
    assert torch.allclose(lsp, T([[1.0, -1.0, 0.0, 0.0]]))
