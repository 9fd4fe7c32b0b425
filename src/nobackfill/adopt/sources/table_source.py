"""A block of vectors with a table of ids and sources, row for row (:class:`TableSource`): its
items, the table's columns, and npy / npz arrays opened with their table, for
:mod:`nobackfill.adopt.sources`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...collection.ingest import text_id
from .common import _IMAGE_SOURCE_COLUMNS, _MODALITIES, _TEXT_SOURCE_COLUMNS, SourceError
from .import_source import ImportSource
from .arrow_json import image_sources_json, sourced_metadata_json, text_sources_json
from .items import _chunk_metas, _Items, _Layer, _meta_keys, _own_ids, _Segment, _text, _texts, with_sources
from .tables import _Chunk, _open_table, _Table
from .vectors import _ArrayVectors, _scan


class TableSource(ImportSource):
    """A block of vectors (npy, npz, faiss) with a table of ids and sources, row for row (or a
    faiss IndexIDMap's own ids when there is no table)."""

    _column_ids_only = True
    #: build the items of a chunk of one modality whose ids the table gives column by column (False:
    #: row by row, as every other chunk; the tests compare the two)
    _columnwise = True

    def __init__(self, segments: list[_Segment], *, kind: str, id_column: str | None, modality_column: str | None,
                 modality: str | None, image_column: str | None, text_column: str | None, url_column: str | None,
                 faiss_ids: np.ndarray | None = None, metadata_columns: Sequence[str] | None = None,
                 **kw: Any) -> None:
        super().__init__(segments, ids_from_column=id_column is not None, **kw)
        self.kind = kind
        self._id_col, self._mod_col, self._modality = id_column, modality_column, modality
        self._img_col, self._txt_col, self._url_col = image_column, text_column, url_column
        self._faiss_ids = faiss_ids
        self._skip = {c for c in (id_column, modality_column, image_column, text_column, url_column) if c}
        self._keep = None if metadata_columns is None else frozenset(metadata_columns)

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
        if own is not None and not self._mod_col and self._columnwise:  # the table's ids, one modality
            sources, said = self._listed_sources(chunk, cheap)
            metas = (None if cheap or chunk.arrow is None or said is None else
                     sourced_metadata_json(chunk.arrow, _meta_keys(chunk.arrow.column_names, self._skip, self._keep),
                                           said))
            return _Items(zeros, list(range(n)), own, mods, sources,
                          with_sources(_chunk_metas(chunk, self._skip, self._keep), sources) if metas is None
                          else metas, [False] * n)
        metas = _chunk_metas(chunk, self._skip, self._keep)
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
        return _Items(zeros, list(range(n)), ids, mods, sources, with_sources(metas, sources), derived)

    def _listed_sources(self, chunk: _Chunk, cheap: bool) -> tuple[Sequence[dict], Any]:
        """The sources of a chunk of rows of one modality whose ids the table gives (no file is
        touched): those the row by row loop of :meth:`_chunk_items` makes, column by column; with
        them, where they were written column by column, what each says in the item's metadata
        (:func:`~.arrow_json.image_sources_json`; else None)."""
        n = len(chunk)
        image = self._modality == "image"
        column = self._img_col if image else self._txt_col
        if column and chunk.arrow is not None and not cheap and not self._url_col:
            cells = chunk.arrow.column(column)
            made = image_sources_json(cells, self._root_str) if image else text_sources_json(cells)
            if made is not None:  # the common cases, written column by column
                return made
        if self._modality != "image":
            texts = _texts(chunk.column(self._txt_col)) if self._txt_col else [""] * n
            return [{"text": t} if t else {} for t in texts], None
        if cheap or not (self._img_col or self._url_col):
            return [{} for _ in range(n)], []
        return self._image_sources(chunk.column(self._img_col) if self._img_col else [None] * n,
                                   chunk.column(self._url_col) if self._url_col else None), None


def _table_columns(table: _Table, *, id_column: str | None, source_column: str | None, modality: str | None,
                   metadata_columns: Sequence[str] | None = None) -> dict[str, Any]:
    """Which of the table's columns hold what (ids only from ``id_column``: never a column taken
    for them by its name)."""
    cols = table.columns
    if id_column is not None:
        table.require(id_column, "the id column")
    for c in metadata_columns or ():
        table.require(c, "a metadata column")
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
            "url_column": url_col, "metadata_columns": None if metadata_columns is None else list(metadata_columns)}


def _source_notes(table: _Table | None, c: dict[str, Any], modality: str | None) -> tuple[list[str], str]:
    """Warnings about missing sources, and the description's column part. Raises when no id can be made."""
    notes: list[str] = []
    has_source = bool(c["image_column"] or c["text_column"] or c["url_column"])
    if table is None:
        return notes, ""
    named_id = c["id_column"] is None and "id" in table.columns
    if not has_source:
        tried = ", ".join(_IMAGE_SOURCE_COLUMNS if modality == "image" else
                          _TEXT_SOURCE_COLUMNS if modality == "text" else _IMAGE_SOURCE_COLUMNS + _TEXT_SOURCE_COLUMNS)
        if c["id_column"] is None:
            raise SourceError(f"no id column given and no source column to derive ids from (looked for: {tried}): give "
                              "id_column (--id-column) and / or source_column (--source-column)"
                              + ("; its column 'id' is taken for ids only when named: id_column='id' (--id-column id)"
                                 if named_id else "") + f"; its columns: {', '.join(table.columns) or 'none'}",
                              table.path)
        notes.append(f"{table.path} has no source column (looked for: {tried}): its items cannot be re-embedded "
                     "(no model check, no backfill)")
    if named_id:
        notes.append(f"{table.path}: its column 'id' was not taken for the ids, which come from content (as add gives "
                     "them: an image's bytes or path, a caption's text) since no id column was given; pass "
                     "id_column='id' (--id-column id) to take its values; each item keeps it in its metadata")
    parts = [f"ids from {c['id_column']!r}" if c["id_column"] else "ids from content"]
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
                  expect_dim: int | None, batch_rows: int, label: str,
                  metadata_columns: Sequence[str] | None = None) -> TableSource:
    if table is None:
        raise SourceError(f"{kind} vectors need a table (table=...) of ids and / or sources, row for row: vectors "
                          "alone have no ids", vec.path)
    tab = _open_table(table)
    if tab.num_rows != vec.n:
        raise SourceError(f"{tab.path} has {tab.num_rows} rows but {vec.path} has {vec.n} vectors: they must match "
                          "row for row")
    c = _table_columns(tab, id_column=id_column, source_column=source_column, modality=modality,
                       metadata_columns=metadata_columns)
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
