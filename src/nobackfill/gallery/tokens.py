"""Per-item token outputs stored beside a gallery, for late-interaction re-ranking (the Target-CMLI paper).

Layout (a ``tokens/`` folder inside the gallery directory; the gallery itself is untouched and
ignores it)::

    tokens/manifest.json     format, space_id, stored dim and dtype, projection, per-modality files
    tokens/<modality>.npz    ids (str), offsets (int64, n + 1), tokens (sum of lengths, d)
    tokens/projection.npy    optional (D, d) shared projection (float32) applied before storing

Only content tokens are stored (image CLS, text BOS / EOS / padding dropped), ragged: item ``i``
owns rows ``offsets[i]:offsets[i+1]``. ``float16`` halves the size; a projection to ``d < D``
dimensions (rows re-normalised) shrinks it further; queries must then be projected the same way
(:attr:`TokenStore.projection`). Every file is written atomically and the manifest last, so a
reader sees the old store or the new one; each file's sha256 is checked when it is read.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .atomic_files import _sha256, atomic_write_bytes, read_tagged_json
from .manifest import MODALITIES
from .types import CorruptGalleryError, GalleryError, SpaceMismatchError
from .npz_bytes import npz_bytes

__all__ = ["TOKENS_DIR", "TokenStore", "NoTokensError", "write_tokens"]

TOKENS_DIR = "tokens"
FORMAT_NAME = "nobackfill-tokens"
FORMAT_VERSION = 1
DTYPES = ("float16", "float32")


class NoTokensError(GalleryError, FileNotFoundError):
    """The gallery has no stored tokens (of a modality)."""


def _read_manifest(root: Path) -> dict:
    path = root / TOKENS_DIR / "manifest.json"
    if not path.is_file():
        raise NoTokensError(f"{root}: no token store ({path} missing); index with --tokens to store token outputs")
    m = read_tagged_json(path, FORMAT_NAME, error=CorruptGalleryError, version_key="format_version",
                         max_version=FORMAT_VERSION)
    try:
        for key in ("space_id", "dim", "dtype", "modalities"):
            if key not in m:
                raise ValueError(f"field {key!r} missing")
        if m["dtype"] not in DTYPES:
            raise ValueError(f"dtype {m['dtype']!r} not in {DTYPES}")
    except (OSError, ValueError) as e:
        raise CorruptGalleryError(f"corrupt token manifest {path}: {e}") from e
    return m


def write_tokens(gallery_dir: str | Path, modality: str, ids: Sequence[str], tokens: Sequence[np.ndarray], *,
                 space_id: str, dtype: str = "float16", projection: np.ndarray | None = None,
                 source_dim: int | None = None) -> "TokenStore":
    """Store (replace) the token outputs of ``modality``: ``tokens[i]`` is ``(L_i, d)`` for item
    ``ids[i]`` (content tokens only, already projected if ``projection`` is given). The store's
    space, dtype and projection must agree with what is already there (else ``ValueError``)."""
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    ids = [str(i) for i in ids]
    if len(ids) != len(tokens):
        raise ValueError(f"{len(ids)} ids but {len(tokens)} token arrays")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{modality} token ids repeat")
    root = Path(gallery_dir)
    if not (root / "manifest.json").is_file():
        raise GalleryError(f"{root} is not a gallery (no manifest.json); build the gallery first")
    dims = {int(t.shape[1]) for t in tokens if np.ndim(t) == 2}
    if any(np.ndim(t) != 2 for t in tokens) or len(dims) > 1:
        raise ValueError("every token array must be 2-D (L, d) with one common d")
    dim = dims.pop() if dims else (projection.shape[1] if projection is not None else int(source_dim or 0))
    folder = root / TOKENS_DIR
    folder.mkdir(exist_ok=True)
    try:
        manifest = _read_manifest(root)
    except NoTokensError:
        manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "space_id": space_id, "dim": dim,
                    "source_dim": int(source_dim or dim), "dtype": dtype, "projection": None, "modalities": {}}
    if manifest["space_id"] != space_id:
        raise SpaceMismatchError(manifest["space_id"], space_id, f"store tokens in {folder}", what="tokens",
                                 hint="tokens must come from the gallery's model")
    if (manifest["dim"], manifest["dtype"]) != (dim, dtype):
        raise ValueError(f"{folder}: stored tokens are {manifest['dim']}-d {manifest['dtype']}, "
                         f"new ones {dim}-d {dtype}")
    proj_data = None
    if projection is not None:
        pbytes = io.BytesIO()
        np.save(pbytes, np.ascontiguousarray(projection, dtype=np.float32))
        proj_data = pbytes.getvalue()
    proj_sha = None if proj_data is None else _sha256(proj_data)
    others = set(manifest["modalities"]) - {modality}
    if others and manifest["projection"] != proj_sha:
        raise ValueError(f"{folder}: {sorted(others)} tokens were stored with "
                         f"{'another projection' if manifest['projection'] else 'no projection'}; use the same")
    if proj_data is not None:
        atomic_write_bytes(folder / "projection.npy", proj_data)
    manifest["projection"] = proj_sha
    lengths = np.array([t.shape[0] for t in tokens], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.concatenate([np.asarray(t, dtype=np.float32) for t in tokens]) if tokens else np.zeros((0, dim))
    data = npz_bytes({"ids": np.array(ids, dtype=str), "offsets": offsets, "tokens": flat.astype(dtype)})
    atomic_write_bytes(folder / f"{modality}.npz", data)
    manifest["modalities"][modality] = {"file": f"{modality}.npz", "sha256": _sha256(data), "count": len(ids),
                                        "n_tokens": int(offsets[-1])}
    atomic_write_bytes(folder / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
    return TokenStore(root, manifest)


@dataclass
class _Loaded:
    ids: dict[str, int]
    offsets: np.ndarray
    tokens: np.ndarray


class TokenStore:
    """Read access to a gallery's stored tokens: :meth:`get` pads the tokens of some ids into a
    ``(k, L_max, d)`` float32 batch with its bool mask."""

    def __init__(self, root: Path, manifest: dict) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self._loaded: dict[str, _Loaded] = {}

    @classmethod
    def open(cls, gallery_dir: str | Path) -> "TokenStore":
        root = Path(gallery_dir)
        return cls(root, _read_manifest(root))

    @property
    def space_id(self) -> str:
        return self.manifest["space_id"]

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def dtype(self) -> str:
        return self.manifest["dtype"]

    def has(self, modality: str) -> bool:
        return modality in self.manifest["modalities"]

    def count(self, modality: str) -> int:
        return int(self.manifest["modalities"].get(modality, {}).get("count", 0))

    @property
    def projection(self) -> np.ndarray | None:
        """The ``(D, d)`` projection the stored tokens went through (queries need it too)."""
        if self.manifest.get("projection") is None:
            return None
        path = self.root / TOKENS_DIR / "projection.npy"
        data = path.read_bytes()
        if _sha256(data) != self.manifest["projection"]:
            raise CorruptGalleryError(f"{path}: sha256 does not match the token manifest")
        return np.load(io.BytesIO(data))

    def _load(self, modality: str) -> _Loaded:
        if modality in self._loaded:
            return self._loaded[modality]
        entry = self.manifest["modalities"].get(modality)
        if entry is None:
            raise NoTokensError(f"{self.root}: no {modality} tokens stored (have: {sorted(self.manifest['modalities'])})")
        path = self.root / TOKENS_DIR / entry["file"]
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptGalleryError(f"{path}: unreadable ({e})") from e
        if _sha256(data) != entry["sha256"]:
            raise CorruptGalleryError(f"{path}: sha256 does not match the token manifest")
        z = np.load(io.BytesIO(data))
        ids = [str(i) for i in z["ids"]]
        loaded = _Loaded({i: k for k, i in enumerate(ids)}, z["offsets"], z["tokens"])
        self._loaded[modality] = loaded
        return loaded

    def ids(self, modality: str) -> list[str]:
        return list(self._load(modality).ids)

    def get(self, modality: str, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Padded float32 tokens ``(len(ids), L_max, d)`` and mask ``(len(ids), L_max)``."""
        lo = self._load(modality)
        missing = [i for i in ids if i not in lo.ids]
        if missing:
            raise NoTokensError(f"{self.root}: no stored {modality} tokens for ids {missing[:5]} "
                                f"(re-run index with --tokens)")
        rows = [lo.ids[i] for i in ids]
        lens = [int(lo.offsets[r + 1] - lo.offsets[r]) for r in rows]
        width = max(lens, default=0)
        out = np.zeros((len(rows), max(width, 1), self.dim), np.float32)
        mask = np.zeros((len(rows), max(width, 1)), bool)
        for k, (r, n) in enumerate(zip(rows, lens)):
            out[k, :n] = lo.tokens[lo.offsets[r]:lo.offsets[r] + n]
            mask[k, :n] = True
        return out, mask
