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
import logging
import os
import threading
from pathlib import Path

from ..encoders import PRETRAINED_TEXT_ALIASES, load_encoder
from ..encoders.base import DualEncoder
from ..encoders.onnx import OnnxEncoder, onnx_encoder
from ..gallery.types import SpaceMismatchError
from .query_cache import DEFAULT_QUERY_CACHE, QueryCache

log = logging.getLogger(__name__)

__all__ = ["ModelPool", "model_ref"]


def model_ref(path: str | Path) -> str:
    """How a collection records a model: the alias as is, a directory as an absolute path."""
    s = str(path)
    if s in PRETRAINED_TEXT_ALIASES and not Path(s).exists():
        return s
    return str(Path(s).resolve())


#: ``NOBACKFILL_ONNX`` (or ``ModelPool(onnx=...)``, ``serve --onnx``): ``auto`` / ``1`` (default) runs a
#: model's exported ONNX towers when onnxruntime is installed, ``export`` also exports them on first load
#: where there is no export of these weights yet (into ``<model>/onnx/``, beside the model), ``int8`` runs
#: their quantised copies, ``off`` / ``0`` always torch
ONNX_ENV = "NOBACKFILL_ONNX"
ONNX_MODES = ("auto", "export", "int8", "off")
_MODE_ALIASES = {"1": "auto", "true": "auto", "yes": "auto", "on": "auto", "0": "off", "false": "off", "no": "off"}


def onnx_mode(mode: str | None = None) -> str:
    """``mode`` (or ``NOBACKFILL_ONNX``, or ``auto``) as one of :data:`ONNX_MODES`."""
    raw = (mode if mode is not None else os.environ.get(ONNX_ENV, "auto")).strip().lower()
    got = _MODE_ALIASES.get(raw, raw)
    if got not in ONNX_MODES:
        src = "onnx" if mode is not None else ONNX_ENV
        raise ValueError(f"{src} must be one of {', '.join(ONNX_MODES)} (or 0: off, 1: auto), got {raw!r}")
    return got


def _export_on_first_load(encoder: DualEncoder, ref: str) -> None:
    """Export ``encoder``'s towers beside its model (``<ref>/onnx/``) unless an export of these weights is
    there; an export that cannot be made (no onnx / onnxruntime, a read-only directory, a check above
    the threshold) is logged and the model served on torch."""
    from ..encoders.onnx import export_onnx, onnx_export_info

    info = onnx_export_info(ref)
    if info is not None and info.get("space_id") == encoder.space_id:
        return
    try:
        export_onnx(ref)
        log.info("exported %s to ONNX Runtime (%s/onnx)", ref, ref)
    except (ImportError, OSError, ValueError) as e:
        log.warning("could not export %s to ONNX Runtime (%s); serving it on torch", ref, e)


def _on_onnx(encoder: DualEncoder, ref: str, mode: str | None = None, threads: int | None = None) -> DualEncoder:
    """``encoder`` on ONNX Runtime where the model directory holds a checked export of it (made now
    with mode ``export``)."""
    from ..encoders import model_directory

    mode = onnx_mode(mode)
    if mode == "off":
        return encoder
    directory = model_directory(ref)  # a shipped model's name (minilm): its package's directory
    if not directory.is_dir():
        return encoder
    if mode == "export" and hasattr(encoder, "text_features"):
        _export_on_first_load(encoder, str(directory))
    return onnx_encoder(encoder, directory, int8=mode == "int8", threads=threads)


