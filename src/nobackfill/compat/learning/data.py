"""Class-incremental data for the compatibility-learning family (seed 002's setting on our world).

* **Items.** Scenes of the world (``nobackfill.data.world.make_item``) with a single object, so the
  class label (``"<colour> <shape>"``, 64 classes) is the only object in the picture. Items are
  rendered by index from the world's ``train`` / ``val`` / ``test`` streams (indices may go past the
  split files' sizes; every item is a pure function of ``(seed, split, index)``).
* **Frozen features.** Each image is embedded once by a frozen backbone: a shipped world CLIP model
  (default ``models/world-new``: its image embedding) or, backbone ``"pixels"``, 8x8 average-pooled
  pixels (no model; used by the tests). Features are standardised with the training statistics and
  cached under ``cache_dir``.
* **Classes.** A seeded permutation of the 64 world classes: the first ``n_train_classes`` are the
  training pool, in order of arrival; the rest never appear in training and form the **open-set**
  evaluation (gallery and query from held-out images of those classes, matched by class).
* **Steps.** Step 1 sees the first ``first_fraction`` of the training classes; the rest are split
  evenly over steps 2..T. ``cumulative``: step t trains on every image of the classes seen so far
  (``T_t = T_k U Delta T``); ``continual``: only the new classes' images plus a small replay memory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ...data.scene import COLOURS, SHAPES
from ...progress import progress_bar

N_WORLD_CLASSES = len(SHAPES) * len(COLOURS)


@dataclass
class DataConfig:
    """Where the images come from and how classes are split (see the module docstring)."""

    backbone: str = "models/world-new"  # a world CLIP model directory, or "pixels"
    world_seed: int = 0
    n_render_train: int = 24000  # rendered train-stream items (about 1/3 are single-object)
    n_render_eval: int = 12000  # rendered eval-split items
    eval_split: str = "test"  # "val" for tuning, "test" for the report
    n_train_classes: int = 48  # training pool; the other 64 - 48 classes are the open set
    first_fraction: float = 0.5  # share of the training pool seen at step 1
    class_seed: int = 0
    cache_dir: str = "runs/compat_steps/cache"

    def __post_init__(self) -> None:
        if not 2 <= self.n_train_classes < N_WORLD_CLASSES:
            raise ValueError(f"n_train_classes must be in [2, {N_WORLD_CLASSES - 1}], got {self.n_train_classes}")
        if not 0 < self.first_fraction < 1:
            raise ValueError(f"first_fraction must be in (0, 1), got {self.first_fraction}")
        if self.eval_split not in ("val", "test"):
            raise ValueError(f"eval_split must be 'val' or 'test', got {self.eval_split!r}")


@dataclass
class ClassData:
    """Standardised features (float32) and labels (arrival order; open-set classes follow the pool)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray  # closed-set held-out images of the training pool (classification, NFR)
    test_y: np.ndarray
    gallery_x: np.ndarray  # open-set classes
    gallery_y: np.ndarray
    query_x: np.ndarray
    query_y: np.ndarray
    n_train_classes: int
    class_order: list[int]  # world class ids in arrival order (pool first, open set after)

    @property
    def in_dim(self) -> int:
        return int(self.train_x.shape[1])


def class_schedule(n_classes: int, steps: int, first_fraction: float = 0.5) -> list[int]:
    """Cumulative class counts ``K_1 < ... < K_T = n_classes``: step 1 gets ``first_fraction`` of the
    classes, steps 2..T share the rest evenly."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    first = n_classes if steps == 1 else max(1, int(round(first_fraction * n_classes)))
    rest = n_classes - first
    if steps > 1 and rest < steps - 1:
        raise ValueError(f"{n_classes} classes cannot give {steps - 1} later steps at least one new class each")
    sizes = [first] + [len(a) for a in np.array_split(np.arange(rest), steps - 1)] if steps > 1 else [first]
    return [int(v) for v in np.cumsum(sizes)]


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
    return np.stack(pixels), np.asarray(labels, np.int64)


def _features(backbone: str, pixels: np.ndarray) -> np.ndarray:
    if backbone == "pixels":
        n = len(pixels)
        return pixels.astype(np.float32).reshape(n, 8, 8, 8, 8, 3).mean((2, 4)).reshape(n, -1) / 255.0
    from ...encoders import load_encoder

    enc = load_encoder(backbone)
    return np.concatenate([enc.encode_images(list(pixels[i:i + 512])) for i in range(0, len(pixels), 512)])


def _cached_split(cfg: DataConfig, split: str, n: int, progress: bool) -> tuple[np.ndarray, np.ndarray]:
    key = json.dumps({"backbone": cfg.backbone, "seed": cfg.world_seed, "split": split, "n": n, "v": 1})
    if cfg.backbone != "pixels":
        weights = Path(cfg.backbone) / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"backbone {cfg.backbone}: no model.safetensors (use a world model or 'pixels')")
        key += str(weights.stat().st_size) + str(int(weights.stat().st_mtime))
    path = Path(cfg.cache_dir) / f"{split}_{hashlib.sha1(key.encode()).hexdigest()[:12]}.npz"
    if path.is_file():
        z = np.load(path)
        return z["x"], z["y"]
    pixels, labels = _render(cfg.world_seed, split, n, progress)
    feats = _features(cfg.backbone, pixels).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, x=feats, y=labels)
    tmp.replace(path)
    return feats, labels


def load_class_data(cfg: DataConfig, progress: bool = True) -> ClassData:
    """Render (or read from the cache), embed, standardise and split the items (module docstring)."""
    tx, ty = _cached_split(cfg, "train", cfg.n_render_train, progress)
    ex, ey = _cached_split(cfg, cfg.eval_split, cfg.n_render_eval, progress)
    order = np.random.default_rng(cfg.class_seed).permutation(N_WORLD_CLASSES)
    arrival = np.empty(N_WORLD_CLASSES, np.int64)
    arrival[order] = np.arange(N_WORLD_CLASSES)
    ty, ey = arrival[ty], arrival[ey]
    pool = ty < cfg.n_train_classes
    mean, std = tx[pool].mean(0), tx[pool].std(0) + 1e-6
    norm = lambda a: ((a - mean) / std).astype(np.float32)
    closed = ey < cfg.n_train_classes
    open_x, open_y = ex[~closed], ey[~closed]
    # per open-set class: alternate items go to the gallery and to the queries
    rank = np.zeros(len(open_y), np.int64)
    for c in np.unique(open_y):
        idx = np.flatnonzero(open_y == c)
        rank[idx] = np.arange(len(idx))
    gal = rank % 2 == 0
    if not pool.any() or gal.sum() == 0 or (~gal).sum() == 0:
        raise ValueError(f"too few rendered items ({cfg.n_render_train} train, {cfg.n_render_eval} eval)")
    return ClassData(norm(tx[pool]), ty[pool], norm(ex[closed]), ey[closed], norm(open_x[gal]), open_y[gal],
                     norm(open_x[~gal]), open_y[~gal], cfg.n_train_classes, [int(c) for c in order])


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
