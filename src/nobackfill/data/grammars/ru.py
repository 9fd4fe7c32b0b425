"""Russian grammar: size and colour adjectives agree with the shape noun in gender and case
(nominative main object; genitive after ``слева/справа от``, instrumental after ``над/под/с``).
Textures are invariable phrases after the noun (``в полоску``)."""

from __future__ import annotations

from .base import TableGrammar

_VELAR_SIBILANT = "кгхжшчщ"  # after these, -ы- is spelt -и-
#: adjective endings: (gender, case) -> (hard ending, soft ending)
_ADJ = {("m", "nom"): ("ый", "ий"), ("f", "nom"): ("ая", "яя"), ("n", "nom"): ("ое", "ее"),
        ("m", "gen"): ("ого", "его"), ("f", "gen"): ("ой", "ей"), ("n", "gen"): ("ого", "его"),
        ("m", "ins"): ("ым", "им"), ("f", "ins"): ("ой", "ей"), ("n", "ins"): ("ым", "им")}
#: noun endings by gender and case (nominative lemma: -consonant (m), -а (f), -о (n))
_NOUN = {("m", "gen"): "а", ("m", "ins"): "ом", ("f", "gen"): "ы", ("f", "ins"): "ой",
         ("n", "gen"): "а", ("n", "ins"): "ом"}


class RussianGrammar(TableGrammar):
    lang = "ru"
    script = "Cyrillic"

    ORDER = ("size", "colour", "shape", "texture")
    SHAPE = {"circle": ("круг", "m"), "square": ("квадрат", "m"), "triangle": ("треугольник", "m"),
             "diamond": ("ромб", "m"), "cross": ("крест", "m"), "star": ("звезда", "f"),
             "hexagon": ("шестиугольник", "m"), "ring": ("кольцо", "n")}
    COLOUR = {"red": "красный", "green": "зелёный", "blue": "синий", "yellow": "жёлтый",
              "purple": "фиолетовый", "orange": "оранжевый", "white": "белый", "black": "чёрный"}
    SIZE = {"small": "маленький", "large": "большой"}
    TEXTURE = {"plain": "", "striped": "в полоску", "dotted": "в горошек", "checkered": "в клетку"}
    WHERE = {"center": "в центре", "h": "{h}", "v": "{v}", "hv": "{v} {h}"}
    HPOS = {"left": "слева", "right": "справа"}
    VPOS = {"top": "вверху", "bottom": "внизу"}
    HEADS = ("{np} {where}", "имеется {np} {where}", "{where} находится {np}",
             "на картинке {np} {where}")
    REL_OF = {"left_of": ("слева от {np}", "gen"), "right_of": ("справа от {np}", "gen"),
              "above": ("над {np}", "ins"), "below": ("под {np}", "ins")}
    WITH = ("с {np} {rel}", "ins")
    REL_IT = {"left_of": "слева от {gen}", "right_of": "справа от {gen}", "above": "над {ins}",
              "below": "под {ins}"}
    PRONOUN = {"m": {"gen": "него", "ins": "ним"}, "n": {"gen": "него", "ins": "ним"},
               "f": {"gen": "неё", "ins": "ней"}}
    BACKGROUND = {"gray": ("на сером фоне", "серый фон"),
                  "sand": ("на песочном фоне", "песочный фон"),
                  "sky": ("на небесно-голубом фоне", "небесно-голубой фон"),
                  "grass": ("на травянисто-зелёном фоне", "травянисто-зелёный фон")}
    PROMPT = ("фотография {np}", "gen", False)

    def adjective(self, lemma: str, gender: str, case: str) -> str:
        stem, end = lemma[:-2], lemma[-2:]
        if end not in ("ый", "ий", "ой"):
            return lemma  # invariable phrase (textures)
        if (gender, case) == ("m", "nom"):
            return lemma
        soft = end == "ий" and stem[-1] not in _VELAR_SIBILANT
        ending = _ADJ[gender, case][soft]
        if ending == "ым" and stem[-1] in _VELAR_SIBILANT:
            ending = "им"
        return stem + ending

    def noun(self, lemma: str, gender: str, case: str) -> str:
        if case == "nom":
            return lemma
        stem = lemma if gender == "m" else lemma[:-1]
        return stem + _NOUN[gender, case]
