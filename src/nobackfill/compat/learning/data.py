"""Class-incremental data for the compatibility-learning family (Biondi et al.'s tutorial's setting on our world).

* **Items.** Scenes of the world (``nobackfill.data.world.make_item``) with a single object, so the
  class label (``"<colour> <shape>"``, 64 classes) is the only object in the picture. Items are
  rendered by index from the world's ``train`` / ``val`` / ``test`` streams (indices may go past the
  split files' sizes; every item is a pure function of ``(seed, split, index)``).
* **Frozen features.** Each image is embedded once by frozen backbones whose features are
  concatenated (``backbone="randconv+models/world-new"``, the default): a shipped world CLIP model's
  image embedding, :func:`random_conv_features` (a seeded random CNN), or ``"pixels"`` (8x8
  average-pooled pixels; no model, used by the tests). ``"image<R>"`` (e.g. ``image32``) is no
  frozen feature: the images themselves, area-down-sampled to ``R x R`` and standardised per
  channel, for a small CNN trained from pixels at every step (:func:`.base.conv_body`; it must be
  the only part). An MLP probe on val (64 classes; random conv
  at full 64x64 resolution there, 2x down-sampled here for speed) gave world-new alone 43% top-1
  classification, random conv 51%, both 59% - the concatenation leaves
  the most for the embedding models to learn. Features are standardised with the training
  statistics; pixels and features are cached under ``cache_dir``.
* **Classes.** A seeded permutation of the 64 world classes: the first ``n_train_classes`` are the
  training pool, in order of arrival; the rest never appear in training.
* **Retrieval protocol (open set).** Gallery and query are held-out images (the eval split) of the
  classes outside the pool - classes no model is ever trained on, as in the tutorial's CIFAR-100 ->
  CIFAR-10 protocol - matched by class and split per class into alternate gallery / query items
  (``eval_classes="unseen"``, the default). ``eval_classes="all"`` uses every world class instead;
  there an old model's gallery cannot separate classes it never learned, so new-class queries fail
  for every method (measured on val before the junk rule below, with 12,000 eval renders, T = 2,
  12 epochs: BCT cross-test 0.30 vs old self-test 0.40 on all classes, 0.70 vs 0.72 on the unseen
  classes); the benchmark then also reports the unseen-class matrix (``open_set``).
* **Renderings and the junk rule.** Each eval item also carries its *rendering group*: the main
  object's size, texture and background (:func:`rendering_groups`). The world renders each class in
  only 2 x 4 x 4 = 32 such conditions, so a dense gallery holds near-duplicates of every query (the
  same class in the same condition, shifted): on val (T = 2, 120,000 rendered eval items) 95 % of the
  old model's top-1 self-test matches share the query's rendering group, against 3 % by chance, and
  the self-test measures re-finding a near-duplicate rather than matching the class. The search
  metric therefore treats a gallery item of the query's class *and* rendering group as junk (not a
  candidate), as the Market-1501 re-identification protocol drops gallery images of the query's
  identity taken by the query's camera (:func:`nobackfill.metrics.class_search.top1_hits`);
  ``search-with-duplicates`` keeps them.
* **Steps** (``SequenceConfig.first_fraction``). By default the training classes are split into T
  equal tasks, as in the tutorial's CIFAR100/10 table (100 classes over 2 / 5 / 20 / 50 steps, so
  its 50-step column adds 2 classes per step). With ``first_fraction`` > 0, step 1 instead sees that
  share of the classes and the rest are split evenly over steps 2..T (the d-Simplex-HOC table's
  "init 10 classes" protocol is ``first_fraction = 0.1``). Val, quick schedule, equal split, before
  the junk rule: AC of BCT / CoReS / d-Simplex-HOC 0.10 / 0 / 0 at T = 5 and 0 / 0 / 0.07 at T = 10.
  ``cumulative``: step t trains on every image of the classes seen so far
  (``T_t = T_k U Delta T``); ``continual``: only the new classes' images plus a small replay memory.
* **Backbone upgrades** (``step_backbones``, off by default). The tutorial's replacement slides
  upgrade the backbone with the classes (ResNet18 on 100 classes -> SENet18 on 300 -> RegNetY on
  600); here step t's model sees only its listed parts of ``backbone`` (the other columns are
  zeroed by the model's input mask), e.g. ``backbone="randconv+models/world-old+models/world-new"``,
  ``step_backbones="randconv+models/world-old,randconv+models/world-new"``. It makes the old model
  genuinely weaker (val, T = 2, 12 epochs: independent models C[1,1] 0.669 -> C[2,2] 0.775 instead
  of 0.722 -> 0.742), but no cross-test follows the new model up: C[2,1] BCT 0.609, CoReS 0.562,
  d-Simplex-HOC 0.580, all below C[1,1] (``scripts/compat_steps_diagnose.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from ..._atomic import write_atomically

from ...data.scene import BACKGROUNDS, COLOURS, SHAPES, SIZES, TEXTURES
from ...encoders.zoo import shipped
from ...progress import progress_bar

N_WORLD_CLASSES = len(SHAPES) * len(COLOURS)


@dataclass
class DataConfig:
    """Where the images come from and how classes are split (see the module docstring)."""

    #: "+"-joined frozen feature extractors: world CLIP model directories, "randconv", "pixels"
    backbone: str = "randconv+models/world-new"
    world_seed: int = 0
    n_render_train: int = 24000  # rendered train-stream items (about 1/3 are single-object)
    #: rendered eval-split items (about 1/3 single-object; 120,000 gives about 5,000 query and 5,000 gallery
    #: items of the 16 open-set classes, a standard error near 0.007 per C entry)
    n_render_eval: int = 120000
    eval_split: str = "test"  # "val" for tuning, "test" for the report
    n_train_classes: int = 48  # training pool; the other 64 - 48 classes are never trained on
    eval_classes: str = "unseen"  # retrieval on the classes outside the pool, or on "all" world classes
    class_seed: int = 0
    #: which classes form the open set: "classes" (a seeded random ``64 - n_train_classes`` colour x
    #: shape combinations, whose colour and shape are both seen in training) or "shapes" (every colour
    #: of ``(64 - n_train_classes) / 8`` seeded shapes no model ever sees, like the tutorial's
    #: CIFAR-100 -> CIFAR-10 object categories)
    open_set: str = "classes"
    cache_dir: str = "runs/compat_steps/cache"
    #: backbone upgrades: ","-separated, per step, the "+"-joined parts of ``backbone`` that step's
    #: model sees (the others are zeroed); later steps repeat the last entry. "" = all parts always
    step_backbones: str = ""

    def __post_init__(self) -> None:
        for name in ("n_render_train", "n_render_eval"):  # (trial AL: 0 ended in numpy's "need at least one array")
            if getattr(self, name) < 1:
                raise ValueError(f"{name} (rendered items) must be >= 1, got {getattr(self, name)}")
        if self.world_seed < 0 or self.class_seed < 0:
            raise ValueError(f"world_seed and class_seed must be >= 0, got {self.world_seed} and {self.class_seed}")
        if not 2 <= self.n_train_classes < N_WORLD_CLASSES:
            raise ValueError(f"n_train_classes must be in [2, {N_WORLD_CLASSES - 1}], got {self.n_train_classes}")
        if self.eval_classes not in ("all", "unseen"):
            raise ValueError(f"eval_classes must be 'all' or 'unseen', got {self.eval_classes!r}")
        if self.open_set not in ("classes", "shapes"):
            raise ValueError(f"open_set must be 'classes' or 'shapes', got {self.open_set!r}")
        if self.open_set == "shapes" and (N_WORLD_CLASSES - self.n_train_classes) % len(COLOURS):
            raise ValueError(f"open_set='shapes' holds out whole shapes ({len(COLOURS)} classes each): "
                             f"64 - n_train_classes = {N_WORLD_CLASSES - self.n_train_classes} is not a multiple")
        if self.eval_split not in ("val", "test"):
            raise ValueError(f"eval_split must be 'val' or 'test', got {self.eval_split!r}")
        parts = self.backbone.split("+")
        images = [p for p in parts if p.startswith("image")]
        for p in images:
            res = p[len("image"):]
            if not res.isdigit() or int(res) < 4 or 64 % int(res):
                raise ValueError(f"backbone part {p!r}: expected image<R> with R a divisor of 64 (e.g. image32)")
        if images and len(parts) > 1:
            raise ValueError(f"backbone {self.backbone!r}: an image part ({images[0]}) cannot be joined with others")
        for step in filter(None, self.step_backbones.split(",")):
            bad = [p for p in step.split("+") if p not in parts]
            if bad:
                raise ValueError(f"step_backbones: {bad} not among the backbone parts {parts}")


@dataclass
class ClassData:
    """Standardised features (float32) and labels (arrival order; open-set classes follow the pool)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray  # closed-set held-out images of the training pool (classification, NFR)
    test_y: np.ndarray
    gallery_x: np.ndarray  # retrieval gallery (held-out images; see DataConfig.eval_classes)
    gallery_y: np.ndarray
    query_x: np.ndarray
    query_y: np.ndarray
    n_train_classes: int
    class_order: list[int]  # world class ids in arrival order (pool first, open set after)
    part_dims: list[tuple[str, int]] | None = None  # (backbone part, columns) in input order
    step_backbones: list[list[str]] | None = None  # parts seen per step (last repeated); None: all
    #: rows of the eval split's cached single-object items behind gallery_x / query_x (diagnostics)
    gallery_index: np.ndarray | None = None
    query_index: np.ndarray | None = None
    #: rendering group (size, texture, background) of each gallery / query item (the junk rule)
    gallery_groups: np.ndarray | None = None
    query_groups: np.ndarray | None = None

    @property
    def in_dim(self) -> int | tuple[int, ...]:
        """Input width of feature vectors, or ``(channels, height, width)`` of image inputs."""
        return int(self.train_x.shape[1]) if self.train_x.ndim == 2 else tuple(int(d) for d in self.train_x.shape[1:])

    def input_mask(self, t: int) -> torch.Tensor | None:
        """0/1 per input column: the backbone parts step ``t`` (0-based) sees; None when it sees all."""
        if not self.step_backbones or not self.part_dims:
            return None
        seen = set(self.step_backbones[min(t, len(self.step_backbones) - 1)])
        mask = torch.cat([torch.full((d,), float(name in seen)) for name, d in self.part_dims])
        return None if bool(mask.all()) else mask


