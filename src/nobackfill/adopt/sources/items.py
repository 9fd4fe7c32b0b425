"""The item rules of :mod:`nobackfill.adopt.sources`: cells as text, ids and JSON-able metadata,
a chunk's items (:class:`_Items`) and the layout of a source (segments of layers)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...catalog.items import JsonRows
from .common import ImportBatch, SourceError
from .tables import _Chunk, _Table
from .vectors import _Vectors


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


def _texts(values: list) -> list[str]:
    """:func:`_text` of each cell of a column."""
    return [v if v.__class__ is str and v.strip() else _text(v) for v in values]


_PLAIN = (str, int, bool, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)
_PLAIN_OR_FLOAT = _PLAIN_TYPES | {float}


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
    own = chunk.column(column)
    if {*map(type, own)} == {str} and all(map(str.strip, own)):
        return own  # every id a string with more than spaces: as written
    own = [_string_id(v) for v in own]
    if not all(own):
        raise SourceError(f"column {column!r} is empty (every row needs an id)", path, first_row + own.index("") + 1)
    return own


def _meta_keys(cols: Sequence[str], skip: set[str], keep: frozenset[str] | None) -> list[str]:
    """The columns of ``cols`` that go into an item's metadata: all but ``skip``, or (``keep``)
    only those named."""
    return [c for c in cols if c not in skip and (keep is None or c in keep)]


def source_metadata(source: dict) -> dict:
    """What an item's metadata says of its source, as ``add`` gives it: an image's ``path`` (and its
    ``url``, when it has one), a caption's ``text``; nothing for an item without a source."""
    if "text" in source:
        return {"text": source["text"]}
    out = {"path": source["path"]} if source.get("path") else {}
    if source.get("url"):
        out["url"] = source["url"]
    return out


def with_sources(metas: Sequence[dict], sources: Sequence[dict]) -> list[dict]:
    """Each item's metadata after what it says of its source (:func:`source_metadata`; a table's
    column of the same name wins, as a key given to ``add`` does)."""
    return [{**source_metadata(s), **m} if s else m for m, s in zip(metas, sources)]


def _chunk_metas(chunk: _Chunk, skip: set[str], keep: frozenset[str] | None = None) -> list[dict]:
    """Each row's metadata: its columns but ``skip`` (only those in ``keep``, when given), JSON-able."""
    n = len(chunk)
    cols = chunk.columns
    if cols is None:
        cols = _shared_keys(chunk.records)
    if cols is not None:  # every row has the same columns
        keys = _meta_keys(cols, skip, keep)
        if not keys:
            return [{} for _ in range(n)]
        out = [{keys[0]: v} for v in _json_column(chunk.column(keys[0]))]
        for key in keys[1:]:
            for meta, v in zip(out, _json_column(chunk.column(key))):
                meta[key] = v
        return out
    return [{k: (v if v.__class__ in _PLAIN else _jsonable(v)) for k, v in r.items()
             if k not in skip and (keep is None or k in keep)} if not r.keys() <= skip else {} for r in chunk.records]


def _shared_keys(records: list[dict]) -> list[str] | None:
    """The keys of every record when each has the same, in the same order (as CSV rows do)."""
    keys = {*map(tuple, records)}
    return list(keys.pop()) if len(keys) == 1 else None


def _json_column(values: list) -> list:
    """A column's cells, JSON-able (:func:`_jsonable` of each)."""
    kinds = {*map(type, values)}
    if kinds <= _PLAIN_TYPES:
        return values
    if kinds <= _PLAIN_OR_FLOAT:
        return [v if v.__class__ is not float or math.isfinite(v) else None for v in values]
    return [_jsonable(v) for v in values]


class _Items:
    """Items of a chunk, column by column; ``j``: each item's row in the chunk."""

    __slots__ = ("layer", "j", "ids", "modality", "sources", "metadata", "derived")

    def __init__(self, layer: list[int] | None = None, j: list[int] | None = None, ids: list[str] | None = None,
                 modality: list[str] | None = None, sources: Sequence[dict] | None = None,
                 metadata: Sequence[dict] | None = None, derived: list[bool] | None = None) -> None:
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
        pick = (lambda xs: xs) if keep is None else \
            (lambda xs: xs.where(keep.tolist()) if isinstance(xs, JsonRows) else [x for x, k in zip(xs, keep.tolist()) if k])
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
