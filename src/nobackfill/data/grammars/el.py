"""Greek grammar: article, size and colour agree with the shape noun in gender and case
(nominative main object; accusative after ``από`` and ``με``). Loan colours and textures
(``μπλε``, ``ριγέ``) are invariable."""

from __future__ import annotations

from .base import TableGrammar

#: endings of -ος adjectives and masculine nouns: (gender, case) -> ending replacing -ος
_ENDING = {("m", "nom"): "ος", ("m", "acc"): "ο", ("f", "nom"): "η", ("f", "acc"): "η",
           ("n", "nom"): "ο", ("n", "acc"): "ο"}
_ACCENTED = str.maketrans("οη", "όή")


class GreekGrammar(TableGrammar):
    lang = "el"
    script = "Greek"

    SHAPE = {"circle": ("κύκλος", "m"), "square": ("τετράγωνο", "n"), "triangle": ("τρίγωνο", "n"),
             "diamond": ("ρόμβος", "m"), "cross": ("σταυρός", "m"), "star": ("αστέρι", "n"),
             "hexagon": ("εξάγωνο", "n"), "ring": ("δακτύλιος", "m")}
    COLOUR = {"red": "κόκκινος", "green": "πράσινος", "blue": "μπλε", "yellow": "κίτρινος",
              "purple": "μωβ", "orange": "πορτοκαλί", "white": "άσπρος", "black": "μαύρος"}
    SIZE = {"small": "μικρός", "large": "μεγάλος"}
    TEXTURE = {"plain": "", "striped": "ριγέ", "dotted": "πουά", "checkered": "καρό"}
    ARTICLE = {("m", "nom"): "ένας", ("f", "nom"): "μια", ("n", "nom"): "ένα",
               ("m", "acc"): "έναν", ("f", "acc"): "μια", ("n", "acc"): "ένα"}
    WHERE = {"center": "στο κέντρο", "h": "στα {h}", "v": "στο {v} μέρος", "hv": "{v} {h}"}
    HPOS = {"left": "αριστερά", "right": "δεξιά"}
    VPOS = {"top": "πάνω", "bottom": "κάτω"}
    HEADS = ("{np} {where}", "υπάρχει {np} {where}", "{where} βρίσκεται {np}",
             "στην εικόνα {np} {where}")
    REL_OF = {"left_of": ("αριστερά από {np}", "acc"), "right_of": ("δεξιά από {np}", "acc"),
              "above": ("πάνω από {np}", "acc"), "below": ("κάτω από {np}", "acc")}
    WITH = ("με {np} {rel}", "acc")
    REL_IT = {"left_of": "αριστερά {gen}", "right_of": "δεξιά {gen}", "above": "πάνω {gen}",
              "below": "κάτω {gen}"}
    PRONOUN = {"m": {"gen": "του"}, "n": {"gen": "του"}, "f": {"gen": "της"}}
    BACKGROUND = {"gray": ("σε γκρι φόντο", "γκρι φόντο"),
                  "sand": ("σε αμμόχρωμο φόντο", "αμμόχρωμο φόντο"),
                  "sky": ("σε γαλάζιο φόντο", "γαλάζιο φόντο"),
                  "grass": ("σε χλοοπράσινο φόντο", "χλοοπράσινο φόντο")}
    PROMPT = ("μια φωτογραφία με {np}", "acc", True)

    def adjective(self, lemma: str, gender: str, case: str) -> str:
        if lemma.endswith("ος"):
            return lemma[:-2] + _ENDING[gender, case]
        if lemma.endswith("ός"):
            return lemma[:-2] + _ENDING[gender, case].translate(_ACCENTED)
        return lemma  # invariable (μπλε, ριγέ, ...)

    def noun(self, lemma: str, gender: str, case: str) -> str:
        # masculine nouns in -ος decline like the adjectives; the neuter nouns here do not change
        return self.adjective(lemma, gender, case)
