"""TEIR: Token Embedding Initialization and Regularization (Sec. "TEIR" of the CLL-CLIP paper,
Yang et al. 2024).

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

Adam divides each coordinate's step by the root of its running squared gradient, so a constant
factor on a row's gradient (``0 < lambda < 1``) mostly cancels out: only ``lambda = 0`` survives
exactly. ``mode="update"`` therefore scales the optimiser's *step* of each overlap row instead
(``theta_j <- theta_j + lambda_j * delta_j``), which is Eq. 5's per-row effective learning rate
``alpha * lambda_j`` for any optimiser; ``mode="grad"`` is the literal reading (scale the gradient).
Both zero the gradient of ``lambda = 0`` rows and scale the weight decay.
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


SCALE_MODES = ("grad", "update")


class RowScaledEmbedding:
    """Scale the gradient (``mode="grad"``) or the optimiser step (``mode="update"``) and the
    decoupled weight decay of each row of ``weight`` by ``scales``. Call :meth:`before_step` before
    and :meth:`after_step` after each optimiser step."""

    def __init__(self, weight: torch.nn.Parameter, scales: np.ndarray | torch.Tensor, weight_decay: float,
                 mode: str = "grad") -> None:
        if mode not in SCALE_MODES:
            raise ValueError(f"mode must be one of {SCALE_MODES}, got {mode!r}")
        s = torch.as_tensor(np.asarray(scales), dtype=weight.dtype)
        if s.shape != (weight.shape[0],):
            raise ValueError(f"scales has shape {tuple(s.shape)}, table has {weight.shape[0]} rows")
        self.weight = weight
        self.scales = s
        self.mode = mode
        self.weight_decay = float(weight_decay)
        self._col = s.unsqueeze(1)
        grad_col = self._col if mode == "grad" else (self._col > 0).to(s.dtype)
        self._handle = weight.register_hook(lambda g: g * grad_col)
        self._partial = torch.nonzero((s > 0) & (s < 1)).flatten() if mode == "update" else None
        self._snapshot: torch.Tensor | None = None

    @torch.no_grad()
    def before_step(self) -> None:
        """``mode="update"``: remember the overlap rows before the optimiser moves them."""
        if self._partial is not None and self._partial.numel():
            self._snapshot = self.weight.index_select(0, self._partial).clone()

    @torch.no_grad()
    def after_step(self, lr: float) -> None:
        """Scale the overlap rows' step (``mode="update"``), then apply the scaled weight decay."""
        if self._snapshot is not None:
            moved = self.weight.index_select(0, self._partial)
            lam = self.scales.index_select(0, self._partial).unsqueeze(1)
            self.weight.index_copy_(0, self._partial, self._snapshot + lam * (moved - self._snapshot))
            self._snapshot = None
        self.decay(lr)

    @torch.no_grad()
    def decay(self, lr: float) -> None:
        """``theta_j <- (1 - lr * beta * lambda_j) theta_j`` (the weight-decay half of Eq. 5)."""
        if self.weight_decay and lr:
            self.weight.mul_(1.0 - lr * self.weight_decay * self._col)

    def remove(self) -> None:
        self._handle.remove()


__all__ = ["teir_row_scales", "RowScaledEmbedding", "SCALE_MODES"]
