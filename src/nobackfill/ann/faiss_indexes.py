"""The in-process faiss backends: :class:`FlatIndex` (exact), :class:`HNSWIndex` (the hand-made
``hnsw`` spelling) and :class:`FactoryIndex` (any faiss factory string with search parameters),
over shared plumbing (:class:`_FaissIndex`: masks as faiss selectors, serialisation)."""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any, Callable

import numpy as np

from .vector_index import VectorIndex

__all__ = ["FactoryIndex", "FlatIndex", "HNSWIndex", "needs_training"]

#: faiss' ``swig_ptr``, imported by the first search (importing nobackfill does not import faiss;
#: a ``from faiss import`` per search costs a microsecond)
_SWIG_PTR: list[Any] = []


def _load_swig_ptr() -> Any:
    from faiss import swig_ptr

    _SWIG_PTR.append(swig_ptr)
    return swig_ptr


#: what a faiss index factory string looks like (``Flat``, ``HNSW32``, ``IVF1024,PQ16``)
_FACTORY_RE = __import__("re").compile(r"^[A-Z][A-Za-z0-9_,.]*$")


class _FaissIndex(VectorIndex):
    """Shared plumbing for in-process faiss indexes."""

    def __init__(self, dim: int, index: Any) -> None:
        super().__init__(dim)
        if int(index.d) != self.dim:
            raise ValueError(f"faiss index has dim {index.d}, expected {self.dim}")
        self._index = index

    @property
    def ntotal(self) -> int:
        n = self.__dict__.get("_ntotal")
        if n is None:  # read from faiss once (a SWIG attribute read costs microseconds), then kept
            n = self._ntotal = int(self._index.ntotal)
        return n

    def _add(self, vectors: np.ndarray) -> None:
        self._index.add(vectors)
        self._ntotal = int(self._index.ntotal)

    def _plain_search(self, queries: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The index's own search on rows already checked (C-contiguous float32 of width ``dim``),
        with ``params`` (faiss search parameters; None: those it was built with): faiss' C entry
        point, without its Python wrapper's copies and assertions (a few microseconds of a
        sub-millisecond search)."""
        swig_ptr = _SWIG_PTR[0] if _SWIG_PTR else _load_swig_ptr()
        n = len(queries)
        scores, positions = np.empty((n, k), np.float32), np.empty((n, k), np.int64)
        self._index.search_c(n, swig_ptr(queries), k, swig_ptr(scores), swig_ptr(positions), params)
        return scores, positions

    #: ``(mask, parameters, faiss parameters, the objects they point to)`` of the last :meth:`_params`
    _last_params: tuple[Any, tuple, Any, tuple] | None = None

    def _params(self, mask: np.ndarray | None, **extra: Any) -> tuple[Any, tuple]:
        """faiss search parameters restricting the search to ``mask``, and the objects they point
        to (faiss keeps raw pointers: they live as long as the parameters are kept). A snapshot's
        searches pass one (never modified) mask: its bitmap, selector and parameters are made
        once, for the first of them (SWIG objects cost microseconds to make and to fill)."""
        key = tuple(sorted(extra.items()))
        last = self._last_params
        if last is not None and last[0] is mask and last[1] == key:
            return last[2], last[3]
        import faiss

        cls = faiss.SearchParametersHNSW if "efSearch" in extra else faiss.SearchParameters
        if mask is None:
            out: tuple[Any, tuple] = ((cls(**extra) if extra else None), ())
        else:
            bitmap = np.packbits(mask, bitorder="little")
            selector = faiss.IDSelectorBitmap(bitmap)
            out = cls(sel=selector, **extra), (bitmap, selector)
        self._last_params = (mask, key, *out)
        return out

    def _search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._plain_search(queries, k, None if mask is None else self._params(mask)[0])

    def _storage(self) -> Any:
        return self._index

    def reconstruct(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return np.zeros((0, self.dim), np.float32)
        return np.asarray(self._storage().reconstruct_batch(positions), dtype=np.float32)

    def to_bytes(self) -> bytes:
        import faiss

        return faiss.serialize_index(self._index).tobytes()

    def write_to(self, write: Callable[[bytes], Any]) -> bool:
        import faiss

        faiss.write_index(self._index, faiss.PyCallbackIOWriter(write))  # in pieces of 1 MB
        return True

    @staticmethod
    def _deserialize(data: "bytes | Callable[[int], bytes]") -> Any:
        """The faiss index in ``data``: bytes, or a reader (read piece by piece: a large cache is
        never held whole beside the index it holds)."""
        import faiss

        if callable(data):
            return faiss.read_index(faiss.PyCallbackIOReader(data))
        return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


class FlatIndex(_FaissIndex):
    """Exact search (``faiss.IndexFlatIP``)."""

    kind = "flat"

    def __init__(self, dim: int, _index: Any = None) -> None:
        import faiss

        super().__init__(dim, _index if _index is not None else faiss.IndexFlatIP(int(dim)))

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, **options: Any) -> "FlatIndex":
        return cls(dim, _index=cls._deserialize(data))


class HNSWIndex(_FaissIndex):
    """Approximate graph search (``faiss.IndexHNSWFlat`` with inner product).

    Options: ``M`` (graph degree, default 32), ``ef`` (efSearch, default 128; raised to ``k`` when
    smaller), ``efc`` (efConstruction, default 40).
    """

    kind = "hnsw"
    options = {"M": int, "ef": int, "efc": int}

    def __init__(self, dim: int, M: int = 32, ef: int = 128, efc: int = 40, _index: Any = None) -> None:
        import faiss

        if min(M, ef, efc) < 1:
            raise ValueError(f"hnsw options must be >= 1, got M={M}, ef={ef}, efc={efc}")
        if _index is None:
            _index = faiss.IndexHNSWFlat(int(dim), int(M), faiss.METRIC_INNER_PRODUCT)
            _index.hnsw.efConstruction = int(efc)
        super().__init__(dim, _index)
        self.ef = int(ef)

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, **options: Any) -> "HNSWIndex":
        return cls(dim, **options, _index=cls._deserialize(data))

    def _search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._plain_search(queries, k, self._params(mask, efSearch=max(self.ef, k))[0])

    def _storage(self) -> Any:
        import faiss

        return faiss.downcast_index(self._index.storage)


def _faiss_message(e: BaseException) -> str:
    """A faiss error's last line without its C++ location."""
    first = str(e).strip().splitlines()[-1] if str(e).strip() else "rejected"
    first = re.sub(r"^Error in .*? at \S+:\d+: (Error: )?", "", first)
    return re.sub(r"^'.*?' failed: ", "", first)  # (the assertion's C++ text)


