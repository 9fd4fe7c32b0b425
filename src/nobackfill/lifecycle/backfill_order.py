"""The backfill's order policies: ``sequential``, ``random`` and ``uncertainty`` (FastFill,
Jaeckle et al., ICLR 2023, arXiv 2303.04766: the items predicted worst-served first, see
:mod:`nobackfill.lifecycle.backfill`), each a list of item ids; the job store keeps it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..encoders.base import encode
from ..collection.collection import Collection, Item

ORDERS = ("sequential", "random", "uncertainty")


def _pending(collection: Collection, target: str, items: dict[str, Item] | None = None) -> list[Item]:
    """Live items the target space can embed that it holds no vector for, in log order (items
    without a source are never pending: nothing can embed them)."""
    mods = set(collection.space(target).modalities)
    if items is None:  # the catalog knows what the target serves (the current space: first in order)
        return collection.not_served_by(target, mods, sourced=True)
    # (trial AL: an image imported with a url alone was ordered, then read as the path '.')
    mine = [it for it in items.values() if it.modality in mods and it.sourced]
    held = _held(collection.store_for_lookup(target), mine)
    return [it for it in mine if it.key not in held[it.modality]]


def one_read_time(store: Any) -> Any:
    """``store.one_read_time()`` where the store has one (a Milvus store: its key lookups in the block
    wait for the server once), else a block that does nothing."""
    return getattr(store, "one_read_time", contextlib.nullcontext)()


def _held(store: Any, items: Sequence[Item]) -> dict[str, set[str]]:
    """Per modality, the keys of ``items`` that ``store`` holds (one batched lookup per modality: a
    Milvus store answers a key at a time in a round trip; both at one read time)."""
    with one_read_time(store):
        return {m: set(store.positions(m, [it.key for it in items if it.modality == m])) for m in ("image", "text")}


# ----------------------------------------------------------------------------- orders
def _encode(encoder: Any, items: Sequence[Item]) -> dict[str, np.ndarray]:
    """Per modality, the vectors of ``items`` of that modality (in their order)."""
    out = {}
    for m in ("image", "text"):
        rows = [it.payload for it in items if it.modality == m]
        if rows:
            out[m] = encode(encoder, m, rows)
    return out


def _old_vectors(collection: Collection, items: Sequence[Item], target: str) -> dict[str, tuple[str, np.ndarray]]:
    """Each item's vector in the first space other than ``target`` (in serving order) that holds
    its current version: id -> (space, vector)."""
    out: dict[str, tuple[str, np.ndarray]] = {}
    for sid in collection.space_ids():
        if sid == target:
            continue
        g = collection.gallery(sid)
        for m in ("image", "text"):
            todo = [it for it in items if it.modality == m and it.id not in out]
            if not todo:
                continue
            pos = g.positions(m, [it.key for it in todo])
            hit = [it for it in todo if it.key in pos]
            if hit:
                vecs = np.asarray(g.vectors(m))
                out.update({it.id: (sid, vecs[pos[it.key]]) for it in hit})
    return out


def _cross_fit_targets(x_old: np.ndarray, x_new: np.ndarray, folds: int = 5, ridge: float = 1e-2,
                       seed: int = 0) -> np.ndarray:
    """FastFill's transformation error, cross-fitted: ``1 - cos(psi(x_old), x_new)`` where ``psi``
    (ridge least squares) never saw the item it scores."""
    n = len(x_old)
    fold = np.random.default_rng(seed).permutation(n) % max(2, min(folds, n))
    out = np.zeros(n, np.float32)
    for f in np.unique(fold):
        tr, te = fold != f, fold == f
        a = x_old[tr]
        w = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ x_new[tr])
        pred = x_old[te] @ w
        pred /= np.maximum(np.linalg.norm(pred, axis=1, keepdims=True), 1e-12)
        out[te] = 1.0 - (pred * x_new[te]).sum(axis=1)
    return out


def _fit_head(x: np.ndarray, y: np.ndarray, ridge: float = 0.1) -> Callable[[np.ndarray], np.ndarray]:
    """The head ``h(v_old)``: ridge regression on the old embedding (with a bias). On the world, a
    linear head beat a one-hidden-layer MLP and a kNN regressor at predicting the per-item gain
    from a 5-10 % sample (``scripts/backfill_order_study.py``)."""
    a = np.c_[x, np.ones(len(x))]
    w = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ np.asarray(y, np.float64))

    def predict(v: np.ndarray) -> np.ndarray:
        return np.c_[np.asarray(v, np.float64), np.ones(len(v))] @ w

    return predict


def _captions_of(items: dict[str, Item]) -> dict[str, list[Item]]:
    """Image id -> its captions, from the captions' ``image_id`` metadata (links inside the collection)."""
    out: dict[str, list[Item]] = {}
    for it in items.values():
        img = it.metadata.get("image_id") if it.modality == "text" else None
        if img in items and items[img].modality == "image":
            out.setdefault(img, []).append(it)
    return out


