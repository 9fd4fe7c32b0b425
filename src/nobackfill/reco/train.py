"""Training the RECO fusion models (Sec. 3.2 "Learning", RECO paper) as a :class:`Method` of the one
training loop.

The encoder is frozen: every training pair is embedded once (here: read from the memory, which
already holds the frozen embeddings), retrieval is done once per pair with the pair itself
excluded from its own neighbours, and the fusion models are the only trainable weights. The loss:

    L = L_NCE(V_bar, T_bar) + L_NCE(V_bar, T) + L_NCE(V, T_bar)

with ``L_NCE`` the symmetric InfoNCE of :func:`nobackfill.train.contrastive.info_nce` (the paper
writes it as a sum over the batch of both directions; ``info_nce`` takes the mean of the two
directions' means, a constant factor ``2n`` that changes only the effective learning rate).

Paper defaults (Sec. 4.1): lr 1e-3, batch 4096, 10 epochs over CC12M. Our world memory is ~20k
pairs, so the defaults here are batch 512 and a step budget with early stopping on a validation
metric (``val``), never on test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..config import to_dict
from ..train.contrastive import info_nce
from ..train.loop import LoopConfig, Method, TrainResult, train
from .fusion import FUSION_KINDS, FusionConfig
from .memory import FUSE_MODES, SEARCH_MODES, Memory
from .model import RecoModel, RecoSpec


@dataclass
class RecoTrainConfig:
    """Fusion shape, retrieval modes and optimisation of ``reco train`` (paper: lr 1e-3)."""

    k: int = 10
    search: str = "uni"
    fuse: str = "cross"
    fusion: str = "transformer"
    heads: int = 4
    batch_size: int = 512
    temperature: float = 0.05  # initial; learnable (clamped to >= 0.01)
    #: steps (a budget with early stopping), lr, warm-up, weight decay, evaluation interval, patience
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(
        steps=1500, lr=1e-3, warmup=50, weight_decay=0.05, threads=1, eval_every=250, log_every=0, checkpoint_every=0))

    def __post_init__(self) -> None:
        """What the run refuses, refused as the config is built (--config, --set, --show-config too)."""
        if self.search not in SEARCH_MODES or self.fuse not in FUSE_MODES:
            raise ValueError(f"search must be in {SEARCH_MODES}, fuse in {FUSE_MODES}; got {self.search!r}, {self.fuse!r}")
        if self.fusion not in FUSION_KINDS:
            raise ValueError(f"fusion kind must be one of {FUSION_KINDS}, got {self.fusion!r}")
        if self.k < 1 or self.heads < 1 or self.batch_size < 2:  # NCE over the batch: it needs negatives
            raise ValueError(f"k and heads must be >= 1 and batch_size >= 2, got {self.k}, {self.heads}, "
                             f"{self.batch_size}")

    def to_dict(self) -> dict:
        return to_dict(self)


@dataclass
class PairEmbeddings:
    """Frozen embeddings of training pairs: images, captions, caption -> image, and each image's
    own row in the memory (-1 if not there; excluded from its own neighbours)."""

    images: np.ndarray
    texts: np.ndarray
    text_image: np.ndarray
    memory_rows: np.ndarray

    @classmethod
    def from_memory(cls, memory: Memory) -> "PairEmbeddings":
        """The memory's own pairs (the default training set), each excluded from its own neighbours."""
        n = memory.gallery.count("image")
        return cls(memory.vectors("image"), memory.vectors("text"), memory.text_image, np.arange(n))


