"""Our own writer of clip-retrieval's ``inference`` output layout (clip-retrieval itself needs
open_clip and torchvision, which nobackfill does not).

The layout, as clip-retrieval writes it::

    OUT/img_emb/img_emb_{i}.npy          (rows, dim) image embeddings, float16 by default
    OUT/text_emb/text_emb_{i}.npy        (rows, dim) caption embeddings
    OUT/metadata/metadata_{i}.parquet    columns image_path, caption, url (each only when given)

With both images and captions, rows are pairs: row ``r`` of ``img_emb_{i}``, of ``text_emb_{i}``
and of ``metadata_{i}`` describe one (image, caption) pair, so an image with five captions is five
rows. Shard numbers are zero-padded to the width of the largest one (``img_emb_00.npy`` ..
``img_emb_11.npy`` for 12 shards), as clip-retrieval does. Read it back with
:func:`nobackfill.adopt.sources.open_source` (``"clip-retrieval:OUT"``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from .._atomic import write_atomically

__all__ = ["write_clip_retrieval"]


def _matrix(name: str, x, n: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-d array (rows, dim), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} rows but there are {n} metadata rows")
    return arr


def write_clip_retrieval(out_dir: str | Path, *, image_paths: Sequence[str | Path] | None = None,
                         image_vectors: np.ndarray | None = None, captions: Sequence[str] | None = None,
                         text_vectors: np.ndarray | None = None, urls: Sequence[str | None] | None = None,
                         shard_rows: int | None = None, dtype: str | np.dtype = np.float16) -> Path:
    """Write embeddings in clip-retrieval's output layout under ``out_dir``; returns ``out_dir``.

    ``image_paths`` / ``captions`` / ``urls``: one per row (the ``image_path`` / ``caption`` /
    ``url`` metadata columns; a column is written only when given). ``image_vectors`` /
    ``text_vectors``: ``(rows, dim)``, row ``r`` belonging to metadata row ``r`` (pairs when both
    are given). ``shard_rows``: rows per shard (default: one shard). ``dtype``: of the ``.npy``
    files, float16 by default like clip-retrieval (pass ``np.float32`` to keep float32 vectors
    bit for bit). Each file is written atomically (temporary file, then rename).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if image_vectors is None and text_vectors is None:
        raise ValueError("nothing to write: give image_vectors and/or text_vectors")
    if text_vectors is not None and captions is None:
        raise ValueError("text_vectors need their captions (captions=...)")
    columns: dict[str, list] = {}
    if image_paths is not None:
        columns["image_path"] = [None if p is None else str(p) for p in image_paths]
    if captions is not None:
        columns["caption"] = [None if c is None else str(c) for c in captions]
    if urls is not None:
        columns["url"] = [None if u is None else str(u) for u in urls]
    if image_vectors is not None and "image_path" not in columns and "url" not in columns:
        raise ValueError("image_vectors need image_paths (or urls) to say which image each row is")
    lengths = {k: len(v) for k, v in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"metadata columns differ in length: {lengths}")
    n = next(iter(lengths.values()))
    dt = np.dtype(dtype)
    if dt.kind != "f":
        raise ValueError(f"dtype must be a floating point type, got {dt}")
    img = None if image_vectors is None else _matrix("image_vectors", image_vectors, n)
    txt = None if text_vectors is None else _matrix("text_vectors", text_vectors, n)
    if img is not None and txt is not None and img.shape[1] != txt.shape[1]:
        raise ValueError(f"image vectors are {img.shape[1]}-d but text vectors {txt.shape[1]}-d")
    if shard_rows is not None and int(shard_rows) < 1:
        raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
    per = max(1, n) if shard_rows is None else int(shard_rows)
    n_shards = max(1, math.ceil(n / per))
    width = int(math.log10(n_shards)) + 1
    out = Path(out_dir)
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    if img is not None:
        (out / "img_emb").mkdir(exist_ok=True)
    if txt is not None:
        (out / "text_emb").mkdir(exist_ok=True)
    for s in range(n_shards):
        lo, hi = s * per, min(n, (s + 1) * per)
        tag = str(s).zfill(width)
        if img is not None:
            block = np.ascontiguousarray(img[lo:hi], dtype=dt)
            write_atomically(out / "img_emb" / f"img_emb_{tag}.npy", lambda fh, b=block: np.save(fh, b), tmp_prefix=".")
        if txt is not None:
            block = np.ascontiguousarray(txt[lo:hi], dtype=dt)
            write_atomically(out / "text_emb" / f"text_emb_{tag}.npy", lambda fh, b=block: np.save(fh, b), tmp_prefix=".")
        table = pa.table({k: pa.array(v[lo:hi], type=pa.string()) for k, v in columns.items()})
        write_atomically(out / "metadata" / f"metadata_{tag}.parquet", lambda fh, t=table: pq.write_table(t, fh), tmp_prefix=".")
    return out
