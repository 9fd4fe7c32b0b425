"""The plug-in base of continual language learning (CLL-CLIP, Yang et al. 2024): a :class:`LingualMethod`
says what a baseline adds to CLL-CLIP through hooks that :class:`~.learner.ContinualLearner` and
the one training loop call (the shape of mammoth's ``NAME`` / ``begin_task`` / ``observe`` /
``end_task``):

* ``begin_task(learner, task)`` - after the vocabulary grew, before TEIR's scales are computed:
  add the task's own modules (adapter, prompt rows, prompt vectors) and return their parameters;
* ``replay()`` - a :class:`~.tasks.ReplayBuffer` whose items join each batch (ER / DER);
* ``observe(trainer, batch, step)`` - extra loss terms beside Eq. 4 (EWC penalty, replay, keys);
* ``end_task(learner, task, english, batches)`` - consolidate (Fisher, memory, freeze);
* ``state()`` / ``load_state(encoder, tensors, meta)`` - what survives a save: tensors (written
  with safetensors) and JSON-able metadata; ``load_state`` also re-attaches the method's
  per-language modules to a freshly loaded encoder;
* ``model_to_save(encoder)`` - the encoder as the model directory holds it (LoRA: without its
  adapters, which live in the state).

TEIR (initialisation + the row scales of Eq. 5-6) is orthogonal to the method: every method runs
with or without it (``CLLConfig.teir``); the loop's ``before_backward`` / ``after_step`` hooks of
:class:`~.methods.CLLCLIPMethod` apply it.

``@register`` adds a method under its ``NAME`` (:mod:`.registry` builds them by name). What a method
sees of the learner, the trainer and the config is declared here (:class:`Learner`,
:class:`Trainer`, :class:`MethodConfig`), so this module imports neither the learner nor the
trainer, which import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Sequence

import numpy as np
import torch

from .tasks import Tensors

if TYPE_CHECKING:  # pragma: no cover
    from .tasks import LanguageTask, LingualBatch, ReplayBuffer, TaskBatches


class MethodConfig(Protocol):
    """The fields of :class:`~.learner.CLLConfig` that the methods read."""

    method: str
    seed: int
    memory_size: int
    der_alpha: float
    ewc_strength: float
    ewc_gamma: float
    ewc_batches: int
    lora_rank: int
    lora_alpha: int
    prompt_length: int
    g_prompt_length: int
    key_match_weight: float
    coda_components: int


class Trainer(Protocol):
    """What a method uses of :class:`~.methods.CLLCLIPMethod`, the loop's plug-in of one task."""

    encoder: Any
    weight: torch.nn.Parameter

    def task_loss(self, english: torch.Tensor, foreign: Sequence[str],
                  images: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]: ...

    def close(self) -> None: ...


class Learner(Protocol):
    """What a method uses of :class:`~.learner.ContinualLearner`."""

    encoder: Any
    generator: torch.Generator

    def new_row_stats(self) -> tuple[float, float]: ...

    def trainer(self, scales: np.ndarray, extra: Sequence[torch.nn.Parameter] = (),
                plugin: "LingualMethod | None" = None) -> Trainer: ...


class LingualMethod:
    """A continual-language-learning method over CLL-CLIP; subclasses set :attr:`NAME` and
    override the hooks they need (the defaults are plain CLL-CLIP)."""

    NAME: ClassVar[str] = ""
    #: the language must be named at inference (``use_language``): one module per language
    PER_LANGUAGE: ClassVar[bool] = False

    def __init__(self, cfg: MethodConfig) -> None:
        self.cfg = cfg

    def begin_task(self, learner: Learner, task: "LanguageTask") -> list[torch.nn.Parameter]:
        """Add the task's modules; return the parameters to train beside the token table."""
        return []

    def replay(self) -> "ReplayBuffer | None":
        """Earlier tasks' items to replay in every batch (None: no replay)."""
        return None

    def observe(self, trainer: Trainer, batch: "LingualBatch",
                step: int) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Extra loss terms for one batch (added to Eq. 4) and scalars to log."""
        return None, {}

    def end_task(self, learner: Learner, task: "LanguageTask", english: np.ndarray,
                 batches: "TaskBatches") -> None:
        """After the task trained (the encoder is frozen again)."""

    def state(self) -> tuple[Tensors, dict[str, Any]]:
        """Tensors and JSON metadata that :meth:`load_state` restores."""
        return {}, {}

    def load_state(self, encoder, tensors: Tensors, meta: dict[str, Any]) -> None:
        """Restore :meth:`state` and re-attach per-language modules to ``encoder``."""

    def model_to_save(self, encoder):
        """The encoder to write as the model directory (default: ``encoder`` itself)."""
        return encoder


#: the registered methods by ``NAME`` (:mod:`.registry` imports the built-in ones before it reads this)
LINGUAL_METHODS: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: register ``cls`` under ``cls.NAME`` (unique, non-empty)."""
    if not cls.NAME or cls.NAME in LINGUAL_METHODS:
        raise ValueError(f"lingual method name {cls.NAME!r} is empty or already registered")
    LINGUAL_METHODS[cls.NAME] = cls
    return cls


def scoped(tensors: Tensors, prefix: str) -> Tensors:
    """The entries of ``tensors`` under ``prefix/``, with the prefix removed."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix + "/")}


__all__ = ["LINGUAL_METHODS", "Learner", "LingualMethod", "MethodConfig", "Tensors", "Trainer", "register", "scoped"]
