"""The semantic model of a world scene: what is in the picture, independent of pixels and words.

A :class:`Scene` is rendered to pixels by :mod:`nobackfill.data.render` and to captions by the
per-language grammars in :mod:`nobackfill.data.grammars`. Because every language renders the same
scene, captions in different languages of one image are parallel (translations of each other).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

SHAPES: tuple[str, ...] = (
    "circle", "square", "triangle", "diamond", "cross", "star", "hexagon", "ring",
)
COLOURS: tuple[str, ...] = (
    "red", "green", "blue", "yellow", "purple", "orange", "white", "black",
)
SIZES: tuple[str, ...] = ("small", "large")
TEXTURES: tuple[str, ...] = ("plain", "striped", "dotted", "checkered")
BACKGROUNDS: tuple[str, ...] = ("gray", "sand", "sky", "grass")
HPOS: tuple[str, ...] = ("left", "center", "right")
VPOS: tuple[str, ...] = ("top", "middle", "bottom")
RELATIONS: tuple[str, ...] = ("left_of", "right_of", "above", "below")

#: RGB of each colour word (objects) and background word
COLOUR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
    "yellow": (240, 220, 40), "purple": (140, 50, 170), "orange": (245, 140, 20),
    "white": (250, 250, 250), "black": (15, 15, 15),
}
BACKGROUND_RGB: dict[str, tuple[int, int, int]] = {
    "gray": (128, 128, 128), "sand": (200, 180, 130), "sky": (150, 200, 235),
    "grass": (110, 150, 90),
}
#: radius in pixels (of a 64-pixel canvas) for each size word
SIZE_RADIUS: dict[str, float] = {"small": 7.0, "large": 12.0}


@dataclass(frozen=True)
class SceneObject:
    """One object; ``x``/``y`` are its centre as fractions of the canvas (0 = left / top)."""

    shape: str
    colour: str
    size: str
    texture: str
    x: float
    y: float
    rotation: float = 0.0

    @property
    def hpos(self) -> str:
        return HPOS[min(2, int(self.x * 3))]

    @property
    def vpos(self) -> str:
        return VPOS[min(2, int(self.y * 3))]

    @property
    def concept(self) -> str:
        """The class label of the object: ``"<colour> <shape>"`` in English words."""
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """Background plus 1-3 objects. ``objects[0]`` is the main object (the class label)."""

    background: str
    objects: tuple[SceneObject, ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def main(self) -> SceneObject:
        return self.objects[0]

    def relation(self, i: int, j: int) -> str:
        """Spatial relation of object ``i`` relative to object ``j`` (dominant axis)."""
        a, b = self.objects[i], self.objects[j]
        dx, dy = a.x - b.x, a.y - b.y
        if abs(dx) >= abs(dy):
            return "left_of" if dx < 0 else "right_of"
        return "above" if dy < 0 else "below"

    def labels(self) -> dict:
        """Classification labels of the scene (shape x colour of the main object etc.)."""
        m = self.main
        return {
            "class": f"{m.colour} {m.shape}",
            "class_id": COLOURS.index(m.colour) * len(SHAPES) + SHAPES.index(m.shape),
            "shape": m.shape,
            "colour": m.colour,
            "size": m.size,
            "texture": m.texture,
            "fine_class": f"{m.size} {m.colour} {m.shape}",
            "n_objects": len(self.objects),
            "background": self.background,
        }


def class_names() -> list[str]:
    """All ``"<colour> <shape>"`` classes in class_id order."""
    return [f"{c} {s}" for c in COLOURS for s in SHAPES]


@dataclass(frozen=True)
class ConceptSet:
    """Which shapes/colours a world (or a model's training data) may contain."""

    shapes: tuple[str, ...] = SHAPES
    colours: tuple[str, ...] = COLOURS

    def __post_init__(self) -> None:
        bad = [s for s in self.shapes if s not in SHAPES] + [c for c in self.colours if c not in COLOURS]
        if bad:
            raise ValueError(f"unknown concept(s) {bad}; shapes are {SHAPES}, colours {COLOURS}")
        if not self.shapes or not self.colours:
            raise ValueError("a concept set needs at least one shape and one colour")

    @classmethod
    def parse(cls, shapes: Sequence[str] | None = None, colours: Sequence[str] | None = None) -> "ConceptSet":
        return cls(tuple(shapes) if shapes else SHAPES, tuple(colours) if colours else COLOURS)


def sample_scene(rng: np.random.Generator, concepts: ConceptSet = ConceptSet(), max_objects: int = 3) -> Scene:
    """Draw one scene: 1..max_objects non-overlapping objects; hard negatives arise naturally
    (the same objects with swapped attributes are other scenes of the same distribution)."""
    n = int(rng.integers(1, max_objects + 1))
    objs: list[SceneObject] = []
    tries = 0
    while len(objs) < n and tries < 50:
        tries += 1
        size = SIZES[int(rng.integers(len(SIZES)))]
        r = SIZE_RADIUS[size] / 64.0
        x = float(rng.uniform(r, 1 - r))
        y = float(rng.uniform(r, 1 - r))
        if any(np.hypot(x - o.x, y - o.y) < r + SIZE_RADIUS[o.size] / 64.0 + 0.02 for o in objs):
            continue
        objs.append(
            SceneObject(
                shape=concepts.shapes[int(rng.integers(len(concepts.shapes)))],
                colour=concepts.colours[int(rng.integers(len(concepts.colours)))],
                size=size,
                texture=TEXTURES[int(rng.integers(len(TEXTURES)))],
                x=x, y=y, rotation=float(rng.uniform(-0.3, 0.3)),
            )
        )
    bg = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    return Scene(background=bg, objects=tuple(objs))
