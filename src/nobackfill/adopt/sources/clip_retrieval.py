"""clip-retrieval ``inference`` output folders (img_emb/, text_emb/, metadata/) for
:mod:`nobackfill.adopt.sources`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from ...collection.ingest import text_id
from .common import SourceError, SourceNotFound
from .import_source import ImportSource
from .items import _chunk_metas, _Items, _Layer, _own_ids, _Segment, _text, source_metadata
from .tables import _Chunk, _ParquetTable
from .vectors import _load_npy, _scan


class ClipRetrievalSource(ImportSource):
    """clip-retrieval ``inference`` output: per metadata row an image item (``img_emb``) and a
    caption item (``text_emb``); the caption's metadata links its row's ``image_id``."""

    kind = "clip-retrieval"

    def __init__(self, segments: list[_Segment], *, id_column: str | None, paired: bool,
                 metadata_columns: Sequence[str] | None = None, **kw: Any) -> None:
        super().__init__(segments, ids_from_column=id_column is not None, **kw)
        self._id_col = id_column
        self._paired = paired
        self._keep = None if metadata_columns is None else frozenset(metadata_columns)

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
        metas = _chunk_metas(chunk, {c for c in skip_cols if c}, self._keep)
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
                    out.add(li, j, img_id, "image", img_source, {**source_metadata(img_source), **metas[j]}, derived_img)
                    continue
                caption = _text(caps[j])
                tmeta = {**({"text": caption} if caption else {}), **metas[j]}
                if img_id:
                    tmeta["image_id"] = img_id
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
                    expect_dim: int | None, batch_rows: int,
                    metadata_columns: Sequence[str] | None = None) -> ClipRetrievalSource:
    if not root.is_dir():
        raise SourceNotFound("clip-retrieval folder not found", root)
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
        for c in metadata_columns or ():
            table.require(c, "a metadata column")
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
                              metadata_columns=metadata_columns,
                              description=desc, images_root=Path(images_root) if images_root else Path.cwd())
    if normalised:
        src.warnings.append(f"{normalised} of {sum(counts.values())} vectors were not unit length: normalised")
    return src
