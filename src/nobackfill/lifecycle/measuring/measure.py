"""Measuring a collection through the :class:`~nobackfill.search.Searcher` as users query it: a split
of a folder as collection items and as queries with their relevant ids, the rank of the first
relevant hit per query, a collection embedded by one model, and one embedded by an old model and
live-upgraded to a new one (plan, routes and merge calibrated on a val split). The backfill curve
(:mod:`.backfill_curve`), the demo and the system benchmarks measure with these."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ...collection.collection import Collection
from ...collection.ingest import add_items, folder_items
from ...search import ModelPool, Searcher
from ..calibrate import pair_tasks
from ..plan_changes import upgrade_collection


def hit_ranks(responses, relevant: Sequence[set[str]], k: int) -> np.ndarray:
    """Per response, the rank of its first relevant hit (``k + 1``: none in the top ``k``)."""
    out = np.full(len(responses), k + 1, np.int64)
    for i, (r, rel) in enumerate(zip(responses, relevant)):
        for h in r.hits:
            if h.id in rel:
                out[i] = h.rank
                break
    return out


def fresh_dir(path: Path) -> Path:
    """``path``, emptied (a scratch folder)."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def embedded_collection(path: Path, pool: ModelPool, ref: str, items, log: Callable[[str], None]) -> Collection:
    """A new collection at ``path`` holding ``items`` embedded by the model ``ref``."""
    enc = pool.get(ref)
    c = Collection.create(fresh_dir(path), space_id=enc.space_id, dim=enc.embed_dim, model=ref,
                          name=getattr(enc, "name", ""), modalities=enc.modalities)
    t0 = time.time()
    add_items(c, enc, items, progress=False)
    log(f"  {path.name}: {len(items)} items embedded by {getattr(enc, 'name', ref)} in {time.time() - t0:.0f}s")
    return c


@dataclass
class QuerySet:
    """A split as collection items and as queries with their relevant item ids: captions query
    images (their own image), images query captions (any of theirs)."""

    items: list[Any]
    texts: list[Any]
    images: list[Any]
    t2i_rel: list[set[str]]
    i2t_images: list[Any]
    i2t_rel: list[set[str]]

    def __post_init__(self) -> None:
        self.cache: dict = {}  # query embeddings of every model, computed once per model

    def measure(self, s: Searcher) -> dict[str, np.ndarray]:
        """Rank (1..10, 11 = not in the top 10) of the first relevant hit, per query and direction."""
        return {"t2i": hit_ranks(s.search_batch(texts=[t.payload for t in self.texts], k=10, target="image",
                                             cache=self.cache), self.t2i_rel, 10),
                "i2t": hit_ranks(s.search_batch(images=[Path(im.payload) for im in self.i2t_images], k=10, target="text",
                                             cache=self.cache), self.i2t_rel, 10)}


def split_queries(split_dir: Path, n_images: int | None = None) -> QuerySet:
    """:class:`QuerySet` of a folder split (English captions; the first ``n_images`` images)."""
    items = folder_items(split_dir, langs=["en"], uncaptioned=False).items
    if n_images is not None:
        keep = {it.id for it in items if it.modality == "image"}
        order = [it.id for it in items if it.id in keep]
        keep = set(order[:n_images])
        items = [it for it in items if (it.id if it.modality == "image" else it.metadata["image_id"]) in keep]
    images = [it for it in items if it.modality == "image"]
    texts = [it for it in items if it.modality == "text"]
    by_image: dict[str, set[str]] = {}
    for t in texts:
        by_image.setdefault(t.metadata["image_id"], set()).add(t.id)
    i2t = [im for im in images if im.id in by_image]
    return QuerySet(items, texts, images, [{t.metadata["image_id"]} for t in texts], i2t, [by_image[im.id] for im in i2t])


def upgraded_collection(ev: QuerySet, path: Path, pool: ModelPool, *, old_ref: str, new_ref: str, upgrade: Path,
                        calibration: Path, calib_images: int | None,
                        log: Callable[[str], None]) -> tuple[Collection, Any, float]:
    """A collection of ``ev``'s items embedded by ``old_ref``, upgraded to ``new_ref`` with the
    upgrade directory ``upgrade`` and calibrated on ``calib_images`` images of the val split of
    ``calibration``; returns it, its plan and the upgrade's seconds."""
    from ...evaluate import load_eval_data

    val = load_eval_data(calibration, "val", langs=["en"], limit=calib_images)
    log(f"world: {len(ev.images)} test images, {len(ev.texts)} captions; calibration on {len(val)} val images")
    c = embedded_collection(path, pool, old_ref, ev.items, log)
    t0 = time.time()
    plan = upgrade_collection(c, new_ref, bridges=[upgrade], calibration=pair_tasks(val),
                              calibration_label=f"{calibration} val ({len(val)} images)", pool=pool)
    return c, plan, time.time() - t0


__all__ = ["QuerySet", "embedded_collection", "fresh_dir", "hit_ranks", "split_queries", "upgraded_collection"]
