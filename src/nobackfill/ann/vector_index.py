"""The interface every vector-index backend implements (:class:`VectorIndex`): an inner-product
index over float32 rows addressed by position, with checked ``add`` / ``search``, masks and an
exact fallback. The backends themselves are in :mod:`.faiss_indexes` and :mod:`.auto_index`,
chosen by spec string in :mod:`nobackfill.ann.backends`."""

from __future__ import annotations

import abc
import math
from typing import Any, Callable, ClassVar

import numpy as np

__all__ = ["VectorIndex", "all_finite"]

_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)


def all_finite(x: np.ndarray) -> bool:
    """Whether every entry of the float array ``x`` is finite. Its sum of squares is finite only
    then (NaN and inf carry through it) and costs half of ``isfinite(x).all()`` (a query's check is
    on the hot path); finite entries whose squares overflow are settled entry by entry."""
    return math.isfinite(np.vdot(x, x)) or bool(np.isfinite(x).all())


class VectorIndex(abc.ABC):
    """An inner-product index over ``dim``-dimensional float32 rows, addressed by position."""

    #: ``(mask given, ntotal, mask padded or None, rows allowed)`` of the last masked search
    _last_mask: tuple[Any, int, np.ndarray | None, int] | None = None

    #: the ``kind`` part of the spec string
    kind: ClassVar[str] = "abstract"
    #: accepted options and their types, e.g. ``{"M": int}``
    options: ClassVar[dict[str, type]] = {}

    def __init__(self, dim: int) -> None:
        if int(dim) <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = int(dim)

    @property
    @abc.abstractmethod
    def ntotal(self) -> int:
        """Number of stored vectors."""

    @abc.abstractmethod
    def _add(self, vectors: np.ndarray) -> None:
        """Append already validated ``(N, dim)`` float32 C-contiguous rows."""

    @abc.abstractmethod
    def _search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` for validated queries among the positions where ``mask`` (bool, ``ntotal``) is
        True (all when None); ``1 <= k <= `` the number of such positions. Position -1 marks a slot
        the backend could not fill (the caller falls back to an exact search for those rows)."""

    @abc.abstractmethod
    def reconstruct(self, positions: np.ndarray) -> np.ndarray:
        """The stored rows at ``positions`` (float32 ``(len, dim)``)."""

    def to_bytes(self) -> bytes | None:
        """Serialised index for an on-disk cache, or ``None`` if this backend is not file-backed."""
        return None

    def write_to(self, write: Callable[[bytes], Any]) -> bool:
        """Serialise the index piece by piece through ``write`` (a faiss index never holds its
        serialised bytes whole: an on-disk cache of a large graph costs no second copy in memory);
        False, having written nothing, if this backend is not file-backed."""
        data = self.to_bytes()
        if data is None:
            return False
        write(data)
        return True

    @classmethod
    def from_bytes(cls, data: "bytes | Callable[[int], bytes]", dim: int, **options: Any) -> "VectorIndex":
        """Inverse of :meth:`to_bytes` (and of :meth:`write_to`: ``data`` may be a reader, called
        with a byte count, returning the next bytes)."""
        raise NotImplementedError(f"backend {cls.kind!r} cannot be loaded from bytes")

    def _rows(self, x: np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(x, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"{what} must have shape (N, {self.dim}), got {np.shape(x)}")
        arr = np.ascontiguousarray(arr)
        if not all_finite(arr):
            raise ValueError(f"{what} contain NaN or infinite values")
        return arr

    def add(self, vectors: np.ndarray) -> None:
        """Append rows; their positions continue from the current :attr:`ntotal`."""
        rows = self._rows(vectors, "vectors")
        if len(rows):
            self._add(rows)

    def search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None, *,
               checked: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores float32 (Q, k'), positions int64 (Q, k'))``.

        ``mask`` (bool, one per stored row) restricts the search to the rows where it is True
        (deleted, superseded or filtered-out rows are False). ``k' = min(k, ntotal)`` or, with a
        mask, ``min(k, mask.sum())``; positions are always valid (never -1): rows an approximate
        backend could not fill are answered exactly over the allowed rows.
        """
        k = int(k)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        q = queries if checked else self._rows(queries, "queries")  # checked: C-contiguous finite float32 rows
        if mask is None:
            allowed = self.ntotal
        else:
            last = self._last_mask  # a snapshot's mask, seen by the last search: its answer is kept
            if last is not None and last[0] is mask and last[1] == self.ntotal:
                mask, allowed = last[2], last[3]
            else:
                mask, allowed = self._mask(mask)
        if k > allowed:
            k = allowed
        if k == 0 or len(q) == 0:
            return np.zeros((len(q), k), np.float32), np.zeros((len(q), k), np.int64)
        scores, positions = self._search(q, k, mask)
        if scores.dtype is not _F32 or positions.dtype is not _I64:
            scores, positions = np.asarray(scores, dtype=np.float32), np.asarray(positions, dtype=np.int64)
        # a row that came up short ends in -1 (one query's row: its last entry read alone)
        if (positions.item(-1) < 0) if len(positions) == 1 else (positions[:, -1].min() < 0):
            short = (positions < 0).any(axis=1)  # a graph search came up short (tiny or filtered sets): exact
            scores[short], positions[short] = self._exact(q[short], k, mask)
        return scores, positions

    def _mask(self, mask: np.ndarray) -> tuple[np.ndarray | None, int]:
        """``(mask padded with False to ntotal rows, or None when it allows every row; rows
        allowed)``. A reader passes the same (never modified) mask object to every search of a
        snapshot: the last one's answer is kept (:meth:`search` reads it first), so a large mask is
        not counted per search."""
        n = self.ntotal
        m = np.asarray(mask, dtype=bool)
        if m.ndim != 1 or len(m) > n:
            raise ValueError(f"mask must be 1-D with at most {n} entries (one per row), got shape {m.shape}")
        if len(m) < n:  # rows added after the mask was made are not allowed
            m = np.concatenate([m, np.zeros(n - len(m), bool)])
        allowed = int(np.count_nonzero(m))
        out = (None if allowed == n else m), allowed
        self._last_mask = (mask, n, *out)
        return out

    def _exact(self, queries: np.ndarray, k: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` over the allowed rows (brute force on reconstructed vectors)."""
        allowed = np.flatnonzero(mask) if mask is not None else np.arange(self.ntotal)
        scores = queries @ self.reconstruct(allowed).T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, top, axis=1).astype(np.float32), allowed[top]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, ntotal={self.ntotal})"
