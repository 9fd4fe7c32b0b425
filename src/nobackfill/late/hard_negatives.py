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

__all__ = ["HardNegativeSet", "swap_attributes", "hard_negative_set"]


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
        rng = item_rng(spec.seed, split, i)
        scene = sample_scene(rng, concepts)
        twin = swap_attributes(scene)
        if twin is None:
            continue
        state = rng.bit_generator.state  # same pixel noise for both renderings
        original_px = render_scene(scene, rng)
        rng.bit_generator.state = state
        twin_px = render_scene(twin, rng)
        v = i % g.n_variants
        pixels += [original_px, twin_px]
        captions += [g.caption(scene, v), g.caption(twin, v)]
        sources.append(i)
        if limit_pairs is not None and len(sources) >= limit_pairs:
            break
    if not sources:
        raise ValueError(f"no {split} item of the world has two objects to swap")
    return HardNegativeSet(np.stack(pixels), captions, sources)
