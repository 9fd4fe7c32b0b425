"""What a model directory's encoder is, known without loading it: its space id (the fingerprint of
its config, weights and vocabulary, :func:`~nobackfill.encoders.fingerprint.fingerprint`), width,
name and modalities, remembered once the model was loaded and its fingerprint computed. The record
is kept under ``$NOBACKFILL_CACHE/models/`` (default ``~/.cache/nobackfill``), keyed by the
directory and by the name, size and modification time of every file in it: a file changed, added or
removed makes it unknown again, and the model is loaded. A trusted import (``--trust-model``), which
embeds nothing, uses it instead of loading torch and the weights (about 375 MB and 4 s)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._atomic import atomic_write_text

__all__ = ["ModelInfo", "cache_dir", "remember", "remembered"]


@dataclass(frozen=True)
class ModelInfo:
    """An encoder's identity without its weights (what a trusted import records)."""

    space_id: str
    embed_dim: int
    name: str
    modalities: tuple[str, ...]

    @classmethod
    def of_space(cls, space: Any) -> "ModelInfo":
        """What a collection's plan says of one of its spaces (``space_id``, ``dim``, ``name``,
        ``modalities``)."""
        return cls(space.space_id, int(space.dim), space.name, tuple(space.modalities))


def cache_dir() -> Path:
    """``$NOBACKFILL_CACHE`` (default ``~/.cache/nobackfill``)."""
    return Path(os.environ.get("NOBACKFILL_CACHE") or Path.home() / ".cache" / "nobackfill")


def _files_key(directory: Path) -> str:
    """A digest of the directory's path and of its files' names, sizes and modification times."""
    entries = []
    for p in sorted(directory.iterdir()):
        if p.is_file():
            st = p.stat()
            entries.append([p.name, st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps([str(directory), entries]).encode()).hexdigest()


def _record_path(directory: Path) -> Path:
    return cache_dir() / "models" / f"{hashlib.sha256(str(directory).encode()).hexdigest()[:24]}.json"


def _directory(ref: str | Path) -> Path | None:
    p = Path(ref)
    return p.resolve() if p.is_dir() and (p / "config.json").is_file() else None


def remembered(ref: str | Path) -> ModelInfo | None:
    """What the model directory ``ref`` was when it was last loaded here, if none of its files
    changed since (None otherwise, and for an alias such as ``minilm``)."""
    directory = _directory(ref)
    if directory is None:
        return None
    try:
        rec = json.loads(_record_path(directory).read_text(encoding="utf-8"))
        if rec.get("key") != _files_key(directory):
            return None
        return ModelInfo(str(rec["space_id"]), int(rec["embed_dim"]), str(rec["name"]), tuple(rec["modalities"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember(ref: str | Path, encoder: Any) -> None:
    """Record what ``encoder`` (loaded from the directory ``ref``, its fingerprint computed) is; a
    cache that cannot be written is skipped (written whole or not at all)."""
    directory = _directory(ref)
    if directory is None:
        return
    info = ModelInfo(encoder.space_id, int(encoder.embed_dim), str(getattr(encoder, "name", "")),
                     tuple(getattr(encoder, "modalities", ("image", "text"))))
    path = _record_path(directory)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"directory": str(directory), "key": _files_key(directory), **asdict(info)}))
