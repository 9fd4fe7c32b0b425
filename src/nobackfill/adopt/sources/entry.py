""":func:`open_source`, the entry point of :mod:`nobackfill.adopt.sources`: a spec such as
``npy:FILE.npy`` opened by the reader of its kind."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .clip_retrieval import _clip_retrieval
from .common import _MODALITIES
from .faiss_reader import _faiss_source
from .import_source import ImportSource
from .table_source import _array_source
from .vectors import _load_npy, _load_npz


def open_source(spec: str, *, table: str | Path | None = None, id_column: str | None = None,
                source_column: str | None = None, modality: str | None = None,
                images_root: str | Path | None = None, lossy: bool = False, batch_rows: int = 16384,
                expect_dim: int | None = None, metadata_columns: Sequence[str] | None = None) -> ImportSource:
    """Open vectors embedded elsewhere: ``clip-retrieval:DIR``, ``npy:FILE.npy``,
    ``npz:FILE.npz[:KEY]`` or ``faiss:FILE`` (see the module docstring).

    ``table``: parquet / JSONL / CSV of ids and sources, row for row with the vectors (npy / npz /
    faiss; for a faiss IndexIDMap, its int id ``k`` is the table's 0-based row ``k``).
    ``id_column``: the table's column of ids (none by default: ids from content, never from a
    column not named here, even one called ``id``). ``source_column``: its column of image paths
    (or urls) / caption texts; by default the first of ``image_path, path, image, filepath, file,
    url`` (images) or ``caption, text`` (texts) that exists. ``metadata_columns``: the other
    columns each item keeps in its metadata (default: every one), beside what its source is (an
    image's ``path`` / ``url``, a caption's ``text``). ``modality``: ``image`` or ``text``,
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
                               batch_rows=batch_rows, metadata_columns=metadata_columns)
    common = dict(table=table, id_column=id_column, source_column=source_column, modality=modality,
                  images_root=images_root, expect_dim=expect_dim, batch_rows=batch_rows,
                  metadata_columns=metadata_columns)
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
