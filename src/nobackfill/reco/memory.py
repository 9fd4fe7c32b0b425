"""The external memory of RECO (Sec. 3.1 of the RECO paper, "Retrieving cross-modal external
knowledge"): image-text pairs ``M = {(I_i, T_i)}`` embedded ONCE with the frozen encoder,
``V^M = [f_image(I_1), ...]`` and ``T^M = [f_text(T_1), ...]``, kept in a model-versioned
:class:`~nobackfill.gallery.gallery.Gallery` (both modalities, its own FAISS index per modality).

Layout of a memory directory::

    memory.json     what was built (source folder, space id, removal counts, threshold); written
                    last, so a directory without it is not a memory
    gallery/        a Gallery: image rows (id = image path in the source folder) and text rows
                    (id = ``line-<n>`` of captions.jsonl, metadata ``{"text", "image", "lang"}``)

Pairs: a text row's pair is its image; an image's pair text is its FIRST caption (the memory of
the paper holds one caption per image; a folder with several captions per image keeps all of them
searchable on the text side).

Test items and their near-duplicates are removed when the memory is built (the paper removes the
near-duplicates of the test images from its memory, Sec. 4.1): a memory image whose decoded pixels
equal an excluded image is a *test item*; one whose cosine similarity to an excluded image is above
``threshold`` is a *near-duplicate*. Both are dropped with their captions and counted in
``memory.json``. The cosine is taken in a copy-detection space, ``dedup``:

* ``"pixels"`` (default): a 16x16 RGB thumbnail (box filter), mean-centred, L2-normalised;
* ``"embedding"``: the frozen encoder's image embeddings.

Default ``pixels`` at 0.95, measured on the world (``nobackfill bench reco`` re-measures it: the JSON key
``near_duplicate_calibration``): the same scene re-rendered with fresh pixel noise has thumbnail
cosine above 0.95 for 99.6% of 500 test scenes, while only ~4% of a 20k train-split memory is that
close to some test/val image. The weak ``world-old`` embedding cannot make this distinction: at
0.95 it also catches 99.4% of re-renders but removes 57% of the memory (every look-alike of a test
scene), which would delete the knowledge RECO is meant to retrieve.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
from PIL import Image

from ..data.folder import PairDataset
from ..data.images import open_rgb
from ..gallery.build import build_gallery
from ..gallery.atomic_files import atomic_write_bytes, read_tagged_json
from ..gallery.gallery import Gallery

if TYPE_CHECKING:
    from ..encoders.base import DualEncoder

MEMORY_FILE = "memory.json"
GALLERY_DIR = "gallery"
MEMORY_FORMAT = "nobackfill-reco-memory"
#: default near-duplicate threshold (cosine of frozen image embeddings); see the module doc
NEAR_DUPLICATE_THRESHOLD = 0.95
DEDUP_SPACES = ("pixels", "embedding")
THUMBNAIL = 16
SEARCH_MODES = ("uni", "cross")  # uni-modal search (the paper's) / cross-modal search (ablation)
FUSE_MODES = ("cross", "uni")  # cross-modal fusion (the paper's) / uni-modal fusion (ablation)
MODALITIES = ("image", "text")


class MemoryFormatError(ValueError):
    """A memory directory that is missing or malformed (the message names the file)."""


def image_content_hash(path: str | Path) -> str:
    """sha256 of the decoded RGB pixels (and size): equal for the same picture stored twice."""
    arr = np.asarray(open_rgb(path))
    h = hashlib.sha256(np.asarray(arr.shape, np.int64).tobytes())
    h.update(arr.tobytes())
    return h.hexdigest()


def thumbnail_features(paths: Sequence[str | Path]) -> np.ndarray:
    """Copy-detection features: 16x16 RGB thumbnails (box filter), mean-centred, unit rows."""
    out = np.empty((len(paths), THUMBNAIL * THUMBNAIL * 3), np.float32)
    for i, p in enumerate(paths):
        out[i] = np.asarray(open_rgb(p).resize((THUMBNAIL, THUMBNAIL), Image.BOX), np.float32).ravel()
    out -= out.mean(axis=1, keepdims=True)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)


@dataclass
class RemovalReport:
    """What :func:`build_memory` removed from the memory folder, and why."""

    threshold: float
    dedup: str = "pixels"
    source_images: int = 0
    source_texts: int = 0
    test_items: int = 0  # exact pixel matches with an excluded image
    near_duplicates: int = 0  # cosine > threshold to an excluded image (and not an exact match)
    kept_images: int = 0
    kept_texts: int = 0
    excluded_sets: list[str] = field(default_factory=list)
    #: a few removed image paths with the reason and the cosine (for inspection)
    examples: list[dict] = field(default_factory=list)

    @property
    def removed(self) -> int:
        return self.test_items + self.near_duplicates


def find_removals(memory_vecs: np.ndarray, memory_hashes: Sequence[str], exclude_vecs: np.ndarray,
                  exclude_hashes: Sequence[str], threshold: float, chunk: int = 4096
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which memory images to drop: ``(is_test_item, is_near_duplicate, max_cosine)`` per row.

    ``is_test_item``: the decoded pixels equal an excluded image. ``is_near_duplicate``: not a test
    item but ``max_cosine > threshold`` (rows are L2-normalised embeddings of one space)."""
    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"near-duplicate threshold must be a cosine in [-1, 1], got {threshold}")
    n = memory_vecs.shape[0]
    test = np.array([h in set(exclude_hashes) for h in memory_hashes], dtype=bool) if n else np.zeros(0, bool)
    best = np.full(n, -np.inf, dtype=np.float32)
    if exclude_vecs.shape[0]:
        ex_t = np.ascontiguousarray(exclude_vecs.T, dtype=np.float32)
        for s in range(0, n, chunk):
            best[s:s + chunk] = (memory_vecs[s:s + chunk] @ ex_t).max(axis=1)
    near = (best > threshold) & ~test
    return test, near, best


