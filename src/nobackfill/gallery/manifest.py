"""A gallery's manifest (``manifest.json``, the only source of truth of a gallery directory): its
constants and layout names, reading and validating it, writing it atomically, the fingerprint of
the chunks a cached index holds, and the in-memory columns a gallery loads chunk by chunk."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ..ann.key_index import KeyIndex

from .atomic_files import _sha256, atomic_write_bytes, read_tagged_json
from ..ann.backends import parse_spec
from .types import CorruptGalleryError, NotAGalleryError

__all__ = ["CHUNK_DIR", "FORMAT_NAME", "FORMAT_VERSION", "MANIFEST", "MODALITIES"]

MODALITIES = ("image", "text")
FORMAT_VERSION = 1
FORMAT_NAME = "nobackfill-gallery"
MANIFEST = "manifest.json"
CHUNK_DIR = "chunks"
_CHUNK_RE = re.compile(r"^(image|text)-\d{5,}\.(npz|jsonl)$")


def _check_modality(modality: str) -> str:
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return modality


def _read_manifest(root: Path) -> dict[str, Any]:
    """Load and validate ``root/manifest.json``; errors name the file."""
    path = root / MANIFEST
    if not root.is_dir():
        raise NotAGalleryError(f"{root} is not a gallery: no such directory")
    if not path.is_file():
        raise NotAGalleryError(f"{root} is not a gallery: {path} does not exist")
    m = read_tagged_json(path, FORMAT_NAME, error=CorruptGalleryError, version_key="format_version",
                         max_version=FORMAT_VERSION)
    try:
        for key, typ in (("space_id", str), ("dim", int), ("model", str), ("backend", str)):
            if not isinstance(m.get(key), typ):
                raise ValueError(f"field {key!r} missing or not {typ.__name__}")
        if m["dim"] <= 0:
            raise ValueError(f"dim must be positive, got {m['dim']}")
        parse_spec(m["backend"])  # (its form: a search parameter out of range is refused when the index opens)
        mods = m.get("modalities")
        if not isinstance(mods, dict) or set(mods) != set(MODALITIES):
            raise ValueError(f"'modalities' must have exactly the keys {MODALITIES}")
        for name, mod in mods.items():
            chunks = mod.get("chunks") if isinstance(mod, dict) else None
            if not isinstance(chunks, list):
                raise ValueError(f"modalities.{name}.chunks must be a list")
            for c in chunks:
                if not isinstance(c, dict) or not all(
                    isinstance(c.get(k), t) for k, t in _CHUNK_FIELDS.items()
                ):
                    raise ValueError(f"bad chunk entry in modalities.{name}: {c!r}")
            if mod.get("count") != sum(c["count"] for c in chunks):
                raise ValueError(f"modalities.{name}.count does not match its chunks")
    except ValueError as e:
        raise CorruptGalleryError(f"corrupt gallery manifest {path}: {e}") from e
    return m


_CHUNK_FIELDS = {"name": str, "count": int, "npz": str, "npz_sha256": str, "meta": str, "meta_sha256": str}


def _manifest_stat(root: Path | str) -> tuple[int, int, int] | None:
    """(inode, size, mtime_ns) of the manifest (``root``: the gallery directory, or the manifest's
    path as a string: the hot path of every search builds no path object): changes whenever a
    writer replaces it."""
    try:
        st = os.stat(root if isinstance(root, str) else root / MANIFEST)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    # orjson: for the manifest's ASCII strings and integers, the text of json.dumps(indent=2,
    # sort_keys=True), several times faster; every commit writes the whole manifest, which grows
    # with the chunks (an import of 1M rows commits 62 of them)
    data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
    atomic_write_bytes(root / MANIFEST, data)


def _copy_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``manifest`` (a commit changes a copy: the manifest readers hold never changes)."""
    return orjson.loads(orjson.dumps(manifest))


def _chunk_key(manifest: dict[str, Any], modality: str, upto: int | None = None) -> str:
    """Fingerprint of what a cached index of ``modality`` must contain (its first ``upto`` chunks:
    a cache of a prefix is extended with the chunks appended since)."""
    chunks = [(c["name"], c["npz_sha256"], c["count"]) for c in manifest["modalities"][modality]["chunks"][:upto]]
    blob = json.dumps({"backend": manifest["backend"], "dim": manifest["dim"], "chunks": chunks})
    return _sha256(blob.encode())


@dataclass
class _Columns:
    """In-memory copy of one modality, loaded chunk by chunk (chunks are append-only)."""

    chunks: list[str] = field(default_factory=list)  # chunk names whose ids are loaded
    count: int = 0  # rows of those chunks
    keys: KeyIndex = field(default_factory=KeyIndex)  # id -> row, compact
    ids: list[str] | None = None  # the ids in row order, loaded only when asked for
    vectors: np.ndarray | None = None  # rows of the first ``vec_chunks`` chunks, read-only
    vec_chunks: int = 0
    metadata: list[dict[str, Any]] = field(default_factory=list)  # rows of the first ``meta_chunks``
    meta_chunks: int = 0
