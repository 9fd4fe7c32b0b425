"""Continual language learning (CLL-CLIP with TEIR; Yang et al. 2024): a deployed text tower learns new
languages one after another by growing and training only its token embeddings, so the image tower
and every stored image embedding stay valid.

Modules: :mod:`.vocab` (per-task vocabularies and their union), :mod:`.embeddings` (the expandable
token embedding layer), :mod:`.teir` (initialisation and per-row scales), :mod:`.losses` (Eq. 2-4),
:mod:`.tasks` (a task's triplets, its batches, the replay buffer), :mod:`.methods` (CLL-CLIP as the
training loop's plug-in), :mod:`.base` and :mod:`.registry` (the continual-learning methods as named
plug-ins with hooks: ``cll_clip``, ``oewc`` (:mod:`.ewc`), ``er`` / ``der`` (:mod:`.replay`),
``lora`` (:mod:`.adapters`), ``prompt`` (:mod:`.prompts`), ``dualprompt``, ``coda_prompt``),
:mod:`.learner` (one language after another; save / reload), :mod:`.sequence` (the task-sequence
runner and the method-name grammar), :mod:`.data` (Multi30K and world tasks / evaluation). Never
imports typer, the benches or the CLI; kept import-free so the command line starts fast: the package
exports :class:`~.learner.CLLConfig` lazily (PEP 562), so importing it does not load torch.

May import: ``_safetensors``, ``_lazy``, ``data``, ``encoders``, ``evaluate``, ``metrics``, ``train``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers and the API reference; at run time ``__getattr__`` imports it
    from .learner import CLLConfig

#: public name -> submodule, imported on first use (the learner imports torch)
_EXPORTS = {"CLLConfig": "learner"}

__all__ = ["CLLConfig"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