def build_memory(encoder: "DualEncoder", data: PairDataset, out: str | Path, *,
                 exclude: Sequence[PairDataset] = (), threshold: float = NEAR_DUPLICATE_THRESHOLD,
                 dedup: str = "pixels", model_ref: str = "", backend: str = "flat",
                 progress: bool = False) -> "Memory":
    """Embed the pairs of ``data`` with the frozen ``encoder`` into a memory at ``out``, without
    the images of ``exclude`` (test sets), their exact copies and their near-duplicates.

    The encoder is only called (no gradient, no weight change); ``out`` must not hold a memory yet.
    """
    out = Path(out)
    if (out / MEMORY_FILE).exists():
        raise FileExistsError(f"{out / MEMORY_FILE} exists: a memory is already built there")
    if dedup not in DEDUP_SPACES:
        raise ValueError(f"dedup must be one of {DEDUP_SPACES}, got {dedup!r}")
    if not -1.0 < float(threshold) <= 1.0:  # a cosine (1.5 kept every near-duplicate, saying "cosine > 1.5")
        raise ValueError(f"threshold is a cosine in (-1, 1], got {threshold}")

    def features(paths: list[Path]) -> np.ndarray:
        return thumbnail_features(paths) if dedup == "pixels" else encoder.encode_images(paths, progress=progress)

    paths = data.image_paths()
    hashes = [image_content_hash(p) for p in paths]
    ex_paths = [p for ex in exclude for p in ex.image_paths()]
    ex_hashes = [image_content_hash(p) for p in ex_paths]
    if ex_paths:
        test, near, best = find_removals(features(paths), hashes, features(ex_paths), ex_hashes, threshold)
    else:
        test = near = np.zeros(len(paths), bool)
        best = np.full(len(paths), -np.inf, np.float32)
    keep = ~(test | near)
    report = RemovalReport(threshold=float(threshold), dedup=dedup, source_images=len(data), source_texts=data.num_captions,
                           test_items=int(test.sum()), near_duplicates=int(near.sum()),
                           excluded_sets=[str(ex.root) for ex in exclude])
    for i in np.flatnonzero(~keep)[:20]:
        report.examples.append({"image": data.images[i], "reason": "test_item" if test[i] else "near_duplicate",
                                "max_cosine": round(float(best[i]), 4)})
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        raise ValueError(f"{data.root}: every image was removed as a test item or near-duplicate")
    image_ids = [data.images[i] for i in kept]
    texts = [(f"line-{data.caption_lines[j]}", data.captions[j],
              {"image": data.images[int(i)], "lang": data.langs[j]})
             for j, i in enumerate(data.caption_image) if keep[int(i)]]
    gallery = build_gallery(encoder, out / GALLERY_DIR, images=list(zip(image_ids, [paths[i] for i in kept])),
                            texts=texts, model_ref=model_ref or str(getattr(encoder, "name", "") or "encoder"),
                            backend=backend, progress=progress)
    report.kept_images, report.kept_texts = gallery.count("image"), gallery.count("text")
    info = {"format": MEMORY_FORMAT, "version": 1, "space_id": encoder.space_id, "dim": encoder.embed_dim,
            "model": model_ref, "source": str(Path(data.root).resolve()), "langs": data.languages(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "removal": asdict(report)}
    atomic_write_bytes(out / MEMORY_FILE, json.dumps(info, indent=2).encode("utf-8"))
    gallery.close()
    return Memory.open(out)


class Memory:
    """A built memory: the gallery of both modalities plus the pairing between its rows.

    ``retrieve(...)`` implements ``KNN_t^{v->v}(v, M) = T^M[NN(v; V^M)]`` and
    ``KNN_v^{t->t}(t, M) = V^M[NN(t; T^M)]`` (RECO Sec. 3.1) and the ablations (cross-modal search,
    uni-modal fusion).
    """

    def __init__(self, path: Path, info: dict, gallery: Gallery) -> None:
        self.path, self.info, self.gallery = path, info, gallery
        image_ids = gallery.ids("image")
        row_of = {iid: r for r, iid in enumerate(image_ids)}
        metas = gallery.metadata("text")
        try:
            self.text_image = np.asarray([row_of[m["image"]] for m in metas], dtype=np.int64)
        except KeyError as e:
            raise MemoryFormatError(f"{path / GALLERY_DIR}: a text row names image {e} that is not in the memory") from None
        first = np.full(len(image_ids), -1, dtype=np.int64)
        for j in range(self.text_image.size - 1, -1, -1):  # backwards: the first caption wins
            first[self.text_image[j]] = j
        if (first < 0).any():
            raise MemoryFormatError(f"{path / GALLERY_DIR}: {(first < 0).sum()} image(s) have no caption")
        self.image_text = first
        #: most text rows that share one image (how many extra hits self-exclusion can cost)
        self.max_texts_per_image = int(np.bincount(self.text_image).max())
        self._vectors = {m: gallery.vectors(m) for m in MODALITIES}

    @classmethod
    def open(cls, path: str | Path) -> "Memory":
        path = Path(path)
        f = path / MEMORY_FILE
        if not f.is_file():
            raise MemoryFormatError(f"{path} is not a RECO memory: {f} does not exist (build it with "
                               "`nobackfill reco build-memory`)")
        info = read_tagged_json(f, MEMORY_FORMAT, error=MemoryFormatError)
        gallery = Gallery.open(path / GALLERY_DIR)
        if gallery.space_id != info.get("space_id"):
            raise MemoryFormatError(f"{f}: space {info.get('space_id')} but its gallery is in {gallery.space_id}")
        return cls(path, info, gallery)

    # ------------------------------------------------------------------ properties
    @property
    def space_id(self) -> str:
        return self.gallery.space_id

    @property
    def dim(self) -> int:
        return self.gallery.dim

    @property
    def removal(self) -> dict:
        return dict(self.info.get("removal", {}))

    def vectors(self, modality: str) -> np.ndarray:
        """``V^M`` (``"image"``) or ``T^M`` (``"text"``), read-only float32."""
        return self._vectors[modality]

    def pair_texts(self) -> np.ndarray:
        """The text row paired with each image row (its first caption)."""
        return self.image_text

    # ------------------------------------------------------------------ retrieval
    def _image_of_rows(self, modality: str, rows: np.ndarray) -> np.ndarray:
        return rows if modality == "image" else self.text_image[rows]

    def retrieve_rows(self, queries: np.ndarray, query_modality: str, k: int, *, search: str = "uni",
                      fuse: str = "cross", exclude_images: np.ndarray | None = None,
                      space_id: str | None = None) -> tuple[str, np.ndarray]:
        """Rows ``(Q, k)`` of the memory modality handed to the fusion model, and that modality.

        ``search="uni"`` searches the query's own modality (v->v, t->t; the paper's), ``"cross"``
        the other one (v->t, t->v). ``fuse="cross"`` returns the OTHER modality's embeddings of the
        hits (an image query gets texts; the paper's), ``"uni"`` the query's own. Hits whose memory
        image is ``exclude_images[q]`` (the query's own pair at training time) are skipped.
        """
        if query_modality not in MODALITIES:
            raise ValueError(f"query_modality must be one of {MODALITIES}, got {query_modality!r}")
        if search not in SEARCH_MODES or fuse not in FUSE_MODES:
            raise ValueError(f"search must be one of {SEARCH_MODES} and fuse one of {FUSE_MODES}, "
                             f"got {search!r}, {fuse!r}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        other = "text" if query_modality == "image" else "image"
        searched = query_modality if search == "uni" else other
        returned = other if fuse == "cross" else query_modality
        q = np.ascontiguousarray(queries, dtype=np.float32)
        n_searched = self.gallery.count(searched)
        extra = 0
        if exclude_images is not None:
            extra = 1 if searched == "image" else self.max_texts_per_image
        kk = min(k + extra, n_searched)
        if kk < k:
            raise ValueError(f"memory {self.path} has {n_searched} {searched} rows, fewer than k={k} (+{extra})")
        res = self.gallery.search(searched, q, kk, space_id=space_id or self.space_id)
        pos = res.positions.astype(np.int64)
        if exclude_images is not None:
            ex = np.asarray(exclude_images, dtype=np.int64).reshape(-1, 1)
            valid = (self._image_of_rows(searched, pos) != ex) & (pos >= 0)
            # stable: keep the first k valid hits of each row, in rank order
            order = np.argsort(~valid, axis=1, kind="stable")[:, :k]
            if not np.take_along_axis(valid, order, axis=1).all():
                raise ValueError("self-exclusion left fewer than k neighbours for some query")
            pos = np.take_along_axis(pos, order, axis=1)
        else:
            pos = pos[:, :k]
        if returned == searched:
            return returned, pos
        if searched == "image":  # image hits -> their pair texts
            return returned, self.image_text[pos]
        return returned, self.text_image[pos]  # text hits -> their images

    def retrieve(self, queries: np.ndarray, query_modality: str, k: int, **kw) -> np.ndarray:
        """Embeddings ``(Q, k, dim)`` handed to the fusion model (see :meth:`retrieve_rows`)."""
        modality, rows = self.retrieve_rows(queries, query_modality, k, **kw)
        return self.vectors(modality)[rows]

    def image_rows_by_hash(self, paths: Sequence[str | Path]) -> np.ndarray:
        """For each image file, the memory image row with the same decoded pixels, else -1
        (how training pairs from another folder find their own pair in the memory)."""
        own = {}
        for r, m in enumerate(self.gallery.metadata("image")):
            p = m.get("path")
            if p and os.path.isfile(p):
                own.setdefault(image_content_hash(p), r)
        return np.asarray([own.get(image_content_hash(p), -1) for p in paths], dtype=np.int64)
