"""Streaming readers of vectors embedded elsewhere ("bring your own index").

:func:`open_source` opens one of::

    clip-retrieval:DIR       clip-retrieval ``inference`` output (img_emb/, text_emb/, metadata/)
    npy:FILE.npy             a (rows, dim) array, with ``table`` = ids and sources, row for row
    npz:FILE.npz[:KEY]       one array of an .npz (KEY, or its only array), with ``table``
    faiss:FILE               a faiss index (vectors reconstructed), ``table`` optional for an IDMap

and gives an :class:`ImportSource`: ``.rows``, ``.dim``, ``.describe()``, ``.warnings`` and
``.batches(start_row)``, which yields :class:`ImportBatch` es of at most ``batch_rows`` items with
unit float32 vectors. Memory stays bounded by one batch beyond the vectors: ``.npy`` files are
memory-mapped, parquet read in record batches, JSONL / CSV line by line (an ``.npz`` array and a
faiss index are loaded whole: that is how numpy and faiss read them). The only whole-file structure
is the ids seen, for duplicate detection: a sorted array of their 64-bit hashes (8 bytes a row); a
hit on a table id is confirmed against the table before it is reported.

**Rows.** A source's rows are its items in a fixed order; ``start_row`` (0-based) resumes there.
A table source has one item per table row. A clip-retrieval folder has, per metadata row, an
image item (when ``img_emb`` exists) then a caption item (when ``text_emb`` exists), shard after
shard: with both, item row ``2r`` is the image and ``2r + 1`` the caption of metadata row ``r``.
Error messages name the file and its own 1-based row (data rows: a CSV header and blank JSONL lines
are not counted).

**Ids** (never a row number):

* the table's id column when there is one (``id_column``; for npy / npz / faiss tables a column
  named ``id`` is used when ``id_column`` is not given). A repeated id is a :class:`SourceError`
  naming both rows. In a clip-retrieval folder with images and captions, the id column names the
  images; a caption's id is then derived as below from its text and its image's id.
* otherwise the rule of ``collection add`` (:mod:`nobackfill.index.ingest`): an image's id is
  :func:`~nobackfill.index.ingest.image_id` of the sha256 of its bytes when the file is readable,
  otherwise ``"img-"`` + the first 20 hex digits of the sha256 of its path as written in the table
  (or of its url when it has no path); a caption's id is
  :func:`~nobackfill.index.ingest.text_id` of its text and its image's id (of its text alone when
  it belongs to no image). Derived ids name content, so a row whose derived id was read before is
  the same item again (clip-retrieval repeats an image once per caption): it is yielded once, and
  ``.warnings`` counts the repeats after a full pass.
* a faiss IndexIDMap without a table: its int ids, as strings.

**Sources.** An image item's source is ``{"path": absolute path or "", "url": url (only when
there is one), "sha256": hex digest of its bytes (only when the file was readable)}``; a caption's
is ``{"text": caption}``; an item with nothing to re-embed from has ``{}``. Relative image paths are
resolved against ``images_root`` when given, otherwise against the table's folder (npy / npz /
faiss tables) or the current directory (clip-retrieval, whose paths are as given to its run).

**Validation**, each a :class:`SourceError` naming the file and the row, before anything is
yielded where possible (vectors are scanned when the source opens): a table whose row count
differs from the vector count, NaN / inf, an all-zero vector, a width other than ``expect_dim``
(checked by :func:`open_source` when given), a missing column (naming the columns that exist), a
duplicate id (raised while streaming). Vectors that are not unit length (norm off by more than
:data:`NORM_TOLERANCE`) are normalised, with one message in ``.warnings`` saying how many rows were;
every yielded vector is unit length (a row already unit to float32 rounding is kept bit for bit).
The width is checked against the model here only when ``expect_dim`` is given; otherwise the caller
compares ``.dim`` with the model's width.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .ingest import image_id, text_id
from .store import file_sha256

__all__ = ["FAISS_EXACT", "NORM_TOLERANCE", "ImportBatch", "ImportSource", "SourceError", "open_source"]

#: a vector whose norm differs from 1 by more than this is counted as "normalised"
NORM_TOLERANCE = 1e-3
#: the faiss index types whose vectors are reconstructed exactly (also inside an IndexIDMap(2))
FAISS_EXACT = ("IndexFlat", "IndexFlatIP", "IndexFlatL2", "IndexHNSWFlat", "IndexIVFFlat")
_SCAN_ROWS = 65536
_MODALITIES = ("image", "text")
_IMAGE_SOURCE_COLUMNS = ("image_path", "path", "image", "filepath", "file", "url")
_TEXT_SOURCE_COLUMNS = ("caption", "text")


class SourceError(ValueError):
    """A source that cannot be imported as it is; the message names the file and the row."""

    def __init__(self, message: str, path: str | Path | None = None, row: int | None = None, *,
                 where: str | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.row = row
        loc = where if where is not None else ("" if row is None else f"row {row}")
        head = " ".join(x for x in (str(path) if path is not None else "", loc) if x)
        super().__init__(f"{head}: {message}" if head else message)


@dataclass
class ImportBatch:
    """Consecutive items of a source (rows ``row0`` .. ``row_end - 1``; a row whose derived id
    repeats an earlier one is left out, so ``len(ids)`` may be less than ``row_end - row0``)."""

    row0: int
    ids: list[str]
    modality: list[str]
    sources: list[dict]
    metadata: list[dict]
    #: float32 ``(n, dim)``, unit rows
    vectors: np.ndarray
    #: each item's row (0-based, in the source's item order)
    rows: list[int] = field(default_factory=list)
    #: the row after the last one this batch covers: resume with ``batches(start_row=row_end)``
    row_end: int = 0

    def __len__(self) -> int:
        return len(self.ids)


# ---------------------------------------------------------------------------------------- tables

class _Chunk:
    """Consecutive rows of a table, read as records (dicts) or column by column (lists)."""

    def __init__(self, n: int, *, records: list[dict] | None = None, arrow: Any = None) -> None:
        self.n, self._records, self._arrow = n, records, arrow

    def __len__(self) -> int:
        return self.n

    @property
    def records(self) -> list[dict]:
        if self._records is None:
            self._records = self._arrow.to_pylist() if self._arrow is not None else [{} for _ in range(self.n)]
        return self._records

    @property
    def columns(self) -> list[str] | None:
        """The columns every row has (None: records may differ, as JSONL lines do)."""
        if self._arrow is not None:
            return list(self._arrow.column_names)
        return [] if self._records is None else None

    def column(self, name: str) -> list:
        if self._arrow is not None:
            if name in self._arrow.column_names:
                return self._arrow.column(name).to_pylist()
            return [None] * self.n
        if self._records is None:
            return [None] * self.n
        return [r.get(name) for r in self._records]


class _Table:
    """A table of ids / sources / metadata read in chunks."""

    path: Path
    columns: list[str]
    num_rows: int
    kind: str

    def chunks(self, start: int, size: int) -> Iterator[_Chunk]:
        """Rows ``start`` .. (0-based) in chunks of ``size`` (the last may be shorter)."""
        raise NotImplementedError

    def take(self, rows: Sequence[int]) -> _Chunk:
        """The rows ``rows`` (0-based, ascending, distinct)."""
        raise NotImplementedError

    def require(self, column: str, why: str) -> None:
        if column not in self.columns:
            raise SourceError(f"no column {column!r} ({why}); its columns: {', '.join(self.columns) or 'none'}",
                              self.path)


class _ParquetTable(_Table):
    kind = "parquet"

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path = path
        try:
            self._pf = pq.ParquetFile(str(path))
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError
            raise SourceError(f"not a readable parquet file ({e})", path) from None
        self.columns = [c for c in self._pf.schema_arrow.names if not c.startswith("__index_level_")]
        md = self._pf.metadata
        self.num_rows = int(md.num_rows)
        sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)

    def chunks(self, start: int, size: int) -> Iterator[_Chunk]:
        import pyarrow as pa

        if start >= self.num_rows:
            return
        g = int(np.searchsorted(self._starts, start, side="right") - 1)
        skip = int(start - self._starts[g])
        pending: list[Any] = []
        count = 0
        for rb in self._pf.iter_batches(batch_size=max(1, size), row_groups=list(range(g, len(self._starts) - 1)),
                                        columns=self.columns, use_pandas_metadata=False):
            if skip >= rb.num_rows:
                skip -= rb.num_rows
                continue
            if skip:
                rb, skip = rb.slice(skip), 0
            pending.append(rb)
            count += rb.num_rows
            while count >= size:
                t = pa.Table.from_batches(pending)
                yield _Chunk(size, arrow=t.slice(0, size))
                rest = t.slice(size)
                pending, count = rest.to_batches(), rest.num_rows
        if count:
            yield _Chunk(count, arrow=pa.Table.from_batches(pending))

    def take(self, rows: Sequence[int]) -> _Chunk:
        import pyarrow as pa

        idx = np.asarray(rows, dtype=np.int64)
        if not idx.size:
            return _Chunk(0, records=[])
        groups = np.searchsorted(self._starts, idx, side="right") - 1
        parts = []
        for g in np.unique(groups):
            local = idx[groups == g] - self._starts[g]
            t = self._pf.read_row_group(int(g), columns=self.columns, use_pandas_metadata=False)
            parts.append(t.take(pa.array(local)))
        return _Chunk(int(idx.size), arrow=pa.concat_tables(parts))


class _LineTable(_Table):
    """JSONL or CSV, streamed line by line."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind
        self._delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        if not path.is_file():
            raise SourceError("table not found", path)
        if kind == "jsonl":
            count, first = 0, None
            with open(path, "rb") as fh:
                for line in fh:
                    if line.strip():
                        count += 1
                        if first is None:
                            first = line
            self.num_rows = count
            self.columns = [] if first is None else list(self._parse(first.decode("utf-8"), 1).keys())
        else:
            with open(path, newline="", encoding="utf-8") as fh:
                reader = csv.reader(fh, delimiter=self._delimiter)
                self.columns = next(reader, [])
                self.num_rows = sum(1 for r in reader if r)

    def _parse(self, line: str, row: int) -> dict:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(f"invalid JSON ({e.msg} at column {e.colno})", self.path, row) from None
        if not isinstance(obj, dict):
            raise SourceError(f"each line must be a JSON object, got {type(obj).__name__}", self.path, row)
        return obj

    def _records(self, start: int, rows: set[int] | None = None, last: int | None = None) -> Iterator[dict]:
        row = -1
        if self.kind == "jsonl":
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    row += 1
                    if last is not None and row > last:
                        return
                    if row < start or (rows is not None and row not in rows):
                        continue
                    yield self._parse(line, row + 1)
        else:
            with open(self.path, newline="", encoding="utf-8") as fh:
                for rec in csv.DictReader(fh, delimiter=self._delimiter):
                    row += 1
                    if last is not None and row > last:
                        return
                    if row < start or (rows is not None and row not in rows):
                        continue
                    yield {k: (v if v != "" else None) for k, v in rec.items() if k is not None}

    def chunks(self, start: int, size: int) -> Iterator[_Chunk]:
        buf: list[dict] = []
        for rec in self._records(start):
            buf.append(rec)
            if len(buf) >= size:
                yield _Chunk(len(buf), records=buf)
                buf = []
        if buf:
            yield _Chunk(len(buf), records=buf)

    def take(self, rows: Sequence[int]) -> _Chunk:
        if not len(rows):
            return _Chunk(0, records=[])
        recs = list(self._records(0, set(int(r) for r in rows), int(max(rows))))
        return _Chunk(len(recs), records=recs)