class ModelPool:
    """Encoders by model reference, loaded lazily, kept for the life of the pool (thread-safe).
    :meth:`get` gives the model itself (torch), which embeds the items a collection stores;
    :meth:`query_encoder` gives the one that embeds queries: on ONNX Runtime where the model directory
    holds an export of the same weights (``nobackfill export-onnx``; :data:`ONNX_ENV`), so that an int8
    export changes the queries' vectors, never the stored ones."""

    def __init__(self, query_cache: int = DEFAULT_QUERY_CACHE, onnx: str | None = None,
                 onnx_threads: int | None = None) -> None:
        if onnx_threads is not None and int(onnx_threads) < 1:
            raise ValueError(f"onnx_threads must be at least 1 (or None), got {onnx_threads}")
        self.onnx = onnx_mode(onnx) if onnx is not None else None  # None: NOBACKFILL_ONNX when a model loads
        self.onnx_threads = onnx_threads  # ONNX Runtime intra-op threads per session (None: its default)
        self.query_cache = QueryCache(query_cache)  # text query embeddings of these encoders (0: none kept)
        self._models: dict[str, DualEncoder] = {}
        self._queries: dict[str, DualEncoder] = {}  # the query encoders (ONNX Runtime where exported)
        self._loaded: set[str] = set()  # loaded here and not yet recorded (encoders.meta); never a put one
        self._upgraded: dict[tuple[str, tuple[str, ...]], DualEncoder] = {}
        self._lock = threading.Lock()

    def get(self, ref: str | Path, space_id: str | None = None, *, what: str = "model") -> DualEncoder:
        """The encoder at ``ref``; with ``space_id``, refuse one whose space differs (the directory
        now holds another model than the one the collection was built with)."""
        key = str(ref)
        with self._lock:
            enc = self._models.get(key)
            if enc is None:
                enc = self._models[key] = load_encoder(key)
                self._loaded.add(key)
        if space_id is not None and enc.space_id != space_id:
            raise SpaceMismatchError(space_id, enc.space_id, f"load the {what} at {key}", what=f"model at {key}",
                                     hint="the collection recorded another model for this space; restore that "
                                          "model directory or re-register the upgrade")
        if space_id is not None and key in self._loaded:  # its fingerprint is computed now
            self.remember(key)
        return enc

    def query_encoder(self, ref: str | Path, space_id: str | None = None, *, what: str = "model") -> DualEncoder:
        """The encoder of queries for the model at ``ref`` (:meth:`get`'s checks): on ONNX Runtime when
        the pool's mode (:data:`ONNX_ENV`) and an export of these weights allow, else the model itself."""
        plain = self.get(ref, space_id, what=what)
        key = str(ref)
        with self._lock:  # (as get loads a model: once, an export on first load included)
            enc = self._queries.get(key)
            if enc is None or enc.space_id != plain.space_id:
                enc = self._queries[key] = _on_onnx(plain, key, self.onnx, self.onnx_threads)
        return enc

    def query_towers(self) -> list[tuple[str, str, str, str]]:
        """``(reference, space id, tower, runtime)`` of each query tower loaded so far: runtime
        ``torch``, ``onnx`` or ``onnx-int8``; a model with an XBT upgrade's adapters (the query side
        of a bridge) as ``"REF via UPGRADE"``, always on torch. The space id tells apart two models
        of one directory name."""
        with self._lock:
            encs, ups = sorted(self._queries.items()), sorted(self._upgraded.items())
        named = [(ref, e, e.runtimes() if isinstance(e, OnnxEncoder) else {t: "torch" for t in e.modalities})
                 for ref, e in encs]
        named += [(f"{ref} via {'+'.join(Path(d).name for d in dirs)}", e, {t: "torch" for t in e.modalities})
                  for (ref, dirs), e in ups]
        return [(ref, e.space_id, tower, runtime) for ref, e, towers in named for tower, runtime in towers.items()]

    def runtimes(self) -> dict[str, dict[str, str]]:
        """:meth:`query_towers` by reference and tower: ``{ref: {tower: runtime}}``."""
        out: dict[str, dict[str, str]] = {}
        for ref, _space, tower, runtime in self.query_towers():
            out.setdefault(ref, {})[tower] = runtime
        return out

    def remember(self, ref: str | Path) -> None:
        """Record what the model at ``ref`` is (:mod:`nobackfill.encoders.meta`), once, if this pool
        loaded it from its directory (never an encoder given by :meth:`put`)."""
        key = str(ref)
        with self._lock:
            enc = self._models.get(key) if key in self._loaded else None
            self._loaded.discard(key)
        if enc is not None:
            from ..encoders.meta import remember

            remember(key, enc)

    def put(self, ref: str | Path, encoder: DualEncoder) -> None:
        """Use an already loaded ``encoder`` for ``ref`` (callers that hold one)."""
        with self._lock:
            self._models[str(ref)] = encoder
            self._loaded.discard(str(ref))

    def upgraded(self, ref: str | Path, upgrade_dir: str | Path, space_id: str | None = None) -> DualEncoder:
        """A separate copy of the model at ``ref`` with the encoder upgrade at ``upgrade_dir``
        applied and its adapters merged into the weights (its outputs live in the upgrade's target
        space; merged, queries skip the LoRA branches and switchable wrappers)."""
        from ..compat.upgrade import load_upgrade

        key = (str(ref), (str(upgrade_dir),))
        with self._lock:
            enc = self._upgraded.get(key)
        if enc is None:
            base = copy.deepcopy(self.get(ref, space_id))  # apply() attaches adapters in place (torch)
            enc = load_upgrade(upgrade_dir).apply(base)
            enc = enc.merged() if hasattr(enc, "merged") else enc
            with self._lock:
                enc = self._upgraded.setdefault(key, enc)
        return enc

    def loaded(self) -> list[str]:
        """References of the models loaded so far (plain and upgraded)."""
        with self._lock:
            return sorted(self._models) + [f"{r}+{'+'.join(u)}" for r, u in sorted(self._upgraded)]


