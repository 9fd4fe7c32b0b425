"""French grammar: colour and texture follow the noun, size precedes it; adjectives agree in
gender with the shape noun. French has no case, so every noun phrase is ``"nom"``."""

from __future__ import annotations

from .base import TableGrammar

#: irregular feminine adjective forms; other adjectives add -e unless they end in -e already
_FEMININE = {"blanc": "blanche", "violet": "violette"}


class FrenchGrammar(TableGrammar):
    lang = "fr"
    script = "Latin"

    ORDER = ("art", "size", "shape", "colour", "texture")
    SHAPE = {"circle": ("cercle", "m"), "square": ("carré", "m"), "triangle": ("triangle", "m"),
             "diamond": ("losange", "m"), "cross": ("croix", "f"), "star": ("étoile", "f"),
             "hexagon": ("hexagone", "m"), "ring": ("anneau", "m")}
    COLOUR = {"red": "rouge", "green": "vert", "blue": "bleu", "yellow": "jaune", "purple": "violet",
              "orange": "orange", "white": "blanc", "black": "noir"}
    SIZE = {"small": "petit", "large": "grand"}
    TEXTURE = {"plain": "", "striped": "rayé", "dotted": "à pois", "checkered": "à carreaux"}
    ARTICLE = {("m", "nom"): "un", ("f", "nom"): "une"}
    WHERE = {"center": "au centre", "h": "à {h}", "v": "en {v}", "hv": "en {v} à {h}"}
    HPOS = {"left": "gauche", "right": "droite"}
    VPOS = {"top": "haut", "bottom": "bas"}
    HEADS = ("{np} {where}", "il y a {np} {where}", "{where} se trouve {np}",
             "une image d'{np} {where}")
    REL_OF = {"left_of": ("à gauche d'{np}", "nom"), "right_of": ("à droite d'{np}", "nom"),
              "above": ("au-dessus d'{np}", "nom"), "below": ("au-dessous d'{np}", "nom")}
    WITH = ("avec {np} {rel}", "nom")
    REL_IT = {"left_of": "à sa gauche", "right_of": "à sa droite", "above": "au-dessus",
              "below": "en dessous"}
    BACKGROUND = {"gray": ("sur un fond gris", "fond gris"),
                  "sand": ("sur un fond sable", "fond sable"),
                  "sky": ("sur un fond bleu ciel", "fond bleu ciel"),
                  "grass": ("sur un fond vert gazon", "fond vert gazon")}
    PROMPT = ("une photo d'{np}", "nom", True)

    def adjective(self, lemma: str, gender: str, case: str) -> str:
        if gender != "f" or lemma.endswith("e") or " " in lemma:
            return lemma
        return _FEMININE.get(lemma, lemma + "e")
