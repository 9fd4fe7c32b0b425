"""Evaluation glue: embed a data folder with a model, and score "query model x gallery model"
with the retrieval protocol of the XBT paper (Sec. 4.1; see :mod:`nobackfill.metrics`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ._atomic import write_atomically
from .data.folder import PairDataset, load_pairs
from .encoders.base import DualEncoder, l2_normalise
from .metrics.retrieval import retrieval_metrics


@dataclass
class Embedded:
    """Image and caption embeddings of one data set in one space."""

    space_id: str
    images: np.ndarray
    texts: np.ndarray


def resolve_data(data: str | Path, split: str = "test") -> Path:
    """A user folder (has ``captions.jsonl``) as is; a world root resolved to ``data/split``."""
    from .data.folder import check_data_folder, split_folder

    d = Path(data)
    check_data_folder(d)  # no such folder (or a file) said so, not as a folder without captions (trial Y)
    if (d / "task1" / "raw").is_dir():  # (said as "no captions.jsonl" before: trial R)
        raise FileNotFoundError(f"{d}: a Multi30K root (captions without their images): this needs image-text "
                                "data, a data folder or a world root; a text bridge is measured by `nobackfill "
                                "bench xbt-text` and `bench routes`")
    root = split_folder(d, split)  # a world root without that split: named, with the splits it has
    if (root / "captions.jsonl").is_file():
        return root
    raise FileNotFoundError(f"{d}: no captions.jsonl here nor in {d / split}")


def load_eval_data(data: str | Path, split: str = "test", langs: Sequence[str] = ("en",),
                   limit: int | None = None, skip_bad: bool = False) -> PairDataset:
    return load_pairs(resolve_data(data, split), langs=list(langs) if langs else None, limit=limit,
                      skip_bad=skip_bad)


def _data_key(data: PairDataset) -> str:
    h = hashlib.sha256()
    h.update(str(Path(data.root).resolve()).encode())
    for x in data.images:
        h.update(x.encode())
    for c in data.captions:
        h.update(c.encode())
    return h.hexdigest()[:16]


def embed_dataset(encoder: DualEncoder, data: PairDataset, *, cache_dir: str | Path | None = None,
                  progress: bool = False, images: bool = True) -> Embedded:
    """Embed every image and caption of ``data``; optionally cached on disk keyed by the model's
    space id and the data's content."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{encoder.space_id}-{_data_key(data)}.npz"
        if path.is_file():
            z = np.load(path)
            return Embedded(encoder.space_id, z["images"], z["texts"])
    img = encoder.encode_images(data.image_paths(), progress=progress) if images else np.zeros((0, encoder.embed_dim), np.float32)
    txt = encoder.encode_texts(data.captions, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: np.savez(f, images=img, texts=txt), tmp_prefix=".")
    return Embedded(encoder.space_id, img, txt)


def align_dims(query: np.ndarray, gallery: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The *raw* comparison of two spaces of different widths: keep the first ``min(d)``
    coordinates of each and re-normalise. No bridge: this is what an un-upgraded system would
    do, and it is expected to be near chance (the problem nobackfill solves)."""
    d = min(query.shape[1], gallery.shape[1])
    return l2_normalise(query[:, :d]), l2_normalise(gallery[:, :d])


def cross_retrieval(query: Embedded, gallery: Embedded, text_to_image: np.ndarray,
                    ks: Sequence[int] = (1, 5, 10)) -> dict:
    """``{"t2i": query texts -> gallery images, "i2t": query images -> gallery texts}``."""
    qt, gi = align_dims(query.texts, gallery.images)
    qi, gt = align_dims(query.images, gallery.texts)
    t2i = retrieval_metrics(gi, qt, text_to_image, ks=ks, directions=("t2i",))["t2i"]
    i2t = retrieval_metrics(qi, gt, text_to_image, ks=ks, directions=("i2t",))["i2t"]
    out = {"t2i": t2i, "i2t": i2t}
    if query.images.shape[1] != gallery.images.shape[1]:
        out["note"] = f"raw comparison of different widths ({query.images.shape[1]} vs {gallery.images.shape[1]}): first {min(query.images.shape[1], gallery.images.shape[1])} dims"
    return out


def cross_flips(rows: dict[str, tuple[Embedded, Embedded]], baseline: str, text_to_image: np.ndarray) -> dict:
    """Negative / positive flips of every row against ``baseline`` (the tutorial's NFR / PFR applied
    to retrieval: a query whose top-1 was right under the baseline and is wrong under the row, and
    the reverse). ``rows`` maps a name to its (query, gallery) embeddings, as for :func:`cross_retrieval`."""
    from .metrics.flips import flip_rates
    from .metrics.retrieval import best_relevant_ranks

    def top1(query: Embedded, gallery: Embedded) -> dict[str, np.ndarray]:
        qt, gi = align_dims(query.texts, gallery.images)
        qi, gt = align_dims(query.images, gallery.texts)
        return {"t2i": best_relevant_ranks(qt, gi, text_to_image, "t2i") == 1,
                "i2t": best_relevant_ranks(qi, gt, text_to_image, "i2t") == 1}

    correct = {name: top1(q, g) for name, (q, g) in rows.items()}
    base = correct[baseline]
    return {name: {d: {k: v for k, v in flip_rates(base[d], c[d]).items() if k in ("NFR", "PFR", "rel_NFR")}
                   for d in ("t2i", "i2t")} for name, c in correct.items() if name != baseline}


#: captions per cache block of :func:`embed_texts_cached` (blocks at fixed offsets, so a prefix of a
#: list reuses the blocks of the whole list)
TEXT_CACHE_BLOCK = 5000


def texts_sha256(texts: Sequence[str]) -> str:
    """sha256 (hex) of a list of texts, each UTF-8 and ended by a line break: what names a list of
    captions (a cache block, the corpus a stage was trained on, given query texts)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _texts_key(texts: Sequence[str]) -> str:
    return texts_sha256(texts)[:20]


def embed_texts_cached(encoder: DualEncoder, texts: Sequence[str], cache_dir: str | Path | None, *,
                       space_id: str | None = None, block: int = TEXT_CACHE_BLOCK, batch_size: int = 256,
                       progress: bool = False, stats: dict | None = None) -> np.ndarray:
    """``encoder.encode_texts(texts)``, cached on disk in blocks of ``block`` captions, each file
    ``<cache_dir>/<space id>-t<sha256 of the block's texts>.npy``. A block is only recomputed
    when its texts or the model's space id change. ``space_id`` overrides ``encoder.space_id``
    (an upgraded query side names its own space). ``stats`` (if given) counts ``hits`` and
    ``misses`` (blocks)."""
    texts = list(texts)
    sid = space_id or encoder.space_id
    if cache_dir is None:
        return encoder.encode_texts(texts, batch_size=batch_size, progress=progress)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    parts = []
    for s in range(0, len(texts), block):
        chunk = texts[s:s + block]
        path = cache / f"{sid}-t{_texts_key(chunk)}.npy"
        if path.is_file():
            arr = np.load(path)
            if arr.shape[0] == len(chunk):
                parts.append(arr)
                if stats is not None:
                    stats["hits"] = stats.get("hits", 0) + 1
                continue
        arr = encoder.encode_texts(chunk, batch_size=batch_size, progress=progress)
        write_atomically(path, lambda f, a=arr: np.save(f, a), tmp_prefix=".")
        parts.append(arr)
        if stats is not None:
            stats["misses"] = stats.get("misses", 0) + 1
    if not parts:
        return np.zeros((0, encoder.embed_dim), np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)
