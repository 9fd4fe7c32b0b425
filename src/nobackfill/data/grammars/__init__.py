"""Per-language caption grammars. ``get_grammar("de")`` returns the German one.

May import: nothing of nobackfill.
"""

from __future__ import annotations

from .base import Grammar, TableGrammar
from .de import GermanGrammar
from .el import GreekGrammar
from .en import EnglishGrammar
from .es import SpanishGrammar
from .fr import FrenchGrammar
from .ru import RussianGrammar
from .zh import ChineseGrammar

_GRAMMARS: dict[str, type[Grammar]] = {
    g.lang: g for g in (EnglishGrammar, GermanGrammar, FrenchGrammar, SpanishGrammar,
                        RussianGrammar, GreekGrammar, ChineseGrammar)
}


def register(cls: type[Grammar]) -> type[Grammar]:
    _GRAMMARS[cls.lang] = cls
    return cls


def languages() -> list[str]:
    """Codes of every language with a grammar, English first."""
    return list(_GRAMMARS)


def get_grammar(lang: str) -> Grammar:
    try:
        return _GRAMMARS[lang]()
    except KeyError:
        raise ValueError(f"no grammar for language {lang!r}; known: {sorted(_GRAMMARS)}") from None


__all__ = [
    "Grammar", "TableGrammar", "EnglishGrammar", "GermanGrammar", "FrenchGrammar", "SpanishGrammar",
    "RussianGrammar", "GreekGrammar", "ChineseGrammar", "get_grammar", "languages", "register",
]
