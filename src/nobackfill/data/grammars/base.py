"""Grammar interface: renders a :class:`~nobackfill.data.scene.Scene` as a caption in one language.

:class:`TableGrammar` is the shared machinery of the non-English grammars: the caption structure
(one clause for the main object, one per other object, one for the background) mirrors the English
reference grammar exactly, and a language supplies only word tables, templates and its inflection
of adjectives and nouns for gender and case.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from ..scene import Scene, SceneObject


class Grammar(abc.ABC):
    """One language's caption grammar. Variants are paraphrase templates of the same content."""

    lang: str = ""
    script: str = "Latin"
    n_variants: int = 1

    @abc.abstractmethod
    def caption(self, scene: Scene, variant: int = 0) -> str:
        """The caption of ``scene`` with paraphrase template ``variant`` (taken modulo n_variants)."""

    @abc.abstractmethod
    def class_prompt(self, shape: str, colour: str, size: str | None = None, texture: str = "plain") -> str:
        """Zero-shot prompt, e.g. English ``"a photo of a red circle"`` (``"plain"`` texture: no word, as in captions)."""

    def concept_words(self, shape: str, colour: str) -> tuple[str, ...]:
        """The colour and shape words of a main object of this shape and colour, in the form in
        which they appear in captions (English: the concept names themselves)."""
        return (colour, shape)


class TableGrammar(Grammar):
    """A grammar driven by word tables; subclasses fill the tables and override the inflection.

    Cases are free-form names (``"nom"`` for the main object; others as the language needs,
    named in :attr:`REL_OF`, :attr:`WITH` and :attr:`PROMPT`); genders are those of :attr:`SHAPE`.
    """

    n_variants = 4
    #: order of the slots of a noun phrase: art(icle), size, colour, texture, shape
    ORDER: ClassVar[tuple[str, ...]] = ("art", "size", "colour", "texture", "shape")
    JOIN: ClassVar[str] = " "  # between words
    SEP: ClassVar[str] = ", "  # between clauses
    SHAPE: ClassVar[dict[str, tuple[str, str]]]  # shape -> (noun lemma, gender)
    COLOUR: ClassVar[dict[str, str]]  # colour -> adjective lemma
    SIZE: ClassVar[dict[str, str]]
    TEXTURE: ClassVar[dict[str, str]]  # "plain" -> "" (not mentioned)
    ARTICLE: ClassVar[dict[tuple[str, str], str]] = {}  # (gender, case) -> indefinite article
    #: position phrases: keys "center", "h" ({h}), "v" ({v}), "hv" ({h} and {v})
    WHERE: ClassVar[dict[str, str]]
    HPOS: ClassVar[dict[str, str]]  # left/right
    VPOS: ClassVar[dict[str, str]]  # top/bottom
    #: main-object clause per variant, with {np} (nominative) and {where}
    HEADS: ClassVar[tuple[str, str, str, str]]
    #: variants 0/2: relation of the main object to another: rel -> (template with {np}, case)
    REL_OF: ClassVar[dict[str, tuple[str, str]]]
    #: variants 1/3: "with <np> <rel> it": (template with {np} and {rel}, case)
    WITH: ClassVar[tuple[str, str]]
    #: relation of another object to the main one ("left of it"); may use :attr:`PRONOUN` fields
    REL_IT: ClassVar[dict[str, str]]
    PRONOUN: ClassVar[dict[str, dict[str, str]]] = {}  # gender of the main object -> fields
    BACKGROUND: ClassVar[dict[str, tuple[str, str]]]  # bg -> (variants 0/1 "on a ..", 2/3 "..")
    PROMPT: ClassVar[tuple[str, str, bool]]  # (template with {np}, case, with article)

    def adjective(self, lemma: str, gender: str, case: str) -> str:
        """``lemma`` agreeing with a noun of ``gender`` in ``case`` (default: invariable)."""
        return lemma

    def noun(self, lemma: str, gender: str, case: str) -> str:
        """The shape noun ``lemma`` in ``case`` (default: invariable)."""
        return lemma

    def noun_phrase(self, shape: str, colour: str, size: str | None = None, texture: str = "plain",
                    case: str = "nom", article: bool = True) -> str:
        """Indefinite noun phrase, e.g. German ``"ein großer roter gestreifter kreis"``."""
        lemma, gender = self.SHAPE[shape]
        adjectives = {"size": self.SIZE[size] if size else "", "colour": self.COLOUR[colour],
                      "texture": self.TEXTURE[texture]}
        words = {k: self.adjective(w, gender, case) if w else "" for k, w in adjectives.items()}
        words["art"] = self.ARTICLE.get((gender, case), "") if article else ""
        words["shape"] = self.noun(lemma, gender, case)
        return self.JOIN.join(words[slot] for slot in self.ORDER if words[slot])

    def object_phrase(self, o: SceneObject, case: str = "nom") -> str:
        """:meth:`noun_phrase` of a scene object."""
        return self.noun_phrase(o.shape, o.colour, o.size, o.texture, case)

    def where(self, o: SceneObject) -> str:
        """Position phrase of ``o`` (the same nine positions as English)."""
        if (o.hpos, o.vpos) == ("center", "middle"):
            return self.WHERE["center"]
        key = "v" if o.hpos == "center" else "h" if o.vpos == "middle" else "hv"
        return self.WHERE[key].format(h=self.HPOS.get(o.hpos, ""), v=self.VPOS.get(o.vpos, ""))

    def caption(self, scene: Scene, variant: int = 0) -> str:
        v = variant % self.n_variants
        main = scene.main
        clauses = [self.HEADS[v].format(np=self.object_phrase(main), where=self.where(main))]
        pronoun = self.PRONOUN.get(self.SHAPE[main.shape][1], {})
        for i, other in enumerate(scene.objects[1:], start=1):
            if v % 2 == 0:
                template, case = self.REL_OF[scene.relation(0, i)]
                clauses.append(template.format(np=self.object_phrase(other, case)))
            else:
                template, case = self.WITH
                rel = self.REL_IT[scene.relation(i, 0)].format(**pronoun)
                clauses.append(template.format(np=self.object_phrase(other, case), rel=rel))
        clauses.append(self.BACKGROUND[scene.background][0 if v < 2 else 1])
        return self.SEP.join(clauses)

    def class_prompt(self, shape: str, colour: str, size: str | None = None, texture: str = "plain") -> str:
        template, case, article = self.PROMPT
        return template.format(np=self.noun_phrase(shape, colour, size, texture, case=case, article=article))

    def concept_words(self, shape: str, colour: str) -> tuple[str, ...]:
        lemma, gender = self.SHAPE[shape]
        return (self.adjective(self.COLOUR[colour], gender, "nom"), self.noun(lemma, gender, "nom"))
