"""``coda_prompt``: CODA-Prompt-style prompting (Smith et al., CVPR 2023; a baseline of the
CLL-CLIP paper, Yang et al. 2024, Reproducibility: E-prompts in the first five layers, 5 components per
task). The prompt is an attention-weighted sum of learnable components ``P_m``:

    ``alpha_m(x) = cos(q(x) * A_m, K_m)``                     (CODA-Prompt Eq. 4: keys K, attention A)
    ``p(x) = sum_m alpha_m(x) P_m``                           (CODA-Prompt Eq. 3)

with ``q(x)`` the frozen query (:class:`~.prompts.FrozenQuery`) and ``*`` the element-wise product.
Each task adds ``coda_components`` components (with their keys and attention vectors), trained
end to end through Eq. 4 of CLL-CLIP; components of earlier tasks are frozen. New components
start orthogonal to the old ones (CODA-Prompt's Gram-Schmidt initialisation); the orthogonality
penalty of the paper is not used. Input-level and CPU-sized (``prompt_length`` 8); English runs the
plain tower, every other text gets its assembled prompt with no language id.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import register
from .prompts import FrozenQuery, PromptPoolMethod


def orthogonal_rows(old: torch.Tensor | None, n: int, dim: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` unit rows orthogonal to each other and to the rows of ``old`` where ``dim`` allows
    (Gram-Schmidt through QR); random unit rows otherwise."""
    x = torch.randn(n, dim, generator=generator)
    m = 0 if old is None else old.shape[0]
    if m + n > dim:
        return F.normalize(x, dim=1)
    if m:
        basis, _ = torch.linalg.qr(old.detach().T)
        x = x - (x @ basis) @ basis.T
    q, _ = torch.linalg.qr(x.T)
    return q.T.contiguous()


class CodaPromptPool(torch.nn.Module):
    """Components ``P`` ``(M, L, D)``, keys ``K`` and attention vectors ``A`` ``(M, D)`` per task."""

    def __init__(self, query: FrozenQuery, length: int, per_task: int) -> None:
        super().__init__()
        self.query = query
        self.length, self.per_task = length, per_task
        self.P = torch.nn.ParameterList()
        self.K = torch.nn.ParameterList()
        self.A = torch.nn.ParameterList()

    @property
    def n_tasks(self) -> int:
        return len(self.P)

    @staticmethod
    def _all(params: torch.nn.ParameterList) -> torch.Tensor | None:
        return torch.cat(list(params)) if len(params) else None

    def add_task(self, mean: float, std: float, generator: torch.Generator | None) -> list[torch.nn.Parameter]:
        m, length, dim = self.per_task, self.length, self.query.table.shape[1]
        old_p = self._all(self.P)
        p = orthogonal_rows(None if old_p is None else old_p.flatten(1), m, length * dim, generator)
        self.P.append(torch.nn.Parameter((p * std * (length * dim) ** 0.5).view(m, length, dim)))
        self.K.append(torch.nn.Parameter(orthogonal_rows(self._all(self.K), m, dim, generator)))
        self.A.append(torch.nn.Parameter(orthogonal_rows(self._all(self.A), m, dim, generator)))
        return [self.P[-1], self.K[-1], self.A[-1]]

    def end_task(self) -> None:
        pass

    def weights(self, q: torch.Tensor) -> torch.Tensor:
        """``alpha`` ``(n, M)``: CODA-Prompt Eq. 4."""
        attended = F.normalize(q.unsqueeze(1) * self._all(self.A).unsqueeze(0), dim=-1)
        return (attended * F.normalize(self._all(self.K), dim=-1).unsqueeze(0)).sum(-1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        if not len(self.P):
            return None
        return torch.einsum("nm,mld->nld", self.weights(self.query(ids, mask)), self._all(self.P))


@register
class CodaPrompt(PromptPoolMethod):
    """The plug-in: a :class:`CodaPromptPool` trained end to end through Eq. 4 (no extra loss)."""

    NAME = "coda_prompt"

    def make_pool(self, query: FrozenQuery) -> CodaPromptPool:
        return CodaPromptPool(query, self.cfg.prompt_length, self.cfg.coda_components)


__all__ = ["CodaPrompt", "CodaPromptPool", "orthogonal_rows"]