def class_schedule(n_classes: int, steps: int, first_fraction: float = 0.0) -> list[int]:
    """Cumulative class counts ``K_1 < ... < K_T = n_classes``: ``T`` equal tasks (``first_fraction``
    0, the tutorial's split), or step 1 gets ``first_fraction`` of the classes and steps 2..T share
    the rest evenly."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 <= first_fraction < 1:
        raise ValueError(f"first_fraction must be in [0, 1) (0: {steps} equal tasks), got {first_fraction}")
    if first_fraction == 0:
        if n_classes < steps:
            raise ValueError(f"{n_classes} classes cannot be split into {steps} tasks")
        return [int(v) for v in np.cumsum([len(a) for a in np.array_split(np.arange(n_classes), steps)])]
    first = n_classes if steps == 1 else max(1, int(round(first_fraction * n_classes)))
    rest = n_classes - first
    if steps > 1 and rest < steps - 1:
        raise ValueError(f"{n_classes} classes cannot give {steps - 1} later steps at least one new class each")
    sizes = [first] + [len(a) for a in np.array_split(np.arange(rest), steps - 1)] if steps > 1 else [first]
    return [int(v) for v in np.cumsum(sizes)]


def rendering_group(scene) -> int:
    """The rendering condition of a scene's main object: ``(size, texture, background)`` as one int."""
    m = scene.main
    return (SIZES.index(m.size) * len(TEXTURES) + TEXTURES.index(m.texture)) * len(BACKGROUNDS) + \
        BACKGROUNDS.index(scene.background)


