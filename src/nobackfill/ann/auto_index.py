"""The default backend, ``auto`` (:class:`AutoIndex`): exact search while a space is small, a faiss
graph index built in the background (or at once) from :data:`AUTO_GRAPH_AT` vectors on, swapped in
only when it is whole."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .faiss_indexes import _FACTORY_RE, FactoryIndex, FlatIndex, _FaissIndex
from .vector_index import VectorIndex

__all__ = ["AUTO_GRAPH_AT", "AutoIndex"]


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

    def write_to(self, write: Callable[[bytes], Any]) -> bool:
        with self._lock:  # no row is appended while the index is written
            return self._inner.write_to(write)

    @classmethod
    def from_bytes(cls, data: "bytes | Callable[[int], bytes]", dim: int, **options: Any) -> "AutoIndex":
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

    def build(self, progress: Callable[[int], Any] | None = None) -> bool:
        """Build the graph now if it is needed (waiting for a background build instead, if one
        runs); True if the graph answers searches afterwards. ``progress(n)``: told of each block
        of ``n`` rows added to the graph."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()
        elif self.needs_graph:
            self._build(progress)
        return not isinstance(self._inner, FlatIndex)

    def _build_quietly(self) -> None:
        try:
            self._build()
        except Exception as e:  # searches stay exact; the reason is kept for status
            self.error = f"{type(e).__name__}: {e}"

    def _build(self, progress: Callable[[int], Any] | None = None) -> None:
        told = progress or (lambda _n: None)
        graph = FactoryIndex(self.dim, factory=self.graph, efSearch=self.efSearch)
        with self._lock:
            flat = self._inner
            if isinstance(flat, FlatIndex):
                graph.reserve(flat.ntotal)  # no array of the graph is reallocated (and copied) as it grows
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
            told(len(block))
        told(n - done)
        self.error = None
        if self.on_built is not None:
            self.on_built(self)

    @staticmethod
    def _flat_rows(flat: "FlatIndex", start: int, stop: int) -> np.ndarray:
        import faiss

        xb = faiss.rev_swig_ptr(flat._index.get_xb(), flat.ntotal * flat.dim).reshape(flat.ntotal, flat.dim)
        return xb[start:stop]
