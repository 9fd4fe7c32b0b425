"""Data for the upgrade methods: the text corpus of stage 1 (Eq. 3), the image-text pairs of
stage 2 (Eq. 5) and of the Direct baselines (Eq. 6), and in-memory world evaluation splits.

* Text corpus: any text file (one caption a line), a user data folder (its train split's
  captions) or a generated world root (``world.json``: captions of the world's *train* split,
  never val/test).
* Pairs: ``N`` distinct (image, caption) pairs, fixed once, reshuffled every epoch (seeded): the
  pair budget of the sweep is exactly ``N``. From a user data folder (its train split, one
  caption per image) or from a world root (train items ``0..N-1`` rendered in memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..data.grammars import get_grammar
from ..data.world import SPLIT_CODES, WorldSpec, caption_variants, load_world_spec, make_item, world_corpus


def _train_dir(path: Path) -> Path:
    return path / "train" if (path / "train" / "captions.jsonl").is_file() else path


def read_text_corpus(path: str | Path, n: int | None = None, lang: str = "en") -> list[str]:
    """Captions for stage 1. ``n`` caps the count (for a world root it is the number generated,
    default 20,000)."""
    p = Path(path)
    if p.is_file():
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
        texts = [ln for ln in lines if ln]
        if not texts:
            raise ValueError(f"{p}: the text corpus is empty")
        return texts[:n] if n else texts
    spec = load_world_spec(p) if p.is_dir() and not (p / "captions.jsonl").is_file() else None
    if spec is not None:
        return world_corpus(spec, n or 20000, lang=lang, split="train")
    if p.is_dir():
        from ..data.folder import load_pairs

        caps = load_pairs(_train_dir(p), langs=[lang], check_images=False).captions
        if not caps:
            raise ValueError(f"{p}: no {lang} captions")
        return list(caps[:n] if n else caps)
    raise FileNotFoundError(f"{p}: {'no such file or folder' if not p.exists() else 'not a text file, data folder or world root'}")


@dataclass
class Pairs:
    """``N`` image-caption pairs; ``images`` is a uint8 array ``(N, H, W, 3)`` or a list of paths."""

    images: np.ndarray | list
    captions: list[str]
    labels: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.captions)

    def subset(self, n: int) -> "Pairs":
        if n > len(self):
            raise ValueError(f"asked for {n} pairs but only {len(self)} are available")
        return Pairs(self.images[:n], self.captions[:n], self.labels[:n])


def item_captions(spec: WorldSpec, split: str, index: int, scene, lang: str = "en") -> list[str]:
    """The ``lang`` captions the folder writer gives item ``index`` (same random draws)."""
    if lang not in spec.langs:
        raise ValueError(f"the world has no {lang!r} captions (languages {spec.langs})")
    vrng = np.random.default_rng([spec.seed, SPLIT_CODES[split], index, 7])
    for code in spec.langs:
        g = get_grammar(code)
        vs = caption_variants(vrng, spec.captions_per_image, g.n_variants)
        if code == lang:
            return [g.caption(scene, v) for v in vs]
    raise AssertionError("unreachable")


def world_pairs(spec: WorldSpec, n: int, split: str = "train", lang: str = "en", start: int = 0) -> Pairs:
    """``n`` items of a world split rendered in memory, each with its first ``lang`` caption (the
    one the folder format writes first)."""
    pixels, caps, labels = [], [], []
    for i in range(start, start + n):
        scene, px = make_item(spec.seed, split, i, spec.concepts)
        pixels.append(px)
        caps.append(item_captions(spec, split, i, scene, lang)[0])
        labels.append(int(scene.labels()["class_id"]))
    return Pairs(np.stack(pixels) if pixels else np.zeros((0, 64, 64, 3), np.uint8), caps, labels)


def load_pair_source(path: str | Path, n: int | None = None, lang: str = "en") -> Pairs:
    """Pairs from a world root (rendered train items) or a user data folder (train split)."""
    p = Path(path)
    spec = load_world_spec(p) if not (p / "captions.jsonl").is_file() else None
    if spec is not None:  # identical to the folder's train split, rendered (faster than PNGs)
        return world_pairs(spec, n or spec.n_train, "train", lang)
    from ..data.folder import load_pairs

    data = load_pairs(_train_dir(p), langs=[lang])
    first = {}
    for c, i in enumerate(data.caption_image):
        first.setdefault(int(i), c)
    order = sorted(first)[: n or None]
    paths = data.image_paths()
    pairs = Pairs([paths[i] for i in order], [data.captions[first[i]] for i in order])
    if n and len(pairs) < n:
        raise ValueError(f"{p}: only {len(pairs)} image-caption pairs, asked for {n}")
    return pairs


class PairBatches:
    """Deterministic batches over fixed pairs: ``batch(i)`` is a pure function of ``i``; every
    epoch is a fresh seeded permutation (the last partial batch of an epoch is dropped)."""

    def __init__(self, pairs: Pairs, batch_size: int, seed: int = 0) -> None:
        if len(pairs) < 2:
            raise ValueError("need at least 2 image-caption pairs")
        self.pairs, self.seed = pairs, seed
        self.batch_size = min(batch_size, len(pairs))
        self.per_epoch = len(pairs) // self.batch_size

    def indices(self, index: int) -> np.ndarray:
        epoch, k = divmod(index, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.pairs))
        return order[k * self.batch_size:(k + 1) * self.batch_size]

    def batch(self, index: int):
        idx = self.indices(index)
        imgs = self.pairs.images
        images = imgs[idx] if isinstance(imgs, np.ndarray) else [imgs[i] for i in idx]
        return images, [self.pairs.captions[i] for i in idx]


class IndexBatches:
    """Seeded epochs over ``n`` rows (stage 1 batches of cached text embeddings)."""

    def __init__(self, n: int, batch_size: int, seed: int = 0) -> None:
        if n < 2:
            raise ValueError("need at least 2 rows")
        self.n, self.seed = n, seed
        self.batch_size = min(batch_size, n)
        self.per_epoch = n // self.batch_size

    def batch(self, index: int) -> np.ndarray:
        epoch, k = divmod(index, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return order[k * self.batch_size:(k + 1) * self.batch_size]


@dataclass
class EvalSet:
    """A world split in memory: images, every ``lang`` caption, caption -> image, class ids."""

    images: np.ndarray
    captions: list[str]
    caption_image: np.ndarray
    class_ids: np.ndarray
    split: str


def world_eval_set(spec: WorldSpec, split: str, n: int | None = None, lang: str = "en") -> EvalSet:
    """Images ``0..n-1`` of ``split`` with the same ``lang`` captions the folder writer produces
    (``spec.captions_per_image`` each)."""
    n = n or spec.counts()[split]
    pixels, caps, c2i, classes = [], [], [], []
    for i in range(n):
        scene, px = make_item(spec.seed, split, i, spec.concepts)
        for c in item_captions(spec, split, i, scene, lang):
            caps.append(c)
            c2i.append(i)
        pixels.append(px)
        classes.append(int(scene.labels()["class_id"]))
    return EvalSet(np.stack(pixels), caps, np.asarray(c2i, np.int64), np.asarray(classes, np.int64), split)


def dedupe(texts: Sequence[str]) -> list[str]:
    """Unique texts in first-seen order (duplicates are false negatives for InfoNCE)."""
    return list(dict.fromkeys(texts))
