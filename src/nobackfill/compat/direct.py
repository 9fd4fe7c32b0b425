"""The Direct baselines of XBT's Table 1 (Jang & Lim 2024, Sec. 4.2, Eq. 6)::

    L_Direct = E_{(x,t) ~ D} [ L_c(v_bar_new, w_old; tau_N) + L_c(w_bar_new, v_old; tau_N) ]

with a *randomly initialised* phi of XBT's architecture producing ``v_bar_new = phi(v_new)`` and
``w_bar_new = phi(w_new)`` (Eq. 4), and the frozen old model embedding every training pair
(``v_old``, ``w_old``): unlike XBT, these methods load and run the old model.

Training options (Sec. 4.2):

* ``full``  - Full-tune: every weight of both new encoders, and phi.
* ``lora``  - LoRA-only: LoRA on both encoders, and phi.
* ``base``  - Base: LoRA-only plus the 10 vision prompts (lr x100), and phi; "akin to XBT
  without the pretrained phi".

phi is trained entirely in all three (it starts random). The same hyper-parameters as XBT
(:class:`~nobackfill.compat.xbt.XBTConfig`; ``tau_N`` = 2.6592 log scale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..train.contrastive import info_nce
from ..train.loop import TrainResult, train
from .adapters import AdapterConfig
from .data import PairBatches, Pairs
from .phi import random_projection
from .upgrade import UpgradedEncoder, new_upgraded_encoder, space_info
from .xbt import XBTConfig, _PairMethod

MODES = {"full": "direct-full", "lora": "direct-lora", "base": "direct-base"}


def direct_adapter_config(mode: str, like: AdapterConfig | None = None) -> AdapterConfig | None:
    """The additions each Direct option trains (None = full fine-tuning, no adapters)."""
    like = like or AdapterConfig()
    kw = dict(lora_rank=like.lora_rank, lora_alpha=like.lora_alpha, lora_dropout=like.lora_dropout,
              lora_targets=like.lora_targets, seed=like.seed, architecture=like.architecture)
    if mode == "full":
        return None
    if mode == "lora":
        return AdapterConfig.lora_only(n_prompts=0, **kw)
    if mode == "base":
        return AdapterConfig.base(n_prompts=like.n_prompts or 10, **kw)
    raise ValueError(f"unknown Direct mode {mode!r}; modes: {sorted(MODES)}")


class DirectTraining(_PairMethod):
    """Eq. 6 with the old model in the loop (frozen, no gradients)."""

    def __init__(self, up: UpgradedEncoder, old, mode: str, cfg: XBTConfig, recipe: dict | None = None) -> None:
        super().__init__(up, cfg, recipe)
        if mode not in MODES:
            raise ValueError(f"unknown Direct mode {mode!r}; modes: {sorted(MODES)}")
        self.old, self.mode = old, mode
        self.name = MODES[mode]
        old.model.requires_grad_(False)
        old.model.eval()
        up.phi.requires_grad_(True)
        if mode == "full":
            up.base.model.requires_grad_(True)

    def param_groups(self) -> list[dict]:
        phi = list(self.up.phi.parameters())
        if self.mode == "full":
            return [{"params": [p for p in self.up.base.model.parameters() if p.requires_grad] + phi}]
        g = self.up.adapters.groups()
        groups = [{"params": g["lora"] + g["layernorm"] + phi}]
        if g["prompts"]:
            groups.append({"params": g["prompts"], "lr_scale": self.cfg.prompt_lr_scale})
        return groups

    def loss(self, batch, step: int):
        images, captions = batch
        v_bar, w_bar = self._features(images, captions)
        with torch.no_grad():
            old = self.old
            v_old = F.normalize(old.image_features(old.preprocessor(images)), dim=-1)
            w_old = F.normalize(old.text_features(**old.tokenize(captions)), dim=-1)
        loss = info_nce(v_bar, w_old, self.scale) + info_nce(w_bar, v_old, self.scale)
        return loss, {}

    def train_mode(self, training: bool) -> None:
        super().train_mode(training)
        self.old.model.eval()


def train_direct(new, old, pairs: Pairs, mode: str, cfg: XBTConfig, out: str | Path, *,
                 progress: bool = False, command: str | None = None,
                 evaluate: Callable[[], dict] | None = None) -> tuple[UpgradedEncoder, TrainResult]:
    """Train one Direct baseline; ``new`` is modified in place (adapters, or its weights for
    ``full``); writes a ``direct-*`` upgrade into ``out``."""
    phi = random_projection(new.embed_dim, old.embed_dim, seed=cfg.loop.seed)
    up = new_upgraded_encoder(new, phi, space_info(old), direct_adapter_config(mode, cfg.adapters), kind=MODES[mode])
    recipe = {"method": MODES[mode], "config": cfg.to_dict(), "n_pairs": len(pairs), "command": command}
    method = DirectTraining(up, old, mode, cfg, recipe)
    res = train(method, PairBatches(pairs, cfg.batch_size, cfg.loop.seed), cfg.loop, out, evaluate=evaluate,
                progress=progress)
    up.train(False)
    if up.adapters is None:
        up.base.invalidate_space_id()
    return up, res
