"""Fine-grained zero-shot label sets of the world's main object: classes fixed by some of its
attributes (size, colour, texture, shape), each with a prompt ensemble in the world's grammar (the
RECO benchmark's zero-shot task, Iscen et al. 2023, Sec. 4.1: class names in prompts)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

#: label sets for fine-grained zero-shot: name -> the attributes of the main object a class fixes
LABEL_SETS: dict[str, tuple[str, ...]] = {
    "size_colour_texture": ("size", "colour", "texture"),
    "size_colour_shape": ("size", "colour", "shape"),
    "colour_shape": ("colour", "shape"),
}
#: attributes whose premise (encoded by the image tower? named by the base?) the bench measures
PREMISE_ATTRIBUTES = ("size", "colour", "shape", "texture", "background")


def attribute_values() -> dict[str, tuple[str, ...]]:
    """The values of every :data:`PREMISE_ATTRIBUTES` attribute in the world."""
    from ..data.scene import BACKGROUNDS, COLOURS, SHAPES, SIZES, TEXTURES

    return {"size": SIZES, "colour": COLOURS, "shape": SHAPES, "texture": TEXTURES, "background": BACKGROUNDS}


@dataclass
class LabelSet:
    """A zero-shot label set: its classes (one value per attribute) and, per class, a prompt ensemble."""

    name: str
    attributes: tuple[str, ...]
    parts: list[tuple[str, ...]]
    prompts: list[list[str]]

    @property
    def names(self) -> list[str]:
        return [" ".join(p) for p in self.parts]

    def labels(self, attrs: dict[str, np.ndarray]) -> np.ndarray:
        """Class ids of images whose attribute values are ``attrs`` (attribute -> values per image)."""
        index = {p: i for i, p in enumerate(self.parts)}
        return np.array([index[p] for p in zip(*(attrs[a] for a in self.attributes))], np.int64)


def label_set(name: str, lang: str = "en") -> LabelSet:
    """The classes of label set ``name`` and their prompts ``"a photo of a {size} {colour} {texture} {shape}"``
    in the world's grammar (the paper adds prompts to the class names "as common in the literature", Sec. 4.1).
    A set without shape averages one prompt per shape (prompt ensembling; a noun phrase needs a shape noun);
    a set without texture names none (plain), one without size no size."""
    from ..data.grammars import get_grammar

    if name not in LABEL_SETS:
        raise ValueError(f"unknown label set {name!r}; choose one of {sorted(LABEL_SETS)}")
    attrs, values, g = LABEL_SETS[name], attribute_values(), get_grammar(lang)
    parts = [tuple(p) for p in itertools.product(*(values[a] for a in attrs))]
    prompts = []
    for p in parts:
        d = dict(zip(attrs, p))
        prompts.append([g.class_prompt(sh, d["colour"], d.get("size"), d.get("texture", "plain"))
                        for sh in ((d["shape"],) if "shape" in d else values["shape"])])
    return LabelSet(name, attrs, parts, prompts)
