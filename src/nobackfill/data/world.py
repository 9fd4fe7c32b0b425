"""The world: a synthetic, multilingual, fine-grained image-caption data set.

``generate_world(out)`` writes ``out/{train,val,test}/`` in the user data format (an image folder
plus ``captions.jsonl``; see :mod:`nobackfill.data.folder`) and ``out/world.json`` describing how it
was made. Every item is a pure function of ``(seed, split, index)``, so worlds are reproducible and
training can stream fresh scenes (:class:`WorldStream`) from a split no file ever contains.
"""

from __future__ import annotations

import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image
from .._atomic import atomic_write_text

from ..progress import progress_bar
from .grammars import get_grammar, languages
from .render import render_scene
from .scene import ConceptSet, Scene, sample_scene

WORLD_VERSION = 1
SPLIT_CODES = {"train": 1, "val": 2, "test": 3, "stream": 4}


@dataclass
class WorldSpec:
    """How a world is generated (saved as ``world.json``)."""

    seed: int = 0
    n_train: int = 20000
    n_val: int = 1000
    n_test: int = 1000
    langs: tuple[str, ...] = field(default_factory=lambda: tuple(languages()))
    captions_per_image: int = 2
    shapes: tuple[str, ...] | None = None
    colours: tuple[str, ...] | None = None
    version: int = WORLD_VERSION

    def __post_init__(self) -> None:
        for name in ("n_train", "n_val", "n_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: no {name[2:]} split), got {getattr(self, name)}")
        if self.n_train + self.n_val + self.n_test == 0:
            raise ValueError("n_train, n_val and n_test are all 0: a world needs images in at least one split")
        if self.captions_per_image < 1:
            raise ValueError(f"captions_per_image must be >= 1, got {self.captions_per_image}")
        from .grammars import languages

        unknown = [lg for lg in self.langs if lg not in languages()]
        if unknown or not self.langs:
            raise ValueError(f"langs: no grammar for {', '.join(map(repr, unknown)) or 'no language'} "
                             f"(grammars: {', '.join(languages())})")

    @property
    def concepts(self) -> ConceptSet:
        return ConceptSet.parse(self.shapes, self.colours)

    def counts(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


def item_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The random generator of one world item (independent streams per split and index)."""
    return np.random.default_rng([seed, SPLIT_CODES[split], index])


def make_item(seed: int, split: str, index: int, concepts: ConceptSet = ConceptSet()) -> tuple[Scene, np.ndarray]:
    rng = item_rng(seed, split, index)
    scene = sample_scene(rng, concepts)
    return scene, render_scene(scene, rng)


def caption_variants(rng: np.random.Generator, n: int, n_variants: int) -> list[int]:
    """``n`` distinct paraphrase template ids (cycled when n > n_variants)."""
    start = int(rng.integers(n_variants))
    return [(start + k) % n_variants for k in range(n)]


def _write_block(args: tuple) -> list[dict]:
    spec_d, split, start, stop, out = args
    spec = WorldSpec(**spec_d)
    grammars = [get_grammar(lang) for lang in spec.langs]
    concepts = spec.concepts
    records: list[dict] = []
    img_dir = Path(out) / split / "images"
    for i in range(start, stop):
        scene, pixels = make_item(spec.seed, split, i, concepts)
        rel = f"images/{i:06d}.png"
        buf = io.BytesIO()  # stored (level 0): noise makes the pixels incompressible anyway
        Image.fromarray(pixels).save(buf, format="PNG", compress_level=0)
        (img_dir / f"{i:06d}.png").write_bytes(buf.getvalue())  # captions.jsonl, written last, commits
        vrng = np.random.default_rng([spec.seed, SPLIT_CODES[split], i, 7])
        labels = scene.labels()
        for g in grammars:
            for v in caption_variants(vrng, spec.captions_per_image, g.n_variants):
                records.append({"image": rel, "caption": g.caption(scene, v), "lang": g.lang,
                                "labels": labels, "variant": v, "item": i})
    return records


def generate_world(out: str | Path, spec: WorldSpec | None = None, workers: int | None = None,
                   progress: bool = True) -> Path:
    """Write a world to ``out`` (splits in the user data format). Returns ``out``."""
    from .folder import write_pairs  # local import: folder depends on nothing here

    spec = spec or WorldSpec()
    out = Path(out)
    workers = workers or min(2, os.cpu_count() or 1)
    block = 500
    for split, n in spec.counts().items():
        if n <= 0:
            continue
        (out / split / "images").mkdir(parents=True, exist_ok=True)
        jobs = [(asdict(spec), split, s, min(n, s + block), str(out)) for s in range(0, n, block)]
        records: list[dict] = []
        with progress_bar(progress, f"world {split}", len(jobs)) as advance:
            if workers > 1 and len(jobs) > 1:
                with ProcessPoolExecutor(workers) as ex:
                    for recs in ex.map(_write_block, jobs):
                        records.extend(recs)
                        advance()
            else:
                for job in jobs:
                    records.extend(_write_block(job))
                    advance()
        write_pairs(out / split, records)
    atomic_write_text(out / "world.json", json.dumps(asdict(spec), indent=2))
    return out


def load_world_spec(directory: str | Path) -> WorldSpec | None:
    """The spec of a generated world (``world.json`` in ``directory`` or its parent: a split's folder),
    else None; None for a folder that does not exist (trial AC: its parent's world was taken)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    for cand in (d / "world.json", d.parent / "world.json"):
        if cand.is_file():
            data = json.loads(cand.read_text())
            for key in ("langs", "shapes", "colours"):
                if data.get(key) is not None:
                    data[key] = tuple(data[key])
            return WorldSpec(**data)
    return None


class WorldStream:
    """Endless batches of fresh world scenes (split ``"stream"``, disjoint from every file).

    Yields ``(pixels uint8 (B,64,64,3), captions list[str], scenes)``; captions use a random
    paraphrase template of ``lang``.
    """

    def __init__(self, batch_size: int, seed: int = 0, concepts: ConceptSet = ConceptSet(),
                 lang: str = "en", start: int = 0) -> None:
        self.batch_size = batch_size
        self.seed = seed
        self.concepts = concepts
        self.grammar = get_grammar(lang)
        self.position = start

    def batch(self, index: int) -> tuple[np.ndarray, list[str], list[Scene]]:
        scenes, pixels, caps = [], [], []
        for j in range(self.batch_size):
            k = index * self.batch_size + j
            scene, px = make_item(self.seed, "stream", k, self.concepts)
            v = int(item_rng(self.seed + 1, "stream", k).integers(self.grammar.n_variants))
            scenes.append(scene)
            pixels.append(px)
            caps.append(self.grammar.caption(scene, v))
        return np.stack(pixels), caps, scenes

    def __iter__(self) -> Iterator[tuple[np.ndarray, list[str], list[Scene]]]:
        while True:
            yield self.batch(self.position)
            self.position += 1


def world_corpus(spec: WorldSpec, n: int, lang: str = "en", split: str = "train") -> list[str]:
    """``n`` captions of the world in ``lang`` (for tokenizer training or text-only stages)."""
    g = get_grammar(lang)
    out = []
    for i in range(n):
        scene = sample_scene(item_rng(spec.seed, split, i), spec.concepts)
        out.append(g.caption(scene, i % g.n_variants))
    return out
