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

The code lives in :mod:`.gallery` (the :class:`Gallery` class), :mod:`.chunks` (reading and
committing chunks), :mod:`.gallery_index` (the cached search index), :mod:`.gallery_repair`
(verify and repair), :mod:`.gallery_manifest` (the manifest), :mod:`.gallery_types` (errors,
results, reports) and :mod:`.atomic_files` (crash-safe writes); this module is the one to import.
"""

from __future__ import annotations

from .atomic_files import _crash_point, _dir_lock, _fsync_dir, _now, _sha256, atomic_write_bytes, file_sha256, \
    read_tagged_json
from .gallery import Gallery
from .gallery_manifest import CHUNK_DIR, FORMAT_NAME, FORMAT_VERSION, MANIFEST, MODALITIES
from .gallery_types import (Bridge, CorruptGalleryError, DuplicateIdError, GalleryError, NotAGalleryError,
                            RepairReport, SearchResult, SpaceMismatchError, VerifyReport)

__all__ = [
    "MODALITIES",
    "FORMAT_VERSION",
    "Bridge",
    "Gallery",
    "GalleryError",
    "NotAGalleryError",
    "CorruptGalleryError",
    "SpaceMismatchError",
    "DuplicateIdError",
    "SearchResult",
    "VerifyReport",
    "RepairReport",
    "VerifyReport",
    "atomic_write_bytes",
]

# importable from here as before the split (nobackfill modules and tests use them)
_REEXPORTED = (CHUNK_DIR, FORMAT_NAME, MANIFEST, _crash_point, _dir_lock, _fsync_dir, _now, _sha256, file_sha256,
               read_tagged_json)
