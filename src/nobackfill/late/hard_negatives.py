"""Attribute-swap hard negatives of the world (the seed's motivation: global embeddings miss small
but important details, e.g. "a red circle left of a blue square" vs the swap).

For a world scene with at least two objects, the *twin* exchanges the colours of the main object
and the second object (or their shapes, when the colours agree). Twin and original have the same
layout, background and pixel noise, and bags of words that are equal up to the binding of the
swapped attribute, so only a model that binds attributes to objects tells them apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..data.grammars import get_grammar
from ..data.render import render_scene
from ..data.scene import ConceptSet, Scene, sample_scene
from ..data.world import WorldSpec, item_rng

__all__ = ["HardNegativeSet", "swap_attributes", "twin_item", "hard_negative_set", "SwapTwinBatches"]


def swap_attributes(scene: Scene) -> Scene | None:
    """The scene with the colours (else the shapes) of objects 0 and 1 exchanged; None when the
    scene has one object or two identical-looking ones."""
    if len(scene.objects) < 2:
        return None
    a, b = scene.objects[0], scene.objects[1]
    if a.colour != b.colour:
        a2, b2 = dataclasses.replace(a, colour=b.colour), dataclasses.replace(b, colour=a.colour)
    elif a.shape != b.shape:
        a2, b2 = dataclasses.replace(a, shape=b.shape), dataclasses.replace(b, shape=a.shape)
    else:
        return None
    return Scene(scene.background, (a2, b2) + scene.objects[2:])


def twin_item(seed: int, split: str, index: int, concepts: ConceptSet = ConceptSet()
              ) -> tuple[Scene, np.ndarray, Scene | None, np.ndarray | None]:
    """World item ``index`` of ``split`` (the same scene and pixels as
    :func:`nobackfill.data.world.make_item`) and its swap twin rendered with the same pixel noise
    (``None, None`` when the scene has no twin)."""
    rng = item_rng(seed, split, index)
    scene = sample_scene(rng, concepts)
    twin = swap_attributes(scene)
    state = rng.bit_generator.state
    pixels = render_scene(scene, rng)
    if twin is None:
        return scene, pixels, None, None
    rng.bit_generator.state = state
    return scene, pixels, twin, render_scene(twin, rng)


@dataclass
class HardNegativeSet:
    """``2n`` images and captions: item ``2i`` is a world scene, ``2i + 1`` its swapped twin.
    Caption ``j`` describes image ``j`` (``caption_image = arange(2n)``)."""

    pixels: np.ndarray  # uint8 (2n, 64, 64, 3)
    captions: list[str]
    source_index: list[int]  # world item index of each pair

    @property
    def caption_image(self) -> np.ndarray:
        return np.arange(len(self.captions))

    def __len__(self) -> int:
        return len(self.captions)


def hard_negative_set(spec: WorldSpec, split: str = "test", n_items: int | None = None, lang: str = "en",
                      limit_pairs: int | None = None) -> HardNegativeSet:
    """Swap twins of the first ``n_items`` items of a world split (default: the whole split) that
    have one; at most ``limit_pairs`` pairs. Captions use paraphrase variant ``index % variants``."""
    g = get_grammar(lang)
    concepts: ConceptSet = spec.concepts
    n = spec.counts()[split] if n_items is None else int(n_items)
    pixels, captions, sources = [], [], []
    for i in range(n):
        scene, original_px, twin, twin_px = twin_item(spec.seed, split, i, concepts)
        if twin is None:
            continue
        v = i % g.n_variants
        pixels += [original_px, twin_px]
        captions += [g.caption(scene, v), g.caption(twin, v)]
        sources.append(i)
        if limit_pairs is not None and len(sources) >= limit_pairs:
            break
    if not sources:
        raise ValueError(f"no {split} item of the world has two objects to swap")
    return HardNegativeSet(np.stack(pixels), captions, sources)


class SwapTwinBatches:
    """Training batches of fresh ``"stream"`` scenes (never a val / test scene), each scene followed
    by its swap twin (image and caption) when it has one, as in-batch hard negatives.

    The twin is just another image-caption pair of the batch, so every contrastive loss (global
    InfoNCE, CMLI InfoNCE, the KD students' contrastive term) sees the original's caption as a
    negative of the twin image and the twin's caption as a negative of the original image: the
    attribute-swap negatives of NegCLIP (Yuksekgonul et al., ICLR 2023, "When and why
    vision-language models behave like bags-of-words"), here built from training scenes only.
    A batch holds ``batch_size`` pairs (about half of them twins), so a step costs the same as
    one of :class:`nobackfill.data.batches.WorldBatches`. Captions use a random paraphrase
    template per scene, shared by the twin (as in :class:`nobackfill.data.world.WorldStream`).
    """

    def __init__(self, batch_size: int, seed: int = 0, concepts: ConceptSet = ConceptSet(), lang: str = "en") -> None:
        if batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (a scene and its twin), got {batch_size}")
        self.batch_size, self.seed, self.concepts = batch_size, seed, concepts
        self.grammar = get_grammar(lang)

    def batch(self, index: int) -> tuple[np.ndarray, list[str]]:
        pixels: list[np.ndarray] = []
        captions: list[str] = []
        j = 0
        while len(captions) < self.batch_size:  # scene ids index * B .. index * B + B - 1: disjoint per batch
            k = index * self.batch_size + j
            scene, px, twin, twin_px = twin_item(self.seed, "stream", k, self.concepts)
            v = int(item_rng(self.seed + 1, "stream", k).integers(self.grammar.n_variants))
            pixels.append(px)
            captions.append(self.grammar.caption(scene, v))
            if twin is not None and len(captions) < self.batch_size:
                pixels.append(twin_px)
                captions.append(self.grammar.caption(twin, v))
            j += 1
        return np.stack(pixels), captions