def _open_table(path: str | Path) -> _Table:
    p = Path(path)
    suffix = p.suffix.lower()
    if not p.is_file():
        raise SourceError("table not found", p)
    if suffix in (".parquet", ".pq"):
        return _ParquetTable(p)
    if suffix in (".jsonl", ".ndjson"):
        return _LineTable(p, "jsonl")
    if suffix in (".csv", ".tsv"):
        return _LineTable(p, "csv")
    raise SourceError(f"unknown table format {suffix or '(no suffix)'!r}: use .parquet, .jsonl or .csv", p)


# --------------------------------------------------------------------------------------- vectors

class _Vectors:
    """A ``(n, dim)`` block of stored vectors; ``raw`` reads in storage order, ``read`` / ``take``
    in the source's row order (the same unless a faiss id map reorders it)."""

    path: Path
    n: int
    dim: int
    dtype: str

    def raw(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.raw(start, stop)

    def take(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

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

    def raw(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self._arr[start:stop], dtype=np.float32)

    def take(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self._arr[np.asarray(rows, dtype=np.int64)], dtype=np.float32)


def _load_npy(path: Path) -> _ArrayVectors:
    if not path.is_file():
        raise SourceError("vector file not found", path)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise SourceError(f"not a readable .npy array ({e})", path) from None
    return _ArrayVectors(arr, path)


def _load_npz(path: Path, key: str | None) -> _ArrayVectors:
    if not path.is_file():
        raise SourceError("vector file not found", path)
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

    def where(self, i: int) -> str:
        return f"vector {i + 1}" + ("" if self._ids is None else f" (faiss id {int(self._ids[i])})")


def _scan(vec: _Vectors, expect_dim: int | None) -> int:
    """Check every stored vector (finite, non-zero, width); returns how many are not unit length."""
    if expect_dim is not None and vec.dim != int(expect_dim):
        raise SourceError(f"vectors are {vec.dim}-d (shape ({vec.n}, {vec.dim})) but the model embeds "
                          f"{int(expect_dim)}-d vectors", vec.path)
    off = 0
    for s in range(0, vec.n, _SCAN_ROWS):
        x = vec.raw(s, min(vec.n, s + _SCAN_ROWS))
        finite = np.isfinite(x).all(axis=1)
        if not finite.all():
            i = s + int(np.argmin(finite))
            raise SourceError("the vector has NaN or infinite values", vec.path, i + 1, where=vec.where(i))
        norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        zero = norms < 1e-12
        if zero.any():
            i = s + int(np.argmax(zero))
            raise SourceError("the vector is all zeros: it has no direction (cannot be normalised)", vec.path,
                              i + 1, where=vec.where(i))
        off += int((np.abs(norms - 1.0) > NORM_TOLERANCE).sum())
    return off


def _unit(x: np.ndarray) -> np.ndarray:
    """Unit rows; a row already unit to float32 rounding (1e-6) is kept bit for bit."""
    x = np.array(x, dtype=np.float32, copy=True)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    off = np.abs(norms - 1.0) > 1e-6
    if off.any():
        x[off] = (x[off] / np.maximum(norms[off], 1e-12)[:, None]).astype(np.float32)
    return x


# ------------------------------------------------------------------------------------ item rules

def _text(value: Any) -> str:
    """A cell as text, as written ("" when empty or blank: a caption keeps its spaces, as in ``add``)."""
    if value.__class__ is str:
        return value if value.strip() else ""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    text = str(value)
    return text if text.strip() else ""


_PLAIN = (str, int, bool, type(None))


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, np.generic):
        return _jsonable(v.item())
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v).hex()
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _string_id(value: Any) -> str:
    """A JSON-able id value (int, str) as the item id string, as written; "" when empty."""
    if value.__class__ is str:
        return value if value.strip() else ""
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else ("" if not math.isfinite(value) else str(value))
    return _text(value)


