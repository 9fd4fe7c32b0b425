"""Vector-index backends behind one interface, chosen by a spec string.

A spec is a faiss index factory string, optionally followed by search parameters:
``"Flat"``, ``"HNSW32"``, ``"HNSW32:efSearch=128"``, ``"IVF1024,PQ16:nprobe=32"`` (indexes that need
training are trained on the vectors of their first build; search parameters are set through
``faiss.ParameterSpace``). The hand-made spellings ``"flat"``, ``"hnsw"``, ``"hnsw:M=16,ef=64"``
keep working. Every backend scores by inner product, which is cosine similarity on the unit-norm
rows a :class:`~nobackfill.encoders.base.DualEncoder` produces.

Adding a backend (e.g. a Milvus collection) means subclassing :class:`VectorIndex`, declaring its
``options`` and calling :func:`register_backend`; backends that live outside this process return
``None`` from :meth:`VectorIndex.to_bytes` and the gallery simply does not cache them on disk.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "VectorIndex",
    "FlatIndex",
    "HNSWIndex",
    "AutoIndex",
    "AUTO_GRAPH_AT",
    "parse_spec",
    "validate_spec",
    "make_index",
    "load_index",
    "register_backend",
    "known_backends",
]


class VectorIndex(abc.ABC):
    """An inner-product index over ``dim``-dimensional float32 rows, addressed by position."""

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

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, **options: Any) -> "VectorIndex":
        """Inverse of :meth:`to_bytes`."""
        raise NotImplementedError(f"backend {cls.kind!r} cannot be loaded from bytes")

    def _rows(self, x: np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(x, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"{what} must have shape (N, {self.dim}), got {np.shape(x)}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{what} contain NaN or infinite values")
        return np.ascontiguousarray(arr)

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
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        q = queries if checked else self._rows(queries, "queries")  # checked: C-contiguous finite float32 rows
        if mask is not None:
            mask, allowed = self._mask(mask)
        else:
            allowed = self.ntotal
        k = min(int(k), allowed)
        if k == 0 or len(q) == 0:
            return np.zeros((len(q), k), np.float32), np.zeros((len(q), k), np.int64)
        scores, positions = self._search(q, k, mask)
        scores = np.asarray(scores, dtype=np.float32)
        positions = np.asarray(positions, dtype=np.int64)
        last = positions[:, -1]  # a row that came up short ends in -1
        if (last[0] < 0) if len(last) == 1 else (last.min() < 0):
            short = (positions < 0).any(axis=1)  # a graph search came up short (tiny or filtered sets): exact
            scores[short], positions[short] = self._exact(q[short], k, mask)
        return scores, positions

    def _mask(self, mask: np.ndarray) -> tuple[np.ndarray | None, int]:
        """``(mask padded with False to ntotal rows, or None when it allows every row; rows
        allowed)``. A reader passes the same (never modified) mask object to every search of a
        snapshot: the last one's answer is kept, so a large mask is not counted per search."""
        n = self.ntotal
        last = self.__dict__.get("_last_mask")
        if last is not None and last[0] is mask and last[1] == n:
            return last[2], last[3]
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

    def _params(self, mask: np.ndarray | None, **extra: Any) -> tuple[Any, tuple]:
        """faiss search parameters restricting the search to ``mask``, and the objects they point
        to (faiss keeps raw pointers: the caller holds them until the search returns)."""
        import faiss

        cls = faiss.SearchParametersHNSW if "efSearch" in extra else faiss.SearchParameters
        if mask is None:
            return (cls(**extra) if extra else None), ()
        last = self.__dict__.get("_last_bitmap")
        if last is not None and last[0] is mask:
            bitmap = last[1]
        else:  # the padded mask of :meth:`_mask` is reused while the snapshot is: so is its bitmap
            bitmap = np.packbits(mask, bitorder="little")
            self._last_bitmap = (mask, bitmap)
        selector = faiss.IDSelectorBitmap(bitmap)
        return cls(sel=selector, **extra), (bitmap, selector)

    def _search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        params, keep = self._params(mask)
        out = self._index.search(queries, k, params=params)
        del keep
        return out

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

    @staticmethod
    def _deserialize(data: bytes) -> Any:
        import faiss

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
        params, keep = self._params(mask, efSearch=max(self.ef, k))
        out = self._index.search(queries, k, params=params)
        del keep
        return out

    def _storage(self) -> Any:
        import faiss

        return faiss.downcast_index(self._index.storage)


_BACKENDS: dict[str, type[VectorIndex]] = {}


def register_backend(cls: type[VectorIndex]) -> type[VectorIndex]:
    """Make ``cls`` available under ``cls.kind`` (usable as a class decorator)."""
    _BACKENDS[cls.kind] = cls
    return cls


def known_backends() -> list[str]:
    """Registered backend kinds, sorted."""
    return sorted(_BACKENDS)


