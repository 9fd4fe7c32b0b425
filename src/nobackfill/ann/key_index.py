"""The row of each key a store holds, in about 26 bytes a key (:class:`KeyIndex`).

A gallery's chunks hold their rows' keys; the store must answer "which row holds key k" for every
add (keys already held are skipped) and every lookup. A Python ``dict`` of the key strings costs
about 200 bytes a key (200 MB at a million rows). Here each key is reduced to a 128-bit hash
(:func:`key_hashes`), kept in sorted arrays: a large one and a few small runs, one per batch added
(each batch is sorted alone), merged into one run when there are :data:`MAX_RUNS` of them and into
the large array when they outgrow a quarter of it (amortised O(log n) a key). Two
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
    hi = np.array(list(map(hash, keys)), np.int64).view(np.uint64)
    lo = np.array([hash("\x01" + k) for k in keys], np.int64).view(np.uint64)  # (the fastest spelling here)
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


def _merged(runs: Sequence[_Sorted]) -> _Sorted:
    """One sorted array of ``runs`` (each sorted: the stable sort merges them in linear time)."""
    return _Sorted(np.concatenate([r.hi for r in runs]), np.concatenate([r.lo for r in runs]),
                   np.concatenate([r.rows for r in runs]))


#: small runs kept apart before they are merged into one (each lookup that passes the filter
#: searches every run; each add sorts its own keys only)
MAX_RUNS = 8


#: bits of the filter of held keys per key held (at least): about 1 in 16 absent keys passes it
FILTER_BITS_PER_KEY = 16


class KeyIndex:
    """Key -> row of a store's rows (rows are only appended, keys unique). A bit per
    :data:`FILTER_BITS_PER_KEY` held keys' slots (set where a held key's first hash falls) sends
    only the keys that may be held to the binary searches: a batch of new keys, the common case of
    an add, mostly skips them."""

    def __init__(self) -> None:
        self._big = _empty()
        self._runs: list[_Sorted] = []  # sorted runs of the keys added since the last merge into _big
        self._bits = np.zeros(1 << 13, np.uint8)  # 2^16 slots
        self._shift = np.uint64(64 - 16)

    def __len__(self) -> int:
        return len(self._big) + sum(map(len, self._runs))

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
            hi = np.concatenate([self._big.hi, *(r.hi for r in self._runs), hi])
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
        self._runs.append(_Sorted(hi, lo, rows))
        if sum(map(len, self._runs)) > max(65536, len(self._big) // 4):
            self._big, self._runs = _merged([self._big, *self._runs]), []
        elif len(self._runs) > MAX_RUNS:
            self._runs = [_merged(self._runs)]

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
        for run in self._runs:  # a key is held once: the runs are asked for what is still missing
            miss = np.flatnonzero(found < 0)
            if not len(miss):
                break
            found[miss] = run.find(hi[miss], lo[miss])
        out[maybe] = found
        return out
