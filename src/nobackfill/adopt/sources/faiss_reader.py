"""faiss indexes as sources for :mod:`nobackfill.adopt.sources`: their vectors reconstructed
(exactly, or lossily on request), with a table or an IndexIDMap's own ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .common import _MODALITIES, FAISS_EXACT, SourceError, SourceNotFound
from .items import _Layer, _Segment
from .table_source import _source_notes, _table_columns, TableSource
from .tables import _open_table, _Table
from .vectors import _scan, _Vectors


class _FaissVectors(_Vectors):
    def __init__(self, index: Any, path: Path, ids: np.ndarray | None, owner: Any) -> None:
        # ``index`` (a downcast view) lives only as long as the object read from the file: keep it
        self._index, self.path, self._ids, self._owner = index, path, ids, owner
        self.n, self.dim, self.dtype = int(index.ntotal), int(index.d), "float32"
        self.order: np.ndarray | None = None  # source row -> index position

    def raw(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.zeros((0, self.dim), np.float32)
        return np.asarray(self._index.reconstruct_n(int(start), int(stop - start)), dtype=np.float32)

    def _positions(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if not positions.size:
            return np.zeros((0, self.dim), np.float32)
        try:
            return np.asarray(self._index.reconstruct_batch(positions), dtype=np.float32)
        except (RuntimeError, AttributeError, TypeError):
            return np.stack([self._index.reconstruct(int(p)) for p in positions]).astype(np.float32)

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.order is None:
            return self.raw(start, stop)
        return self._positions(self.order[start:stop])

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        return self._positions(rows if self.order is None else self.order[rows])

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """``x`` encoded as the index stores its vectors, then decoded (a graph index's storage
        holds the codes)."""
        import faiss

        codec = self._index
        if isinstance(codec, faiss.IndexHNSW):
            codec = faiss.downcast_index(codec.storage)
        x = np.ascontiguousarray(x, dtype=np.float32)
        return np.asarray(codec.sa_decode(codec.sa_encode(x)), dtype=np.float32)

    def where(self, i: int) -> str:
        return f"vector {i + 1}" + ("" if self._ids is None else f" (faiss id {int(self._ids[i])})")


def _faiss_layers(index: Any, path: Path) -> tuple[Any, np.ndarray | None, str, bool]:
    """(the index holding the vectors by position, the IDMap's ids or None, type name, exact)."""
    import faiss

    top = faiss.downcast_index(index)
    ids = None
    if isinstance(top, faiss.IndexIDMap):  # IndexIDMap2 derives from it
        ids = faiss.vector_to_array(top.id_map).astype(np.int64)
        inner = faiss.downcast_index(top.index)
        name = f"{type(top).__name__}({type(inner).__name__})"
    else:
        inner, name = top, type(top).__name__
    if isinstance(inner, faiss.IndexIVF):
        try:
            inner.make_direct_map()
        except RuntimeError as e:
            raise SourceError(f"cannot map the {type(inner).__name__}'s entries to positions (it holds ids of its "
                              f"own: {str(e).splitlines()[-1]}); wrap it in an IndexIDMap instead", path) from None
    exact = (isinstance(inner, faiss.IndexFlat) or isinstance(inner, faiss.IndexHNSWFlat)
             or (type(inner).__name__ == "IndexIVFFlat"))
    if isinstance(inner, faiss.IndexHNSW) and not exact:
        exact = isinstance(faiss.downcast_index(inner.storage), faiss.IndexFlat)
    return inner, ids, name, exact


def _faiss_source(path: Path, *, table: str | Path | None, id_column: str | None, source_column: str | None,
                  modality: str | None, images_root: str | Path | None, lossy: bool, expect_dim: int | None,
                  batch_rows: int, metadata_columns: Any = None) -> TableSource:
    import faiss

    if not path.is_file():
        raise SourceNotFound("faiss index not found", path)
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as e:
        raise SourceError(f"not a readable faiss index ({str(e).splitlines()[-1]})", path) from None
    inner, ids, name, exact = _faiss_layers(index, path)
    warnings: list[str] = []
    if not exact:
        if not lossy:
            raise SourceError(f"this {name} index stores its vectors lossily (compressed: PQ / SQ / a transform), "
                              "so they cannot be given back exactly; pass lossy=True (--lossy) to import "
                              "approximations, or import the original vectors (exact index types: "
                              f"{', '.join(FAISS_EXACT)})", path)
        warnings.append(f"{path} is a lossy {name} index: the imported vectors are its reconstructions, approximations "
                        "of the originals; search scores drift from those of the original vectors, the model check "
                        "compares approximations (with a threshold lowered to what the compression keeps of the "
                        "sample's own vectors), and only a backfill with the model gives exact vectors back")
    if inner.ntotal:
        try:
            inner.reconstruct(0)  # a catchable probe: faiss aborts the process if reconstruct_n fails
        except RuntimeError as e:
            why = str(e).splitlines()[-1]
            raise SourceError(f"this {name} index cannot give back its vectors ({why})", path) from None
    vec = _FaissVectors(inner, path, ids, owner=index)
    if ids is not None:
        uniq, first = np.unique(ids, return_index=True)
        if uniq.size != ids.size:
            dup = np.setdiff1d(np.arange(ids.size), first)[0]
            prev = int(np.flatnonzero(ids == ids[dup])[0])
            raise SourceError(f"faiss id {int(ids[dup])} repeats the id of vector {prev + 1} (ids must be unique)",
                              path, where=f"vector {int(dup) + 1}")
    segment_table: _Table | None = None
    c: dict[str, Any] = {"id_column": None, "modality_column": None, "image_column": None, "text_column": None,
                         "url_column": None}
    notes: list[str] = []
    if table is not None:
        segment_table = _open_table(table)
        if segment_table.num_rows != vec.n:
            raise SourceError(f"{segment_table.path} has {segment_table.num_rows} rows but {path} has {vec.n} "
                              "vectors: they must match row for row")
        if ids is not None:  # the int ids are (0-based) table rows: read in table order
            bad = np.flatnonzero((ids < 0) | (ids >= vec.n))
            if bad.size:
                i = int(bad[0])
                raise SourceError(f"faiss id {int(ids[i])} is not a row of {segment_table.path} (an IndexIDMap's ids "
                                  f"are the table's 0-based rows: 0..{vec.n - 1})", path, where=f"vector {i + 1}")
            order = np.empty(vec.n, dtype=np.int64)
            order[ids] = np.arange(vec.n, dtype=np.int64)
            vec.order = order
        c = _table_columns(segment_table, id_column=id_column, source_column=source_column, modality=modality,
                           metadata_columns=metadata_columns)
        notes, cols = _source_notes(segment_table, c, modality)
        what = f"with table {segment_table.path} ({cols})"
    elif ids is None:
        raise SourceError(f"this {name} index holds no ids: give a table (table=...) of ids and / or sources in index "
                          "order", path)
    else:
        if id_column is not None or source_column is not None or metadata_columns is not None:
            raise ValueError("id_column / source_column / metadata_columns need a table")
        if modality not in _MODALITIES:
            raise SourceError("say whether the vectors are of images or texts (modality='image' or 'text'): there "
                              "is no table with a modality column", path)
        notes.append(f"{path} comes without a table: its {vec.n} items have no source and cannot be re-embedded "
                     "(no model check, no backfill); their ids are the index's int ids")
        what = f"ids from its id map, {modality}s, no sources"
    normalised = _scan(vec, expect_dim)
    desc = f"faiss index {path}: {name}, {vec.n} x {vec.dim} ({'exact' if exact else 'lossy'}), {what}"
    src = TableSource([_Segment(segment_table, [_Layer(vec, modality)], vec.n)], kind="faiss", modality=modality,
                      faiss_ids=ids if segment_table is None else None, batch_rows=batch_rows, description=desc,
                      images_root=Path(images_root) if images_root else
                      (segment_table.path.parent.absolute() if segment_table is not None else Path.cwd()), **c)
    if not exact:  # the model check measures what the compression keeps (index/model_check.py)
        src.round_trip, src.compression = vec.round_trip, name
    src.warnings.extend(warnings + notes)
    if normalised:
        src.warnings.append(f"{normalised} of {vec.n} vectors were not unit length: normalised")
    return src