def _clustering_advice(index: Any, n: int, factory: str) -> list[str]:
    """Before ``index`` trains on ``n`` rows: where they are fewer than its k-means advise (``k`` x
    ``min_points_per_centroid``, 39, for the IVF lists and the PQ's centroids), the lines to say as
    our own warning once it trained; faiss' own line of it is turned off (its C++ prints it on stderr
    whatever the log level: a server's log held one per training). The training is unchanged: that
    setting decides the warning only."""
    import faiss

    params = []
    with contextlib.suppress(Exception):
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
        params.append((ivf.nlist, ivf.cp, "IVF lists"))
        index = ivf
    pq = getattr(faiss.downcast_index(index), "pq", None)
    if pq is not None:
        params.append((pq.ksub, pq.cp, "PQ centroids per sub-vector"))
    out = []
    for k, cp, what in params:
        advised = int(k) * int(cp.min_points_per_centroid)
        if n < advised:
            out.append(f"index {factory!r} is trained on {n} rows, fewer than faiss advises for its {int(k)} {what} "
                       f"({advised}): its searches may find less than the same index trained on more")
        cp.min_points_per_centroid = 0
    return out


def needs_training(factory: str, dim: int) -> bool:
    """Whether faiss' ``factory`` index must be trained before it takes rows (IVF, PQ; not Flat or
    HNSW); True for a string faiss refuses (no index of it answers)."""
    import faiss

    try:
        return not faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT).is_trained
    except RuntimeError:
        return True


