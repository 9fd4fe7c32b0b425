"""A small LRU cache of text query embeddings, per model pool: a repeated query (the same text,
character for character, for the same loaded encoder) is not embedded again. Thread-safe; its hits,
misses and size are read by the service's ``/metrics``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from ..encoders.base import encode

__all__ = ["DEFAULT_QUERY_CACHE", "QueryCache"]

#: entries kept by default (a 512-d float32 row is 2 KiB: 4096 entries are 8 MiB)
DEFAULT_QUERY_CACHE = 4096


class QueryCache:
    """``(encoder, text) -> its embedding``, the ``size`` most recently used (0: off), shared by the
    pool's encoders. The key is the encoder object itself (the pool keeps it for its life), its space
    id and the exact text: no normalisation, since the tokenizers see a tab, a doubled or a trailing
    space as tokens of their own (world-old's embedding of ``"a\tred circle"`` is at cosine ~0.5 of
    ``"a red circle"``'s), and a cache must never change a result."""

    def __init__(self, size: int = DEFAULT_QUERY_CACHE) -> None:
        if int(size) < 0:
            raise ValueError(f"query cache size must be >= 0, got {size}")
        self.size = int(size)
        self.hits = 0
        self.misses = 0
        self._rows: OrderedDict[tuple[int, str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def stats(self) -> dict[str, int]:
        return {"size": self.size, "entries": len(self._rows), "hits": self.hits, "misses": self.misses}

    def embed_texts(self, encoder: Any, texts: Sequence[str]) -> np.ndarray:
        """``encode(encoder, "text", texts)``, rows already cached taken from the cache."""
        if self.size == 0:
            with self._lock:
                self.misses += len(texts)
            return encode(encoder, "text", texts)
        space = encoder.space_id  # changes when weights are changed in place
        keys = [(id(encoder), space, t) for t in texts]
        found: dict[int, np.ndarray] = {}
        with self._lock:
            for i, k in enumerate(keys):
                row = self._rows.get(k)
                if row is not None:
                    self._rows.move_to_end(k)
                    found[i] = row
            self.hits += len(found)
            self.misses += len(keys) - len(found)
        if len(found) == len(keys) and keys:
            return np.stack([found[i] for i in range(len(keys))])
        missing = [i for i in range(len(keys)) if i not in found]
        fresh = encode(encoder, "text", [texts[i] for i in missing])
        with self._lock:
            for i, row in zip(missing, fresh):
                row = row.copy()
                row.flags.writeable = False
                self._rows[keys[i]] = row
                self._rows.move_to_end(keys[i])
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)
        if not found:
            return fresh
        out = np.empty((len(keys), fresh.shape[1]), np.float32)
        out[missing] = fresh
        for i, row in found.items():
            out[i] = row
        return out
