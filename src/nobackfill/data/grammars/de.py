"""German grammar: adjectives agree with the noun's gender after the indefinite article
(nominative for the main object, dative after prepositions). Lower-case like every caption."""

from __future__ import annotations

from .base import TableGrammar

#: mixed-declension adjective endings after ein/eine/einem/einer: (gender, case) -> ending
_ENDING = {("m", "nom"): "er", ("f", "nom"): "e", ("n", "nom"): "es",
           ("m", "dat"): "en", ("f", "dat"): "en", ("n", "dat"): "en"}


class GermanGrammar(TableGrammar):
    lang = "de"
    script = "Latin"

    SHAPE = {"circle": ("kreis", "m"), "square": ("quadrat", "n"), "triangle": ("dreieck", "n"),
             "diamond": ("raute", "f"), "cross": ("kreuz", "n"), "star": ("stern", "m"),
             "hexagon": ("sechseck", "n"), "ring": ("ring", "m")}
    COLOUR = {"red": "rot", "green": "grün", "blue": "blau", "yellow": "gelb", "purple": "violett",
              "orange": "orangefarben", "white": "weiß", "black": "schwarz"}
    SIZE = {"small": "klein", "large": "groß"}
    TEXTURE = {"plain": "", "striped": "gestreift", "dotted": "gepunktet", "checkered": "kariert"}
    ARTICLE = {("m", "nom"): "ein", ("f", "nom"): "eine", ("n", "nom"): "ein",
               ("m", "dat"): "einem", ("f", "dat"): "einer", ("n", "dat"): "einem"}
    WHERE = {"center": "in der mitte", "h": "{h}", "v": "{v}", "hv": "{v} {h}"}
    HPOS = {"left": "links", "right": "rechts"}
    VPOS = {"top": "oben", "bottom": "unten"}
    HEADS = ("{np} {where}", "hier ist {np} {where}", "{where} ist {np}", "zu sehen ist {np} {where}")
    REL_OF = {"left_of": ("links von {np}", "dat"), "right_of": ("rechts von {np}", "dat"),
              "above": ("über {np}", "dat"), "below": ("unter {np}", "dat")}
    WITH = ("mit {np} {rel}", "dat")
    REL_IT = {"left_of": "links davon", "right_of": "rechts davon", "above": "darüber",
              "below": "darunter"}
    BACKGROUND = {"gray": ("auf einem grauen hintergrund", "grauer hintergrund"),
                  "sand": ("auf einem sandfarbenen hintergrund", "sandfarbener hintergrund"),
                  "sky": ("auf einem himmelblauen hintergrund", "himmelblauer hintergrund"),
                  "grass": ("auf einem grasgrünen hintergrund", "grasgrüner hintergrund")}
    PROMPT = ("ein foto von {np}", "dat", True)

    def adjective(self, lemma: str, gender: str, case: str) -> str:
        return lemma + _ENDING[gender, case]
