"""Models kept warm for search: each model loaded once per process and checked against the space
id the collection recorded for it, plus upgraded copies for bridge routes.

A model reference is a model directory (any saved :class:`~nobackfill.encoders.base.DualEncoder`,
e.g. a local ``openai/clip-vit-base-patch32``) or an alias of the shipped all-MiniLM-L6-v2
(:data:`~nobackfill.encoders.PRETRAINED_TEXT_ALIASES`). An encoder upgrade (XBT) attaches adapters
to the model it is applied to, so it gets its own copy: the plain model keeps serving native
queries, unchanged, from other threads.
"""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path

from ..encoders import PRETRAINED_TEXT_ALIASES, load_encoder
from ..encoders.base import DualEncoder
from ..encoders.onnx import OnnxEncoder, onnx_encoder
from ..gallery.types import SpaceMismatchError
from .query_cache import DEFAULT_QUERY_CACHE, QueryCache

__all__ = ["ModelPool", "model_ref"]


def model_ref(path: str | Path) -> str:
    """How a collection records a model: the alias as is, a directory as an absolute path."""
    s = str(path)
    if s in PRETRAINED_TEXT_ALIASES and not Path(s).exists():
        return s
    return str(Path(s).resolve())


#: ``NOBACKFILL_ONNX``: ``1`` (default) runs a model's exported ONNX towers when onnxruntime is
#: installed, ``int8`` their quantised copies, ``0`` always torch
ONNX_ENV = "NOBACKFILL_ONNX"


def _on_onnx(encoder: DualEncoder, ref: str) -> DualEncoder:
    """``encoder`` on ONNX Runtime where the model directory holds a checked export of it."""
    mode = os.environ.get(ONNX_ENV, "1").strip().lower()
    if mode in ("0", "false", "no", "off") or not Path(ref).is_dir():
        return encoder
    return onnx_encoder(encoder, ref, int8=mode == "int8")


class ModelPool:
    """Encoders by model reference, loaded lazily, kept for the life of the pool (thread-safe). A model
    directory with an ONNX export of the same weights (``nobackfill export-onnx``) is served on ONNX
    Runtime (:data:`ONNX_ENV`)."""

    def __init__(self, query_cache: int = DEFAULT_QUERY_CACHE) -> None:
        self.query_cache = QueryCache(query_cache)  # text query embeddings of these encoders (0: none kept)
        self._models: dict[str, DualEncoder] = {}
        self._upgraded: dict[tuple[str, tuple[str, ...]], DualEncoder] = {}
        self._lock = threading.Lock()

    def get(self, ref: str | Path, space_id: str | None = None, *, what: str = "model") -> DualEncoder:
        """The encoder at ``ref``; with ``space_id``, refuse one whose space differs (the directory
        now holds another model than the one the collection was built with)."""
        key = str(ref)
        with self._lock:
            enc = self._models.get(key)
            if enc is None:
                enc = self._models[key] = _on_onnx(load_encoder(key), key)
        if space_id is not None and enc.space_id != space_id:
            raise SpaceMismatchError(space_id, enc.space_id, f"load the {what} at {key}", what=f"model at {key}",
                                     hint="the collection recorded another model for this space; restore that "
                                          "model directory or re-register the upgrade")
        return enc

    def put(self, ref: str | Path, encoder: DualEncoder) -> None:
        """Use an already loaded ``encoder`` for ``ref`` (callers that hold one)."""
        with self._lock:
            self._models[str(ref)] = encoder

    def upgraded(self, ref: str | Path, upgrade_dir: str | Path, space_id: str | None = None) -> DualEncoder:
        """A separate copy of the model at ``ref`` with the encoder upgrade at ``upgrade_dir``
        applied and its adapters merged into the weights (its outputs live in the upgrade's target
        space; merged, queries skip the LoRA branches and switchable wrappers)."""
        from ..compat.upgrade import load_upgrade

        key = (str(ref), (str(upgrade_dir),))
        with self._lock:
            enc = self._upgraded.get(key)
        if enc is None:
            plain = self.get(ref, space_id)
            plain = plain.encoder if isinstance(plain, OnnxEncoder) else plain  # adapters attach to torch modules
            base = copy.deepcopy(plain)  # apply() attaches adapters in place
            enc = load_upgrade(upgrade_dir).apply(base)
            enc = enc.merged() if hasattr(enc, "merged") else enc
            with self._lock:
                enc = self._upgraded.setdefault(key, enc)
        return enc

    def loaded(self) -> list[str]:
        """References of the models loaded so far (plain and upgraded)."""
        with self._lock:
            return sorted(self._models) + [f"{r}+{'+'.join(u)}" for r, u in sorted(self._upgraded)]