def rendering_groups(seed: int, split: str, n: int) -> np.ndarray:
    """:func:`rendering_group` of the single-object items among the first ``n`` of ``split``, in the
    order :func:`_render` keeps them (scenes only: no pixels are drawn)."""
    from ...data.world import item_rng, sample_scene

    scenes = (sample_scene(item_rng(seed, split, i)) for i in range(n))
    return np.asarray([rendering_group(s) for s in scenes if len(s.objects) == 1], np.int64)


def _cached_groups(cfg: DataConfig) -> np.ndarray:
    """:func:`rendering_groups` of the eval split, cached beside its features."""
    path = Path(cfg.cache_dir) / f"groups_{cfg.eval_split}_{cfg.world_seed}_{cfg.n_render_eval}.npz"
    if path.is_file():
        return np.load(path)["groups"]
    groups = rendering_groups(cfg.world_seed, cfg.eval_split, cfg.n_render_eval)
    _atomic_savez(path, groups=groups)
    return groups


def _render(seed: int, split: str, n: int, progress: bool) -> tuple[np.ndarray, np.ndarray]:
    from ...data.world import make_item

    pixels, labels = [], []
    with progress_bar(progress, f"render {split}", n) as advance:
        for i in range(n):
            scene, px = make_item(seed, split, i)
            advance()
            if len(scene.objects) == 1:
                pixels.append(px)
                labels.append(scene.labels()["class_id"])
    if not pixels:
        field = "n_render_train" if split == "train" else "n_render_eval"
        raise ValueError(f"too few rendered items: none of the {n} {split} items rendered holds one object (about 1 "
                         f"in 3 does): raise {field}")
    return np.stack(pixels), np.asarray(labels, np.int64)


