"""Train world models for late interaction with the one training loop: a CMLI-trained (FILIP-style)
model and Target-CMLI students, on fresh world scenes every step (never a val/test scene)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..data.batches import WorldBatches
from ..data.world import WorldSpec, WorldStream
from ..encoders.clip import CLIPDualEncoder
from ..encoders.zoo import Preset, create_model, get_preset
from ..train.contrastive import ContrastivePretraining
from ..train.loop import LoopConfig, Method, TrainResult, train, write_recipe
from .distill import KDConfig, TargetCMLIDistillation
from .hard_negatives import SwapTwinBatches
from .train import CMLIConfig, CMLIContrastive

__all__ = ["LATE_PRESET", "LateTrainConfig", "late_loop", "train_world_method", "new_world_model"]

#: the tiny zoo preset of the late-interaction experiments (world-old's size, all concepts)
LATE_PRESET = "world-tiny"
KINDS = ("cmli", "global", "kd")


@dataclass
class LateTrainConfig:
    """``nobackfill late train``: the model, the kind of training and its optimisation; ``cmli`` and
    ``kd`` hold the CMLI loss (Eq. 1-4 as logits) and the Target-CMLI distillation (Eq. 5-8)."""

    kind: str = "cmli"
    preset: str = LATE_PRESET
    batch_size: int = 64
    swap_twins: bool = False
    #: the whole loop config (``--set steps=500`` is short for ``loop.steps``); log_every /
    #: checkpoint_every 0 = scaled to steps as :func:`late_loop` does
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(steps=2000, lr=2e-3, warmup=50, threads=1,
                                                                log_every=0, checkpoint_every=0))
    cmli: CMLIConfig = field(default_factory=CMLIConfig)
    kd: KDConfig = field(default_factory=KDConfig)

    def __post_init__(self) -> None:
        if self.batch_size < 2:  # (1 trained to "loss 0.000": no negatives)
            raise ValueError(f"batch_size must be >= 2 (a contrastive batch needs other pairs as its negatives), got {self.batch_size}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")


def new_world_model(preset: str | Preset, tokenizer, seed: int = 0) -> CLIPDualEncoder:
    """A fresh model of ``preset`` that shares ``tokenizer`` (e.g. the teacher's, so that student
    and teacher tokenise captions the same way)."""
    return create_model(preset if isinstance(preset, Preset) else get_preset(preset), tokenizer, seed=seed)


def late_loop(loop: LoopConfig) -> LoopConfig:
    """``loop`` as the late runs use it: warm-up capped at steps/5, a log line every
    min(50, steps) and a checkpoint every max(100, steps/4) steps where those are 0 (unset)."""
    steps = loop.steps
    return replace(loop, warmup=min(loop.warmup, max(1, steps // 5)),
                   log_every=loop.log_every or max(1, min(50, steps)),
                   checkpoint_every=loop.checkpoint_every or max(100, steps // 4))


def train_world_method(kind: str, out: str | Path, spec: WorldSpec, tokenizer, *, preset: str | Preset = LATE_PRESET,
                       steps: int = 600, batch_size: int = 64, lr: float = 2e-3, warmup: int = 50, seed: int = 0,
                       threads: int = 1, cmli: CMLIConfig | None = None, kd: KDConfig | None = None,
                       teacher: CLIPDualEncoder | None = None, swap_twins: bool = False,
                       progress: bool = False, loop: LoopConfig | None = None) -> tuple[Method, TrainResult]:
    """Train a fresh ``preset`` model on the world stream with ``kind``: ``"global"`` (InfoNCE,
    :class:`ContrastivePretraining`), ``"cmli"`` (:class:`CMLIContrastive`) or ``"kd"``
    (:class:`TargetCMLIDistillation` from ``teacher``). Every kind sees the same batches (seeded
    by ``spec.seed`` and ``seed``) and the same initial weights. ``swap_twins``: batches of scenes
    and their attribute-swap twins (:class:`nobackfill.late.hard_negatives.SwapTwinBatches`, in-batch
    hard negatives from training scenes). ``loop``: the whole loop config (weight decay, clipping,
    schedule, intervals, ...), in place of ``steps``, ``lr``, ``warmup``, ``seed`` and ``threads``;
    see :func:`late_loop`. Writes the model and its ``recipe.json`` into ``out``."""
    if loop is None:
        loop = LoopConfig(steps=steps, lr=lr, warmup=warmup, seed=seed, threads=threads, log_every=0,
                          checkpoint_every=0)
    cfg = late_loop(loop)
    steps, lr, seed = cfg.steps, cfg.lr, cfg.seed
    enc = new_world_model(preset, tokenizer, seed=seed)
    enc.meta.update({"name": Path(out).name, "late_kind": kind})
    if kind == "global":
        method: Method = ContrastivePretraining(enc)
    elif kind == "cmli":
        method = CMLIContrastive(enc, cmli or CMLIConfig())
    elif kind == "kd":
        if teacher is None:
            raise ValueError("kind 'kd' needs a teacher model")
        method = TargetCMLIDistillation(enc, teacher, kd or KDConfig())
    else:
        raise ValueError(f"kind must be 'global', 'cmli' or 'kd', got {kind!r}")
    method.run_settings = {"kind": kind, "batch_size": batch_size, "swap_twins": swap_twins,
                           "preset": getattr(preset, "name", preset), "world_seed": spec.seed}
    stream_seed = spec.seed * 1000 + 500 + seed
    batches = (SwapTwinBatches(batch_size, seed=stream_seed) if swap_twins
               else WorldBatches(WorldStream(batch_size, seed=stream_seed)))
    result = train(method, batches, cfg, out, progress=progress)
    recipe = {"kind": kind, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
              "preset": getattr(preset, "name", preset), "world_seed": spec.seed, "swap_twins": swap_twins,
              "loop": asdict(cfg),
              "cmli": asdict(cmli) if kind == "cmli" and cmli else None,
              "kd": asdict(kd) if kind == "kd" and kd else None, "seconds": round(result.seconds, 1)}
    write_recipe(out, recipe)
    return method, result