def _own_ids(chunk: "_Chunk", column: str | None, path: Any, first_row: int) -> list[str] | None:
    """The ids of ``column`` in ``chunk`` (None without an id column); an empty one is an error
    naming its row (``first_row``: the chunk's first row, 0-based)."""
    if not column:
        return None
    own = [_string_id(v) for v in chunk.column(column)]
    if not all(own):
        raise SourceError(f"column {column!r} is empty (every row needs an id)", path, first_row + own.index("") + 1)
    return own


def _chunk_metas(chunk: _Chunk, skip: set[str]) -> list[dict]:
    """Each row's metadata: its columns but ``skip``, JSON-able."""
    n = len(chunk)
    cols = chunk.columns
    if cols is not None:  # every row has the same columns
        keys = [c for c in cols if c not in skip]
        if not keys:
            return [{} for _ in range(n)]
        values = []
        for c in keys:
            col = chunk.column(c)
            if not all(v.__class__ in _PLAIN for v in col):
                col = [_jsonable(v) for v in col]
            values.append(col)
        return [dict(zip(keys, row)) for row in zip(*values)]
    return [{k: (v if v.__class__ in _PLAIN else _jsonable(v)) for k, v in r.items() if k not in skip}
            if not r.keys() <= skip else {} for r in chunk.records]


class _Items:
    """Items of a chunk, column by column; ``j``: each item's row in the chunk."""

    __slots__ = ("layer", "j", "ids", "modality", "sources", "metadata", "derived")

    def __init__(self, layer: list[int] | None = None, j: list[int] | None = None, ids: list[str] | None = None,
                 modality: list[str] | None = None, sources: list[dict] | None = None,
                 metadata: list[dict] | None = None, derived: list[bool] | None = None) -> None:
        self.layer, self.j = layer if layer is not None else [], j if j is not None else []
        self.ids = ids if ids is not None else []
        self.modality = modality if modality is not None else []
        self.sources = sources if sources is not None else []
        self.metadata = metadata if metadata is not None else []
        self.derived = derived if derived is not None else []

    def add(self, layer: int, j: int, iid: str, modality: str, source: dict, metadata: dict, derived: bool) -> None:
        self.layer.append(layer)
        self.j.append(j)
        self.ids.append(iid)
        self.modality.append(modality)
        self.sources.append(source)
        self.metadata.append(metadata)
        self.derived.append(derived)

    def batch(self, seg: "_Segment", m: int, vecs: list[np.ndarray], dim: int, keep: np.ndarray | None, *,
              row0: int, row_end: int, metas: list[int] | None = None) -> ImportBatch:
        """An :class:`ImportBatch` of these items (only ``keep`` ones), with their vectors from
        ``vecs`` (one block per layer, row ``j`` of the chunk)."""
        n = len(self.ids)
        layer = np.asarray(self.layer, dtype=np.int64)
        j = np.asarray(self.j, dtype=np.int64)
        pick = (lambda xs: xs) if keep is None else (lambda xs: [x for x, k in zip(xs, keep.tolist()) if k])
        if keep is not None:
            layer, j = layer[keep], j[keep]
        table_rows = (j + m) if metas is None else np.asarray(metas, dtype=np.int64)[j] if j.size else j
        rows = (seg.offset + table_rows * seg.k + layer).tolist()
        if len(vecs) == 1 and keep is None and n == len(vecs[0]) and (n == 0 or self.j[-1] == n - 1):
            vectors = vecs[0]  # every row of the chunk, in order
        elif len(vecs) == 1:
            vectors = vecs[0][j]
        else:
            vectors = np.empty((j.size, dim), np.float32)
            for li, block in enumerate(vecs):
                sel = layer == li
                vectors[sel] = block[j[sel]]
        return ImportBatch(row0=row0, ids=pick(self.ids), modality=pick(self.modality), sources=pick(self.sources),
                           metadata=pick(self.metadata), vectors=np.ascontiguousarray(vectors, dtype=np.float32),
                           rows=rows, row_end=row_end)