def random_conv_features(pixels: np.ndarray, seed: int = 0, batch: int = 256) -> np.ndarray:
    """A frozen, randomly initialised 3-layer CNN (seeded) on 2x down-sampled images: max- and
    mean-pooled channels of the last layer (256-d). Random convolutional features keep colour and
    local shape that the world CLIP embedding (trained on whole-scene captions) partly discards."""
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    convs = [nn.Conv2d(3, 32, 5, padding=2), nn.Conv2d(32, 64, 3, padding=1), nn.Conv2d(64, 128, 3, padding=1)]
    with torch.no_grad():
        for c in convs:
            bound = 1.0 / np.sqrt(c.in_channels * c.kernel_size[0] * c.kernel_size[1])
            c.weight.copy_(torch.rand(c.weight.shape, generator=gen) * 2 * bound - bound)
            c.bias.zero_()
    net = nn.Sequential(nn.AvgPool2d(2), convs[0], nn.ReLU(), nn.MaxPool2d(2), convs[1], nn.ReLU(), nn.MaxPool2d(2),
                        convs[2], nn.ReLU()).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(pixels), batch):
            x = torch.from_numpy(pixels[i:i + batch]).permute(0, 3, 1, 2).float() / 255.0 - 0.5
            h = net(x)
            out.append(torch.cat([h.amax((2, 3)), h.mean((2, 3))], 1).numpy())
    return np.concatenate(out)


