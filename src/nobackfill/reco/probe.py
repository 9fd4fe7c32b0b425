"""A supervised linear probe of frozen embeddings (softmax regression on the one training loop): how
much of a label an embedding carries at all. The RECO benchmark uses it as a ceiling: zero-shot with
refined PROMPTS only is a linear classifier of the frozen image embedding (one class vector per
prompt), so a linear probe fitted with the labels themselves bounds it from above, in practice; any
refinement, being a function of the frozen embedding (and of neighbours chosen by that embedding),
cannot recover a label the embedding does not carry.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._safetensors import save_tensors
from ..train.loop import LoopConfig, Method, train


class LinearProbe(Method):
    """Softmax regression ``logits = scale * x W^T + b`` on fixed features (cross-entropy)."""

    name = "linear-probe"

    def __init__(self, dim: int, n_classes: int, scale: float = 10.0) -> None:
        self.head = nn.Linear(dim, n_classes)
        self.scale = scale

    def param_groups(self) -> list[dict]:
        return [{"params": list(self.head.parameters()), "weight_decay": 0.0}]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale * x)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor], step: int):
        loss = F.cross_entropy(self.logits(batch[0]), batch[1])
        return loss, {"ce": float(loss.detach())}

    def state_dict(self) -> dict:
        return {k: v.clone() for k, v in self.head.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state)

    def export(self, out: Path) -> None:
        save_tensors(self.state_dict(), Path(out) / "probe.safetensors")


class _FullBatch:
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        # copies: the inputs may be read-only views (e.g. a memory's memory-mapped vectors)
        self.data = (torch.tensor(np.asarray(x, np.float32)), torch.tensor(np.asarray(y, np.int64)))

    def batch(self, index: int):
        return self.data


def linear_probe_predictions(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, n_classes: int, *,
                             steps: int = 300, lr: float = 1e-2, seed: int = 0) -> np.ndarray:
    """Fit a :class:`LinearProbe` on ``(train_x, train_y)`` (full batch, ``steps`` AdamW steps, constant lr)
    and return its class predictions for ``test_x``."""
    if len(train_x) != len(train_y) or not len(train_x):
        raise ValueError(f"probe needs as many labels as rows, got {len(train_x)} rows and {len(train_y)} labels")
    torch.manual_seed(seed)
    probe = LinearProbe(train_x.shape[1], n_classes)
    cfg = LoopConfig(steps=steps, lr=lr, warmup=0, weight_decay=0.0, seed=seed, log_every=steps,
                     checkpoint_every=10 * steps, eval_every=10 * steps, schedule="constant")
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        train(probe, _FullBatch(train_x, train_y), cfg, tmp, progress=False, export=False)
    with torch.no_grad():
        return probe.logits(torch.as_tensor(np.asarray(test_x, np.float32))).argmax(1).numpy()


__all__ = ["LinearProbe", "linear_probe_predictions"]