@dataclass
class _Layer:
    vectors: _Vectors
    #: fixed modality, or None: from the table's modality column (or the default)
    modality: str | None


@dataclass
class _Segment:
    table: _Table | None
    layers: list[_Layer]
    n: int  # table rows (= vectors in each layer)
    offset: int = 0  # the segment's first item row

    @property
    def k(self) -> int:
        return len(self.layers)

    @property
    def end(self) -> int:
        return self.offset + self.n * self.k

    @property
    def file(self) -> Path:
        return self.table.path if self.table is not None else self.layers[0].vectors.path


class ImportSource:
    """Vectors embedded elsewhere, with their ids and sources, read in batches (see the module
    docstring for the order of rows, the id rule and the checks)."""

    kind = "source"

    def __init__(self, segments: list[_Segment], *, batch_rows: int, description: str,
                 ids_from_column: bool, images_root: Path) -> None:
        if int(batch_rows) < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        off = 0
        for seg in segments:
            seg.offset = off
            off += seg.n * seg.k
        self._segments = segments
        self.batch_rows = int(batch_rows)
        self._description = description
        self._ids_from_column = ids_from_column
        self._root_str = os.path.join(os.path.abspath(images_root), "")
        self._dirs: dict[str, bool] = {}
        #: human messages about what was changed or cannot be done (normalised rows, repeats, ...)
        self.warnings: list[str] = []
        self._repeats_note: str | None = None
        dims = {(seg.layers[0].vectors.dim if seg.layers else 0) for seg in segments}
        self.dim = int(next(iter(dims))) if dims else 0

    @property
    def rows(self) -> int:
        """Items in the source (image and caption items of a clip-retrieval row count apart)."""
        return sum(seg.n * seg.k for seg in self._segments)

    def describe(self) -> str:
        """One line for humans: what the source is."""
        return self._description

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._description}>"

    # -- image sources, shared by every layout
    def _abspath(self, raw: str) -> str:
        if raw.startswith("~"):
            raw = os.path.expanduser(raw)
        path = raw if raw.startswith(os.sep) else self._root_str + raw
        if f"{os.sep}." in path or os.sep * 2 in path:
            path = os.path.normpath(path)
        return path

    def _is_file(self, path: str) -> bool:
        """``os.path.isfile``, skipping the stat in folders already known not to exist."""
        folder = path.rpartition(os.sep)[0]
        known = self._dirs.get(folder)
        if known is None:
            if len(self._dirs) > 65536:
                self._dirs.clear()
            known = self._dirs[folder] = os.path.isdir(folder)
        return known and os.path.isfile(path)

    def _image(self, raw_path: str, url: str, cheap: bool, need_id: bool = True) -> tuple[str, dict]:
        """(derived id, source) of an image given its path (as written) and / or url. With
        ``cheap``, no file is read and the id is "" when the file's bytes would give it."""
        if raw_path and "://" in raw_path:  # a url in the path column
            url, raw_path = url or raw_path, ""
        source: dict[str, Any] = {"path": ""}
        if url:
            source["url"] = url
        digest = None
        if raw_path:
            path = self._abspath(raw_path)
            source["path"] = path
            if self._is_file(path):
                if cheap:
                    return "", source
                try:
                    digest = file_sha256(Path(path))
                except OSError:
                    digest = None
                if digest is not None:
                    source["sha256"] = digest
        if digest is not None:
            return image_id(digest), source
        name = raw_path or url
        if not name or not need_id:
            return "", source
        return image_id(hashlib.sha256(name.encode("utf-8")).hexdigest()), source

    # -- items, chunk by chunk
    def _chunk_items(self, seg: _Segment, chunk: _Chunk, m: int, skip: int, cheap: bool = False,
                     layers: Sequence[Sequence[int]] | None = None) -> _Items:
        """The items of table rows ``m`` .. ``m + len(chunk) - 1`` of ``seg``: each row's layers
        (the first row's from ``skip`` on), or ``layers[j]`` for row ``j``. With ``cheap``, no
        file is read and an id that needs a file's bytes is ""."""
        raise NotImplementedError

    def _chunks(self, seg: _Segment, start: int, size: int) -> Iterator[_Chunk]:
        if seg.table is not None:
            yield from seg.table.chunks(start, size)
            return
        for s in range(start, seg.n, size):
            yield _Chunk(min(size, seg.n - s))

    # -- streaming
    def batches(self, start_row: int = 0) -> Iterator[ImportBatch]:
        """Batches of at most ``batch_rows`` items from row ``start_row`` (0-based) on; a batch
        never spans two shards. Raises :class:`SourceError` at the first duplicate id."""
        start_row = int(start_row)
        if not 0 <= start_row <= self.rows:
            raise ValueError(f"start_row must be in 0..{self.rows}, got {start_row}")
        seen = _SeenIds()
        if start_row and self._ids_from_column:
            self._seed(start_row, seen)
        repeats = 0
        for seg in self._segments:
            if seg.end <= start_row:
                continue
            k = seg.k
            m, skip = divmod(max(0, start_row - seg.offset), k)
            for chunk in self._chunks(seg, m, max(1, self.batch_rows // k)):
                stop = m + len(chunk)
                vecs = [_unit(layer.vectors.read(m, stop)) for layer in seg.layers]
                items = self._chunk_items(seg, chunk, m, skip)
                hits = seen.add(items.ids)
                keep = None
                if hits.any():
                    keep = ~hits
                    for i in np.flatnonzero(hits).tolist():
                        if items.derived[i]:  # the same content again
                            repeats += 1
                            continue
                        err = self._duplicate(items.ids[i], seg, m + items.j[i])
                        if err is not None:  # (None: two ids with one hash, not a duplicate)
                            raise err
                        keep[i] = True
                    if keep.all():
                        keep = None
                yield items.batch(seg, m, vecs, self.dim, keep, row0=seg.offset + m * k + skip,
                                  row_end=seg.offset + stop * k)
                skip, m = 0, stop
        self._note_repeats(repeats)

    def _note_repeats(self, repeats: int) -> None:
        if self._repeats_note is not None and self._repeats_note in self.warnings:
            self.warnings.remove(self._repeats_note)
            self._repeats_note = None
        if repeats:
            self._repeats_note = (f"{repeats} rows repeat an item read before (same image bytes, path or url, or the "
                                  "same caption of the same image): each item is imported once")
            self.warnings.append(self._repeats_note)

    def read_rows(self, rows: Sequence[int]) -> ImportBatch:
        """The items of ``rows`` (0-based item rows, any order; returned ascending, no duplicate
        check): reads only those table rows and vectors."""
        want = sorted({int(r) for r in rows})
        if want and (want[0] < 0 or want[-1] >= self.rows):
            raise ValueError(f"rows must be in 0..{self.rows - 1}")
        parts: list[ImportBatch] = []
        for seg in self._segments:
            sel = [r for r in want if seg.offset <= r < seg.end]
            if not sel:
                continue
            by_meta: dict[int, list[int]] = {}
            for r in sel:
                mm, layer = divmod(r - seg.offset, seg.k)
                by_meta.setdefault(mm, []).append(layer)
            metas = sorted(by_meta)
            chunk = seg.table.take(metas) if seg.table is not None else _Chunk(len(metas))
            vecs = [_unit(layer.vectors.take(np.asarray(metas))) for layer in seg.layers]
            items = self._chunk_items_at(seg, chunk, metas, [by_meta[mm] for mm in metas])
            parts.append(items.batch(seg, 0, vecs, self.dim, None, row0=0, row_end=0, metas=metas))
        out = ImportBatch(row0=want[0] if want else 0, ids=[], modality=[], sources=[], metadata=[],
                          vectors=np.zeros((0, self.dim), np.float32), row_end=want[-1] + 1 if want else 0)
        for b in parts:
            out.ids += b.ids
            out.modality += b.modality
            out.sources += b.sources
            out.metadata += b.metadata
            out.rows += b.rows
        if parts:
            out.vectors = np.concatenate([b.vectors for b in parts]).astype(np.float32, copy=False)
        return out

    def _chunk_items_at(self, seg: _Segment, chunk: _Chunk, metas: list[int], layers: list[list[int]]) -> _Items:
        """Items of scattered table rows ``metas`` (``chunk`` holds them, in that order)."""
        if all(b == a + 1 for a, b in zip(metas, metas[1:])):
            return self._chunk_items(seg, chunk, metas[0], 0, layers=layers)
        out = _Items()
        for j, mm in enumerate(metas):  # one row at a time: error messages name each row's own number
            sub = _Chunk(1, records=[chunk.records[j]])
            one = self._chunk_items(seg, sub, mm, 0, layers=[layers[j]])
            for i in range(len(one.ids)):
                out.add(one.layer[i], j, one.ids[i], one.modality[i], one.sources[i], one.metadata[i], one.derived[i])
        return out

    # -- duplicates
    def _id_rows(self, stop_row: int | None = None) -> Iterator[tuple[str, _Segment, int, bool]]:
        """(id, segment, table row, derived) of every item before ``stop_row``, without reading
        image files (an image id that needs its bytes is left out)."""
        for seg in self._segments:
            if stop_row is not None and seg.offset >= stop_row:
                return
            m = 0
            for chunk in self._chunks(seg, 0, self.batch_rows):
                items = self._chunk_items(seg, chunk, m, 0, cheap=True)
                for i, iid in enumerate(items.ids):
                    row = seg.offset + (m + items.j[i]) * seg.k + items.layer[i]
                    if stop_row is not None and row >= stop_row:
                        return
                    if iid:
                        yield iid, seg, m + items.j[i], items.derived[i]
                m += len(chunk)

    def _seed(self, start_row: int, seen: "_SeenIds") -> None:
        ids: list[str] = []
        for iid, _seg, _row, _derived in self._id_rows(start_row):
            ids.append(iid)
            if len(ids) >= self.batch_rows:
                seen.add(ids)
                ids = []
        seen.add(ids)

    def _duplicate(self, iid: str, seg: _Segment, row: int) -> SourceError | None:
        """The error for ``iid`` at ``row`` of ``seg`` naming the earlier row with the same id, or
        None when no earlier row has it."""
        for other, oseg, orow, _derived in self._id_rows():
            if oseg is seg and orow == row:
                return None
            if other == iid:
                earlier = f"row {orow + 1}" if oseg is seg else f"{oseg.file} row {orow + 1}"
                return SourceError(f"id {iid!r} repeats the id of {earlier} (ids must be unique)", seg.file, row + 1)
        return None


class _SeenIds:
    """The ids read so far, as a sorted array of their 64-bit hashes (8 bytes an id rather than a
    Python string each); a hit on a table id is confirmed against the table before it is called a
    duplicate."""

    def __init__(self) -> None:
        self._h = np.zeros(0, np.int64)

    def add(self, ids: list[str]) -> np.ndarray:
        """Add ``ids``; True where an id's hash was seen before (earlier, or earlier in ``ids``)."""
        h = np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids))
        hit = np.zeros(h.size, bool)
        if self._h.size and h.size:
            pos = np.minimum(np.searchsorted(self._h, h), self._h.size - 1)
            hit = self._h[pos] == h
        order = np.argsort(h, kind="stable")
        hit[order[1:]] |= h[order[1:]] == h[order[:-1]]
        new = np.unique(h[~hit])
        if new.size:
            self._h = np.insert(self._h, np.searchsorted(self._h, new), new)
        return hit


