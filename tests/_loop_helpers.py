"""A toy method and batch source for tests of the one training loop (train/loop.py)."""

from __future__ import annotations

import torch

from nobackfill.train.loop import Method


class ToyMethod(Method):
    """Fit ``w`` (three numbers) to the batch targets. ``nan_at``: the loss of that step is NaN;
    ``interrupt_at``: that step raises KeyboardInterrupt (Ctrl-C); ``lr_scale``: of its one group."""

    name = "toy"

    def __init__(self, nan_at: int | None = None, interrupt_at: int | None = None, lr_scale: float = 1.0) -> None:
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.nan_at, self.interrupt_at, self.lr_scale = nan_at, interrupt_at, lr_scale

    def param_groups(self):
        return [{"params": [self.w], "lr_scale": self.lr_scale}]

    def loss(self, batch, step):
        if step == self.interrupt_at:
            raise KeyboardInterrupt
        if step == self.nan_at:
            return self.w.sum() * float("nan"), {}
        return ((self.w - batch) ** 2).sum(), {"w0": float(self.w[0].detach())}

    def state_dict(self):
        return {"w": self.w.detach().clone()}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.w.copy_(state["w"])

    def export(self, out):
        torch.save(self.w.detach(), out / "w.pt")


class CyclicBatches:
    """Batch ``i`` is three times ``i % 3``."""

    def batch(self, index):
        return torch.full((3,), float(index % 3))
