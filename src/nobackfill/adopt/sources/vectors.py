"""Stored vector blocks for :mod:`nobackfill.adopt.sources`: the block protocol, npy / npz
arrays, the scan that checks every vector, and unit rows."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from .common import _SCAN_ROWS, NORM_TOLERANCE, SourceError, SourceNotFound


#: a row whose norm is this close to 1 is unit to float32 rounding: :func:`_unit` keeps it as it is
_UNIT_ROUNDING = 1e-6
#: how far two float64 sums of one row's squares (summed in another order) may differ, and more
_MARGIN = 1e-9


class _Vectors:
    """A ``(n, dim)`` block of stored vectors; ``raw`` reads in storage order, ``read`` / ``take``
    in the source's row order (the same unless a faiss id map reorders it)."""

    path: Path
    n: int
    dim: int
    dtype: str
    #: packed bits, one a stored row: 1 where :func:`_unit` may change the row (set by :func:`_scan`)
    _moved: np.ndarray | None = None

    def raw(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.raw(start, stop)

    def take(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def unit(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` in the source's row order as unit float32 rows (see :func:`_unit`)."""
        return _unit(self.read(start, stop))

    def norms(self, start: int, stop: int) -> np.ndarray:
        """The float64 norms of stored rows ``start:stop`` read as float32."""
        return _norms(self.raw(start, stop))

    def where(self, i: int) -> str:
        return f"row {i + 1}"


class _ArrayVectors(_Vectors):
    def __init__(self, arr: np.ndarray, path: Path) -> None:
        if arr.ndim != 2:
            raise SourceError(f"expected a 2-d array (rows, dim), got shape {tuple(arr.shape)}", path)
        if arr.dtype.kind != "f":
            raise SourceError(f"vectors must be floating point (float16 / float32 / float64), got {arr.dtype}", path)
        self._arr, self.path = arr, path
        self.n, self.dim, self.dtype = int(arr.shape[0]), int(arr.shape[1]), str(arr.dtype)
        self._map, self._map_offset = _mapping_of(arr)

    def raw(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as float32 (a copy). Read from a memory-mapped ``.npy``, their pages
        are then released: a stream of batches holds one batch of vectors in memory, not the file."""
        x = np.array(self._arr[start:stop], dtype=np.float32)
        self._release(start, stop)
        return x

    def take(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self._arr[np.asarray(rows, dtype=np.int64)], dtype=np.float32)

    def unit(self, start: int, stop: int) -> np.ndarray:
        """As :meth:`_Vectors.unit`; rows the scan found unit (``_moved``) are not measured again."""
        x = self.raw(start, stop)
        if self._moved is not None and not _bits(self._moved, start, stop).any():
            return x  # what _unit returns for these rows: each is unit to float32 rounding
        return _unit(x, copy=False)

    def norms(self, start: int, stop: int) -> np.ndarray:
        if self._arr.dtype != np.float32:
            return super().norms(start, stop)
        out = _norms(self._arr[start:stop])  # float32 rows as stored: no copy
        self._release(start, stop)
        return out

    def _release(self, start: int, stop: int) -> None:
        """Release the mapped pages of rows ``start:stop`` (read already)."""
        if self._map is not None and stop > start:
            row = self._arr.strides[0]
            lo = (self._map_offset + start * row) // mmap.PAGESIZE * mmap.PAGESIZE
            hi = min(len(self._map), -(-(self._map_offset + stop * row) // mmap.PAGESIZE) * mmap.PAGESIZE)
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _mapping_of(arr: np.ndarray) -> tuple["mmap.mmap | None", int]:
    """The memory map under ``arr`` (a C-ordered ``np.memmap``) and where its first row lies in the
    map; (None, 0) for an array in memory or a platform without ``madvise``."""
    m = getattr(arr, "_mmap", None)
    if not isinstance(m, mmap.mmap) or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED") \
            or not arr.flags.c_contiguous:
        return None, 0
    base = np.frombuffer(m, np.uint8)
    offset = arr.ctypes.data - base.ctypes.data
    del base  # a live export would stop the map from closing
    return m, int(offset)


def _load_npy(path: Path) -> _ArrayVectors:
    if not path.is_file():
        raise SourceNotFound("vector file not found", path)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise SourceError(f"not a readable .npy array ({e})", path) from None
    return _ArrayVectors(arr, path)


def _load_npz(path: Path, key: str | None) -> _ArrayVectors:
    if not path.is_file():
        raise SourceNotFound("vector file not found", path)
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            if key is None:
                if len(keys) != 1:
                    raise SourceError(f"holds {len(keys)} arrays ({', '.join(keys) or 'none'}): name one as "
                                      f"npz:{path}:KEY", path)
                key = keys[0]
            if key not in keys:
                raise SourceError(f"no array {key!r}; its arrays: {', '.join(keys) or 'none'}", path)
            arr = z[key]
    except SourceError:
        raise
    except (ValueError, OSError) as e:
        raise SourceError(f"not a readable .npz file ({e})", path) from None
    return _ArrayVectors(arr, path)


def _scan(vec: _Vectors, expect_dim: int | None) -> int:
    """Check every stored vector (finite, non-zero, width); returns how many are not unit length.
    Records in ``vec._moved`` the rows :func:`_unit` may change (the others need no second look)."""
    if expect_dim is not None and vec.dim != int(expect_dim):
        raise SourceError(f"vectors are {vec.dim}-d (shape ({vec.n}, {vec.dim})) but the model embeds "
                          f"{int(expect_dim)}-d vectors: nothing was imported (were they made by another model "
                          "than the one named?)", vec.path)
    off = 0
    moved = []
    for s in range(0, vec.n, _SCAN_ROWS):
        norms = vec.norms(s, min(vec.n, s + _SCAN_ROWS))
        finite = np.isfinite(norms)  # (a float32 row's sum of squares is finite in float64 unless it holds NaN / inf)
        if not finite.all():
            i = s + int(np.argmin(finite))
            raise SourceError("the vector has NaN or infinite values", vec.path, i + 1, where=vec.where(i))
        zero = norms < 1e-12
        if zero.any():
            i = s + int(np.argmax(zero))
            raise SourceError("the vector is all zeros: it has no direction (cannot be normalised)", vec.path,
                              i + 1, where=vec.where(i))
        dev = np.abs(norms - 1.0)
        off += int((dev > NORM_TOLERANCE).sum())
        moved.append(np.packbits(dev > _UNIT_ROUNDING - _MARGIN))  # _SCAN_ROWS is a multiple of 8
    vec._moved = np.concatenate(moved) if moved else np.zeros(0, np.uint8)
    return off


def _norms(x: np.ndarray) -> np.ndarray:
    """Float64 norms of float32 rows."""
    return np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))


def _bits(packed: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bits ``start:stop`` of ``packed`` (``np.packbits`` of a bool array), as bools."""
    lo = start // 8
    return np.unpackbits(packed[lo:-(-stop // 8)])[start - lo * 8:stop - lo * 8].view(bool)


def _unit(x: np.ndarray, copy: bool = True) -> np.ndarray:
    """Unit rows; a row already unit to float32 rounding (1e-6) is kept bit for bit. ``copy=False``:
    ``x`` (float32) may be changed in place."""
    x = np.array(x, dtype=np.float32, copy=True) if copy else np.asarray(x, dtype=np.float32)
    norms = _norms(x)
    off = np.abs(norms - 1.0) > _UNIT_ROUNDING
    if off.any():
        x[off] = (x[off] / np.maximum(norms[off], 1e-12)[:, None]).astype(np.float32)
    return x
