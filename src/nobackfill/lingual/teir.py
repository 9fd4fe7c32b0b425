"""TEIR: Token Embedding Initialization and Regularization (Sec. "TEIR" of the CLL-CLIP paper,
seed 004).

* Initialisation: rows of new tokens ~ N(mu_{t-1}, sigma_{t-1}^2), the statistics of the table
  learned so far (plain CLL-CLIP uses N(0, 0.02^2)).
* Regularisation (Eq. 5-6): a per-row scale ``lambda_{t,j}`` multiplies both the gradient and the
  decoupled weight decay of row ``j``:

  ``lambda = 0``          for ``V_{t,old} = V_{t-1} minus V_hat_t`` (tokens the task does not use),
  ``lambda = 1/(c+1)``    for ``V_{t,cap} = V_{t-1} cap V_hat_t`` (lexical overlap),
  ``lambda = 1``          for ``V_{t,new} = V_hat_t minus V_{t-1}``,

  with ``c_{t,j}`` the number of times token ``j`` appeared in the earlier tasks (``c_1 = 1``).

:class:`RowScaledEmbedding` applies the scales: a gradient hook (so the loop's gradient clipping
and AdamW see ``lambda * grad``) and :meth:`RowScaledEmbedding.decay`, the AdamW decoupled decay
``theta_j <- (1 - alpha * beta * lambda_j) theta_j`` run by the method after every optimiser step
(the loop's AdamW is given weight decay 0 for the table). Plain CLL-CLIP is the same code with
``lambda = 1`` everywhere.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch


def teir_row_scales(size: int, old_size: int, task_ids: Iterable[int], counts: np.ndarray) -> np.ndarray:
    """Eq. 6: ``lambda`` for every row of a ``size``-row table whose first ``old_size`` rows are
    ``V_{t-1}``; ``task_ids`` are the ids of ``V_hat_t`` in the merged vocabulary and ``counts``
    the ``c_t`` vector (at least ``old_size`` long)."""
    if len(counts) < old_size:
        raise ValueError(f"counts has {len(counts)} entries for {old_size} old rows")
    lam = np.zeros(size, np.float64)
    ids = np.unique(np.asarray(list(task_ids), dtype=np.int64))
    if ids.size and (ids.min() < 0 or ids.max() >= size):
        raise ValueError(f"task ids must lie in [0, {size})")
    overlap = ids[ids < old_size]
    lam[overlap] = 1.0 / (np.asarray(counts, np.float64)[overlap] + 1.0)
    lam[ids[ids >= old_size]] = 1.0
    lam[old_size:] = 1.0  # every appended row belongs to V_{t,new}
    return lam


class RowScaledEmbedding:
    """Scale the gradient and the decoupled weight decay of each row of ``weight`` by ``scales``."""

    def __init__(self, weight: torch.nn.Parameter, scales: np.ndarray | torch.Tensor, weight_decay: float) -> None:
        s = torch.as_tensor(np.asarray(scales), dtype=weight.dtype)
        if s.shape != (weight.shape[0],):
            raise ValueError(f"scales has shape {tuple(s.shape)}, table has {weight.shape[0]} rows")
        self.weight = weight
        self.scales = s
        self.weight_decay = float(weight_decay)
        self._col = s.unsqueeze(1)
        self._handle = weight.register_hook(lambda g: g * self._col)

    @torch.no_grad()
    def decay(self, lr: float) -> None:
        """``theta_j <- (1 - lr * beta * lambda_j) theta_j`` (the weight-decay half of Eq. 5)."""
        if self.weight_decay and lr:
            self.weight.mul_(1.0 - lr * self.weight_decay * self._col)

    def remove(self) -> None:
        self._handle.remove()


__all__ = ["teir_row_scales", "RowScaledEmbedding"]
