"""``dualprompt``: DualPrompt-style prompting (Wang et al., ECCV 2022; a baseline of the CLL-CLIP
paper, Yang et al. 2024, Reproducibility: G-prompt length 2, E-prompt length 16, pool size = tasks, k = 1).

A shared **G(eneral)-prompt** ``g`` (trained in every task) and one **E(xpert)-prompt** ``e_t``
with a key ``k_t`` per task. A text's query ``q(x)`` (:class:`~.prompts.FrozenQuery`) picks

    ``t*(x) = argmax_t cos(q(x), k_t)``                       (DualPrompt's key-query matching)

and the text runs with ``[g ; e_{t*}]`` after its first token. Training uses the task's own
``e_t`` and pulls its key to the task's queries with the matching loss

    ``L_match = lambda * mean_x (1 - cos(q(x), k_t))``        (DualPrompt's surrogate loss, lambda = 1)

added to Eq. 4. After its task, ``e_t`` and ``k_t`` are frozen. Ours is input-level (the vectors
stand at the first transformer layer's input; the paper prefixes layers 1-2 and 3-5) and CPU-sized
(``g_prompt_length`` 2, ``prompt_length`` 8). English, the starting model's language, runs the
plain tower; every other text picks its E-prompt by its key, with no language id.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import register
from .prompts import FrozenQuery, PromptPoolMethod


class DualPromptPool(torch.nn.Module):
    """``g``, the E-prompts and their keys; ``train_task`` (set while a task trains) forces its
    E-prompt, otherwise each text picks by key."""

    def __init__(self, query: FrozenQuery, g_length: int, e_length: int) -> None:
        super().__init__()
        dim = query.table.shape[1]
        self.query = query
        self.g = torch.nn.Parameter(torch.zeros(g_length, dim))
        self.e = torch.nn.ParameterList()
        self.keys = torch.nn.ParameterList()
        self.e_length = e_length
        self.train_task: int | None = None

    @property
    def n_tasks(self) -> int:
        return len(self.e)

    def add_task(self, mean: float, std: float, generator: torch.Generator | None) -> list[torch.nn.Parameter]:
        dim = self.g.shape[1]
        if not self.e:
            with torch.no_grad():
                self.g.copy_(torch.randn(self.g.shape, generator=generator) * std + mean)
        self.e.append(torch.nn.Parameter(torch.randn(self.e_length, dim, generator=generator) * std + mean))
        self.keys.append(torch.nn.Parameter(F.normalize(torch.randn(dim, generator=generator), dim=0)))
        self.train_task = len(self.e) - 1
        return [self.g, self.e[-1], self.keys[-1]]

    def end_task(self) -> None:
        self.train_task = None

    def pick(self, q: torch.Tensor) -> torch.Tensor:
        """``argmax_t cos(q, k_t)`` per row of ``q``."""
        return (q @ F.normalize(torch.stack(list(self.keys)), dim=-1).T).argmax(1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        if not self.e:
            return None
        n = len(ids)
        if self.train_task is None:
            sel = self.pick(self.query(ids, mask))
        else:
            sel = torch.full((n,), self.train_task, dtype=torch.long)
        return torch.cat([self.g.expand(n, -1, -1), torch.stack(list(self.e))[sel]], dim=1)


@register
class DualPrompt(PromptPoolMethod):
    """The plug-in: a :class:`DualPromptPool`, plus the key matching loss in ``observe``."""

    NAME = "dualprompt"

    def make_pool(self, query: FrozenQuery) -> DualPromptPool:
        return DualPromptPool(query, self.cfg.g_prompt_length, self.cfg.prompt_length)

    def observe(self, trainer, batch, step: int) -> tuple[torch.Tensor | None, dict[str, float]]:
        pool = self.pool
        enc = trainer.encoder.tokenize(batch.foreign)
        q = pool.query(enc["input_ids"], enc["attention_mask"])
        match = (1.0 - q @ F.normalize(pool.keys[pool.train_task], dim=0)).mean()
        return self.cfg.key_match_weight * match, {"L_match": float(match.detach())}



__all__ = ["DualPrompt", "DualPromptPool"]