def downsampled_images(pixels: np.ndarray, resolution: int) -> np.ndarray:
    """``(N, 64, 64, 3)`` uint8 -> ``(N, 3, R, R)`` float32 in [0, 1], by averaging ``64/R`` blocks."""
    n, size = len(pixels), pixels.shape[1]
    f = size // resolution
    out = pixels.reshape(n, resolution, f, resolution, f, 3).mean((2, 4), dtype=np.float32) / 255.0
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def _features(backbone: str, pixels: np.ndarray) -> np.ndarray:
    if backbone.startswith("image"):
        return downsampled_images(pixels, int(backbone[len("image"):]))
    if backbone == "pixels":
        n = len(pixels)
        return pixels.astype(np.float32).reshape(n, 8, 8, 8, 8, 3).mean((2, 4)).reshape(n, -1) / 255.0
    if backbone == "randconv":
        return random_conv_features(pixels)
    from ...encoders import load_encoder

    enc = load_encoder(backbone)
    return np.concatenate([enc.encode_images(list(pixels[i:i + 512])) for i in range(0, len(pixels), 512)])


def _atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: np.savez(f, **arrays), tmp_prefix=".")


def _cached_split(cfg: DataConfig, split: str, n: int, progress: bool
                  ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Features of the single-object items of ``split`` (``n`` rendered); each ``+``-joined backbone
    part is cached on its own, and so are the rendered pixels."""
    cache = Path(cfg.cache_dir)
    pixels: list = []

    def rendered() -> tuple[np.ndarray, np.ndarray]:
        if not pixels:
            path = cache / f"pixels_{split}_{cfg.world_seed}_{n}.npz"
            if path.is_file():
                z = np.load(path)
                pixels.append((z["pixels"], z["y"]))
            else:
                px, y = _render(cfg.world_seed, split, n, progress)
                _atomic_savez(path, pixels=px, y=y)
                pixels.append((px, y))
        return pixels[0]

    parts, labels = [], None
    for part in cfg.backbone.split("+"):
        if part.startswith("image"):  # cheap from the cached pixels: no feature cache
            px, labels = rendered()
            parts.append(_features(part, px))
            continue
        key = json.dumps({"backbone": part, "seed": cfg.world_seed, "split": split, "n": n, "v": 1})
        if part not in ("pixels", "randconv"):
            part = str(shipped(part))  # the default's models/world-new from any working directory
            weights = Path(part) / "model.safetensors"
            if not weights.is_file():
                raise FileNotFoundError(f"backbone {part}: no model.safetensors (use a world model, 'randconv' "
                                        "or 'pixels')")
            key += str(weights.stat().st_size) + str(int(weights.stat().st_mtime))
        path = cache / f"{split}_{hashlib.sha1(key.encode()).hexdigest()[:12]}.npz"
        if path.is_file():
            z = np.load(path)
            feats, y = z["x"], z["y"]
        else:
            px, y = rendered()
            feats = _features(part, px).astype(np.float32)
            _atomic_savez(path, x=feats, y=y)
        parts.append(feats)
        labels = y
    return np.concatenate(parts, 1), labels, [p.shape[1] for p in parts]


def class_arrival_order(cfg: DataConfig) -> np.ndarray:
    """World class ids in arrival order: a seeded permutation; with ``open_set="shapes"`` the classes
    of the held-out shapes are moved (in permutation order) behind the training pool."""
    order = np.random.default_rng(cfg.class_seed).permutation(N_WORLD_CLASSES)
    if cfg.open_set == "shapes":
        n_held = (N_WORLD_CLASSES - cfg.n_train_classes) // len(COLOURS)
        held = np.random.default_rng([cfg.class_seed, 1]).permutation(len(SHAPES))[:n_held]
        unseen = np.isin(order % len(SHAPES), held)  # class_id = colour * len(SHAPES) + shape
        order = np.concatenate([order[~unseen], order[unseen]])
    return order


def load_class_data(cfg: DataConfig, progress: bool = True) -> ClassData:
    """Render (or read from the cache), embed, standardise and split the items (module docstring)."""
    tx, ty, part_widths = _cached_split(cfg, "train", cfg.n_render_train, progress)
    ex, ey, _ = _cached_split(cfg, cfg.eval_split, cfg.n_render_eval, progress)
    order = class_arrival_order(cfg)
    arrival = np.empty(N_WORLD_CLASSES, np.int64)
    arrival[order] = np.arange(N_WORLD_CLASSES)
    ty, ey = arrival[ty], arrival[ey]
    pool = ty < cfg.n_train_classes
    axes = (0,) if tx.ndim == 2 else (0, 2, 3)  # per column, or per channel of images
    mean, std = tx[pool].mean(axes, keepdims=True)[0], tx[pool].std(axes, keepdims=True)[0] + 1e-6
    norm = lambda a: ((a - mean) / std).astype(np.float32)
    closed = ey < cfg.n_train_classes
    retrieval = ~closed if cfg.eval_classes == "unseen" else np.ones(len(ey), bool)
    open_x, open_y, open_index = ex[retrieval], ey[retrieval], np.flatnonzero(retrieval)
    # per class: alternate items go to the gallery and to the queries
    rank = np.zeros(len(open_y), np.int64)
    for c in np.unique(open_y):
        idx = np.flatnonzero(open_y == c)
        rank[idx] = np.arange(len(idx))
    gal = rank % 2 == 0
    if not pool.any() or gal.sum() == 0 or (~gal).sum() == 0:
        raise ValueError(f"too few rendered items ({cfg.n_render_train} train, {cfg.n_render_eval} eval)")
    dims = [(part, d) for part, d in zip(cfg.backbone.split("+"), part_widths)]
    steps = [s.split("+") for s in cfg.step_backbones.split(",") if s] or None
    groups = _cached_groups(cfg)
    if len(groups) != len(ey):
        raise ValueError(f"{cfg.cache_dir}: the cached {cfg.eval_split} items ({len(ey)}) do not match the "
                         f"world's single-object items ({len(groups)}); delete the stale cache")
    open_groups = groups[open_index]
    return ClassData(norm(tx[pool]), ty[pool], norm(ex[closed]), ey[closed], norm(open_x[gal]), open_y[gal],
                     norm(open_x[~gal]), open_y[~gal], cfg.n_train_classes, [int(c) for c in order], dims, steps,
                     open_index[gal], open_index[~gal], open_groups[gal], open_groups[~gal])


class ReplayMemory:
    """A class-balanced replay memory: ``per_class`` random training items of every class seen
    (CL2R, d-Simplex-HOC and the ``-ER`` variants in the continual regime)."""

    def __init__(self, per_class: int, seed: int = 0) -> None:
        self.per_class = per_class
        self.seed = seed
        self.indices = np.zeros(0, np.int64)

    def add_classes(self, labels: np.ndarray, classes: range) -> None:
        """Add ``per_class`` items (indices into the training arrays) of each class in ``classes``."""
        picked = [self.indices]
        for c in classes:
            idx = np.flatnonzero(labels == c)
            rng = np.random.default_rng([self.seed, c])
            picked.append(np.sort(rng.choice(idx, min(self.per_class, len(idx)), replace=False)))
        self.indices = np.concatenate(picked)


class StepBatches:
    """Deterministic batches of one step (``batch(i)`` is a pure function of ``(seed, i)``):
    ``{"x", "y", "replay"}`` tensors. With a replay memory, half of each batch comes from it."""

    def __init__(self, x: np.ndarray, y: np.ndarray, current: np.ndarray, memory: np.ndarray,
                 batch_size: int, seed: int) -> None:
        if len(current) == 0:
            raise ValueError("a step without training items")
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.current, self.memory = current, memory
        self.batch_size, self.seed = batch_size, seed

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, index])
        n_mem = self.batch_size // 2 if len(self.memory) else 0
        idx = np.concatenate([rng.choice(self.current, self.batch_size - n_mem),
                              rng.choice(self.memory, n_mem) if n_mem else np.zeros(0, np.int64)])
        replay = torch.zeros(len(idx), dtype=torch.bool)
        replay[self.batch_size - n_mem:] = True
        return {"x": self.x[idx], "y": self.y[idx], "replay": replay}


def config_dict(cfg: DataConfig) -> dict:
    return asdict(cfg)
