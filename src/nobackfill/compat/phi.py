"""The projection module phi of XBT (Jang & Lim 2024, Sec. 4.1).

``phi`` maps a new model's L2-normalised embedding (dimension ``in_dim``) into the old model's
space (dimension ``out_dim``):

    Linear - LN - GELU - Linear - LN - GELU - Linear

with hidden width ``4 * out_dim`` ("four times the dimensionality of the output embedding"), no
dropout ("found to degrade performance empirically"), and an L2-normalised output (every embedding
of the paper is L2-normalised, Sec. 3). The same module is the bridge of stage 1 (Eq. 3, trained on
text only), the projection of stage 2 (Eq. 4-5) and, randomly initialised, the projection of the
Direct baselines (Eq. 6).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .._safetensors import save_tensors

PHI_WEIGHTS = "phi.safetensors"
PHI_CONFIG = "phi_config.json"


class Projection(nn.Module):
    """phi: ``new_dim -> old_dim`` (Sec. 4.1). ``forward`` returns unit rows."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        if in_dim < 1 or out_dim < 1:
            raise ValueError(f"phi dims must be positive, got {in_dim} -> {out_dim}")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.hidden = int(hidden or 4 * out_dim)
        h = self.hidden
        self.net = nn.Sequential(
            nn.Linear(self.in_dim, h), nn.LayerNorm(h), nn.GELU(),
            nn.Linear(h, h), nn.LayerNorm(h), nn.GELU(),
            nn.Linear(h, self.out_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=-1)

    # ----------------------------------------------------------------- parts
    def layernorm_parameters(self) -> list[nn.Parameter]:
        """The LayerNorm weights and biases (the only part of phi XBT's stage 2 trains, App. A.2)."""
        return [p for m in self.net if isinstance(m, nn.LayerNorm) for p in m.parameters()]

    def config(self) -> dict:
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": self.hidden,
                "architecture": "Linear-LN-GELU-Linear-LN-GELU-Linear", "dropout": 0.0,
                "normalised_output": True}

    # ----------------------------------------------------------------- numpy convenience
    @torch.inference_mode()
    def project(self, x: np.ndarray, batch_size: int = 4096) -> np.ndarray:
        """phi on a float array (rows need not be unit; they are passed as given)."""
        was = self.training
        self.eval()
        out = [self(torch.as_tensor(np.asarray(x[s:s + batch_size], np.float32))).numpy()
               for s in range(0, len(x), batch_size)]
        self.train(was)
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.out_dim), np.float32)

    # ----------------------------------------------------------------- persistence
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_tensors({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(d / PHI_WEIGHTS))
        (d / PHI_CONFIG).write_text(json.dumps(self.config(), indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> "Projection":
        d = Path(directory)
        if not (d / PHI_CONFIG).is_file():
            raise FileNotFoundError(f"{d}: no {PHI_CONFIG}")
        cfg = json.loads((d / PHI_CONFIG).read_text())
        phi = cls(cfg["in_dim"], cfg["out_dim"], cfg.get("hidden"))
        phi.load_state_dict(load_file(str(d / PHI_WEIGHTS)))
        return phi.eval()


def random_projection(in_dim: int, out_dim: int, seed: int = 0) -> Projection:
    """A randomly initialised phi (the Direct baselines' projection, Sec. 4.2), seeded."""
    g = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return Projection(in_dim, out_dim)
    finally:
        torch.random.set_rng_state(g)