# ------------------------------------------------------------------------------- clip-retrieval

class ClipRetrievalSource(ImportSource):
    """clip-retrieval ``inference`` output: per metadata row an image item (``img_emb``) and a
    caption item (``text_emb``); the caption's metadata links its row's ``image_id``."""

    kind = "clip-retrieval"

    def __init__(self, segments: list[_Segment], *, id_column: str | None, paired: bool, **kw: Any) -> None:
        super().__init__(segments, ids_from_column=id_column is not None, **kw)
        self._id_col = id_column
        self._paired = paired

    def _chunk_items(self, seg: _Segment, chunk: _Chunk, m: int, skip: int, cheap: bool = False,
                     layers: Sequence[Sequence[int]] | None = None) -> _Items:
        n, k = len(chunk), seg.k
        mods = [layer.modality for layer in seg.layers]
        has_image, has_text = "image" in mods, "text" in mods
        own = _own_ids(chunk, self._id_col, seg.file, m)
        cols = chunk.columns
        paths = chunk.column("image_path")
        urls = chunk.column("url")
        caps = chunk.column("caption") if has_text else None
        link = has_image or cols is None or "image_path" in cols or "url" in cols
        skip_cols = {"image_path", "url", self._id_col} | ({"caption"} if has_text else set())
        metas = _chunk_metas(chunk, {c for c in skip_cols if c})
        out = _Items()
        for j in range(n):
            want = layers[j] if layers is not None else (range(skip, k) if (j == 0 and skip) else range(k))
            img_id, img_source, derived_img = "", {}, True
            if link:
                raw, url = _text(paths[j]), _text(urls[j])
                if raw or url or has_image:
                    mine = own is not None and has_image
                    img_id, img_source = self._image(raw, url, cheap, need_id=not mine)
                    if mine:
                        img_id, derived_img = own[j], False
                    if has_image and not img_id and not cheap:
                        raise SourceError("no image_path or url to derive the image's id from (give an id column)",
                                          seg.file, m + j + 1)
            for li in want:
                if mods[li] == "image":
                    out.add(li, j, img_id, "image", img_source, metas[j], derived_img)
                    continue
                caption = _text(caps[j])
                tmeta = {**metas[j], "image_id": img_id} if img_id else dict(metas[j])
                if own is not None and not has_image:
                    out.add(li, j, own[j], "text", {"text": caption} if caption else {}, tmeta, False)
                elif not caption:
                    raise SourceError("empty caption: a caption item needs its text (or an id column)", seg.file,
                                      m + j + 1)
                elif cheap and has_image and not img_id:
                    out.add(li, j, "", "text", {"text": caption}, tmeta, True)
                else:
                    out.add(li, j, text_id(caption, img_id), "text", {"text": caption}, tmeta, True)
        return out


