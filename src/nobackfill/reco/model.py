"""A trained RECO refinement: phi_image and phi_text plus how they retrieve (k, search, fusion),
bound to one frozen encoder's embedding space and one memory.

Directory layout (``nobackfill reco train --out DIR``)::

    fusion.safetensors   phi_image.* / phi_text.* / logit_scale (absent for mean fusion)
    reco.json            space id, dim, k, search / fuse modes, fusion config, memory path, recipe
                         (written last)

Backfill-free use (the point of the ``L_NCE(V, T_bar)`` term of the RECO loss): refined TEXT
queries are compared with the ORIGINAL image embeddings already in a gallery ("queries only"), and
refined image queries with the original texts; "refine both" also refines the gallery side.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from .._safetensors import save_tensors
from ..gallery.atomic_files import atomic_write_bytes, read_tagged_json
from .fusion import FusionConfig, make_fusion
from .memory import FUSE_MODES, SEARCH_MODES, Memory

RECO_FILE = "reco.json"
WEIGHTS_FILE = "fusion.safetensors"
RECO_FORMAT = "nobackfill-reco"


@dataclass
class RecoSpec:
    """How queries are refined. Defaults: the paper's uni-modal search + cross-modal fusion with a
    one-layer transformer; k = 10 neighbours."""

    space_id: str
    dim: int
    k: int = 10
    search: str = "uni"
    fuse: str = "cross"
    fusion: FusionConfig | None = None
    memory: str = ""
    recipe: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fusion is None:
            self.fusion = FusionConfig(dim=self.dim)
        if self.fusion.dim != self.dim:
            raise ValueError(f"fusion dim {self.fusion.dim} != embedding dim {self.dim}")
        if self.search not in SEARCH_MODES or self.fuse not in FUSE_MODES:
            raise ValueError(f"search must be in {SEARCH_MODES}, fuse in {FUSE_MODES}; got {self.search!r}, {self.fuse!r}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fusion"] = self.fusion.to_dict()
        return d


class RecoModel(nn.Module):
    """phi_image, phi_text and a learnable logit scale (used by the training loss only)."""

    def __init__(self, spec: RecoSpec, temperature: float = 0.05) -> None:
        super().__init__()
        self.spec = spec
        self.phi_image = make_fusion(spec.fusion)
        self.phi_text = make_fusion(spec.fusion)
        self.logit_scale = nn.Parameter(torch.tensor(float(np.log(1.0 / temperature))))

    @property
    def trainable(self) -> bool:
        return self.spec.fusion.kind != "mean"

    def fuse(self, modality: str, original: torch.Tensor, retrieved: torch.Tensor) -> torch.Tensor:
        """``phi_image`` for image queries, ``phi_text`` for text queries."""
        return (self.phi_image if modality == "image" else self.phi_text)(original, retrieved)

    def retrieve(self, memory: Memory, queries: np.ndarray, modality: str,
                 exclude_images: np.ndarray | None = None) -> np.ndarray:
        """The k memory embeddings fused with each query (this model's search / fuse modes)."""
        return memory.retrieve(queries, modality, self.spec.k, search=self.spec.search, fuse=self.spec.fuse,
                               exclude_images=exclude_images)

    @torch.no_grad()
    def refine(self, memory: Memory, queries: np.ndarray, modality: str, *, batch_size: int = 4096,
               exclude_images: np.ndarray | None = None) -> np.ndarray:
        """Refined unit rows ``(Q, d)`` float32 of ``queries`` (frozen-encoder embeddings)."""
        if memory.space_id != self.spec.space_id:
            raise ValueError(f"memory {memory.path} is in space {memory.space_id}, the RECO model in "
                             f"{self.spec.space_id}")
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.spec.dim:
            raise ValueError(f"queries must be (N, {self.spec.dim}), got {q.shape}")
        was = self.training
        self.eval()
        out = []
        for s in range(0, q.shape[0], batch_size):
            chunk = q[s:s + batch_size]
            ex = None if exclude_images is None else exclude_images[s:s + batch_size]
            r = self.retrieve(memory, chunk, modality, ex)
            out.append(self.fuse(modality, torch.tensor(chunk), torch.tensor(r)).numpy())
        self.train(was)
        return np.concatenate(out) if out else np.zeros((0, self.spec.dim), np.float32)

    # ------------------------------------------------------------------ files
    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if self.trainable:  # (save_tensors writes atomically)
            save_tensors({k: v.detach().contiguous() for k, v in self.state_dict().items()}, d / WEIGHTS_FILE)
        info = {"format": RECO_FORMAT, "version": 1, **self.spec.to_dict()}
        if info.get("memory"):  # found from any working directory, and beside the RECO directory if both move
            mem = Path(info["memory"]).resolve()
            info["memory"], info["memory_from_here"] = str(mem), os.path.relpath(mem, d.resolve())
        atomic_write_bytes(d / RECO_FILE, json.dumps(info, indent=2, default=str).encode("utf-8"))
        return d

    @classmethod
    def load(cls, directory: str | Path) -> "RecoModel":
        d = Path(directory)
        f = d / RECO_FILE
        if not f.is_file():
            raise FileNotFoundError(f"{d} is not a RECO directory: {f} does not exist (train one with "
                                    "`nobackfill reco train`)")
        info = read_tagged_json(f, RECO_FORMAT)
        try:
            spec = RecoSpec(space_id=info["space_id"], dim=int(info["dim"]), k=int(info["k"]),
                            search=info["search"], fuse=info["fuse"], fusion=FusionConfig(**info["fusion"]),
                            memory=_memory_path(d, info), recipe=info.get("recipe") or {})
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{f}: malformed RECO file ({e})") from e
        model = cls(spec)
        if model.trainable:
            w = d / WEIGHTS_FILE
            if not w.is_file():
                raise FileNotFoundError(f"{w} is missing")
            model.load_state_dict(load_file(str(w)))
        model.eval()
        return model

    def open_memory(self, override: str | Path | None = None) -> Memory:
        """The memory this model was trained with (or ``override``)."""
        path = override or self.spec.memory
        if not path:
            raise ValueError("this RECO model records no memory path; pass one")
        return Memory.open(path)


def load_reco(directory: str | Path, memory: str | Path | None = None) -> tuple[RecoModel, Memory]:
    """A trained RECO directory and its memory, ready for :meth:`RecoModel.refine`."""
    model = RecoModel.load(directory)
    return model, model.open_memory(memory)


def _memory_path(directory: Path, info: dict) -> str:
    """The memory a RECO file names: its absolute path where it exists, else the same memory found
    from the RECO directory (the two moved together), else the path as written (an older file's
    relative path: from the working directory, as before; trial R saw it fail from any other)."""
    mem = str(info.get("memory", "") or "")
    if not mem or Path(mem).is_absolute() and Path(mem).exists():
        return mem
    beside = info.get("memory_from_here")
    if beside and (directory / beside).exists():
        return str((directory / beside).resolve())
    return mem
