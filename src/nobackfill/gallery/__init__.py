"""One embedding space's vectors on disk: a crash-safe, model-versioned gallery.

Holds: :class:`Gallery` (one directory per space: append-only chunks, an atomic manifest, a lazily
built and cached search index), its files (``atomic_files``: atomic writes, fsync, advisory locks;
``npz_bytes``; ``manifest``; ``chunks``), their integrity (``repair``: verify and repair), the
search index cache (``search_index``), token stores for late interaction (``tokens``), the gallery's
types and errors (``types``) and :func:`build_gallery` (embed into a gallery, resuming a killed run).

Layer: above :mod:`nobackfill.ann`. May import: ``_atomic``, ``ann`` and the core helpers (``progress``,
``encoders`` for types only).
"""

from .build import build_gallery
from .gallery import Gallery
from .manifest import MODALITIES
from .types import (Bridge, CorruptGalleryError, DuplicateIdError, GalleryError, NotAGalleryError, SearchResult,
                    SpaceMismatchError, VerifyReport)

__all__ = [
    "MODALITIES",
    "Bridge",
    "CorruptGalleryError",
    "DuplicateIdError",
    "Gallery",
    "GalleryError",
    "NotAGalleryError",
    "SearchResult",
    "SpaceMismatchError",
    "VerifyReport",
    "build_gallery",
]