_SHARD = re.compile(r"^(?P<kind>img_emb|text_emb|metadata)_(?P<tag>\d+)\.(?:npy|parquet)$")


def _clip_retrieval(root: Path, *, id_column: str | None, images_root: str | Path | None,
                    expect_dim: int | None, batch_rows: int) -> ClipRetrievalSource:
    if not root.is_dir():
        raise SourceError("clip-retrieval folder not found", root)
    found: dict[str, dict[str, Path]] = {"img_emb": {}, "text_emb": {}, "metadata": {}}
    for sub, ext in (("img_emb", ".npy"), ("text_emb", ".npy"), ("metadata", ".parquet")):
        d = root / sub
        if d.is_dir():
            for p in d.iterdir():
                mt = _SHARD.match(p.name)
                if mt and mt["kind"] == sub and p.suffix == ext:
                    found[sub][mt["tag"]] = p
    if not found["metadata"]:
        raise SourceError("no metadata/metadata_*.parquet files: not a clip-retrieval inference output folder", root)
    if not found["img_emb"] and not found["text_emb"]:
        raise SourceError("no img_emb/img_emb_*.npy nor text_emb/text_emb_*.npy files: nothing to import", root)
    for sub in ("img_emb", "text_emb"):
        for tag, p in found[sub].items():
            if tag not in found["metadata"]:
                raise SourceError(f"has no metadata file (metadata/metadata_{tag}.parquet)", p)
    kinds = [(sub, mod) for sub, mod in (("img_emb", "image"), ("text_emb", "text")) if found[sub]]
    segments: list[_Segment] = []
    counts = {"image": 0, "text": 0}
    normalised = 0
    dims: dict[int, Path] = {}
    dtypes: set[str] = set()
    for tag in sorted(found["metadata"], key=lambda t: (int(t), t)):
        table = _ParquetTable(found["metadata"][tag])
        layers: list[_Layer] = []
        for sub, mod in kinds:
            p = found[sub].get(tag)
            if p is None:
                raise SourceError(f"has no {sub} file ({sub}/{sub}_{tag}.npy) but other shards do", table.path)
            vec = _load_npy(p)
            if vec.n != table.num_rows:
                raise SourceError(f"{table.path} has {table.num_rows} rows but {p} has {vec.n} vectors: they must "
                                  "match row for row")
            dims.setdefault(vec.dim, p)
            if len(dims) > 1:
                a, b = sorted(dims.items())[:2]
                raise SourceError(f"vectors of different widths: {a[1]} is {a[0]}-d, {b[1]} is {b[0]}-d")
            normalised += _scan(vec, expect_dim)
            dtypes.add(vec.dtype)
            layers.append(_Layer(vec, mod))
            counts[mod] += vec.n
        if id_column is not None:
            table.require(id_column, "the id column")
        if found["img_emb"] and id_column is None and not ({"image_path", "url"} & set(table.columns)):
            table.require("image_path", "the images' paths, to derive their ids")
        if found["text_emb"]:
            table.require("caption", "the captions embedded in text_emb")
        segments.append(_Segment(table, layers, table.num_rows))
    dim = next(iter(dims)) if dims else 0
    what = " + ".join(f"{counts[m]} {label}" for m, label in (("image", "images"), ("text", "captions")) if counts[m])
    desc = (f"clip-retrieval folder {root}: {len(segments)} shard{'s' if len(segments) != 1 else ''}, {what}, "
            f"{dim}-d {'/'.join(sorted(dtypes))}" + (f", ids from column {id_column!r}" if id_column else ""))
    src = ClipRetrievalSource(segments, id_column=id_column, paired=len(kinds) == 2, batch_rows=batch_rows,
                              description=desc, images_root=Path(images_root) if images_root else Path.cwd())
    if normalised:
        src.warnings.append(f"{normalised} of {sum(counts.values())} vectors were not unit length: normalised")
    return src


