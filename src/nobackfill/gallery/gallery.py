"""A gallery on disk: embeddings of one embedding space, append-only and crash-safe.

Layout of a gallery directory::

    manifest.json               the only source of truth (format, space_id, dim, model, backend,
                                committed chunks per modality with counts and sha256)
    chunks/<modality>-<nnnnn>.npz    vectors (float32) + ids of one ``add`` call
    chunks/<modality>-<nnnnn>.jsonl  one metadata dict per row
    index-<modality>.faiss      cached search index (derived data, rebuilt when chunks change)
    index-<modality>.json       which chunk list that cached index was built from, and its sha256
    .lock                       advisory lock taken by writers

Every file is written to a temporary name in its directory, fsynced, renamed into place and the
directory fsynced. A chunk is committed only when the manifest naming it has been replaced, so a
process killed at any point leaves either the old or the new gallery, never half of one; chunk
files the manifest does not list are ignored and removed by the next writer.

Every read checks what it reads: a chunk's bytes against the manifest's sha256 (a damaged or
edited chunk is an error naming the file and what to run, never data served), a cached index against
the chunk list it was built from and its own sha256 (a damaged one is rebuilt). :meth:`Gallery.verify`
reports every problem; :meth:`Gallery.repair` rebuilds what is derived and takes damaged chunks out
of the manifest, listing the ids that must be added again.

Vectors carry the gallery's ``space_id``: adding or searching with another space raises
:class:`SpaceMismatchError` (queries of another space are mapped into the gallery's space by a
:class:`Bridge` before :meth:`Gallery.search`; ``nobackfill.search.routes`` does that).

This module holds the :class:`Gallery` class (creating, opening, refreshing, its properties and
:meth:`Gallery.search`); the mixins it is made of live in :mod:`.chunks` (reading and committing
chunks), :mod:`.gallery_index` (the cached search index) and :mod:`.gallery_repair` (verify and
repair); :mod:`.gallery_manifest` has the manifest, :mod:`.gallery_types` the errors, results and
reports, :mod:`.atomic_files` the crash-safe writes.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import file_above
from .atomic_files import _dir_lock, _now
from ..ann.backends import VectorIndex, check_buildable, validate_spec
from .chunks import GalleryChunks
from .search_index import GalleryIndex
from .manifest import (CHUNK_DIR, FORMAT_NAME, FORMAT_VERSION, MANIFEST, MODALITIES, _check_modality, _Columns,
                       _copy_manifest, _manifest_stat, _read_manifest, _write_manifest)
from .repair import GalleryIntegrity
from .types import GalleryError, SearchResult, SpaceMismatchError

__all__ = ["Gallery", "check_gallery_folder"]


def check_gallery_folder(path: str | Path, space_id: str | None = None) -> None:
    """``ValueError`` unless a gallery can be made or resumed at ``path``: absent, empty (hidden files
    aside), a gallery (of ``space_id``, when given: else :class:`SpaceMismatchError`), or what a
    killed create left. Writes nothing, so a command checks its ``--out`` before it reads its data
    and leaves no lock in a folder it refuses (trial Y: a model's folder)."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root} is a file, not a gallery folder")
    if not root.is_dir():
        if (above := file_above(root)) is not None:
            raise ValueError(f"{root}: {above} is a file, not a folder")
        return
    if (root / MANIFEST).exists():
        if space_id is not None:
            _check_space(root, _read_manifest(root)["space_id"], space_id)
        return
    stray = [p.name for p in root.iterdir() if not p.name.startswith(".") and p.name != CHUNK_DIR]
    if stray:
        raise ValueError(f"{root} is not empty and not a gallery (found {', '.join(sorted(stray)[:5])})")


def _check_space(root: Path, held: str, space_id: str) -> None:
    """:class:`SpaceMismatchError` unless the gallery at ``root``, of space ``held``, takes ``space_id``'s vectors."""
    if held != space_id:
        raise SpaceMismatchError(held, space_id, f"resume gallery {root}", what="model's embeddings",
                                 hint="use a new directory for a new embedding space")


class Gallery(GalleryChunks, GalleryIndex, GalleryIntegrity):
    """Embeddings of images and texts in one embedding space, stored under one directory.

    Open with :meth:`create` (new or resume) or :meth:`open`. One writer at a time per directory
    (enforced with an advisory lock while a chunk is committed); any number of readers.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        """Internal; use :meth:`create` or :meth:`open`."""
        self.path = path
        self._manifest_path = str(path / MANIFEST)
        self._manifest = manifest
        self._cols: dict[str, _Columns] = {m: _Columns() for m in MODALITIES}
        # modality -> (chunk key, chunk names, index, ntotal last written to the on-disk cache)
        self._indexes: dict[str, tuple[str, list[str], VectorIndex, int]] = {}
        self._index_manifest: dict[str, dict[str, Any]] = {}  # modality -> the manifest its index matches
        self._lock = threading.RLock()  # one thread at a time grows or searches an index
        self._stat = _manifest_stat(path)
        self._closed = False

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, path: str | Path, *, space_id: str, dim: int, model: str, backend: str = "flat") -> "Gallery":
        """Create a gallery at ``path``, or resume the one there if it has the same ``space_id``.

        Raises :class:`SpaceMismatchError` if a gallery of another space exists there, and
        ``ValueError`` for a different ``dim`` or a non-empty directory that is not a gallery.
        A different ``backend`` on resume replaces the stored one (the index is derived data).
        """
        if not isinstance(space_id, str) or not space_id:
            raise ValueError("space_id must be a non-empty string")
        if int(dim) <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        backend = validate_spec(backend)
        check_buildable(backend, int(dim))  # before the folder is made
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        with _dir_lock(root):
            if (root / MANIFEST).exists():
                manifest = _read_manifest(root)
                _check_space(root, manifest["space_id"], space_id)
                if manifest["dim"] != int(dim):
                    raise ValueError(f"gallery {root} has dim {manifest['dim']}, asked for {dim}")
                if manifest["backend"] != backend:
                    manifest["backend"], manifest["updated"] = backend, _now()
                    _write_manifest(root, manifest)
            else:
                check_gallery_folder(root)
                now = _now()
                manifest = {
                    "format": FORMAT_NAME,
                    "format_version": FORMAT_VERSION,
                    "space_id": space_id,
                    "dim": int(dim),
                    "model": str(model),
                    "backend": backend,
                    "created": now,
                    "updated": now,
                    "modalities": {m: {"count": 0, "chunks": []} for m in MODALITIES},
                }
                (root / CHUNK_DIR).mkdir(exist_ok=True)
                _write_manifest(root, manifest)
            gallery = cls(root, manifest)
            gallery._collect_garbage_locked()
        return gallery

    @classmethod
    def open(cls, path: str | Path) -> "Gallery":
        """Open an existing gallery; uncommitted leftovers of a crash are removed if possible."""
        root = Path(path)
        gallery = cls(root, _read_manifest(root))
        with contextlib.suppress(OSError), _dir_lock(root, blocking=False) as taken:
            if taken:
                gallery._manifest, gallery._stat = _read_manifest(root), _manifest_stat(root)
                gallery._collect_garbage_locked()
        return gallery

    def refresh(self) -> bool:
        """Re-read the manifest if another process committed since it was read; True if it changed.
        Cheap when nothing changed (one ``stat``); loaded chunks and indexes are kept and grown."""
        self._check_open()
        st = _manifest_stat(self._manifest_path)
        if st == self._stat:
            return False
        with self._lock:
            self._manifest, self._stat = _read_manifest(self.path), st
        return True

    def close(self) -> None:
        """Drop cached vectors and indexes; the object is unusable afterwards."""
        self._cols.clear()
        self._indexes.clear()
        self._index_manifest.clear()
        self._closed = True

    def __enter__(self) -> "Gallery":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ properties

    @property
    def space_id(self) -> str:
        return self._manifest["space_id"]

    @property
    def dim(self) -> int:
        return self._manifest["dim"]

    @property
    def model(self) -> str:
        return self._manifest["model"]

    @property
    def backend(self) -> str:
        return self._manifest["backend"]

    @property
    def manifest(self) -> dict[str, Any]:
        """A copy of the committed manifest."""
        return _copy_manifest(self._manifest)

    def count(self, modality: str) -> int:
        return self._manifest["modalities"][_check_modality(modality)]["count"]

    def __len__(self) -> int:
        return sum(self.count(m) for m in MODALITIES)

    def __repr__(self) -> str:
        counts = ", ".join(f"{m}={self.count(m)}" for m in MODALITIES)
        return f"Gallery({str(self.path)!r}, space={self.space_id[:12]}, dim={self.dim}, {counts})"

    # ------------------------------------------------------------------ reading

    def _check_open(self) -> None:
        if self._closed:
            raise GalleryError(f"gallery {self.path} is closed")

    def search(
        self,
        modality: str,
        queries: np.ndarray,
        k: int = 10,
        *,
        space_id: str,
        mask: np.ndarray | None = None,
    ) -> SearchResult:
        """Top-``k`` rows of ``modality`` by inner product for each query row.

        ``space_id`` is the space the queries were embedded in; it must be the gallery's, otherwise
        :class:`SpaceMismatchError` is raised (queries of another space are carried into the
        gallery's by a :class:`Bridge` before the search: see ``nobackfill.search.routes``).
        ``mask`` (bool, one per row in insertion order) restricts the search to the rows where it
        is True; rows committed after the mask was made count as False (a reader's snapshot never
        sees them).
        """
        if self._closed:
            self._check_open()
        if modality not in MODALITIES:
            _check_modality(modality)
        if space_id != self._manifest["space_id"]:  # (the property costs a call: this is every search)
            raise SpaceMismatchError(self.space_id, space_id, f"search {modality} gallery {self.path}",
                                     what="queries", expected_name=self.model,
                                     hint="embed them with the gallery's model, or map them into its space with a "
                                          "bridge first")
        q = self._check_rows(queries, "queries")
        k = int(k)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock:
            index = self._index(modality)
            scores, positions = index.search(q, k, mask=mask, checked=True)  # a shorter mask: padded
            # inner products of unit vectors: a score outside [-1, 1] can only be rounding. Rows are
            # sorted by descending score, so one query's row is checked at its two ends (the ufuncs
            # cost more than the search's other steps together)
            if len(scores) != 1 or scores.shape[1] and (scores.item(0) > 1.0 or scores.item(-1) < -1.0):
                np.minimum(scores, 1.0, out=scores)
                np.maximum(scores, -1.0, out=scores)
            # the hits' keys are named lazily (most callers map positions; a large gallery's keys are
            # not loaded for them), as committed now: the manifest is replaced, never changed, by a commit
            return SearchResult(scores, None, positions, names=functools.partial(self._names_at, self._manifest,
                                                                                    modality))

    def _names_at(self, manifest: dict[str, Any], modality: str) -> list[str]:
        """The row keys of ``modality`` as ``manifest`` committed them (the current ones while the
        gallery is open; read from its chunks after it was closed)."""
        if not self._closed:
            return self._ids(modality)
        return [str(i) for e in manifest["modalities"][modality]["chunks"] for i in self._load_npz(e, "ids")]
