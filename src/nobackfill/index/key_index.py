"""The row of each key a store holds, in about 26 bytes a key (:class:`KeyIndex`).

A gallery's chunks hold their rows' keys; the store must answer "which row holds key k" for every
add (keys already held are skipped) and every lookup. A Python ``dict`` of the key strings costs
about 200 bytes a key (200 MB at a million rows). Here each key is reduced to a 128-bit hash
(:func:`key_hashes`), kept in two sorted arrays: a large one and a small one that new keys are merged into,
itself merged into the large one when it outgrows a quarter of it (amortised O(log n) a key). Two
different keys share a 128-bit hash with probability about n^2 / 2^129 (1e-27 at a million keys).
A filter of 16 bits a key sends only the keys that may be held to the binary searches.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["KeyIndex", "key_hashes"]


def key_hashes(keys: Sequence[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes of each key (``hi``, ``lo``): Python's own string hash (SipHash, keyed
    afresh by each process: the index lives in memory only) of the key and of the key behind a
    one-character prefix."""
    if isinstance(keys, np.ndarray):
        keys = keys.tolist()
    n = len(keys)
    hi = np.fromiter(map(hash, keys), np.int64, n).view(np.uint64)
    lo = np.fromiter(map(hash, map("\x01".__add__, keys)), np.int64, n).view(np.uint64)
    return hi, lo


class _Sorted:
    """Keys' hashes sorted by hi, with their rows (built from sorted runs: the stable sort merges
    them in linear time)."""

    def __init__(self, hi: np.ndarray, lo: np.ndarray, rows: np.ndarray) -> None:
        order = np.argsort(hi, kind="stable")
        self.hi, self.lo, self.rows = hi[order], lo[order], rows[order]

    def __len__(self) -> int:
        return len(self.hi)

    def find(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The row of each (hi, lo), -1 where absent."""
        out = np.full(len(hi), -1, np.int64)
        if not len(self.hi) or not len(hi):
            return out
        at = np.empty(len(hi), np.int64)
        order = np.argsort(hi)  # sorted needles: each binary search starts where the last one ended
        at[order] = np.searchsorted(self.hi, hi[order])
        inside = at < len(self.hi)
        at_c = np.minimum(at, len(self.hi) - 1)
        same_hi = inside & (self.hi[at_c] == hi)
        hit = same_hi & (self.lo[at_c] == lo)
        out[hit] = self.rows[at_c[hit]]
        for q in np.flatnonzero(same_hi & ~hit):  # keys sharing this hi (rare): walk their run
            j = int(at_c[q])
            while j < len(self.hi) and self.hi[j] == hi[q]:
                if self.lo[j] == lo[q]:
                    out[q] = self.rows[j]
                    break
                j += 1
        return out


def _empty() -> _Sorted:
    return _Sorted(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.int64))


#: bits of the filter of held keys per key held (at least): about 1 in 16 absent keys passes it
FILTER_BITS_PER_KEY = 16


class KeyIndex:
    """Key -> row of a store's rows (rows are only appended, keys unique). A bit per
    :data:`FILTER_BITS_PER_KEY` held keys' slots (set where a held key's first hash falls) sends
    only the keys that may be held to the binary searches: a batch of new keys, the common case of
    an add, mostly skips them."""

    def __init__(self) -> None:
        self._big = _empty()
        self._small = _empty()
        self._bits = np.zeros(1 << 13, np.uint8)  # 2^16 slots
        self._shift = np.uint64(64 - 16)

    def __len__(self) -> int:
        return len(self._big) + len(self._small)

    def _slots(self, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each hash's filter byte and the bit in it."""
        slot = hi >> self._shift
        return slot >> np.uint64(3), np.left_shift(np.uint8(1), (slot & np.uint64(7)).astype(np.uint8))

    def _mark(self, hi: np.ndarray) -> None:
        if (len(self) + len(hi)) * FILTER_BITS_PER_KEY > 8 * len(self._bits):  # grown: a larger filter, refilled
            bits = 16
            while (1 << bits) < 2 * (len(self) + len(hi)) * FILTER_BITS_PER_KEY:
                bits += 1
            self._bits, self._shift = np.zeros(1 << (bits - 3), np.uint8), np.uint64(64 - bits)
            hi = np.concatenate([self._big.hi, self._small.hi, hi])
        byte, bit = self._slots(hi)
        np.bitwise_or.at(self._bits, byte, bit)

    def _maybe(self, hi: np.ndarray) -> np.ndarray:
        """False where no held key has this first hash."""
        byte, bit = self._slots(hi)
        return (self._bits[byte] & bit) != 0

    def add(self, keys: Sequence[str] | np.ndarray, first_row: int) -> None:
        """Record ``keys`` at rows ``first_row, first_row + 1, ...`` (keys not held yet)."""
        self.add_hashes(*key_hashes(keys), first_row)

    def add_hashes(self, hi: np.ndarray, lo: np.ndarray, first_row: int) -> None:
        """:meth:`add` of keys given by their :func:`key_hashes`."""
        rows = np.arange(first_row, first_row + len(hi), dtype=np.int64)
        self._mark(hi)
        s = self._small
        self._small = _Sorted(np.concatenate([s.hi, hi]), np.concatenate([s.lo, lo]), np.concatenate([s.rows, rows]))
        if len(self._small) > max(65536, len(self._big) // 4):
            b, s = self._big, self._small
            self._big = _Sorted(np.concatenate([b.hi, s.hi]), np.concatenate([b.lo, s.lo]),
                                np.concatenate([b.rows, s.rows]))
            self._small = _empty()

    def rows(self, keys: Sequence[str] | np.ndarray) -> np.ndarray:
        """The row of each key, -1 for a key not held."""
        return self.rows_of(*key_hashes(keys))

    def rows_of(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """:meth:`rows` of keys given by their :func:`key_hashes`."""
        maybe = np.flatnonzero(self._maybe(hi))
        out = np.full(len(hi), -1, np.int64)
        if not len(maybe):
            return out
        hi, lo = hi[maybe], lo[maybe]
        found = self._big.find(hi, lo)
        miss = found < 0
        if miss.any() and len(self._small):
            found[miss] = self._small.find(hi[miss], lo[miss])
        out[maybe] = found
        return out