def _route_failure(collection: Collection, pool: Any, sample: Sequence[Item],
                   items: dict[str, Item]) -> dict[str, float]:
    """How badly each linked sample item is served now (before it is backfilled): for an image, the
    share of its captions whose query does not find it first; for a caption, whether its image's
    query misses every caption of that image. Queries go through the collection's own routes."""
    from ..search.searcher import Searcher

    caps = _captions_of(items)
    s = Searcher(collection, pool=pool)
    out: dict[str, float] = {}
    imgs = [it for it in sample if it.modality == "image" and caps.get(it.id)]
    if imgs:
        qs = [(im.id, c.payload) for im in imgs for c in caps[im.id]]
        res = s.search_batch(texts=[q for _, q in qs], k=1, target="image")
        miss: dict[str, list[float]] = {}
        for (iid, _), r in zip(qs, res):
            miss.setdefault(iid, []).append(float(not r.hits or r.hits[0].id != iid))
        out.update({iid: float(np.mean(v)) for iid, v in miss.items()})
    texts = [it for it in sample if it.modality == "text" and it.metadata.get("image_id") in caps]
    if texts:
        img_ids = sorted({t.metadata["image_id"] for t in texts})
        paths = [Path(items[i].payload) for i in img_ids]
        try:
            res: list[Any] = s.search_batch(images=paths, k=1, target="text")
        except (OSError, ValueError, SyntaxError):  # an image file gone or corrupt: its captions go unlabelled
            res = [_or_none(lambda p=p: s.search_batch(images=[p], k=1, target="text")[0]) for p in paths]
        hit = {i: bool(r.hits) and r.hits[0].id in {c.id for c in caps[i]} for i, r in zip(img_ids, res) if r is not None}
        out.update({t.id: float(not hit[t.metadata["image_id"]]) for t in texts if t.metadata["image_id"] in hit})
    return out


def _or_none(call: Callable[[], Any]) -> Any:
    """``call()``, or None where it cannot read its source."""
    try:
        return call()
    except (OSError, ValueError, SyntaxError):
        return None


def _interleave(per_modality: dict[str, list[str]]) -> list[str]:
    """Modalities interleaved in proportion to their sizes, so every direction's gallery is
    backfilled at the same pace (t2i gains only from images, i2t only from captions)."""
    lists = {m: v for m, v in per_modality.items() if v}
    idx = {m: 0 for m in lists}
    out: list[str] = []
    for _ in range(sum(len(v) for v in lists.values())):
        m = min((m for m in lists if idx[m] < len(lists[m])), key=lambda m: (idx[m] + 1) / len(lists[m]))
        out.append(lists[m][idx[m]])
        idx[m] += 1
    return out


def _cover_images_first(ordered: list[Item], already: set[str]) -> list[Item]:
    """Captions: one per image first (images without a backfilled caption), then the others, each
    pass in the given order: an image query is answered once any of its captions is found."""
    first, second, seen = [], [], set(already)
    for it in ordered:
        img = it.metadata.get("image_id")
        (second if img in seen else first).append(it)
        if img is not None:
            seen.add(img)
    return first + second


def _uncertainty_order(collection: Collection, target: str, pending: list[Item], sample: list[Item],
                       labels: dict[str, float], seed: int) -> tuple[list[str], dict[str, Any]]:
    """The items not in ``sample`` (already backfilled), predicted worst-served first, per
    modality, interleaved (see the module doc). ``labels`` are the sample's route failures; where
    fewer than 8 sample items of a (space, modality) have one, the head learns FastFill's
    transformation error instead."""
    g = collection.gallery(target)
    g.refresh()
    in_sample = {it.id for it in sample}
    rest = [it for it in pending if it.id not in in_sample]
    old = _old_vectors(collection, sample + rest, target)
    scores: dict[str, float] = {}
    info: dict[str, Any] = {}
    for m in ("image", "text"):
        new_pos = g.positions(m, [it.key for it in sample if it.modality == m])
        new_vecs = np.asarray(g.vectors(m)) if new_pos else None
        for sid in sorted({old[it.id][0] for it in sample + rest if it.modality == m and it.id in old}):
            todo = [it for it in rest if it.modality == m and it.id in old and old[it.id][0] == sid]
            train = [it for it in sample if it.modality == m and it.id in old and old[it.id][0] == sid]
            if not todo:
                continue
            labelled = [it for it in train if it.id in labels]
            if len(labelled) >= 8:
                kind, x = "route_failure", np.stack([old[it.id][1] for it in labelled])
                y = np.array([labels[it.id] for it in labelled])
            else:
                train = [it for it in train if it.key in new_pos]
                if len(train) < 8:  # nothing to learn from: log order
                    continue
                kind, x = "transformation_error", np.stack([old[it.id][1] for it in train])
                y = _cross_fit_targets(x, new_vecs[[new_pos[it.key] for it in train]], seed=seed)
            head = _fit_head(x, y)
            pred = head(np.stack([old[it.id][1] for it in todo]))
            fit = head(x)
            info[f"{sid}/{m}"] = {"target": kind, "sample": len(y), "target_mean": float(np.mean(y)),
                                  "train_corr": float(np.corrcoef(fit, y)[0, 1]) if len(y) > 2 and np.std(y) > 0 else None}
            scores.update({it.id: float(p) for it, p in zip(todo, pred)})
    per: dict[str, list[str]] = {}
    for m in ("image", "text"):
        ranked = sorted((it for it in rest if it.modality == m), key=lambda it: -scores.get(it.id, -np.inf))
        if m == "text":
            ranked = _cover_images_first(ranked, {it.metadata.get("image_id") for it in sample if it.modality == "text"})
        per[m] = [it.id for it in ranked]
    return _interleave(per), info


