"""Text-to-text contrastive training on caption pairs: two different captions of the same image are
a positive pair, the other rows of the batch are negatives (symmetric InfoNCE, :func:`info_nce`).

One :class:`TextPairContrastive` plug-in for the one training loop serves two uses:

* training a small text encoder from scratch (every weight trainable, learnable temperature) -
  the Multi30K "old" model of ``nobackfill bench xbt-text`` (:func:`train_text_model`);
* the XBT recipe applied to text (Eq. 5 with a caption in place of the image): a head ``phi`` on
  top of the encoder, ``L_c(phi(w(cap_a)), phi(w(cap_b)))``, trainable parameters chosen by the
  caller through ``requires_grad`` (LoRA + LayerNorms + phi), fixed temperature.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..encoders.minilm import MiniLMTextEncoder
from .contrastive import info_nce
from .checkpoint import data_settings
from .loop import LoopConfig, Method, TrainResult, train, write_recipe

#: CLIP's initial logit scale, log(1 / 0.07) = 2.6592 (the XBT paper's fixed temperature value)
CLIP_LOG_SCALE = math.log(1 / 0.07)


class CaptionPairBatches:
    """Deterministic batches of caption pairs: ``batch(i) = (captions_a, captions_b)``, the two
    lists row-aligned, every row a distinct image and ``a != b`` two different caption slots of it.

    ``captions[k][i]`` is caption slot ``k`` of image ``i`` (at least two slots). Images are
    reshuffled every epoch (seeded by ``(seed, epoch)``); the batch size is capped at the number of
    images."""

    def __init__(self, captions: Sequence[Sequence[str]], batch_size: int, seed: int = 0) -> None:
        if len(captions) < 2:
            raise ValueError(f"caption pairs need at least 2 captions per image, got {len(captions)}")
        n = len(captions[0])
        if any(len(c) != n for c in captions):
            raise ValueError("every caption slot must hold one caption per image")
        if n < 2:
            raise ValueError(f"caption pairs need at least 2 images, got {n}")
        self.captions = [list(c) for c in captions]
        self.n_images, self.batch_size, self.seed = n, min(int(batch_size), n), int(seed)
        self.per_epoch = n // self.batch_size

    def batch(self, index: int) -> tuple[list[str], list[str]]:
        epoch, k = divmod(int(index), self.per_epoch)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.n_images)
        idx = order[k * self.batch_size:(k + 1) * self.batch_size]
        slots = len(self.captions)
        first = rng.integers(0, slots, size=self.n_images)
        second = (first + rng.integers(1, slots, size=self.n_images)) % slots  # always != first
        a = [self.captions[first[i]][i] for i in idx]
        b = [self.captions[second[i]][i] for i in idx]
        return a, b


class TextPairContrastive(Method):
    """Symmetric InfoNCE between ``head(w(cap_a))`` and ``head(w(cap_b))`` (both L2-normalised).

    ``w`` is the encoder's mean-pooled text feature. Trainable: every encoder / head parameter
    with ``requires_grad`` (set them before building the method), plus the logit scale when
    ``learn_temperature``. The temperature starts at ``exp(-log_scale)`` and the learnable scale is
    clamped to ``[0, log(max_logit_scale)]``."""

    name = "text-pairs"

    def __init__(self, encoder: MiniLMTextEncoder, head: nn.Module | None = None, *,
                 learn_temperature: bool = True, log_scale: float = CLIP_LOG_SCALE,
                 max_logit_scale: float = 100.0) -> None:
        self.encoder = encoder
        self.head = head
        self.learn_temperature = bool(learn_temperature)
        self.log_scale = nn.Parameter(torch.tensor(float(log_scale)), requires_grad=self.learn_temperature)
        self.max_log_scale = float(np.log(max_logit_scale))

    # ----------------------------------------------------------------- model pieces
    def _modules(self) -> dict[str, nn.Module]:
        mods = {"encoder": self.encoder.model}
        if self.head is not None:
            mods["head"] = self.head
        return mods

    def _trainable(self) -> dict[str, nn.Parameter]:
        out = {f"{m}.{n}": p for m, mod in self._modules().items() for n, p in mod.named_parameters()
               if p.requires_grad}
        if self.learn_temperature:
            out["log_scale"] = self.log_scale
        return out

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Differentiable, L2-normalised ``head(w(texts))`` (``w`` is L2-normalised first, as
        ``encode_texts`` gives it: the head sees what it would see at inference)."""
        w = F.normalize(self.encoder.text_features(**self.encoder.tokenize(texts)), dim=-1)
        if self.head is not None:
            w = F.normalize(self.head(w), dim=-1)
        return w

    # ----------------------------------------------------------------- Method hooks
    def param_groups(self) -> list[dict]:
        decay, no_decay = [], []
        for n, p in self._trainable().items():
            (no_decay if p.ndim < 2 or "embeddings" in n or "norm" in n.lower() else decay).append(p)
        if not decay and not no_decay:
            raise ValueError("nothing to train: no parameter requires grad")
        groups = [{"params": decay}] if decay else []
        return groups + ([{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])

    def loss(self, batch: tuple[Sequence[str], Sequence[str]], step: int):
        a, b = batch
        scale = self.log_scale.exp()
        loss = info_nce(self.embed(a), self.embed(b), scale)
        return loss, {"temperature": float(1.0 / scale.item())}

    def train_mode(self, training: bool) -> None:
        for mod in self._modules().values():
            mod.train(training)
        self.encoder.invalidate_space_id()

    def after_step(self, step: int) -> None:
        if self.learn_temperature:
            with torch.no_grad():
                self.log_scale.clamp_(0.0, self.max_log_scale)

    def state_dict(self) -> dict:
        return {n: p.detach().clone() for n, p in self._trainable().items()}

    def load_state_dict(self, state: dict) -> None:
        params = self._trainable()
        missing = sorted(set(params) - set(state))
        if missing:
            raise KeyError(f"{self.name}: state lacks {missing[:5]}")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(state[n])
        self.encoder.invalidate_space_id()

    def export(self, out: Path) -> None:
        if self.head is not None:
            raise NotImplementedError("a text-pair run with a head is evaluated in place "
                                      "(train(..., export=False)); it has no model directory to export")
        self.encoder.invalidate_space_id()
        self.encoder.save(out)


# --------------------------------------------------------------------------- a text model from scratch
@dataclass
class TextModelSpec:
    """A tiny BERT (``transformers.BertModel``) with our own byte-level BPE vocabulary; mean pooling +
    L2 through :class:`MiniLMTextEncoder`."""

    vocab_size: int = 4096
    hidden: int = 32
    layers: int = 1
    heads: int = 2
    intermediate: int = 128
    max_length: int = 32
    dropout: float = 0.1


@dataclass
class TextTrainSpec:
    """Optimisation of :func:`train_text_model` (``steps`` is a budget: early stopping on val R@1)."""

    steps: int = 4000
    batch_size: int = 128
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.05
    eval_every: int = 200
    patience: int = 3
    seed: int = 0
    threads: int = 1


@dataclass
class TextTrainRecipe:
    """What ``nobackfill train-text`` reads from ``--config`` / ``--set``: ``model.*`` and ``train.*``."""

    model: TextModelSpec = field(default_factory=TextModelSpec)
    train: TextTrainSpec = field(default_factory=TextTrainSpec)


def tiny_bert_encoder(tokenizer, spec: TextModelSpec, seed: int = 0, name: str = "text") -> MiniLMTextEncoder:
    """A freshly initialised tiny ``BertModel`` behind :class:`MiniLMTextEncoder`."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                     num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
                     max_position_embeddings=spec.max_length, type_vocab_size=1,
                     hidden_dropout_prob=spec.dropout, attention_probs_dropout_prob=spec.dropout,
                     pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = BertModel(cfg)  # the pooler is unused (mean pooling) but kept: AutoModel re-creates it on load
    return MiniLMTextEncoder(model, tokenizer, {"name": name}, max_length=spec.max_length)


def caption_retrieval(query: np.ndarray, gallery: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Row ``i`` of ``query`` retrieves among all rows of ``gallery``; row ``i`` is its match.
    ``{"R@1":.., "R@5":.., "R@10":.., "median_rank":.., "mAP":.., "n_queries":..}``."""
    from ..metrics.retrieval import retrieval_metrics

    return retrieval_metrics(gallery, query, np.arange(len(query)), ks=ks, directions=("t2i",))["t2i"]


def train_text_model(captions: Sequence[Sequence[str]], val_query: Sequence[str], val_gallery: Sequence[str],
                     out: str | Path, *, model: TextModelSpec | None = None, train_spec: TextTrainSpec | None = None,
                     progress: bool = True, command: str | None = None, data: str | None = None) -> TrainResult:
    """Train a tiny text encoder on caption pairs until val R@1 (``val_query[i]`` -> ``val_gallery[i]``)
    stops improving; export the best state to ``out`` with ``recipe.json`` (the command, specs,
    the val curve). Resumes from ``out/checkpoint.safetensors``."""
    from ..encoders.tokenizer import train_bpe_tokenizer

    model = model or TextModelSpec()
    ts = train_spec or TextTrainSpec()
    out = Path(out)
    corpus = [c for col in captions for c in col]
    tokenizer = train_bpe_tokenizer(corpus, model.vocab_size, model.max_length)
    encoder = tiny_bert_encoder(tokenizer, model, seed=ts.seed, name=out.name)
    method = TextPairContrastive(encoder)
    method.run_settings = data_settings(data, [list(col) for col in captions], list(val_query), list(val_gallery))
    batches = CaptionPairBatches(captions, ts.batch_size, seed=ts.seed)

    def evaluate() -> dict[str, float]:
        m = caption_retrieval(encoder.encode_texts(val_query), encoder.encode_texts(val_gallery))
        return {k: m[k] for k in ("R@1", "R@5", "R@10")}

    cfg = LoopConfig(steps=ts.steps, lr=ts.lr, warmup=ts.warmup, weight_decay=ts.weight_decay, seed=ts.seed,
                     threads=ts.threads, eval_every=ts.eval_every, checkpoint_every=ts.eval_every,
                     log_every=max(1, min(50, ts.eval_every)), early_stop="R@1", patience=ts.patience)
    result = train(method, batches, cfg, out, evaluate=evaluate, progress=progress)
    curve = [{"step": r["step"], "seconds": r["seconds"], "loss": round(r["loss"], 4),
              **{k[5:]: r[k] for k in r if k.startswith("eval/")}} for r in result.history if "eval/R@1" in r]
    recipe = {"kind": "m30k-old-text", "model": asdict(model), "train": asdict(ts), "loop": asdict(cfg),
              "data": data, "n_train_images": len(captions[0]), "n_val": len(val_query),
              "seconds": round(result.seconds, 1), "steps_run": result.steps, "best_step": result.best_step,
              "best_val_R@1": result.best_value, "stopped_early": result.stopped_early, "val_curve": curve,
              "command": command or " ".join(["nobackfill"] + sys.argv[1:])}
    write_recipe(out, recipe)
    return result


__all__ = ["CaptionPairBatches", "TextPairContrastive", "TextModelSpec", "TextTrainSpec", "tiny_bert_encoder",
           "train_text_model", "caption_retrieval", "CLIP_LOG_SCALE"]