class FactoryIndex(_FaissIndex):
    """Any faiss index from a factory string (``faiss.index_factory`` with inner product), with
    search parameters (``efSearch``, ``nprobe``, ...) applied through ``faiss.ParameterSpace``."""

    kind = "faiss"
    options = {"factory": str, "efSearch": int, "nprobe": int}

    def __init__(self, dim: int, factory: str = "Flat", _index: Any = None, **params: Any) -> None:
        import faiss

        if _index is None:
            try:
                _index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
            except RuntimeError as e:
                first = str(e).strip().splitlines()[-1] if str(e).strip() else "rejected"
                raise ValueError(f"faiss cannot build {factory!r} for dim {dim}: {first}") from None
        super().__init__(dim, _index)
        self.factory, self.params = factory, dict(params)
        for name, value in self.params.items():
            faiss.ParameterSpace().set_index_parameter(self._index, name, value)

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, **options: Any) -> "FactoryIndex":
        return cls(dim, _index=cls._deserialize(data), **options)

    def _add(self, vectors: np.ndarray) -> None:
        if not self._index.is_trained:  # IVF / PQ: trained on the first build's vectors
            try:
                self._index.train(vectors)
            except RuntimeError as e:
                raise ValueError(f"faiss {self.factory!r} could not be trained on {len(vectors)} vectors "
                                 f"({str(e).strip().splitlines()[-1]}); it needs more vectors or a smaller "
                                 "index (e.g. fewer IVF lists)") from None
        self._index.add(vectors)
        self._ntotal = int(self._index.ntotal)

    def _plain_k(self) -> float:
        """The largest k a search without a mask may ask with the construction's parameters (an
        HNSW graph's efSearch; read from the index once: SWIG attribute reads are slow)."""
        ef = self.__dict__.get("_plain_k_value")
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
        if mask is None and k <= self._plain_k():
            return self._index.search(queries, k)  # the parameters set at construction apply
        import faiss

        inner = self._inner()
        extra: dict[str, Any] = {}
        if isinstance(inner, faiss.IndexHNSW):
            extra["efSearch"] = max(int(inner.hnsw.efSearch), k)
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
        params, keep = self._params(mask, **extra)
        try:
            out = self._index.search(queries, k, params=params)
        except RuntimeError:  # an index that takes no selector (e.g. IndexPQ): search deeper, filter here
            return self._filtered(queries, k, mask)
        del keep
        return out

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


#: ``auto``: exact search below this many vectors, a graph index from there on
AUTO_GRAPH_AT = 50_000


