"""Spanish grammar: colour and texture follow the noun, size precedes it (``gran`` is the
prenominal form of ``grande``); adjectives in -o agree in gender with the shape noun."""

from __future__ import annotations

from .base import TableGrammar


class SpanishGrammar(TableGrammar):
    lang = "es"
    script = "Latin"

    ORDER = ("art", "size", "shape", "colour", "texture")
    SHAPE = {"circle": ("círculo", "m"), "square": ("cuadrado", "m"), "triangle": ("triángulo", "m"),
             "diamond": ("rombo", "m"), "cross": ("cruz", "f"), "star": ("estrella", "f"),
             "hexagon": ("hexágono", "m"), "ring": ("anillo", "m")}
    COLOUR = {"red": "rojo", "green": "verde", "blue": "azul", "yellow": "amarillo",
              "purple": "morado", "orange": "naranja", "white": "blanco", "black": "negro"}
    SIZE = {"small": "pequeño", "large": "gran"}
    TEXTURE = {"plain": "", "striped": "a rayas", "dotted": "a lunares", "checkered": "a cuadros"}
    ARTICLE = {("m", "nom"): "un", ("f", "nom"): "una"}
    WHERE = {"center": "en el centro", "h": "a la {h}", "v": "{v}", "hv": "{v} a la {h}"}
    HPOS = {"left": "izquierda", "right": "derecha"}
    VPOS = {"top": "arriba", "bottom": "abajo"}
    HEADS = ("{np} {where}", "hay {np} {where}", "{where} se encuentra {np}",
             "una imagen de {np} {where}")
    REL_OF = {"left_of": ("a la izquierda de {np}", "nom"), "right_of": ("a la derecha de {np}", "nom"),
              "above": ("encima de {np}", "nom"), "below": ("debajo de {np}", "nom")}
    WITH = ("con {np} {rel}", "nom")
    REL_IT = {"left_of": "a su izquierda", "right_of": "a su derecha", "above": "encima",
              "below": "debajo"}
    BACKGROUND = {"gray": ("sobre un fondo gris", "fondo gris"),
                  "sand": ("sobre un fondo arena", "fondo arena"),
                  "sky": ("sobre un fondo azul cielo", "fondo azul cielo"),
                  "grass": ("sobre un fondo verde hierba", "fondo verde hierba")}
    PROMPT = ("una foto de {np}", "nom", True)

    def adjective(self, lemma: str, gender: str, case: str) -> str:
        return lemma[:-1] + "a" if gender == "f" and lemma.endswith("o") else lemma
