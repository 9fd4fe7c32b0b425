"""English grammar: the reference for every other language's grammar."""

from __future__ import annotations

from ..scene import Scene, SceneObject
from .base import Grammar


class EnglishGrammar(Grammar):
    lang = "en"
    script = "Latin"
    n_variants = 4

    TEXTURE = {"plain": "", "striped": "striped", "dotted": "dotted", "checkered": "checkered"}
    HPOS = {"left": "left", "center": "center", "right": "right"}
    VPOS = {"top": "top", "middle": "middle", "bottom": "bottom"}
    REL = {"left_of": "left of", "right_of": "right of", "above": "above", "below": "below"}
    BG = {"gray": "gray", "sand": "sand", "sky": "sky blue", "grass": "grass green"}

    def noun_phrase(self, o: SceneObject, article: bool = True) -> str:
        words = [o.size, o.colour, self.TEXTURE[o.texture], o.shape]
        np_ = " ".join(w for w in words if w)
        return f"a {np_}" if article else np_

    def where(self, o: SceneObject) -> str:
        if o.hpos == "center" and o.vpos == "middle":
            return "in the center"
        if o.vpos == "middle":
            return f"on the {self.HPOS[o.hpos]}"
        if o.hpos == "center":
            return f"at the {self.VPOS[o.vpos]}"
        return f"at the {self.VPOS[o.vpos]} {self.HPOS[o.hpos]}"

    def caption(self, scene: Scene, variant: int = 0) -> str:
        v = variant % self.n_variants
        objs = scene.objects
        main = objs[0]
        bg = self.BG[scene.background]
        parts = []
        if v == 0:
            parts.append(f"{self.noun_phrase(main)} {self.where(main)}")
        elif v == 1:
            parts.append(f"there is {self.noun_phrase(main)} {self.where(main)}")
        elif v == 2:
            parts.append(f"{self.where(main)} is {self.noun_phrase(main)}")
        else:
            parts.append(f"a picture of {self.noun_phrase(main)} {self.where(main)}")
        for i in range(1, len(objs)):
            rel = self.REL[scene.relation(0, i)] if v % 2 == 0 else self.REL[scene.relation(i, 0)]
            if v % 2 == 0:
                parts.append(f"{rel} {self.noun_phrase(objs[i])}")
            else:
                parts.append(f"with {self.noun_phrase(objs[i])} {rel} it")
        text = ", ".join(parts)
        return f"{text}, on a {bg} background" if v < 2 else f"{text}, {bg} background"

    def class_prompt(self, shape: str, colour: str, size: str | None = None, texture: str = "plain") -> str:
        words = " ".join(w for w in (size, colour, self.TEXTURE[texture], shape) if w)
        return f"a photo of a {words}"