# ---------------------------------------------------------------------------- npy / npz / faiss

class TableSource(ImportSource):
    """A block of vectors (npy, npz, faiss) with a table of ids and sources, row for row (or a
    faiss IndexIDMap's own ids when there is no table)."""

    def __init__(self, segments: list[_Segment], *, kind: str, id_column: str | None, modality_column: str | None,
                 modality: str | None, image_column: str | None, text_column: str | None, url_column: str | None,
                 faiss_ids: np.ndarray | None = None, **kw: Any) -> None:
        super().__init__(segments, ids_from_column=id_column is not None, **kw)
        self.kind = kind
        self._id_col, self._mod_col, self._modality = id_column, modality_column, modality
        self._img_col, self._txt_col, self._url_col = image_column, text_column, url_column
        self._faiss_ids = faiss_ids
        self._skip = {c for c in (id_column, modality_column, image_column, text_column, url_column) if c}

    def _chunk_items(self, seg: _Segment, chunk: _Chunk, m: int, skip: int, cheap: bool = False,
                     layers: Sequence[Sequence[int]] | None = None) -> _Items:
        n = len(chunk)
        zeros = [0] * n
        if self._faiss_ids is not None and seg.table is None:
            ids = [str(int(x)) for x in self._faiss_ids[m:m + n].tolist()]
            return _Items(zeros, list(range(n)), ids, [str(self._modality)] * n, [{} for _ in range(n)],
                          [{} for _ in range(n)], [False] * n)
        if self._mod_col:
            mods = []
            for j, v in enumerate(chunk.column(self._mod_col)):
                value = _text(v).strip().lower()
                modality = value or self._modality
                if modality not in _MODALITIES:
                    raise SourceError(f"column {self._mod_col!r} must be 'image' or 'text', got {v!r}" if value else
                                      f"column {self._mod_col!r} is empty and no default modality was given",
                                      seg.file, m + j + 1)
                mods.append(modality)
        else:
            mods = [str(self._modality)] * n
        own = _own_ids(chunk, self._id_col, seg.file, m)
        metas = _chunk_metas(chunk, self._skip)
        imgs = chunk.column(self._img_col) if self._img_col and "image" in mods else None
        urls = chunk.column(self._url_col) if self._url_col and "image" in mods else None
        texts = chunk.column(self._txt_col) if self._txt_col and "text" in mods else None
        ids: list[str] = [] if own is None else own
        sources: list[dict] = []
        derived = [own is None] * n
        image = self._image
        for j in range(n):
            if mods[j] == "image":
                raw = _text(imgs[j]) if imgs is not None else ""
                url = _text(urls[j]) if urls is not None else ""
                if not raw and not url:
                    iid, source = "", {}
                elif own is not None and cheap:
                    iid, source = "", {}
                else:
                    iid, source = image(raw, url, cheap, own is None)
                sources.append(source)
                if own is None:
                    if not iid and not cheap:
                        what = f"column {self._img_col!r} is empty" if self._img_col else "no source column"
                        raise SourceError(f"no id column and no image path or url to derive an id from ({what})",
                                          seg.file, m + j + 1)
                    ids.append(iid)
            else:
                text = _text(texts[j]) if texts is not None else ""
                sources.append({"text": text} if text else {})
                if own is None:
                    if not text:
                        what = f"column {self._txt_col!r} is empty" if self._txt_col else "no text column"
                        raise SourceError(f"no id column and no text to derive an id from ({what})", seg.file,
                                          m + j + 1)
                    ids.append(text_id(text))
        return _Items(zeros, list(range(n)), ids, mods, sources, metas, derived)


def _table_columns(table: _Table, *, id_column: str | None, source_column: str | None, modality: str | None
                   ) -> dict[str, Any]:
    cols = table.columns
    if id_column is not None:
        table.require(id_column, "the id column")
    elif "id" in cols:
        id_column = "id"
    mod_col = "modality" if "modality" in cols else None
    if mod_col is None and modality is None:
        raise SourceError("no 'modality' column and no modality given: say whether the vectors are of images or "
                          f"texts (modality='image' or 'text'); its columns: {', '.join(cols) or 'none'}", table.path)
    kinds = {modality} if mod_col is None else set(_MODALITIES)
    img_col = txt_col = None
    if source_column is not None:
        table.require(source_column, "the source column")
        img_col = source_column if "image" in kinds else None
        txt_col = source_column if "text" in kinds else None
    else:
        if "image" in kinds:
            img_col = next((c for c in _IMAGE_SOURCE_COLUMNS if c in cols), None)
        if "text" in kinds:
            txt_col = next((c for c in _TEXT_SOURCE_COLUMNS if c in cols), None)
    url_col = "url" if "url" in cols and img_col != "url" and "image" in kinds else None
    return {"id_column": id_column, "modality_column": mod_col, "image_column": img_col, "text_column": txt_col,
            "url_column": url_col}


def _source_notes(table: _Table | None, c: dict[str, Any], modality: str | None) -> tuple[list[str], str]:
    """Warnings about missing sources, and the description's column part. Raises when no id can be made."""
    notes: list[str] = []
    has_source = bool(c["image_column"] or c["text_column"] or c["url_column"])
    if table is None:
        return notes, ""
    if not has_source:
        tried = ", ".join(_IMAGE_SOURCE_COLUMNS if modality == "image" else
                          _TEXT_SOURCE_COLUMNS if modality == "text" else _IMAGE_SOURCE_COLUMNS + _TEXT_SOURCE_COLUMNS)
        if c["id_column"] is None:
            raise SourceError(f"no id column and no source column (looked for: id, {tried}): give id_column and / or "
                              f"source_column; its columns: {', '.join(table.columns) or 'none'}", table.path)
        notes.append(f"{table.path} has no source column (looked for: {tried}): its items cannot be re-embedded "
                     "(no model check, no backfill)")
    parts = []
    if c["id_column"]:
        parts.append(f"ids from {c['id_column']!r}")
    srcs = sorted({x for x in (c["image_column"], c["text_column"]) if x})
    if srcs:
        parts.append("sources from " + ", ".join(repr(s) for s in srcs))
    if c["modality_column"]:
        parts.append(f"modality from {c['modality_column']!r}")
    elif modality:
        parts.append(f"{modality}s")
    return notes, "; ".join(parts)