class AutoIndex(VectorIndex):
    """Exact search while a space is small, a graph index once it is not (the default backend).

    Below ``at`` vectors (default :data:`AUTO_GRAPH_AT`) searches are exact (``Flat``: a flat
    index of 50k 128-d vectors answers in about a millisecond). From ``at`` on, the ``graph``
    index (a faiss factory string, default ``HNSW32`` searched with ``efSearch`` 128) is built from
    the stored vectors in a background thread (:meth:`start_build`) or at once
    (:meth:`build`); until it is ready every search stays exact, so readers are never blocked and
    never see approximate results from a half-built graph. Vectors added during a build are
    appended to the graph before it replaces the exact index. ``on_built(self)`` is called after
    the swap (the gallery re-saves its on-disk cache there).
    """

    kind = "auto"
    options = {"at": int, "graph": str, "efSearch": int}
    #: rows copied from the exact index per step of a build (appends wait for one step at most)
    block = 65_536

    def __init__(self, dim: int, at: int = AUTO_GRAPH_AT, graph: str = "HNSW32", efSearch: int = 128,
                 _inner: VectorIndex | None = None) -> None:
        import threading

        super().__init__(dim)
        if int(at) < 1 or int(efSearch) < 1:
            raise ValueError(f"auto options must be >= 1, got at={at}, efSearch={efSearch}")
        if not _FACTORY_RE.match(graph) or graph.lower() == "flat":
            raise ValueError(f"auto: graph must be a faiss factory string of an approximate index, got {graph!r}")
        self.at, self.graph, self.efSearch = int(at), graph, int(efSearch)
        self._inner: VectorIndex = _inner if _inner is not None else FlatIndex(dim)
        self._lock = threading.Lock()
        self._thread: Any = None
        self.on_built: Any = None
        self.error: str | None = None  # why the last build failed (searches stay exact)

    @property
    def in_use(self) -> str:
        """The index answering searches now: ``"Flat"`` or the graph's factory string."""
        return "Flat" if isinstance(self._inner, FlatIndex) else self.graph

    @property
    def building(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def needs_graph(self) -> bool:
        return isinstance(self._inner, FlatIndex) and self.ntotal >= self.at

    @property
    def ntotal(self) -> int:
        return self._inner.ntotal

    def _add(self, vectors: np.ndarray) -> None:
        with self._lock:
            self._inner._add(vectors)

    def _search(self, queries: np.ndarray, k: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._inner._search(queries, k, mask)

    def reconstruct(self, positions: np.ndarray) -> np.ndarray:
        return self._inner.reconstruct(positions)

    def to_bytes(self) -> bytes:
        with self._lock:  # no row is appended while the index is serialised
            return self._inner.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, dim: int, **options: Any) -> "AutoIndex":
        import faiss

        index = _FaissIndex._deserialize(data)
        flat = isinstance(faiss.downcast_index(index), faiss.IndexFlat)
        graph = options.get("graph", "HNSW32")
        inner = FlatIndex(dim, _index=index) if flat else FactoryIndex(
            dim, factory=graph, _index=index, efSearch=int(options.get("efSearch", 128)))
        return cls(dim, **options, _inner=inner)

    def start_build(self) -> bool:
        """Build the graph in a daemon thread when it is needed and not building; True if one runs."""
        with self._lock:
            if not self.needs_graph or self.building:
                return self.building
            import threading

            self._thread = threading.Thread(target=self._build_quietly, name="nobackfill-index-build", daemon=True)
            self._thread.start()
            return True

    def build(self) -> bool:
        """Build the graph now if it is needed (waiting for a background build instead, if one
        runs); True if the graph answers searches afterwards."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()
        elif self.needs_graph:
            self._build()
        return not isinstance(self._inner, FlatIndex)

    def _build_quietly(self) -> None:
        try:
            self._build()
        except Exception as e:  # searches stay exact; the reason is kept for status
            self.error = f"{type(e).__name__}: {e}"

    def _build(self) -> None:
        graph = FactoryIndex(self.dim, factory=self.graph, efSearch=self.efSearch)
        step = self.block
        done = 0
        while True:
            with self._lock:  # copy one block (the flat storage may move when rows are appended)
                flat = self._inner
                if not isinstance(flat, FlatIndex):
                    return  # another build won
                n = flat.ntotal
                if done >= n - step:  # the last block: append it and swap under the lock
                    if n > done:
                        graph._add(np.ascontiguousarray(self._flat_rows(flat, done, n)))
                    self._inner = graph
                    break
                block = np.array(self._flat_rows(flat, done, done + step))
            graph._add(block)
            done += len(block)
        self.error = None
        if self.on_built is not None:
            self.on_built(self)

    @staticmethod
    def _flat_rows(flat: "FlatIndex", start: int, stop: int) -> np.ndarray:
        import faiss

        xb = faiss.rev_swig_ptr(flat._index.get_xb(), flat.ntotal * flat.dim).reshape(flat.ntotal, flat.dim)
        return xb[start:stop]


for _cls in (FlatIndex, HNSWIndex, FactoryIndex, AutoIndex):
    register_backend(_cls)

_FACTORY_RE = __import__("re").compile(r"^[A-Z][A-Za-z0-9_,.]*$")


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"hnsw:M=16,ef=64"`` -> ``("hnsw", {"M": 16, "ef": 64})``; a faiss factory string
    ``"IVF1024,PQ16:nprobe=32"`` -> ``("faiss", {"factory": "IVF1024,PQ16", "nprobe": 32})``
    (``"Flat"`` is the hand-made ``"flat"``); validates kind and options."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"backend spec must be a non-empty string, got {spec!r}")
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip()
    if kind.lower() not in _BACKENDS and _FACTORY_RE.match(kind):
        opts = dict(_parse_options(rest, FactoryIndex.options, "faiss", spec))
        opts.pop("factory", None)
        return "faiss", {"factory": kind, **opts}
    kind = kind.lower()
    if kind not in _BACKENDS:
        names = ", ".join(k for k in known_backends() if k != "faiss")
        raise ValueError(f"unknown index backend {kind!r} in {spec!r}; known: {names}, or a faiss index factory "
                         "string such as Flat, HNSW32, IVF1024,PQ16 (search parameters after ':', e.g. "
                         "HNSW32:efSearch=128)")
    return kind, _parse_options(rest, _BACKENDS[kind].options, kind, spec)


def _parse_options(rest: str, allowed: dict[str, type], kind: str, spec: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in allowed:
            known = ", ".join(allowed) or "none"
            raise ValueError(f"bad option {item!r} for backend {kind!r} in {spec!r}; options: {known}")
        try:
            opts[name] = allowed[name](value.strip())
        except ValueError:
            raise ValueError(f"option {name!r} of {spec!r} must be {allowed[name].__name__}") from None
    return opts


def validate_spec(spec: str) -> str:
    """Checks ``spec`` without building anything; returns it normalised (``kind[:k=v,...]``, or the
    factory string with its search parameters)."""
    kind, opts = parse_spec(spec)
    if kind == "faiss":
        opts = dict(opts)
        factory = opts.pop("factory")
        return factory + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")
    return kind + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")


def make_index(kind: str, dim: int) -> VectorIndex:
    """A new empty index for spec ``kind`` (e.g. ``"flat"``, ``"hnsw:M=16,ef=64"``)."""
    name, opts = parse_spec(kind)
    return _BACKENDS[name](dim, **opts)


def load_index(kind: str, dim: int, data: bytes) -> VectorIndex:
    """Restore an index written by :meth:`VectorIndex.to_bytes` for the same spec."""
    name, opts = parse_spec(kind)
    return _BACKENDS[name].from_bytes(data, dim, **opts)
