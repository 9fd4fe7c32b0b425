"""The plug-in base of the compatibility-learning family: a small embedding model per step and a
:class:`CompatMethod` (a :class:`nobackfill.train.loop.Method`) whose hooks the step runner
(:mod:`.sequence`) calls around the one training loop.

Per step ``t`` the runner calls ``on_step_start(ctx)`` (build the step's model, fresh or fine-tuned
from ``phi_{t-1}``, and compute what the loss needs from the frozen previous models), then
``train.loop.train(method, batches, ...)`` (``loss(batch)`` per optimiser step), then
``on_step_end(ctx)`` which returns the frozen :class:`StepModel` of the step.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..._safetensors import save_tensors
from ...train.loop import Method


@dataclass
class ModelConfig:
    """The per-step embedding model: an MLP over frozen backbone features, or a small CNN trained
    from pixels when the inputs are images (``DataConfig.backbone = "image32"``)."""

    hidden: int = 256
    #: CNN body (image inputs): output channels of its 3x3 conv + BatchNorm + ReLU + 2x2 max-pool
    #: blocks, then global average pooling and the MLP head (``hidden``) to the feature
    conv_widths: tuple[int, ...] = (16, 32, 64)
    dim: int = 63  # = K - 1 for a d-Simplex with K = 64 pre-allocated classes (CoReS)
    n_classes: int = 64  # classifier rows allocated (>= classes ever seen)
    #: learned heads: ``s cos(f, w)`` (a normalised-softmax classifier, as in metric learning) when
    #: > 0, plain ``f . w`` when 0. The fixed d-Simplex always uses ``f . w`` (the CoReS slide).
    cosine_scale: float = 16.0


def conv_body(in_channels: int, widths: tuple[int, ...], hidden: int, out_dim: int) -> nn.Sequential:
    """A small CNN from pixels (the tutorial trains a fresh ResNet per step; this is its CPU-sized
    stand-in): ``conv3x3-BN-ReLU-maxpool2`` per width, global average pooling, ``Linear-ReLU-Linear``."""
    layers: list[nn.Module] = []
    c = in_channels
    for w in widths:
        layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
        c = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, hidden), nn.ReLU(),
                         nn.Linear(hidden, out_dim))


class StepModel(nn.Module):
    """``phi_t``: body (MLP over features, or :func:`conv_body` over images) -> optional basis
    transformation -> feature; a classifier head (learned, or a fixed buffer for the d-Simplex);
    optionally a mapping to the previous step's space (LCE). ``in_dim``: the input width, or the
    ``(channels, height, width)`` of image inputs."""

    #: inputs embedded per forward pass when no gradient is needed (bounds a CNN's activation memory)
    inference_chunk = 1024

    def __init__(self, in_dim: int | tuple[int, ...], cfg: ModelConfig, out_dim: int | None = None,
                 fixed_head: torch.Tensor | None = None) -> None:
        super().__init__()
        out_dim = out_dim or cfg.dim
        if isinstance(in_dim, (tuple, list)) and len(in_dim) == 3:
            self.body = conv_body(int(in_dim[0]), tuple(cfg.conv_widths), cfg.hidden, out_dim)
        else:
            width = int(in_dim[0]) if isinstance(in_dim, (tuple, list)) else int(in_dim)
            self.body = nn.Sequential(nn.Linear(width, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, out_dim))
        self.transform: nn.Module = nn.Identity()
        self.to_previous: nn.Module | None = None
        if fixed_head is not None:
            self.register_buffer("fixed_head", fixed_head.clone())
            self.head = None
        else:
            self.fixed_head = None
            self.head = nn.Linear(out_dim, cfg.n_classes, bias=False)
        self.n_seen = 0  # classes this model was trained on (set by the runner)
        self.cosine_scale = 0.0 if fixed_head is not None else float(cfg.cosine_scale)
        #: 0/1 per input column: the frozen backbone parts this model sees (None: all of them)
        self.register_buffer("input_mask", None)

    def set_input_mask(self, mask: torch.Tensor | None) -> None:
        """See only the input columns where ``mask`` is 1 (the step's backbone; ``None``: all)."""
        self.input_mask = None if mask is None else mask.detach().clone().float()

    @property
    def out_dim(self) -> int:
        return int(self.body[-1].out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and len(x) > self.inference_chunk:
            return torch.cat([self(x[i:i + self.inference_chunk]) for i in range(0, len(x), self.inference_chunk)])
        if self.input_mask is not None:
            x = x * self.input_mask
        return self.transform(self.body(x))

    def weight(self) -> torch.Tensor:
        return self.fixed_head if self.head is None else self.head.weight

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        return classifier_logits(feats, self.weight(), self.cosine_scale)

    def seen_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the ``n_seen`` classes this model was trained on, for inputs ``x``."""
        return self.logits(self(x))[:, : self.n_seen]


def classifier_logits(feats: torch.Tensor, weight: torch.Tensor, cosine_scale: float = 0.0) -> torch.Tensor:
    """``f . w`` per class, or ``s cos(f, w)`` with ``cosine_scale`` s > 0."""
    if cosine_scale > 0:
        return cosine_scale * F.normalize(feats, dim=1) @ F.normalize(weight, dim=1).t()
    return feats @ weight.t()


def simplex_vertices(n_classes: int) -> torch.Tensor:
    """The d-Simplex fixed classifier (CoReS slide): ``W = [e_1, ..., e_{K-1}, (1 - sqrt K)/(K - 1) sum e_i]``
    in ``R^{K-1}`` (a regular simplex), then centred on its centroid and scaled to unit rows as the
    authors' Regular-Polytope code does, so every pair of rows has cosine ``-1/(K-1)``. ``(K, K-1)``."""
    k = int(n_classes)
    if k < 2:
        raise ValueError(f"a d-Simplex needs at least 2 classes, got {k}")
    w = torch.zeros(k, k - 1, dtype=torch.float64)
    w[: k - 1] = torch.eye(k - 1, dtype=torch.float64)
    w[k - 1] = (1 - k ** 0.5) / (k - 1)
    w = w - w.mean(0, keepdim=True)
    return (w / w.norm(dim=1, keepdim=True)).float()


@dataclass
class StepContext:
    """What a method may see at step ``t`` (0-based)."""

    t: int
    n_seen: int  # K_t
    n_prev: int  # K_{t-1} (0 at the first step)
    previous: list[StepModel]  # frozen models of steps 0..t-1
    train_x: torch.Tensor  # this step's training items (cumulative or new + memory)
    train_y: torch.Tensor
    in_dim: int | tuple[int, ...]  # input width, or (channels, height, width) of images
    seed: int = 0
    extra: dict = field(default_factory=dict)  # runner services (e.g. "train_reference")
    input_mask: torch.Tensor | None = None  # the step's backbone columns (``ClassData.input_mask``)

    @property
    def old(self) -> StepModel | None:
        return self.previous[-1] if self.previous else None


@dataclass
class MethodConfig:
    """Options shared by every method (subclasses add theirs with the paper's defaults)."""

    regime: str = ""  # "" = the method's default ("cumulative" | "continual")
    init_from_previous: bool | None = None  # None = the method's default
    lr_scale: float = 1.0  # multiplies the loop's learning rate for this method's parameters
    #: number options that must be > 0 (every other number must be >= 0), and those at most 1
    positive: ClassVar[tuple[str, ...]] = ("lr_scale",)
    at_most_one: ClassVar[tuple[str, ...]] = ()


def checked_options(name: str, config: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of method ``name`` checked against its ``config`` dataclass: known fields, their
    types (an int is a fine float) and ranges (finite, >= 0, or as ``config.positive`` /
    ``at_most_one`` say); a ValueError names the first bad option."""
    from ...config import coerce

    names = {f.name for f in fields(config)}
    bad = sorted(set(options) - names)
    if bad:
        raise ValueError(f"{name}: unknown option(s) {bad}; known: {sorted(names)}")
    hints = get_type_hints(config)
    out = {}
    for key, value in options.items():
        where = f"{name}: option {key}"
        out[key] = v = coerce(hints[key], value, where)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            low = "> 0" if key in config.positive else ">= 0"
            if not math.isfinite(v) or v < 0 or (v == 0 and low == "> 0") or (v > 1 and key in config.at_most_one):
                want = f"{low} and <= 1" if key in config.at_most_one else low
                raise ValueError(f"{where}: must be a finite number {want}, got {value!r}")
    return out


def frozen(model: StepModel) -> StepModel:
    model = copy.deepcopy(model).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def masked_logits(logits: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` class logits (a learned classifier only competes among seen classes)."""
    return logits[:, :n]


def class_means(feats: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Mean feature per class ``0..n_classes-1`` (zeros for a class without items)."""
    out = torch.zeros(n_classes, feats.shape[1])
    out.index_add_(0, labels, feats)
    counts = torch.bincount(labels, minlength=n_classes).clamp(min=1).unsqueeze(1)
    return out / counts


def kl_to_target(student_logits: torch.Tensor, target_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """Per-sample ``tau^2 KL(softmax(target/tau) || softmax(student/tau))`` (Hinton scaling)."""
    p = F.softmax(target_logits / tau, dim=1)
    return tau * tau * (p * (F.log_softmax(target_logits / tau, dim=1)
                             - F.log_softmax(student_logits / tau, dim=1))).sum(1)


class CompatMethod(Method):
    """Base plug-in. Subclasses set :attr:`name`, their ``Config`` dataclass, class attributes
    (``regime``, ``init_from_previous``, ``fixed_simplex``) and override :meth:`extra_loss`,
    :meth:`prepare` and, to change what is indexed, :meth:`retrieval_features` /
    :meth:`query_features`."""

    name = "compat-base"
    Config: type = MethodConfig
    regime = "cumulative"
    init_from_previous = False
    fixed_simplex = False
    #: the method is about negative flips (its NFR is tabulated against the baseline)
    reduces_flips = False
    #: the registered name of a method whose training this one repeats exactly (same loss, data,
    #: initialisation and seeds), so a benchmark may reuse its models; "" = none
    trains_like = ""
    #: extra_loss needs a previous model (False: it also runs at the first step, e.g. ELODI)
    needs_old = True

    def __init__(self, model: ModelConfig | None = None, **options: Any) -> None:
        self.cfg = self.Config(**checked_options(self.name, self.Config, options))
        self.model_cfg = model or ModelConfig()
        if self.cfg.regime:
            if self.cfg.regime not in ("cumulative", "continual"):
                raise ValueError(f"regime must be 'cumulative' or 'continual', got {self.cfg.regime!r}")
            self.regime = self.cfg.regime
        if self.cfg.init_from_previous is not None:
            self.init_from_previous = bool(self.cfg.init_from_previous)
        self.model: StepModel | None = None
        self.aux = nn.ModuleDict()  # trainable modules that are not part of the exported model
        self.ctx: StepContext | None = None

    # ------------------------------------------------------------------ step hooks
    def new_model(self, ctx: StepContext) -> StepModel:
        """Fresh ``phi_t``, or a trainable copy of ``phi_{t-1}`` (fine-tuning)."""
        if self.init_from_previous and ctx.old is not None:
            model = copy.deepcopy(ctx.old)
            for p in model.parameters():
                p.requires_grad_(True)
            return model.train()
        torch.manual_seed(ctx.seed * 1000 + ctx.t)
        head = simplex_vertices(self.model_cfg.dim + 1) if self.fixed_simplex else None
        if head is not None and len(head) < ctx.n_seen:
            raise ValueError(f"{self.name}: {ctx.n_seen} classes exceed the d-Simplex's {len(head)} pre-allocated")
        return StepModel(ctx.in_dim, self.model_cfg, fixed_head=head)

    def on_step_start(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.aux = nn.ModuleDict()
        self.model = self.new_model(ctx)
        self.model.set_input_mask(ctx.input_mask)
        self.model.n_seen = ctx.n_seen
        if ctx.old is not None or not self.needs_old:
            self.prepare(ctx)

    def prepare(self, ctx: StepContext) -> None:
        """Compute what the loss needs (from the frozen previous models, or reference models);
        called when ``t > 0``, or at every step when ``needs_old`` is False."""

    def on_step_end(self, ctx: StepContext) -> StepModel:
        return frozen(self.model)

    # ------------------------------------------------------------------ loop plug-in
    def param_groups(self) -> list[dict]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        params += [p for p in self.aux.parameters() if p.requires_grad]
        return [{"params": params, "lr_scale": self.cfg.lr_scale}]

    def classification_loss(self, feats: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over the seen classes (learned head) or over all K pre-allocated vertices
        (d-Simplex: the L_SCE of the CoReS slide, whose denominator includes future classes)."""
        logits = self.model.logits(feats)
        return F.cross_entropy(logits if self.fixed_simplex else masked_logits(logits, self.ctx.n_seen), y)

    def extra_loss(self, batch: dict, feats: torch.Tensor, step: int) -> tuple[torch.Tensor, dict]:
        """The method's own terms (0 by default)."""
        return feats.new_zeros(()), {}

    def loss(self, batch: dict, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        feats = self.model(batch["x"])
        ce = self.classification_loss(feats, batch["y"])
        extra, logs = (self.extra_loss(batch, feats, step) if self.ctx.old is not None or not self.needs_old
                       else (feats.new_zeros(()), {}))
        return ce + extra, {"ce": float(ce.detach()), **logs}

    def train_mode(self, training: bool) -> None:
        if self.model is not None:
            self.model.train(training)
        self.aux.train(training)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "aux": self.aux.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.aux.load_state_dict(state["aux"])

    def export(self, out: Path) -> None:
        save_step_model(self.model, Path(out), {"method": self.name, "config": asdict(self.cfg)})

    # ------------------------------------------------------------------ evaluation
    def retrieval_features(self, model: StepModel, x: torch.Tensor) -> torch.Tensor:
        """What the gallery indexes (the embedding by default)."""
        return model(x)

    def query_features(self, models: list[StepModel], t: int, k: int, x: torch.Tensor) -> torch.Tensor:
        """Model ``t``'s query features to compare with gallery model ``k <= t``."""
        return self.retrieval_features(models[t], x)

    def predict(self, model: StepModel, x: torch.Tensor) -> torch.Tensor:
        """Class prediction among the model's seen classes."""
        return model.seen_logits(x).argmax(1)


def save_step_model(model: StepModel, out: Path, meta: dict) -> None:
    """``out/step_model.safetensors`` (the state) and ``out/step_model.json`` (method, config, shapes)."""
    out.mkdir(parents=True, exist_ok=True)
    save_tensors({k: v.detach().contiguous() for k, v in model.state_dict().items()}, out / "step_model.safetensors")
    (out / "step_model.json").write_text(json.dumps({**meta, "n_seen": model.n_seen, "out_dim": model.out_dim},
                                                    indent=2, default=str))


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy().astype(np.float32)
