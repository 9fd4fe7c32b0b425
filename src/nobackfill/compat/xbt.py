"""XBT, cross-modal backward-compatible training (Jang & Lim 2024), as two
:class:`~nobackfill.train.loop.Method` plug-ins of the one training loop.

Stage 1 - :class:`TextOnlyProjectionPretraining` (Sec. 3.2, Eq. 3)::

    L_pre = E_{t ~ D_T} [ L_c( phi(w_new + eps), w_old ; tau_pre ) ]

over a text corpus only; ``eps ~ N(0, noise_std^2 I)``; both text encoders frozen (we embed the
corpus once with each and train phi on the cached embeddings, which is the same computation).
``L_c`` is the symmetric InfoNCE :func:`nobackfill.train.contrastive.info_nce`.

Stage 2 - :class:`XBTTraining` (Sec. 3.3, Eq. 4-5)::

    v_bar_new = phi(v_new),  w_bar_new = phi(w_new)                       (Eq. 4)
    L_x = E_{(x,t) ~ D} [ L_c( v_bar_new, w_bar_new ; tau_x ) ]            (Eq. 5)

on image-text pairs; **the old model is never loaded**. Trainable: LoRA on both new encoders,
10 soft prompts on the vision encoder (learning rate x100), the encoders' LayerNorms, and phi.
Which part of phi: App. A.2 / Sec. 4.2 say "XBT only trains layer-normalization layers including
pretrained phi", while the issue lists "phi" as trainable; we follow the seed (``phi_train =
"layernorm"``, the default) and offer ``"all"``.

Hyper-parameters (App. A.2): ``tau_pre = tau_x = 2.6592`` is CLIP's *log* logit scale, i.e. a
logit scale ``e^2.6592 = 14.29`` (tau = 0.07); AdamW, weight decay 0.01, constant learning rate;
prompts at 100x the learning rate. Our CPU defaults differ where stated in :class:`Stage1Config`
and :class:`XBTConfig` (learning rate, batch size, steps), tuned on the world *val* split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..config import to_dict
from ..train.contrastive import info_nce
from ..evaluate import texts_sha256
from ..train.checkpoint import data_digest, data_settings
from ..train.loop import LoopConfig, Method, TrainResult, setting_changes, train
from .adapters import AdapterConfig, check_adapter_config
from .bridges import PhiBridge
from .data import IndexBatches, PairBatches, Pairs, dedupe
from .phi import Projection
from .upgrade import UpgradedEncoder, new_upgraded_encoder, save_vector_upgrade, space_info

#: App. A.2: "Temperature hyper-parameters tau_pre, tau_X and tau_N are fixed at 2.6592" (log scale)
LOG_LOGIT_SCALE = 2.6592


def scaled_loop(**kw) -> LoopConfig:
    """The XBT stages' loop: AdamW with weight decay 0.01 (App. A.2), cosine schedule, log /
    checkpoint / evaluation intervals scaled to the steps."""
    return LoopConfig(**{"weight_decay": 0.01, "log_every": 0, "checkpoint_every": 0, "eval_every": 0, **kw})


@dataclass
class Stage1Config:
    """Text-only pretraining of phi (Eq. 3).

    Paper (App. A.2): batch 8,192, AdamW lr 1e-4 (fixed), wd 0.01, one epoch over 67M captions,
    noise std not given. Ours (CPU, ~39k distinct world captions): batch 1,024, lr 1e-3 with a
    cosine schedule, 1,500 steps (~40 epochs), noise std 0.05 per coordinate. Chosen on the world
    VAL split (``scripts/tune_xbt.py stage1``; text-only phi rows, t2i / i2t R@1, old/old = .320 /
    .324):

    ============================  =============  ==============
    lr, noise, steps               t2i R@1        i2t R@1
    ============================  =============  ==============
    1e-4, 0.00, 1500               .355           .511
    1e-4, 0.02, 1500               .357           .549
    1e-4, 0.05, 1500               .355           .535
    1e-3, 0.00, 1500               .354           .428
    1e-3, 0.02, 1500               .355           .594
    1e-3, 0.05, 1500 (default)     .349           .614
    1e-3, 0.10, 1500               .353           .573
    1e-3, 0.05, 1500, scale e^3.9  .339           .687
    ============================  =============  ==============

    The noise is what lets phi, trained on text, carry *image* embeddings across (Table 4 (a)-(b)
    of the paper makes the same point). t2i hardly moves with any setting: it is bounded by how
    the old model embeds images of concepts it never saw (see the benchmark's notes). The
    temperature stays the paper's (a larger logit scale helps i2t, hurts t2i).
    """

    batch_size: int = 1024
    noise_std: float = 0.05
    log_logit_scale: float = LOG_LOGIT_SCALE
    corpus_size: int = 40000
    #: steps, lr, warm-up, weight decay, schedule, seed, threads (intervals scaled to the steps)
    loop: LoopConfig = field(default_factory=lambda: scaled_loop(steps=1500, lr=1e-3, warmup=50))


@dataclass
class XBTConfig:
    """Stage 2 (Eq. 5) and, with the same fields, the Direct baselines (Eq. 6).

    Paper (App. A.2): batch 1,024, AdamW lr 1e-4 (fixed), wd 0.01, prompts lr x100, one epoch over
    4M pairs. Ours (CPU): batch 128 (scaled down), lr 1e-4 (the paper's) with 20 warm-up steps and a
    cosine decay, 300 steps (about 10 epochs of 4k pairs; one epoch of 4k pairs at batch 128 is 31
    steps, too few to move anything). Chosen on the world VAL split (``scripts/tune_xbt.py``;
    4,000 pairs, 300 steps, from the default stage-1 phi whose text-only rows are .349 / .614):

    ==========================  =========  =========
    stage 2                      t2i R@1    i2t R@1
    ==========================  =========  =========
    XBT, lr 1e-3                 .338       .596
    XBT, lr 1e-4 (default)       .352       .585
    Direct Base, lr 1e-4         .543       .409
    ==========================  =========  =========

    (old/old .320 / .324, new/new .945 / .949.) The same settings serve the Direct baselines, as
    in the paper's Table 1.
    """

    batch_size: int = 128
    prompt_lr_scale: float = 100.0
    log_logit_scale: float = LOG_LOGIT_SCALE
    phi_train: str = "layernorm"  # "layernorm" (App. A.2) | "all"
    adapters: AdapterConfig = field(default_factory=AdapterConfig)
    #: steps, lr, warm-up, weight decay, schedule, seed, threads (intervals scaled to the steps)
    loop: LoopConfig = field(default_factory=lambda: scaled_loop(steps=300, lr=1e-4, warmup=20))

    def __post_init__(self) -> None:
        if self.batch_size < 2:  # (1 trained to "loss 0.000": no negatives)
            raise ValueError(f"batch_size must be >= 2 (a contrastive batch needs other pairs as its negatives), got {self.batch_size}")
        if self.phi_train not in ("layernorm", "all"):
            raise ValueError(f"phi_train must be 'layernorm' or 'all', got {self.phi_train!r}")
        if isinstance(self.adapters, dict):
            self.adapters = AdapterConfig(**self.adapters)


    def to_dict(self) -> dict:
        return to_dict(self)


# ----------------------------------------------------------------------------- stage 1
class TextOnlyProjectionPretraining(Method):
    """Eq. 3 on cached text embeddings: batches are row indices into the corpus."""

    name = "xbt-stage1"

    def __init__(self, phi: Projection, new_texts: np.ndarray, old_texts: np.ndarray, noise_std: float = 0.02,
                 log_logit_scale: float = LOG_LOGIT_SCALE, source: dict | None = None,
                 target: dict | None = None, recipe: dict | None = None) -> None:
        if len(new_texts) != len(old_texts):
            raise ValueError(f"{len(new_texts)} new vs {len(old_texts)} old text embeddings")
        if new_texts.shape[1] != phi.in_dim or old_texts.shape[1] != phi.out_dim:
            raise ValueError(f"phi maps {phi.in_dim} -> {phi.out_dim} but the embeddings are "
                             f"{new_texts.shape[1]} -> {old_texts.shape[1]}")
        self.phi = phi
        self.w_new = torch.as_tensor(np.asarray(new_texts, np.float32))
        self.w_old = torch.as_tensor(np.asarray(old_texts, np.float32))
        self.noise_std = float(noise_std)
        self.scale = math.exp(log_logit_scale)
        self.source, self.target, self.recipe = source, target, recipe

    def param_groups(self) -> list[dict]:
        return [{"params": list(self.phi.parameters())}]

    def loss(self, batch, step: int):
        idx = torch.as_tensor(np.asarray(batch), dtype=torch.long)
        x = self.w_new[idx]
        if self.noise_std:
            x = x + self.noise_std * torch.randn_like(x)  # eps of Eq. 3
        loss = info_nce(self.phi(x), self.w_old[idx], self.scale)
        return loss, {}

    def train_mode(self, training: bool) -> None:
        self.phi.train(training)

    def state_dict(self) -> dict:
        return {"phi": self.phi.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.phi.load_state_dict(state["phi"])

    def export(self, out: Path) -> None:
        if self.source is None or self.target is None:
            self.phi.save(out)
            return
        save_vector_upgrade(out, PhiBridge(self.phi, self.source["space_id"], self.target["space_id"]),
                            self.source, self.target, recipe=self.recipe)


def embed_texts(encoder, texts: Sequence[str], batch_size: int = 512, progress: bool = False) -> np.ndarray:
    return encoder.encode_texts(list(texts), batch_size=batch_size, progress=progress)


def embed_corpus(new, old, corpus: Sequence[str], cfg: Stage1Config,
                 progress: bool = False) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The deduplicated corpus (duplicates would be false negatives of the InfoNCE) and its
    embeddings by both frozen text encoders."""
    texts = stage1_texts(corpus, cfg)
    return texts, embed_texts(new, texts, progress=progress), embed_texts(old, texts, progress=progress)


def stage1_texts(corpus: Sequence[str], cfg: Stage1Config) -> list[str]:
    """The captions stage 1 trains on: ``corpus`` deduplicated, cut to ``cfg.corpus_size``."""
    return dedupe(corpus)[: cfg.corpus_size or None]


def train_phi(w_new: np.ndarray, w_old: np.ndarray, cfg: Stage1Config, out: str | Path, *,
              source: dict | None = None, target: dict | None = None, recipe: dict | None = None,
              progress: bool = False, evaluate: Callable[[], dict] | None = None) -> tuple[Projection, TrainResult]:
    """Eq. 3 on cached embeddings; writes a ``phi`` upgrade (or bare phi files) into ``out``."""
    torch.manual_seed(cfg.loop.seed)
    phi = Projection(w_new.shape[1], w_old.shape[1])
    method = TextOnlyProjectionPretraining(phi, w_new, w_old, cfg.noise_std, cfg.log_logit_scale,
                                           source=source, target=target, recipe=recipe)
    res = train(method, IndexBatches(len(w_new), cfg.batch_size, cfg.loop.seed), cfg.loop, out,
                evaluate=evaluate, progress=progress)
    phi.eval()
    return phi, res


def pretrain_phi(new, old, corpus: Sequence[str], cfg: Stage1Config, out: str | Path, *,
                 progress: bool = False, command: str | None = None,
                 evaluate: Callable[[], dict] | None = None) -> tuple[Projection, TrainResult, dict]:
    """Stage 1 end to end: embed the corpus with both frozen text encoders, train phi (Eq. 3),
    write a ``phi`` upgrade into ``out``. ``old`` may be any encoder with ``encode_texts`` (for
    continual updates: the previous, upgraded model)."""
    t0 = time.time()
    texts, w_new, w_old = embed_corpus(new, old, corpus, cfg, progress)
    embed_s = time.time() - t0
    source, target = space_info(new), space_info(old)
    recipe = {"stage": 1, "config": to_dict(cfg), "corpus_size": len(texts), "corpus_sha256": texts_sha256(texts),
              "command": command}
    phi, res = train_phi(w_new, w_old, cfg, out, source=source, target=target, recipe=recipe,
                         progress=progress, evaluate=evaluate)
    return phi, res, {"embed_seconds": embed_s, "train_seconds": res.seconds, "corpus_size": len(texts),
                      "source": source, "target": target}


def finished_stage1(folder: Path, new_id: str, old_id: str, corpus: Sequence[str],
                    cfg: Stage1Config) -> tuple[Projection, dict] | None:
    """(phi, target) of the finished stage 1 a previous run of the same upgrade left in ``folder``
    (a run killed in stage 2 resumes after it), when it was trained from the same models, on the same
    captions, with the same settings (those a resume may change aside: :func:`~nobackfill.train.loop.setting_changes`);
    else None (stage 1 trains again)."""
    from .upgrade import load_upgrade

    if not (folder / "upgrade.json").is_file():
        return None
    try:
        up = load_upgrade(folder)
    except (OSError, ValueError):
        return None
    recipe = up.manifest.get("recipe") or {}
    same = (up.kind == "phi" and up.source_id == new_id and up.target_id == old_id and not up.check_files()
            and isinstance(recipe.get("config"), dict) and not setting_changes(recipe["config"], to_dict(cfg))
            and recipe.get("corpus_sha256") == texts_sha256(stage1_texts(corpus, cfg)))
    return (Projection.load(folder), up.target) if same else None


# ----------------------------------------------------------------------------- stage 2
class _PairMethod(Method):
    """Shared plumbing of XBT and the Direct baselines (an :class:`UpgradedEncoder` in training)."""

    def __init__(self, up: UpgradedEncoder, cfg: XBTConfig, recipe: dict | None = None) -> None:
        self.up, self.cfg, self.recipe = up, cfg, recipe
        self.scale = math.exp(cfg.log_logit_scale)

    def _features(self, images, captions):
        up = self.up
        v = up.image_features(up.preprocessor(images))
        w = up.text_features(**up.tokenize(captions))
        return v, w

    def train_mode(self, training: bool) -> None:
        self.up.train(training)

    def state_dict(self) -> dict:
        state = {"phi": self.up.phi.state_dict()}
        if self.up.adapters is not None:
            state["adapters"] = self.up.adapters.state_dict()
        else:
            state["model"] = self.up.base.model.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.up.phi.load_state_dict(state["phi"])
        if self.up.adapters is not None:
            self.up.adapters.load_state_dict(state["adapters"])
        else:
            self.up.base.model.load_state_dict(state["model"])

    def export(self, out: Path) -> None:
        if self.up.adapters is None:
            self.up.base.invalidate_space_id()
        self.up.save(out, recipe=self.recipe)


class XBTTraining(_PairMethod):
    """Eq. 5: ``L_c(phi(v_new), phi(w_new); tau_x)``; no old model anywhere."""

    name = "xbt"

    def __init__(self, up: UpgradedEncoder, cfg: XBTConfig, recipe: dict | None = None) -> None:
        super().__init__(up, cfg, recipe)
        if up.adapters is None:
            raise ValueError("XBT trains adapters; the upgraded encoder has none")
        phi_params = up.phi.layernorm_parameters() if cfg.phi_train == "layernorm" else list(up.phi.parameters())
        up.phi.requires_grad_(False)
        for p in phi_params:
            p.requires_grad_(True)
        self._phi_params = phi_params

    def param_groups(self) -> list[dict]:
        g = self.up.adapters.groups()
        groups = [{"params": g["lora"] + g["layernorm"] + self._phi_params}]
        if g["prompts"]:
            groups.append({"params": g["prompts"], "lr_scale": self.cfg.prompt_lr_scale})
        return [x for x in groups if x["params"]]

    def loss(self, batch, step: int):
        images, captions = batch
        v_bar, w_bar = self._features(images, captions)
        return info_nce(v_bar, w_bar, self.scale), {}


def train_xbt(new, phi: Projection, pairs: Pairs, cfg: XBTConfig, out: str | Path, *, target: dict,
              progress: bool = False, command: str | None = None,
              evaluate: Callable[[], dict] | None = None, data: str | Path | None = None,
              corpus: str | Path | None = None) -> tuple[UpgradedEncoder, TrainResult]:
    """Stage 2 end to end on ``pairs`` (read from ``data``) from ``phi`` (trained on the text ``corpus``):
    a resume that finds other pairs or another phi is refused, naming those folders; writes an ``xbt``
    upgrade into ``out``. ``new`` is modified in place (adapters attached); ``target`` names the old
    space (``space_info``)."""
    up = new_upgraded_encoder(new, phi, target, cfg.adapters, kind="xbt")
    recipe = {"stage": 2, "config": cfg.to_dict(), "n_pairs": len(pairs), "command": command}
    method = XBTTraining(up, cfg, recipe)
    images = pairs.images if isinstance(pairs.images, np.ndarray) else [str(i) for i in pairs.images]
    method.run_settings = {**data_settings(data, images, list(pairs.captions)),  # other --pairs: refused, named
                           # (trial AF: another --text-corpus retrained stage 1, and stage 2 resumed on the new phi)
                           "text corpus": str(Path(corpus).resolve()) if corpus else None,
                           "stage 1 (phi)": data_digest([t.detach().cpu().numpy() for t in phi.state_dict().values()])}
    res = train(method, PairBatches(pairs, cfg.batch_size, cfg.loop.seed), cfg.loop, out, evaluate=evaluate,
                progress=progress)
    up.train(False)
    return up, res


# ----------------------------------------------------------------------------- both stages
@dataclass
class XBTUpgradeConfig:
    """``nobackfill upgrade xbt``: stage 1 (:class:`Stage1Config`, Eq. 3) on at most
    ``stage1.corpus_size`` captions, then stage 2 (:class:`XBTConfig`, Eq. 5) on ``n_pairs``
    distinct image-text pairs. Written as ``--config FILE.toml`` with ``[stage1]`` / ``[stage2]``
    tables, or ``--set stage2.lr=1e-4``."""

    n_pairs: int = 4000
    stage1: Stage1Config = field(default_factory=Stage1Config)
    stage2: XBTConfig = field(default_factory=XBTConfig)

    def with_seed(self, seed: int) -> "XBTUpgradeConfig":
        """One seed for both stages' loops and the adapters' initialisation."""
        from ..config import updated

        return updated(self, stage1={"loop": {"seed": seed}}, stage2={"loop": {"seed": seed}, "adapters": {"seed": seed}})


def upgrade_xbt(old: str | Path, new: str | Path, text_corpus: str | Path, pairs: str | Path, out: str | Path,
                cfg: XBTUpgradeConfig, *, stage1: str | Path | None = None, progress: bool = False,
                command: str | None = None, log: Callable[[str], None] = lambda m: None) -> tuple[UpgradedEncoder, dict]:
    """Both XBT stages end to end, resumable: stage 1 trains phi on text only (Eq. 3) into
    ``out/stage1`` (or reuses the phi upgrade ``stage1``), then the old model is dropped and stage 2
    (Eq. 5) trains the new model's adapters with phi; writes the ``xbt`` upgrade into ``out``.
    Returns the upgraded encoder and ``{"stage1": TrainResult | None, "stage2": TrainResult}``."""
    import gc

    from ..encoders import load_encoder
    from .data import load_pair_source, read_text_corpus
    from .upgrade import load_upgrade

    out = Path(out)
    pair_data = load_pair_source(pairs, cfg.n_pairs)  # read (and checked: enough pairs?) before stage 1 trains
    new_enc = load_encoder(new)
    check_adapter_config(new_enc.model, cfg.stage2.adapters, "stage2.adapters")  # before stage 1 trains
    r1 = None
    if stage1 is None:
        old_enc = load_encoder(old)
        target = space_info(old_enc)
        corpus = read_text_corpus(text_corpus, cfg.stage1.corpus_size)
        done = finished_stage1(out / "stage1", new_enc.space_id, target["space_id"], corpus, cfg.stage1)
        if done is not None:
            phi, target = done
            log(f"stage 1: the finished phi in {out / 'stage1'} (a previous run's, same models, captions and "
                "settings) is reused")
        else:
            log(f"stage 1: phi on {len(corpus)} captions (text only) ...")
            phi, r1, info = pretrain_phi(new_enc, old_enc, corpus, cfg.stage1, out / "stage1", progress=progress,
                                         command=command)
            log(f"stage 1 done in {info['embed_seconds'] + info['train_seconds']:.0f}s (loss {r1.last_loss:.3f})")
        del old_enc  # stage 2 never touches the old model
        gc.collect()
    else:
        up1 = load_upgrade(stage1)
        if up1.kind != "phi" or up1.source_id != new_enc.space_id:
            raise ValueError(f"{stage1}: not a stage-1 (phi) upgrade of {new}")
        phi, target = Projection.load(stage1), up1.target
    log(f"stage 2: XBT on {len(pair_data)} image-text pairs (old model not loaded) ...")
    up, r2 = train_xbt(new_enc, phi, pair_data, cfg.stage2, out, target=target, progress=progress, command=command,
                       data=pairs, corpus=text_corpus if stage1 is None else stage1)
    return up, {"stage1": r1, "stage2": r2}