def _array_source(kind: str, vec: _ArrayVectors, *, table: str | Path | None, id_column: str | None,
                  source_column: str | None, modality: str | None, images_root: str | Path | None,
                  expect_dim: int | None, batch_rows: int, label: str) -> TableSource:
    if table is None:
        raise SourceError(f"{kind} vectors need a table (table=...) of ids and / or sources, row for row: vectors "
                          "alone have no ids", vec.path)
    tab = _open_table(table)
    if tab.num_rows != vec.n:
        raise SourceError(f"{tab.path} has {tab.num_rows} rows but {vec.path} has {vec.n} vectors: they must match "
                          "row for row")
    c = _table_columns(tab, id_column=id_column, source_column=source_column, modality=modality)
    notes, cols = _source_notes(tab, c, modality)
    normalised = _scan(vec, expect_dim)
    desc = f"{label} ({vec.n} x {vec.dim} {vec.dtype}) with table {tab.path} ({cols})"
    src = TableSource([_Segment(tab, [_Layer(vec, modality)], vec.n)], kind=kind, modality=modality,
                      batch_rows=batch_rows, description=desc,
                      images_root=Path(images_root) if images_root else tab.path.parent.absolute(), **c)
    src.warnings.extend(notes)
    if normalised:
        src.warnings.append(f"{normalised} of {vec.n} vectors were not unit length: normalised")
    return src


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
                  batch_rows: int) -> TableSource:
    import faiss

    if not path.is_file():
        raise SourceError("faiss index not found", path)
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
                        "compares approximations, and only a backfill with the model gives exact vectors back")
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
        c = _table_columns(segment_table, id_column=id_column, source_column=source_column, modality=modality)
        notes, cols = _source_notes(segment_table, c, modality)
        what = f"with table {segment_table.path} ({cols})"
    elif ids is None:
        raise SourceError(f"this {name} index holds no ids: give a table (table=...) of ids and / or sources in index "
                          "order", path)
    else:
        if id_column is not None or source_column is not None:
            raise ValueError("id_column / source_column need a table")
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
    src.warnings.extend(warnings + notes)
    if normalised:
        src.warnings.append(f"{normalised} of {vec.n} vectors were not unit length: normalised")
    return src


# ------------------------------------------------------------------------------------ entry point

def open_source(spec: str, *, table: str | Path | None = None, id_column: str | None = None,
                source_column: str | None = None, modality: str | None = None,
                images_root: str | Path | None = None, lossy: bool = False, batch_rows: int = 16384,
                expect_dim: int | None = None) -> ImportSource:
    """Open vectors embedded elsewhere: ``clip-retrieval:DIR``, ``npy:FILE.npy``,
    ``npz:FILE.npz[:KEY]`` or ``faiss:FILE`` (see the module docstring).

    ``table``: parquet / JSONL / CSV of ids and sources, row for row with the vectors (npy / npz /
    faiss; for a faiss IndexIDMap, its int id ``k`` is the table's 0-based row ``k``).
    ``id_column`` / ``source_column``: the table's columns of ids and of image paths (or urls) /
    caption texts; by default ``id`` and the first of ``image_path, path, image, filepath, file,
    url`` (images) or ``caption, text`` (texts) that exists. ``modality``: ``image`` or ``text``,
    required unless the table has a ``modality`` column (its empty cells take ``modality``).
    ``lossy``: accept a faiss index that stores vectors lossily (a warning says what it costs).
    ``expect_dim``: the declared model's width; a vector file of another width is refused here
    (without it, compare ``.dim`` yourself).

    Every vector is checked before this returns (NaN / inf, zero vectors, width); a duplicate id
    is found while streaming. Raises :class:`SourceError` naming the file (and row).
    """
    if modality is not None and modality not in _MODALITIES:
        raise ValueError(f"modality must be 'image' or 'text', got {modality!r}")
    kind, sep, rest = str(spec).partition(":")
    if not sep or not rest:
        raise ValueError(f"unknown source {spec!r}: use clip-retrieval:DIR, npy:FILE.npy, npz:FILE.npz[:KEY] or "
                         "faiss:FILE")
    kind = kind.lower()
    if kind != "faiss" and lossy:
        raise ValueError("lossy applies to faiss indexes only")
    if kind == "clip-retrieval":
        for name, value in (("table", table), ("source_column", source_column), ("modality", modality)):
            if value is not None:
                raise ValueError(f"{name} does not apply to a clip-retrieval folder (its metadata folder is the "
                                 "table: image_path, caption, url)")
        return _clip_retrieval(Path(rest), id_column=id_column, images_root=images_root, expect_dim=expect_dim,
                               batch_rows=batch_rows)
    common = dict(table=table, id_column=id_column, source_column=source_column, modality=modality,
                  images_root=images_root, expect_dim=expect_dim, batch_rows=batch_rows)
    if kind == "npy":
        return _array_source("npy", _load_npy(Path(rest)), label=f"npy {rest}", **common)
    if kind == "npz":
        file, key = rest, None
        head, colon, tail = rest.rpartition(":")
        if colon and head.lower().endswith(".npz"):
            file, key = head, tail
        return _array_source("npz", _load_npz(Path(file), key), label=f"npz {file}" + (f":{key}" if key else ""),
                             **common)
    if kind == "faiss":
        return _faiss_source(Path(rest), lossy=lossy, **common)
    if kind.startswith("milvus"):
        raise ValueError("a Milvus collection is adopted in place, not read through open_source")
    raise ValueError(f"unknown source {spec!r}: use clip-retrieval:DIR, npy:FILE.npy, npz:FILE.npz[:KEY] or faiss:FILE")
