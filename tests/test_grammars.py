"""Tests of the per-language caption grammars (parallel captions of the synthetic world)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from nobackfill.data.grammars import Grammar, get_grammar, languages
from nobackfill.data.scene import COLOURS, SHAPES, Scene, sample_scene

SCRIPT_RANGES = {"Cyrillic": ("\u0400", "\u04ff"), "Greek": ("\u0370", "\u03ff"),
                 "Han": ("\u4e00", "\u9fff")}
ASCII_LETTER = re.compile(r"[A-Za-z]")


@pytest.fixture(scope="module")
def scenes() -> list[Scene]:
    return [sample_scene(np.random.default_rng(seed)) for seed in range(200)]


@pytest.mark.parametrize("lang", languages())
def test_captions_well_formed(lang: str, scenes: list[Scene]) -> None:
    g = get_grammar(lang)
    assert g.lang == lang and g.n_variants == 4
    for scene in scenes:
        colour_word, shape_word = g.concept_words(scene.main.shape, scene.main.colour)
        for v in range(g.n_variants):
            cap = g.caption(scene, v)
            assert isinstance(cap, str) and cap
            assert cap == g.caption(scene, v) == get_grammar(lang).caption(scene, v + g.n_variants)
            assert cap == cap.lower() and not cap.endswith(".")
            assert colour_word in cap and shape_word in cap, (lang, v, cap)
            if g.script in SCRIPT_RANGES:
                lo, hi = SCRIPT_RANGES[g.script]
                assert any(lo <= ch <= hi for ch in cap), cap
                assert not ASCII_LETTER.search(cap), cap


@pytest.mark.parametrize("lang", languages())
def test_main_colour_changes_caption(lang: str, scenes: list[Scene]) -> None:
    g = get_grammar(lang)
    for scene in scenes[:50]:
        other = next(c for c in COLOURS if c != scene.main.colour)
        recoloured = Scene(scene.background,
                           (dataclasses.replace(scene.main, colour=other),) + scene.objects[1:])
        for v in range(g.n_variants):
            assert g.caption(scene, v) != g.caption(recoloured, v)


@pytest.mark.parametrize("lang", languages())
def test_captions_parallel_to_english(lang: str, scenes: list[Scene]) -> None:
    """Per variant, English caption <-> caption is one-to-one: the same information is carried."""
    en, g = get_grammar("en"), get_grammar(lang)
    for v in range(4):
        pairs = {(en.caption(s, v), g.caption(s, v)) for s in scenes}
        assert len({a for a, _ in pairs}) == len({b for _, b in pairs}) == len(pairs)


@pytest.mark.parametrize("lang", languages())
def test_concept_words_distinct(lang: str) -> None:
    g = get_grammar(lang)
    for shape in SHAPES:
        assert len({g.concept_words(shape, c)[0] for c in COLOURS}) == len(COLOURS)
    for colour in COLOURS:
        assert len({g.concept_words(s, colour)[1] for s in SHAPES}) == len(SHAPES)


@pytest.mark.parametrize("lang", languages())
def test_class_prompt(lang: str) -> None:
    g = get_grammar(lang)
    prompts = {g.class_prompt(s, c) for s in SHAPES for c in COLOURS}
    assert len(prompts) == len(SHAPES) * len(COLOURS)
    assert g.class_prompt("circle", "red", "large") != g.class_prompt("circle", "red", "small")


def test_registry() -> None:
    langs = languages()
    assert langs == ["en", "de", "fr", "es", "ru", "el", "zh"]
    grammars = [get_grammar(lang) for lang in langs]
    assert all(isinstance(g, Grammar) for g in grammars)
    assert len({g.script for g in grammars} - {"Latin"}) >= 2
    with pytest.raises(ValueError, match="known: .*'de'"):
        get_grammar("xx")
