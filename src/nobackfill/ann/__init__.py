"""Vector and key indexes behind one interface, chosen by a spec string (the faiss way).

Holds: :class:`VectorIndex` (the interface), the faiss factory indexes (``Flat``, ``HNSW32``, ...),
the ``auto`` index (exact search, then a graph built in the background), the backend registry
(:func:`make_index` by spec, :func:`load_index`) and :class:`~nobackfill.ann.key_index.KeyIndex`
(sorted 64-bit key hashes: which ids a store holds).

Layer: the lowest of the storage layers. May import: nothing of nobackfill (numpy and faiss only).
"""

from .backends import VectorIndex, known_backends, load_index, make_index, parse_spec, register_backend

__all__ = ["VectorIndex", "known_backends", "load_index", "make_index", "parse_spec", "register_backend"]
