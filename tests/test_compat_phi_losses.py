"""phi's architecture (Sec. 4.1) and every XBT loss on hand-computable cases (Eq. 3, 5, 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from nobackfill.compat.direct import DirectTraining
from nobackfill.compat.phi import Projection, random_projection
from nobackfill.compat.xbt import LOG_LOGIT_SCALE, TextOnlyProjectionPretraining, XBTConfig, XBTTraining

S = math.exp(LOG_LOGIT_SCALE)
I2 = [[1.0, 0.0], [0.0, 1.0]]
SWAP = [[0.0, 1.0], [1.0, 0.0]]
SKEW = [[1.0, 0.0], [0.6, 0.8]]
#: L_c(SKEW, I): logits s * [[1, 0], [.6, .8]]; rows a->b: log(1+e^-s), log(1+e^-.2s); columns
#: b->a: log(1+e^-.4s), log(1+e^-.8s); L_c is the mean of the two directions' mean CE
MATCH = 0.5 * ((math.log1p(math.exp(-S)) + math.log1p(math.exp(-0.2 * S))) / 2
               + (math.log1p(math.exp(-0.4 * S)) + math.log1p(math.exp(-0.8 * S))) / 2)
MISMATCH = math.log1p(math.exp(S))  # L_c(I, SWAP): positive logit 0, negative s in every row


def test_temperature_is_clip_log_scale():
    assert LOG_LOGIT_SCALE == 2.6592
    assert S == pytest.approx(14.2857, abs=1e-3)  # tau = 0.07
    assert 1 / S == pytest.approx(0.07, abs=1e-4)


def test_phi_architecture():
    phi = Projection(128, 64)
    kinds = [type(m) for m in phi.net]
    assert kinds == [nn.Linear, nn.LayerNorm, nn.GELU, nn.Linear, nn.LayerNorm, nn.GELU, nn.Linear]
    lin = [m for m in phi.net if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in lin] == [(128, 256), (256, 256), (256, 64)]
    assert phi.hidden == 4 * 64
    assert not any(isinstance(m, nn.Dropout) for m in phi.modules())
    out = phi(torch.randn(5, 128))
    assert out.shape == (5, 64)
    assert torch.allclose(out.norm(dim=-1), torch.ones(5), atol=1e-6)
    assert len(phi.layernorm_parameters()) == 4  # two LayerNorms, weight + bias


def test_phi_save_load_and_seeded_random(tmp_path):
    phi = random_projection(12, 6, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(phi.state_dict().values(),
                                                  random_projection(12, 6, seed=3).state_dict().values()))
    phi.save(tmp_path)
    back = Projection.load(tmp_path)
    x = np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32)
    assert np.array_equal(phi.project(x), back.project(x))


class _Fixed(nn.Module):
    """A stand-in phi that returns given rows (plus a dummy parameter for the optimiser)."""

    def __init__(self, rows=None) -> None:
        super().__init__()
        self.rows = None if rows is None else torch.tensor(rows)
        self.w = nn.Parameter(torch.zeros(1))
        self.in_dim = self.out_dim = 2

    def forward(self, x):
        return (x if self.rows is None else self.rows) + 0 * self.w

    def layernorm_parameters(self):
        return [self.w]


def test_stage1_loss_hand_case():
    # phi = identity, no noise: phi(w_new) = w_new
    m = TextOnlyProjectionPretraining(_Fixed(), np.array(SKEW, np.float32), np.array(I2, np.float32), noise_std=0.0)
    loss, _ = m.loss(np.array([0, 1]), 0)
    assert loss.item() == pytest.approx(MATCH, rel=1e-5)
    m = TextOnlyProjectionPretraining(_Fixed(), np.array(I2, np.float32), np.array(SWAP, np.float32), noise_std=0.0)
    assert m.loss(np.array([0, 1]), 0)[0].item() == pytest.approx(MISMATCH, rel=1e-5)


def test_stage1_noise_is_gaussian_on_w_new():
    w_new = np.array(I2, np.float32)
    m = TextOnlyProjectionPretraining(_Fixed(), w_new, w_new, noise_std=0.5)
    torch.manual_seed(7)
    loss = m.loss(np.array([0, 1]), 0)[0].item()
    torch.manual_seed(7)
    x = torch.tensor(I2) + 0.5 * torch.randn(2, 2)
    logits = S * x @ torch.tensor(I2).t()
    t = torch.arange(2)
    expect = 0.5 * (nn.functional.cross_entropy(logits, t) + nn.functional.cross_entropy(logits.t(), t))
    assert loss == pytest.approx(expect.item(), rel=1e-5)


class _FakeUp:
    """The parts of an UpgradedEncoder the pair methods use, returning fixed unit rows."""

    def __init__(self, v, w) -> None:
        self.v, self.w = torch.tensor(v), torch.tensor(w)
        self.phi = _Fixed()
        self.adapters = type("A", (), {"groups": lambda self: {"lora": [], "prompts": [], "layernorm": []}})()
        self.preprocessor = lambda images: images
        self.tokenize = lambda caps: {"input_ids": caps, "attention_mask": None}

    def image_features(self, pv):
        return self.v

    def text_features(self, input_ids, attention_mask):
        return self.w

    def train(self, training=True):
        pass


def test_xbt_loss_hand_case():
    m = XBTTraining(_FakeUp(SKEW, I2), XBTConfig())
    assert m.loss((None, None), 0)[0].item() == pytest.approx(MATCH, rel=1e-5)
    m = XBTTraining(_FakeUp(I2, SWAP), XBTConfig())
    assert m.loss((None, None), 0)[0].item() == pytest.approx(MISMATCH, rel=1e-5)


def test_direct_loss_hand_case():
    class _Old:
        model = nn.Linear(1, 1)
        preprocessor = staticmethod(lambda images: images)
        tokenize = staticmethod(lambda caps: {"input_ids": caps, "attention_mask": None})

        def image_features(self, pv):  # v_old
            return torch.tensor(I2)

        def text_features(self, input_ids, attention_mask):  # w_old
            return torch.tensor(I2)

    up = _FakeUp(SKEW, SWAP)  # L_c(v_bar_new=SKEW, w_old=I) + L_c(w_bar_new=SWAP, v_old=I)
    m = DirectTraining.__new__(DirectTraining)
    m.up, m.cfg, m.old, m.mode, m.scale = up, XBTConfig(), _Old(), "base", S
    loss = m.loss((None, None), 0)[0].item()
    assert loss == pytest.approx(MATCH + MISMATCH, rel=1e-5)
