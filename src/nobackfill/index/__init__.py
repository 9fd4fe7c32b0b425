"""Model-versioned, crash-safe galleries of image and text embeddings.

* :class:`Gallery` — one directory per embedding space (``space_id``), append-only chunks,
  atomic manifest, lazily built and cached search index.
* :func:`make_index` — vector-index backends by spec string (``"flat"``, ``"hnsw:M=16,ef=64"``).
* :func:`build_gallery` — embed images/texts with a :class:`~nobackfill.encoders.base.DualEncoder`
  into a gallery, resuming where a previous (killed) run stopped.
"""

from .backends import VectorIndex, known_backends, load_index, make_index, parse_spec, register_backend
from .build import build_gallery
from .gallery import Gallery
from .gallery_manifest import MODALITIES
from .gallery_types import Bridge, CorruptGalleryError, DuplicateIdError, GalleryError, NotAGalleryError, SearchResult, SpaceMismatchError, VerifyReport

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
    "VectorIndex",
    "VerifyReport",
    "build_gallery",
    "known_backends",
    "load_index",
    "make_index",
    "parse_spec",
    "register_backend",
]