class RecoBatches:
    """Deterministic batches: ``batch_size`` distinct images per step (reshuffled each epoch, seeded),
    each with one of its captions, plus the precomputed retrieved embeddings of both."""

    def __init__(self, memory: Memory, pairs: PairEmbeddings, spec: RecoSpec, batch_size: int, seed: int = 0,
                 neighbour_cache: dict | None = None, k_max: int | None = None) -> None:
        n = pairs.images.shape[0]
        if n < batch_size:
            raise ValueError(f"{n} training images, fewer than the batch size {batch_size}")
        self.pairs, self.batch_size, self.seed = pairs, batch_size, seed
        self.per_epoch = n // batch_size
        self.caps_of = [[] for _ in range(n)]
        for c, i in enumerate(pairs.text_image):
            self.caps_of[int(i)].append(c)
        # neighbours of every pair, own pair excluded; with a cache, computed once for k_max and
        # sliced (the first k valid hits are a prefix of the first k_max)
        key = (id(pairs), spec.search, spec.fuse)
        k_max = max(spec.k, k_max or 0)
        cached = neighbour_cache.get(key) if neighbour_cache is not None else None
        if cached is None or cached[1].shape[1] < spec.k:
            kw = dict(search=spec.search, fuse=spec.fuse)
            own = pairs.memory_rows
            cached = (*memory.retrieve_rows(pairs.images, "image", k_max, exclude_images=own, **kw),
                      *memory.retrieve_rows(pairs.texts, "text", k_max, exclude_images=own[pairs.text_image], **kw))
            if neighbour_cache is not None:
                neighbour_cache[key] = cached
        self.img_mod, self.txt_mod = cached[0], cached[2]
        self.img_rows, self.txt_rows = cached[1][:, :spec.k], cached[3][:, :spec.k]
        self.memory = memory

    def indices(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The image rows and caption rows of batch ``index``."""
        epoch, k = divmod(index, self.per_epoch)
        rng = np.random.default_rng([self.seed, epoch])
        img = rng.permutation(self.pairs.images.shape[0])[k * self.batch_size:(k + 1) * self.batch_size]
        cap = np.asarray([self.caps_of[i][int(rng.integers(len(self.caps_of[i])))] for i in img], dtype=np.int64)
        return img, cap

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        img, cap = self.indices(index)
        mv, mt = self.memory.vectors(self.img_mod), self.memory.vectors(self.txt_mod)
        return {"v": torch.from_numpy(self.pairs.images[img]), "t": torch.from_numpy(self.pairs.texts[cap]),
                "v_ret": torch.from_numpy(mv[self.img_rows[img]]), "t_ret": torch.from_numpy(mt[self.txt_rows[cap]])}


def reco_loss(model: RecoModel, v: torch.Tensor, t: torch.Tensor, v_ret: torch.Tensor, t_ret: torch.Tensor
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """``L = NCE(V_bar, T_bar) + NCE(V_bar, T) + NCE(V, T_bar)`` (RECO Sec. 3.2)."""
    v_bar = model.fuse("image", v, v_ret)
    t_bar = model.fuse("text", t, t_ret)
    scale = model.logit_scale.exp()
    both, img_only, txt_only = info_nce(v_bar, t_bar, scale), info_nce(v_bar, t, scale), info_nce(v, t_bar, scale)
    return both + img_only + txt_only, {"nce_both": float(both.detach()),
                                        "nce_vbar_t": float(img_only.detach()),
                                        "nce_v_tbar": float(txt_only.detach())}


class RecoTraining(Method):
    """The RECO plug-in: trainable = phi_image, phi_text, logit scale; the encoder is not here at all."""

    name = "reco"

    def __init__(self, model: RecoModel, max_logit_scale: float = 100.0) -> None:
        if not model.trainable:
            raise ValueError("mean fusion has no parameters to train")
        self.model = model
        self.max_log_scale = float(np.log(max_logit_scale))

    def param_groups(self) -> list[dict]:
        decay = [p for n, p in self.model.named_parameters() if p.ndim >= 2 and "type_embedding" not in n]
        rest = [p for n, p in self.model.named_parameters() if not (p.ndim >= 2 and "type_embedding" not in n)]
        return [{"params": decay}, {"params": rest, "weight_decay": 0.0}]

    def loss(self, batch: dict[str, torch.Tensor], step: int):
        loss, logs = reco_loss(self.model, batch["v"], batch["t"], batch["v_ret"], batch["t_ret"])
        logs["temperature"] = float(1.0 / self.model.logit_scale.exp().item())
        return loss, logs

    def train_mode(self, training: bool) -> None:
        self.model.train(training)

    def after_step(self, step: int) -> None:
        with torch.no_grad():
            self.model.logit_scale.clamp_(0.0, self.max_log_scale)

    def state_dict(self) -> dict:
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])

    def export(self, out: Path) -> None:
        self.model.save(out)


def make_reco_model(memory: Memory, cfg: RecoTrainConfig, memory_ref: str | Path | None = None,
                    recipe: dict | None = None) -> RecoModel:
    spec = RecoSpec(space_id=memory.space_id, dim=memory.dim, k=cfg.k, search=cfg.search, fuse=cfg.fuse,
                    fusion=FusionConfig(dim=memory.dim, kind=cfg.fusion, heads=cfg.heads),
                    memory=str(memory_ref if memory_ref is not None else memory.path),
                    recipe={"train": cfg.to_dict(), **(recipe or {})})
    torch.manual_seed(cfg.loop.seed)
    return RecoModel(spec, temperature=cfg.temperature)


def train_reco(memory: Memory, out: str | Path, cfg: RecoTrainConfig | None = None, *,
               pairs: PairEmbeddings | None = None,
               evaluate: Callable[[RecoModel], dict[str, float]] | None = None, early_stop: str = "",
               memory_ref: str | Path | None = None, recipe: dict | None = None,
               neighbour_cache: dict | None = None, k_max: int | None = None,
               progress: bool = False) -> tuple[RecoModel, TrainResult | None]:
    """Train phi_image / phi_text on ``pairs`` (default: the memory's own pairs, each excluded from
    its own neighbours) and write the RECO directory ``out``. ``evaluate(model)`` (on a validation
    split) enables early stopping on its key ``early_stop``. Mean fusion is written untrained.
    ``neighbour_cache`` (a dict shared between runs on the same ``pairs``) keeps the training-time
    retrieval, computed for ``k_max`` neighbours, for the next run (e.g. a k sweep)."""
    cfg = cfg or RecoTrainConfig()
    if cfg.loop.threads:
        torch.set_num_threads(cfg.loop.threads)
    model = make_reco_model(memory, cfg, memory_ref, recipe)
    if not model.trainable:
        model.eval()
        model.save(out)
        return model, None
    pairs = pairs or PairEmbeddings.from_memory(memory)
    batches = RecoBatches(memory, pairs, model.spec, cfg.batch_size, cfg.loop.seed, neighbour_cache, k_max)
    loop = dataclasses.replace(cfg.loop, early_stop=early_stop if evaluate else "")
    method = RecoTraining(model)
    result = train(method, batches, loop, out, evaluate=(lambda: evaluate(model)) if evaluate else None,
                   progress=progress)
    model.eval()
    return model, result


def retrieval_evaluator(memory: Memory, images: np.ndarray, texts: np.ndarray, text_image: np.ndarray
                        ) -> Callable[[RecoModel], dict[str, float]]:
    """Validation metrics of a RECO model on held-out pairs: R@1 with refined queries against the
    original gallery (queries only, both directions) and their mean ``score``."""
    from ..metrics.retrieval import retrieval_metrics

    def evaluate(model: RecoModel) -> dict[str, float]:
        vb, tb = model.refine(memory, images, "image"), model.refine(memory, texts, "text")
        t2i = retrieval_metrics(images, tb, text_image, ks=(1,), directions=("t2i",))["t2i"]["R@1"]
        i2t = retrieval_metrics(vb, texts, text_image, ks=(1,), directions=("i2t",))["i2t"]["R@1"]
        return {"t2i_R@1": t2i, "i2t_R@1": i2t, "score": 0.5 * (t2i + i2t)}

    return evaluate


__all__ = ["PairEmbeddings", "RecoBatches", "RecoTrainConfig", "RecoTraining", "make_reco_model", "reco_loss",
           "retrieval_evaluator", "train_reco"]


def training_inputs(memory: Memory, model: str | Path | None, *, pairs: str | Path | None = None,
                    val: str | Path | None = None, progress: bool = False) -> tuple[PairEmbeddings | None, Callable | None]:
    """What ``reco train`` trains and stops on besides the memory's own pairs: ``pairs`` (a data
    folder / world root, train split) embedded by ``model`` (the memory's encoder), each image's
    own memory row excluded from its neighbours; ``val`` (val split) as an early-stopping evaluator
    on mean R@1 of refined queries. (None, None) when neither is given."""
    if pairs is None and val is None:
        return None, None
    if model is None:
        raise ValueError("--val and --pairs need --model (the memory's encoder) to embed them")
    from ..encoders import load_encoder
    from ..evaluate import embed_dataset, load_eval_data

    enc = load_encoder(model)
    if enc.space_id != memory.space_id:
        raise ValueError(f"{model} is in space {enc.space_id}, the memory in {memory.space_id}")
    pair_emb = evaluate = None
    if pairs is not None:
        pds = load_eval_data(pairs, "train", langs=memory.info.get("langs"))
        pe = embed_dataset(enc, pds, progress=progress)
        pair_emb = PairEmbeddings(pe.images, pe.texts, pds.caption_image, memory.image_rows_by_hash(pds.image_paths()))
    if val is not None:
        vds = load_eval_data(val, "val")
        ve = embed_dataset(enc, vds)
        evaluate = retrieval_evaluator(memory, ve.images, ve.texts, vds.caption_image)
    return pair_emb, evaluate
