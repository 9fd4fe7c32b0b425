"""The one interface every embedding model in nobackfill implements.

A :class:`DualEncoder` maps images and texts into one L2-normalised embedding space. The space is
named by :attr:`DualEncoder.space_id`, a stable fingerprint of the model's config and weights: two
different models never share one, and the same model saved and reloaded keeps it. Galleries store
the space id next to every vector, so a query from another space is refused (see
``nobackfill.gallery``).
"""

from __future__ import annotations

import abc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy as np
from PIL import Image

if TYPE_CHECKING:  # torch is imported by the encoders that use it, not by this interface
    import torch

ImageInput = Union[Image.Image, np.ndarray, str, Path]


class NoImageTower(NotImplementedError, ValueError):
    """A text-only model asked to embed images: bad input (a ``ValueError``: one line, exit 2, 422),
    as well as what the model does not implement."""


@dataclass
class TokenOutput:
    """Token-level outputs of one tower (needed by late interaction, the Target-CMLI paper).

    ``tokens``: float32 ``(N, L, D)`` projected, L2-normalised token embeddings in the shared space.
    ``mask``: bool ``(N, L)``; True for real content tokens (CLS / EOS / padding excluded).
    """

    tokens: torch.Tensor
    mask: torch.Tensor


class DualEncoder(abc.ABC):
    """Image and text towers that embed into one L2-normalised space."""

    #: short name of the implementation, written into saved configs
    kind: str = "abstract"
    #: what the model embeds: a text-only model (e.g. a sentence encoder) has ``("text",)``
    modalities: tuple[str, ...] = ("image", "text")

    @property
    @abc.abstractmethod
    def embed_dim(self) -> int:
        """Dimension of the global embeddings."""

    @property
    @abc.abstractmethod
    def space_id(self) -> str:
        """Stable fingerprint of config + weights (hex string)."""

    @abc.abstractmethod
    def encode_images(
        self, images: Sequence[ImageInput], batch_size: int = 128, progress: bool = False
    ) -> np.ndarray:
        """Embed images; returns float32 ``(N, embed_dim)`` with unit rows."""

    @abc.abstractmethod
    def encode_texts(
        self, texts: Sequence[str], batch_size: int = 256, progress: bool = False
    ) -> np.ndarray:
        """Embed texts; returns float32 ``(N, embed_dim)`` with unit rows."""

    def image_tokens(self, images: Sequence[ImageInput]) -> TokenOutput:
        raise NotImplementedError(f"{type(self).__name__} has no image token outputs")

    def text_tokens(self, texts: Sequence[str]) -> TokenOutput:
        raise NotImplementedError(f"{type(self).__name__} has no text token outputs")

    @abc.abstractmethod
    def save(self, directory: str | Path) -> Path:
        """Write the model so that :func:`nobackfill.encoders.load_encoder` restores it exactly."""


def l2_normalise(x: np.ndarray | torch.Tensor, eps: float = 1e-12):
    """Row-wise L2 normalisation for numpy arrays or tensors."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.nn.functional.normalize(x, dim=-1, eps=eps)
    x = np.asarray(x)
    if x.dtype.kind == "f":  # np.linalg.norm's own arithmetic, without its Python checks (a query's hot path)
        n = np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True))
    else:
        n = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(n, eps)).astype(np.float32, copy=False)


def encode(encoder: Any, modality: str, inputs: Sequence[Any], *, progress: bool = False) -> np.ndarray:
    """``inputs`` of one ``modality`` embedded by ``encoder``, as float32 rows: texts, or images
    (paths, given as ``str`` or ``Path``, or PIL images). The one encode-by-modality step of the
    searcher's query pipeline, adding items and the backfill."""
    rows = inputs if type(inputs) is list else list(inputs)
    kw = {"progress": True} if progress else {}
    if modality == "image":
        rows = [Path(p) if isinstance(p, str) else p for p in rows]
        return np.asarray(encoder.encode_images(rows, **kw), np.float32)
    if modality == "text":
        return np.asarray(encoder.encode_texts(rows, **kw), np.float32)
    raise ValueError(f"modality must be 'image' or 'text', got {modality!r}")
