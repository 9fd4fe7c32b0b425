"""Continual-language-learning methods by name: ``@register`` (:mod:`.base`) on a
:class:`~.base.LingualMethod` subclass adds it under its ``NAME``; :func:`create_lingual_method`
builds the one a :class:`~.learner.CLLConfig` names. The plug-in modules are imported on first use,
so importing the registry stays cheap.

=============  =================================================================  ==============
name           method                                                             file
=============  =================================================================  ==============
cll_clip       token embeddings only, Eq. 4                                       cll_clip.py
oewc           + online EWC on the table                                          ewc.py
er / der       + replay of earlier triplets / distillation of stored features     replay.py
lora           + a LoRA adapter per language (language named at inference)        adapters.py
prompt         + a soft prompt per language (language named at inference)         prompts.py
dualprompt     + shared G-prompt and E-prompts picked by key-query matching       dualprompt.py
coda_prompt    + prompt = attention-weighted sum of components (old ones frozen)  coda_prompt.py
=============  =================================================================  ==============
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LINGUAL_METHODS, register

if TYPE_CHECKING:  # pragma: no cover
    from .base import LingualMethod, MethodConfig


def _import_plugins() -> None:
    from . import adapters, cll_clip, coda_prompt, dualprompt, ewc, prompts, replay  # noqa: F401


def lingual_method_names() -> list[str]:
    """Registered names, in the order of the table above."""
    _import_plugins()
    order = ["cll_clip", "oewc", "er", "der", "lora", "prompt", "dualprompt", "coda_prompt"]
    return sorted(LINGUAL_METHODS, key=lambda n: (order.index(n) if n in order else len(order), n))


def create_lingual_method(cfg: "MethodConfig") -> "LingualMethod":
    """The method that ``cfg.method`` names, configured by ``cfg``."""
    _import_plugins()
    if cfg.method not in LINGUAL_METHODS:
        raise ValueError(f"unknown lingual method {cfg.method!r}; choose from {', '.join(lingual_method_names())}")
    return LINGUAL_METHODS[cfg.method](cfg)


__all__ = ["register", "lingual_method_names", "create_lingual_method"]
