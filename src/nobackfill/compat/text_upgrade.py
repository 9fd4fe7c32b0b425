"""XBT on a text-only model (Jang & Lim 2024's recipe with a second caption in place of the image): the
``xbt-text`` upgrade kind, e.g. all-MiniLM-L6-v2 (new) -> the Multi30K old text model.

Stage 1 (Eq. 3) on cached embeddings of the train captions (both text encoders frozen)::

    L_pre = L_c( phi(w_new + eps), w_old ; tau_pre )

Stage 2 (Eq. 4-5 with caption b of the same image in place of the image)::

    L_x = L_c( phi(w_new(cap_a)), phi(w_new(cap_b)) ; tau_x )

over pairs of two different captions of one train image; trainable: LoRA on the new model's
attention projections and trainable copies of its LayerNorms (:class:`~.adapters.Adapters`,
architecture ``"bert"``) and phi (from the stage-1 phi). **The old model is not loaded in stage 2**:
it embeds the stage-1 corpus (and any caller texts, e.g. a val gallery) first and is then freed
(checked with a weak reference).

:func:`train_text_upgrade` (:class:`TextUpgradeTrainer`) runs both stages and writes an ``xbt-text`` upgrade directory
(``load_upgrade(out).apply(new_model)`` -> :class:`~.upgrade.TextUpgradedEncoder`).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import hashlib
import json
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..config import from_dict, to_dict, updated
from ..train.loop import LoopConfig, TrainResult
from .adapters import AdapterConfig
from .phi import Projection
from .xbt import LOG_LOGIT_SCALE, Stage1Config, scaled_loop, train_phi
from .upgrade import TextUpgradedEncoder, new_upgraded_encoder, space_info

KIND = "xbt-text"
DEFAULT_OLD_MODEL = "models/m30k-old-text"


@dataclass
class TextXBTConfig:
    """Stage 2 (Eq. 5 on caption pairs) on the first ``images`` train images (the text model's
    :class:`~.xbt.XBTConfig`; both stages: :class:`TextXBTUpgradeConfig`).

    Paper (App. A.2): AdamW lr 1e-4 constant, wd 0.01, batch 1,024, tau fixed (log scale 2.6592),
    one epoch over 4M pairs. Ours (CPU, a few seconds per MiniLM step): lr 1e-4 constant, batch 32
    pairs, 60 steps; chosen on a dev split of train (``scripts/tune_xbt_text.py``) among lr
    5e-5..5e-4, batch 32/64, 60..240 steps, phi all / LayerNorms only (larger learning rates or
    longer runs drift away from the old space: no term of Eq. 5 anchors phi's output to it)."""

    images: int = 29000
    batch_size: int = 32
    phi_train: str = "all"  # "all" (the issue: "and phi") | "layernorm" (App. A.2) | "none" (frozen)
    lora_rank: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    #: steps, lr, warm-up, schedule, evaluation interval (seed and threads: :class:`TextXBTUpgradeConfig`'s)
    loop: LoopConfig = field(default_factory=lambda: scaled_loop(steps=60, lr=1e-4, warmup=5, schedule="constant",
                                                                 eval_every=15))

    def __post_init__(self) -> None:
        if self.phi_train not in ("all", "layernorm", "none"):
            raise ValueError(f"phi_train must be 'all', 'layernorm' or 'none', got {self.phi_train!r}")

    def adapters(self, seed: int = 0) -> AdapterConfig:
        """LoRA (rank / alpha / dropout of this config) on the BERT attention projections + LayerNorm
        copies (Sec. 4.1; no prompts: no vision tower)."""
        return AdapterConfig.text(lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                                  lora_dropout=self.lora_dropout, seed=seed)


def _stage1_default() -> Stage1Config:
    return Stage1Config(batch_size=1024, noise_std=0.02, corpus_size=0, loop=scaled_loop(steps=3000, lr=1e-3, warmup=50))


@dataclass
class TextXBTUpgradeConfig:
    """The whole text upgrade (the text model's :class:`~.xbt.XBTUpgradeConfig`): stage 1
    (:class:`~.xbt.Stage1Config`) on the captions of the first ``stage1_images`` train images (all
    5 each, deduplicated), then stage 2 (:class:`TextXBTConfig`)."""

    stage1_images: int = 29000
    stage1: Stage1Config = field(default_factory=_stage1_default)
    xbt: TextXBTConfig = field(default_factory=TextXBTConfig)
    seed: int = 0
    threads: int = 1
    #: stage 1's target for a caption: its own old embedding (``same``, Eq. 3 as written) or the old
    #: embedding of another caption of the same image (``sibling``: a caption corpus with pairs)
    stage1_positives: str = "same"

    def __post_init__(self) -> None:
        if self.stage1_positives not in ("same", "sibling"):
            raise ValueError(f"stage1_positives must be 'same' or 'sibling', got {self.stage1_positives!r}")
        if isinstance(self.stage1, dict):
            self.stage1 = from_dict(Stage1Config, self.stage1, "stage1")
        if isinstance(self.xbt, dict):
            self.xbt = from_dict(TextXBTConfig, self.xbt, "xbt")
        # one seed and thread count for both stages
        for loop in (self.stage1.loop, self.xbt.loop):
            loop.seed, loop.threads = self.seed, self.threads

    @classmethod
    def quick(cls, **kw) -> "TextXBTUpgradeConfig":
        """``--quick``: stage 1 on 8,000 images (40k captions) for 1,500 steps; stage 2 pairs from
        the same 8,000 images."""
        s1 = updated(_stage1_default(), steps=1500)
        return cls(stage1_images=8000, stage1=s1, xbt=TextXBTConfig(images=8000), **kw)

    def to_dict(self) -> dict:
        return to_dict(self)


# ----------------------------------------------------------------------------- models and data
def load_text_encoder(path):
    """A MiniLM-style text encoder: the shipped pretrained all-MiniLM-L6-v2 for ``None`` /
    ``"pretrained"``, else a saved model directory; an encoder object is returned as is."""
    from ..encoders.minilm import MiniLMTextEncoder

    if path is not None and not isinstance(path, (str, Path)):
        return path
    return MiniLMTextEncoder.pretrained() if path in (None, "", "pretrained") else MiniLMTextEncoder.load(path)


#: how the old model is opened (a module attribute so tests can watch it)
load_old_model: Callable = load_text_encoder


def stage1_corpus(captions: Sequence[Sequence[str]], n_images: int) -> tuple[list[str], np.ndarray]:
    """Every caption of the first ``n_images`` images, image-major (a smaller corpus is a prefix of
    a larger one and reuses its cached embedding blocks), and the indices of its first occurrences
    of distinct captions (duplicates would be false negatives of Eq. 3's InfoNCE)."""
    from .data import dedupe

    flat = [col[i] for i in range(min(n_images, len(captions[0]))) for col in captions]
    first = {t: i for i, t in reversed(list(enumerate(flat)))}
    return flat, np.array([first[t] for t in dedupe(flat)], np.int64)


def stage1_targets(corpus_idx: np.ndarray, per_image: int, positives: str = "same", seed: int = 0) -> np.ndarray:
    """Indices (into the image-major flat caption list) of the old embeddings stage 1 aligns each
    corpus caption with: itself (``same``, Eq. 3), or a random other caption of its image
    (``sibling``, fixed per caption by ``seed``)."""
    idx = np.asarray(corpus_idx, np.int64)
    if positives == "same" or per_image < 2:
        return idx
    rng = np.random.default_rng(seed)
    slot = idx % per_image
    other = (slot + rng.integers(1, per_image, size=idx.size)) % per_image
    return idx - slot + other


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- stage 2
def train_text_xbt(new, phi: Projection, captions: Sequence[Sequence[str]], cfg: TextXBTConfig, out: str | Path, *,
                   target: dict, seed: int = 0, threads: int = 0, progress: bool = False,
                   evaluate: Callable[[TextUpgradedEncoder], dict] | None = None, data: str | Path | None = None
                   ) -> tuple[TextUpgradedEncoder, TrainResult, dict[str, int]]:
    """Stage 2 (Eq. 5 on caption pairs ``captions[k][i]``, slot ``k`` of image ``i``): attach LoRA +
    LayerNorm copies to ``new`` (in place) and train them with a copy of ``phi`` (the argument is
    left as is). There is no old-model argument: ``target`` only names the old space
    (:func:`~.upgrade.space_info`). ``evaluate(upgraded)`` runs every ``cfg.eval_every`` steps.
    Checkpoints and the log go to ``out`` (nothing is exported there); ``data``: where the captions
    came from (named where a resume finds other captions). Returns ``(the upgraded
    encoder (eval mode), TrainResult, trainable parameter counts)``."""
    from ..train.checkpoint import data_settings
    from ..train.loop import train
    from ..train.text_pairs import CaptionPairBatches, TextPairContrastive

    up = new_upgraded_encoder(new, copy.deepcopy(phi), target, cfg.adapters(seed), kind=KIND)
    phi = up.phi
    phi_params = {"layernorm": phi.layernorm_parameters, "all": lambda: list(phi.parameters()),
                  "none": list}[cfg.phi_train]()
    phi.requires_grad_(False)
    for p in phi_params:
        p.requires_grad_(True)
    counts = up.adapters.num_parameters()
    counts = {"lora": counts["lora"], "layernorm": counts["layernorm"], "phi": sum(p.numel() for p in phi_params)}
    # L_c(phi(w_new(a)), phi(w_new(b)); tau_x) with tau_x fixed at the paper's log scale (App. A.2)
    method = TextPairContrastive(new, head=phi, learn_temperature=False, log_scale=LOG_LOGIT_SCALE)
    loop = dataclasses.replace(cfg.loop, seed=seed, threads=threads)
    pairs = [list(c[:cfg.images]) for c in captions]
    method.run_settings = data_settings(data, pairs)  # a resume on other captions: refused, naming both folders
    batches = CaptionPairBatches(pairs, cfg.batch_size, seed=seed)
    ev = (lambda: evaluate(up)) if evaluate is not None else None
    res = train(method, batches, loop, out, evaluate=ev, progress=progress, export=False)
    up.train(False)
    return up, res, counts


# ----------------------------------------------------------------------------- both stages
@dataclass
class TextUpgradeResult:
    """What :func:`train_text_upgrade` made: the upgraded encoder (in memory, equal to the saved
    directory), the stage-1 phi, both training results, and the frozen models' embeddings of the
    caller's ``embed`` texts (``old_embeddings[name]`` / ``new_embeddings[name]``)."""

    upgraded: TextUpgradedEncoder
    phi_stage1: Projection
    stage1: TrainResult
    xbt: TrainResult
    out: Path
    source: dict
    target: dict
    trainable: dict[str, int]
    corpus_size: int
    pair_images: int
    old_embeddings: dict[str, np.ndarray]
    new_embeddings: dict[str, np.ndarray]
    old_model_alive: bool
    timings: dict[str, float]
    cache: dict[str, dict]
    recipe: dict


class TextUpgradeTrainer:
    """Both stages, split so that a caller (the benchmark) can read the frozen models' embeddings
    before training. Construction reads the Multi30K task-2 train captions of ``data``, embeds the
    stage-1 corpus (and ``embed``'s named texts) with the old text model ``old`` (a directory),
    frees it, and embeds the same with the frozen new model ``new`` (a directory, ``"pretrained"`` /
    ``None`` for all-MiniLM-L6-v2, or an encoder, which :meth:`run` modifies in place). Embeddings
    are cached in ``cache_dir`` by space id and text hash."""

    def __init__(self, old: str | Path, new, data: str | Path, config: TextXBTUpgradeConfig | None = None, *,
                 cache_dir: str | Path | None = None, embed: Mapping[str, Sequence[str]] | None = None,
                 progress: bool = False, log: Callable[[str], None] | None = None) -> None:
        from ..data.multi30k import read_task2

        self.say = log or (lambda s: None)
        self.cfg = cfg = config or TextXBTUpgradeConfig()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.old_path, self.data, self.cache_dir, self.progress = old, data, cache_dir, progress
        self.new_desc = str(new) if new is None or isinstance(new, (str, Path)) else getattr(new, "name", "")
        self.timings: dict[str, float] = {}
        self.cache: dict[str, dict] = {}
        n_img = max(cfg.stage1_images, cfg.xbt.images)
        self.train_captions = read_task2(data, "train", "en", limit=n_img)
        self.flat, self.corpus_idx = stage1_corpus(self.train_captions.captions, cfg.stage1_images)
        embed = dict(embed or {})

        # ---- old model: the stage-1 corpus and the caller's texts; then freed (stage 2 never sees it)
        t0 = time.time()
        old_enc = load_old_model(old)
        self.target = space_info(old_enc)
        self.old_embeddings = {name: self._cached(old_enc, texts, f"old_{name}") for name, texts in embed.items()}
        k = len(self.train_captions.captions)
        self._o_train = self._cached(old_enc, self.flat, "old_train")[
            stage1_targets(self.corpus_idx, k, cfg.stage1_positives, cfg.seed)]
        self._old_ref = weakref.ref(old_enc.model)
        del old_enc
        gc.collect()
        self.timings["old_embed_s"] = time.time() - t0
        self.say(f"old model {self.target['name']} {self.target['space_id']}: embedded in "
                 f"{self.timings['old_embed_s']:.0f}s")

        # ---- new model, frozen
        t0 = time.time()
        self.new = load_text_encoder(new)
        self.source = space_info(self.new)
        self.new_embeddings = {name: self._cached(self.new, texts, f"new_{name}") for name, texts in embed.items()}
        self._n_train = self._cached(self.new, self.flat, "new_train")[self.corpus_idx]
        self.timings["new_embed_s"] = time.time() - t0
        self.say(f"new model {self.source['name']} {self.source['space_id']}: embedded in "
                 f"{self.timings['new_embed_s']:.0f}s")

    def _cached(self, enc, texts, what: str) -> np.ndarray:
        from ..evaluate import embed_texts_cached

        return embed_texts_cached(enc, texts, self.cache_dir, progress=self.progress,
                                  stats=self.cache.setdefault(what, {}))

    @property
    def old_model_alive(self) -> bool:
        """Whether the old model object is still referenced anywhere (it must not be in stage 2)."""
        gc.collect()
        return self._old_ref() is not None

    def work_key(self) -> str:
        """A key of the models, the config and the train corpus (the scratch folder's name)."""
        return _key({"old": self.target["space_id"], "new": self.source["space_id"], "cfg": self.cfg.to_dict(),
                     "train": _key(self.flat), "n": self.train_captions.n_images})

    def run(self, out: str | Path, *, work_dir: str | Path | None = None,
            evaluate: Callable[[TextUpgradedEncoder], dict] | None = None,
            command: str | None = None) -> TextUpgradeResult:
        """Stage 1 (Eq. 3) on the cached embeddings, stage 2 (Eq. 5 on caption pairs, the old model
        gone), then write the ``xbt-text`` upgrade to ``out`` (atomically). Scratch (the stage-1
        ``phi`` upgrade in ``stage1/``, the stage-2 log and checkpoints) goes to ``out`` itself when
        ``work_dir`` is None (a killed run resumes), else to ``work_dir/<work_key()>``.
        ``evaluate(upgraded)`` is called every ``eval_every`` stage-2 steps."""
        cfg, out = self.cfg, Path(out)
        if self._n_train is None:
            raise RuntimeError("TextUpgradeTrainer.run can only be called once (it modifies the new model)")
        work = out if work_dir is None else Path(work_dir) / self.work_key()
        recipe = {"kind": KIND, "config": cfg.to_dict(), "data": str(self.data), "train": "Multi30K task2 en train",
                  "old_model": str(self.old_path), "new_model": self.new_desc,
                  "corpus_size": int(len(self.corpus_idx)),
                  "pair_images": min(cfg.xbt.images, self.train_captions.n_images), "command": command}

        # ---- stage 1 (Eq. 3) on the cached embeddings; a phi upgrade in work/stage1
        t0 = time.time()
        phi1, res1 = train_phi(self._n_train, self._o_train, cfg.stage1, work / "stage1", source=self.source,
                               target=self.target, recipe=dict(recipe, stage=1), progress=self.progress)
        self._n_train = self._o_train = None
        self.timings["stage1_train_s"] = res1.seconds
        self.say(f"stage 1: {res1.steps} steps on {len(self.corpus_idx)} captions, loss {res1.last_loss:.3f} "
                 f"({time.time() - t0:.0f}s)")

        # ---- stage 2 (Eq. 5 on caption pairs); the old model is gone
        old_alive = self.old_model_alive
        if old_alive:
            raise RuntimeError("the old model is still in memory at the XBT stage")
        up, res2, counts = train_text_xbt(self.new, phi1, self.train_captions.captions, cfg.xbt, work,
                                          target=self.target, seed=cfg.seed, threads=cfg.threads,
                                          progress=self.progress, evaluate=evaluate, data=self.data)
        self.timings["xbt_train_s"] = res2.seconds
        self.say(f"stage 2: {res2.steps} steps, loss {res2.last_loss:.3f} ({res2.seconds:.0f}s)")
        recipe.update(stage=2, stage1={"steps": res1.steps, "seconds": round(res1.seconds, 1),
                                       "last_loss": res1.last_loss},
                      xbt={"steps": res2.steps, "seconds": round(res2.seconds, 1), "last_loss": res2.last_loss,
                           "trainable": counts})
        up.meta["recipe"] = recipe
        up.save(out, recipe=recipe)
        return TextUpgradeResult(upgraded=up, phi_stage1=phi1, stage1=res1, xbt=res2, out=out, source=self.source,
                                 target=self.target, trainable=counts, corpus_size=recipe["corpus_size"],
                                 pair_images=recipe["pair_images"], old_embeddings=self.old_embeddings,
                                 new_embeddings=self.new_embeddings, old_model_alive=old_alive,
                                 timings=dict(self.timings), cache=self.cache, recipe=recipe)


def train_text_upgrade(old: str | Path, new, data: str | Path, out: str | Path, config: TextXBTUpgradeConfig | None = None,
                       *, cache_dir: str | Path | None = None, work_dir: str | Path | None = None,
                       evaluate: Callable[[TextUpgradedEncoder], dict] | None = None, command: str | None = None,
                       progress: bool = False, log: Callable[[str], None] | None = None) -> TextUpgradeResult:
    """Train and save an ``xbt-text`` upgrade from the text model ``new`` (a directory,
    ``"pretrained"`` / ``None`` for all-MiniLM-L6-v2, or an encoder) into the space of the old text
    model ``old`` on Multi30K task 2 (``data``, train split only), written to ``out``
    (:class:`TextUpgradeTrainer`; ``command`` is recorded in ``upgrade.json`` -> ``recipe``)."""
    trainer = TextUpgradeTrainer(old, new, data, config, cache_dir=cache_dir, progress=progress, log=log)
    return trainer.run(out, work_dir=work_dir, evaluate=evaluate, command=command)


__all__ = ["KIND", "TextXBTConfig", "TextXBTUpgradeConfig", "TextUpgradeResult", "TextUpgradeTrainer", "train_text_upgrade",
           "train_text_xbt",
           "stage1_corpus", "load_text_encoder", "DEFAULT_OLD_MODEL"]