class FactoryIndex(_FaissIndex):
    """Any faiss index from a factory string (``faiss.index_factory`` with inner product), with
    search parameters (``efSearch``, ``nprobe``, ...) applied through ``faiss.ParameterSpace``.

    An index that must be trained (IVF, PQ) is trained on the rows of its first build; while they
    are too few to train it (fewer than its IVF lists, say), its rows are searched exactly (a flat
    index stands in: ``waiting`` says why) and it is trained once an added block brings enough (trial
    AE: a small collection created with ``IVF1024,PQ16`` answered every search with faiss' error)."""

    kind = "faiss"
    options = {"factory": str, "efSearch": int, "nprobe": int}

    def __init__(self, dim: int, factory: str = "Flat", _index: Any = None, **params: Any) -> None:
        import faiss

        self.check_params(factory, params)
        self.factory, self.params = factory, dict(params)
        self.waiting: str | None = None  # why the rows are searched exactly for now (see the class doc)
        if _index is None:
            _index = self._new_index(int(dim))
        elif isinstance(faiss.downcast_index(_index), faiss.IndexFlat) and needs_training(factory, dim):
            self.waiting = f"too few rows to train {factory!r} ({int(_index.ntotal)})"  # (a cached stand-in)
        super().__init__(dim, _index)
        self._set_params()

    @classmethod
    def check_params(cls, factory: str, params: dict[str, Any]) -> None:
        """Refuse (``ValueError``) an integer search parameter below 1 (``nprobe=0``, ``efSearch=-1``) or
        past faiss' int (2**31 - 1): faiss takes it and fails at every search (trials AL, AM)."""
        for name, value in params.items():
            if cls.options.get(name) is int and not 1 <= int(value) <= 2**31 - 1:
                spec = factory + ":" + ",".join(f"{k}={v}" for k, v in params.items())
                raise ValueError(f"faiss search option {name} must be in [1, 2147483647], got {value} in {spec!r}")

    def _new_index(self, dim: int) -> Any:
        import faiss

        try:
            return faiss.index_factory(dim, self.factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ValueError(f"faiss cannot build {self.factory!r} for dim {dim}: {_faiss_message(e)}") from None

    def _set_params(self) -> None:
        import faiss

        if self.waiting is None:
            for name, value in self.params.items():
                try:
                    faiss.ParameterSpace().set_index_parameter(self._index, name, value)
                except RuntimeError:  # (trial AM: a traceback for HNSW32:nprobe=4)
                    raise ValueError(f"faiss search option {name} does not apply to the index {self.factory!r} "
                                     "(efSearch: HNSW indexes; nprobe: IVF indexes)") from None

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, **options: Any) -> "FactoryIndex":
        return cls(dim, _index=cls._deserialize(data), **options)

    def _add(self, vectors: np.ndarray) -> None:
        if self._index.is_trained and self.waiting is None:
            self._index.add(vectors)
            self._ntotal = int(self._index.ntotal)
            return
        import faiss

        rows = vectors if not self.ntotal else np.vstack([self._storage().reconstruct_n(0, self.ntotal), vectors])
        index = self._new_index(self.dim)
        try:  # IVF / PQ: trained on the rows of the first build that has enough of them
            advice = _clustering_advice(index, len(rows), self.factory)
            index.train(rows)
            for line in advice:
                logging.getLogger("nobackfill.ann").warning(line)
            self.waiting = None
        except RuntimeError as e:
            index = faiss.IndexFlatIP(self.dim)
            self.waiting = f"{len(rows)} rows cannot train {self.factory!r} yet: {_faiss_message(e)}"
        index.add(rows)
        self._index, self._ntotal = index, int(index.ntotal)
        for cached in ("_inner_index", "_plain_k_value", "_last_params"):  # (of the index replaced)
            self.__dict__.pop(cached, None)
        self._set_params()

    def reserve(self, n: int) -> None:
        """Size a graph's arrays (its vectors, neighbour lists, levels and offsets) for ``n`` rows
        now, so that adding blocks up to ``n`` rows never reallocates them: each reallocation holds
        the old array and its copy at once (about 1.3 GB more at 5M 64-d rows). An index that is
        not a flat-storage graph (``HNSW..``) is left as it is."""
        inner = self._inner()
        hnsw, storage = getattr(inner, "hnsw", None), getattr(inner, "storage", None)
        if hnsw is None or storage is None:
            return
        import faiss

        flat = faiss.downcast_index(storage)
        codes = getattr(flat, "codes", None)
        if codes is None:
            return
        probas = faiss.vector_to_array(hnsw.assign_probas)
        cum = faiss.vector_to_array(hnsw.cum_nneighbor_per_level)
        per_row = float(sum(p * cum[min(i + 1, len(cum) - 1)] for i, p in enumerate(probas)))
        # expected neighbour slots a row takes (its level is drawn at random), with a margin far
        # beyond the spread of their sum over many rows
        wanted = [(codes, int(n) * int(flat.code_size)), (hnsw.neighbors, int(n * per_row * 1.01) + 1024),
                  (hnsw.levels, int(n)), (hnsw.offsets, int(n) + 1)]
        for vec, size in wanted:
            now = int(vec.size())
            if size > now:  # grown and shrunk back: the capacity stays (std::vector)
                vec.resize(size)
                vec.resize(now)

    #: the largest k a search without a mask may ask with the construction's parameters (an HNSW
    #: graph's efSearch): read from the index once (SWIG attribute reads are slow), by :meth:`_plain_k`
    _plain_k_value: float | None = None

    def _plain_k(self) -> float:
        ef = self._plain_k_value
        if ef is None:
            import faiss

            inner = self._inner()
            ef = self._plain_k_value = float(inner.hnsw.efSearch) if isinstance(inner, faiss.IndexHNSW) else np.inf
        return ef

    def _inner(self) -> Any:
        inner = self.__dict__.get("_inner_index")
        if inner is None:  # the index object never changes: downcast it once
            import faiss

            inner = self._inner_index = faiss.downcast_index(
                self._index.index if hasattr(self._index, "index") and isinstance(self._index, faiss.IndexPreTransform)
                else self._index)
        return inner

    def _search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if mask is None and k <= (self._plain_k_value or self._plain_k()):
            return self._plain_search(queries, k)  # the parameters set at construction apply
        import faiss

        inner = self._inner()
        extra: dict[str, Any] = {}
        if isinstance(inner, faiss.IndexHNSW):
            extra["efSearch"] = max(int(self._plain_k()), k)
        elif isinstance(inner, faiss.IndexIVF):
            extra["nprobe"] = int(inner.nprobe)
        if mask is None and not extra:
            return self._index.search(queries, k)
        if isinstance(inner, faiss.IndexIVF):
            sel = None if mask is None else faiss.IDSelectorBitmap(np.packbits(mask, bitorder="little"))
            params = faiss.SearchParametersIVF(sel=sel, nprobe=extra["nprobe"]) if sel is not None else \
                faiss.SearchParametersIVF(nprobe=extra["nprobe"])
            keep = (params, sel)
            out = self._index.search(queries, k, params=params)
            del keep
            return out
        try:
            return self._plain_search(queries, k, self._params(mask, **extra)[0])
        except RuntimeError:  # an index that takes no selector (e.g. IndexPQ): search deeper, filter here
            return self._filtered(queries, k, mask)

    def _filtered(self, queries: np.ndarray, k: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        depth = min(self.ntotal, max(4 * k, 32))
        while True:
            scores, positions = self._index.search(queries, depth)
            ok = positions >= 0
            if mask is not None:
                ok &= mask[np.clip(positions, 0, None)]
            out_s = np.full((len(queries), k), -np.inf, np.float32)
            out_p = np.full((len(queries), k), -1, np.int64)
            for i in range(len(queries)):
                keep = np.flatnonzero(ok[i])[:k]
                out_s[i, :len(keep)], out_p[i, :len(keep)] = scores[i, keep], positions[i, keep]
            if (out_p >= 0).all() or depth >= self.ntotal:
                return out_s, out_p  # rows still short fall back to the exact search of the caller
            depth = min(self.ntotal, depth * 4)

    def _storage(self) -> Any:
        import faiss

        inner = self._inner()
        if isinstance(inner, faiss.IndexHNSW):
            return faiss.downcast_index(inner.storage)
        if isinstance(inner, faiss.IndexIVF):
            inner.make_direct_map()
        return self._index
