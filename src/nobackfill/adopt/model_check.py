"""The model check: were these stored vectors made by the model declared for them?

Re-embed a random sample of items whose source is readable with the declared model and compare
with the stored vectors (cosine). Vectors from the declared model match to rounding (cosine ~1;
float16 storage ~0.9999); vectors from another model, or rows shuffled against their table, do not
(cosine near 0). :func:`sample_rows` picks the sample from an
:class:`~nobackfill.adopt.sources.ImportSource` without reading it whole; :func:`check_model`
decides: accepted when the median cosine is at least ``threshold`` (0.99).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

if TYPE_CHECKING:  # the encoder module pulls in torch only where it is used
    from ..encoders.base import DualEncoder
    from .sources import ImportSource

__all__ = ["DEFAULT_SAMPLES", "DEFAULT_THRESHOLD", "ModelCheck", "Sample", "check_model", "collection_samples",
           "sample_rows", "skipped_check"]

DEFAULT_SAMPLES = 64
DEFAULT_THRESHOLD = 0.99
#: a lossy index's threshold: the lowest cosine its codes give back the sample's own fresh vectors at, less this
LOSSY_MARGIN = 0.02
#: the largest share of sampled items whose cosine may fall below the threshold in an accepted check
MAX_MISMATCHED = 0.1


class Sample(NamedTuple):
    """One sampled item: ``(modality, payload, vector)`` first (an image path or a caption text,
    and the stored vector), then where it came from."""

    modality: str
    payload: str
    vector: np.ndarray
    row: int = -1
    id: str = ""


@dataclass
class ModelCheck:
    """The verdict of :func:`check_model` (cosines are ``None`` when nothing could be compared)."""

    n: int
    median_cosine: float | None
    min_cosine: float | None
    accepted: bool
    message: str
    model: str = ""
    threshold: float = DEFAULT_THRESHOLD
    #: sampled items whose source could not be embedded (unreadable image, ...)
    skipped: int = 0
    #: for vectors stored lossily: the index, how its codes keep the sample's fresh vectors, the default threshold
    lossy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return {"model": self.model, "n": self.n, "median_cosine": self.median_cosine,
                "min_cosine": self.min_cosine, "threshold": self.threshold, "accepted": self.accepted,
                "skipped": self.skipped, "message": self.message, **({"lossy": self.lossy} if self.lossy else {})}


def _lossy_threshold(threshold: float, fresh: np.ndarray, round_trip: Callable[[np.ndarray], np.ndarray],
                     compression: str) -> tuple[float, dict[str, Any]]:
    """The threshold for vectors a lossy index gave back: its codec takes the sample's fresh
    vectors to what it would have stored for them; the vectors of the declared model then lie at
    about those cosines from them (the stored ones are the codes of the same vectors), so the
    threshold is the lowest of them less :data:`LOSSY_MARGIN` (never above ``threshold``)."""
    info: dict[str, Any] = {"index": compression, "default_threshold": threshold}
    try:
        back = np.asarray(round_trip(fresh), dtype=np.float32)
    except Exception as e:  # a codec faiss cannot run alone: the exact threshold stays, and the message says so
        info["error"] = str(e).splitlines()[-1] if str(e) else type(e).__name__
        return threshold, info
    back = back / np.maximum(np.linalg.norm(back, axis=1, keepdims=True), 1e-12)
    kept = np.einsum("ij,ij->i", fresh, back).astype(np.float64)
    info.update(min_cosine=round(float(kept.min()), 4), median_cosine=round(float(np.median(kept)), 4))
    return min(threshold, round(float(kept.min()) - LOSSY_MARGIN, 4)), info


def _lossy_note(info: dict[str, Any] | None, threshold: float) -> str:
    if not info:
        return ""
    if "error" in info:
        return (f"; the vectors come from a lossy {info['index']} index whose compression could not be measured "
                f"({info['error']}): the threshold is that of exact vectors")
    return (f"; threshold {threshold:g} rather than {info['default_threshold']:g} since the vectors are the "
            f"reconstructions of a lossy {info['index']} index, whose codes give back these items' own vectors at "
            f"cosine {info['min_cosine']:.4f} at worst (median {info['median_cosine']:.4f}), less {LOSSY_MARGIN:g}")


def skipped_check(model: str) -> dict[str, Any]:
    """The verdict recorded for an import whose model check was skipped (``trust_model``)."""
    return {"skipped": True, "model": model,
            "message": f"skipped (trust_model): nothing checked that {model} made these vectors"}


def _model_name(encoder: Any, model: str | None) -> str:
    if model:
        return str(model)
    return str(getattr(encoder, "name", "") or type(encoder).__name__)


def _embed(encoder: "DualEncoder", modality: str, payloads: list[str]) -> np.ndarray:
    if modality == "image":
        return np.asarray(encoder.encode_images([Path(p) for p in payloads], progress=False), dtype=np.float32)
    return np.asarray(encoder.encode_texts(list(payloads), progress=False), dtype=np.float32)


def _embed_each(encoder: "DualEncoder", modality: str, payloads: list[str]) -> tuple[list[int], np.ndarray | None]:
    """Embed all at once; on a bad item, one at a time, leaving out those that fail."""
    try:
        return list(range(len(payloads))), _embed(encoder, modality, payloads)
    except (OSError, ValueError, SyntaxError):
        keep, rows = [], []
        for i, p in enumerate(payloads):
            try:
                rows.append(_embed(encoder, modality, [p])[0])
                keep.append(i)
            except (OSError, ValueError, SyntaxError):
                continue
        return keep, (np.stack(rows) if rows else None)


def check_model(encoder: "DualEncoder", samples: Sequence[Sequence[Any]], *, threshold: float = DEFAULT_THRESHOLD,
                model: str | None = None, round_trip: Callable[[np.ndarray], np.ndarray] | None = None,
                compression: str = "") -> ModelCheck:
    """Re-embed ``samples`` (each ``(modality, payload, stored vector, ...)``: an image path or a
    caption text) with ``encoder`` and compare with the stored vectors.

    Accepted when the median cosine is at least ``threshold`` and at most :data:`MAX_MISMATCHED`
    of the items fall below it (a table whose rows are partly shifted against its vectors has a
    median of 1 and many mismatches: refused). Refused, with the numbers in
    ``message``, otherwise; also refused (never raised) when the stored vectors' width is not the
    encoder's, when the encoder cannot embed a sampled modality, or when nothing could be compared.
    ``model``: the name used in messages (the encoder's ``name`` or class name by default).
    ``round_trip``: for vectors a lossy index gave back (``compression`` names it), its codec
    (encode, then decode): the threshold is lowered to what the compression keeps of the sample's
    own fresh vectors (:func:`_lossy_threshold`), and the message says which threshold and why.
    """
    name = _model_name(encoder, model)
    threshold = float(threshold)

    def refuse(message: str, n: int = 0, skipped: int = 0) -> ModelCheck:
        return ModelCheck(n=n, median_cosine=None, min_cosine=None, accepted=False, message=message, model=name,
                          threshold=threshold, skipped=skipped)

    if not samples:
        return refuse(f"cannot check the model {name}: no item with a readable source (an image file that exists or "
                      "a caption text) to re-embed")
    dim = int(encoder.embed_dim)
    widths = sorted({int(np.asarray(s[2]).reshape(-1).shape[0]) for s in samples})
    if widths != [dim]:
        return refuse(f"these vectors were not made by {name}: they are {'/'.join(map(str, widths))}-d and {name} "
                      f"embeds {dim}-d vectors")
    by_mod: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        if s[0] not in ("image", "text"):
            raise ValueError(f"sample {i}: modality must be 'image' or 'text', got {s[0]!r}")
        by_mod.setdefault(str(s[0]), []).append(i)
    can = set(getattr(encoder, "modalities", ("image", "text")))
    for modality, idx in by_mod.items():
        if modality not in can:
            return refuse(f"these vectors were not made by {name}: {name} does not embed {modality}s, but "
                          f"{len(idx)} sampled items are {modality}s")
    cosines: list[np.ndarray] = []
    fresh_rows: list[np.ndarray] = []
    skipped = 0
    for modality, idx in by_mod.items():
        keep, fresh = _embed_each(encoder, modality, [str(samples[i][1]) for i in idx])
        skipped += len(idx) - len(keep)
        if fresh is None or not keep:
            continue
        stored = np.stack([np.asarray(samples[idx[k]][2], dtype=np.float32).reshape(-1) for k in keep])
        a = stored / np.maximum(np.linalg.norm(stored, axis=1, keepdims=True), 1e-12)
        b = fresh / np.maximum(np.linalg.norm(fresh, axis=1, keepdims=True), 1e-12)
        cosines.append(np.einsum("ij,ij->i", a, b))
        fresh_rows.append(b)
    if not cosines:
        return refuse(f"cannot check the model {name}: none of the {len(samples)} sampled items could be embedded",
                      skipped=skipped)
    lossy = None
    if round_trip is not None:
        threshold, lossy = _lossy_threshold(threshold, np.concatenate(fresh_rows), round_trip, compression)
    cos = np.concatenate(cosines).astype(np.float64)
    n, med, low = int(cos.size), float(np.median(cos)), float(cos.min())
    below = int(np.count_nonzero(cos < threshold))
    accepted = med >= threshold and below <= MAX_MISMATCHED * n
    extra = (f"; {skipped} sampled items could not be embedded" if skipped else "") + _lossy_note(lossy, threshold)
    if below:
        extra = f"; {below} of them below the threshold" + extra
    if accepted:
        message = (f"these vectors match {name}: median cosine {med:.4f} over {n} items (min {low:.4f}, threshold "
                   f"{threshold:g}){extra}")
    else:
        message = (f"these vectors were not made by {name}: median cosine {med:.2f} over {n} items (min {low:.2f}, "
                   f"threshold {threshold:g}){extra}")
    return ModelCheck(n=n, median_cosine=med, min_cosine=low, accepted=accepted, message=message, model=name,
                      threshold=threshold, skipped=skipped, lossy=lossy)


def _readable(modality: str, source: dict) -> str:
    """The payload to re-embed an item from, or "" when its source cannot be read."""
    if modality == "image":
        path = source.get("path") or ""
        return path if path and os.path.isfile(path) and os.access(path, os.R_OK) else ""
    return str(source.get("text") or "")


def sample_rows(source: "ImportSource", n: int = DEFAULT_SAMPLES, seed: int = 0, *,
                max_candidates: int | None = None) -> list[Sample]:
    """A random sample (fixed ``seed``: the same sample every time) of up to ``n`` items whose
    source is readable (an image file that exists, a non-empty caption), returned in row order.

    Random rows are drawn, then read in row order (:meth:`ImportSource.read_rows`) in rounds of
    growing size until ``n`` readable ones are found or ``max_candidates`` rows (default ``64 * n``)
    were looked at; a source with few readable items can give fewer than ``n``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:  # (0 read as "no readable source")
        raise ValueError(f"samples must be an integer >= 1 (items the model check embeds again), got {n!r}")
    total = int(source.rows)
    n = int(n)
    if n < 1 or total == 0:
        return []
    cap = min(total, int(max_candidates) if max_candidates is not None else max(64 * n, 1024))
    rng = np.random.default_rng(seed)
    order = rng.choice(total, size=cap, replace=False)  # distinct rows in a random order
    picked: list[tuple[int, Sample]] = []  # (rank in the random order, sample)
    pos, step = 0, 2 * n
    while pos < cap and len(picked) < n:
        chunk = order[pos:pos + step]
        rank = {int(r): pos + i for i, r in enumerate(chunk)}
        batch = source.read_rows(chunk.tolist())
        for j, row in enumerate(batch.rows):
            payload = _readable(batch.modality[j], batch.sources[j])
            if payload:
                picked.append((rank[row], Sample(batch.modality[j], payload, batch.vectors[j].copy(), row,
                                                 batch.ids[j])))
        pos += len(chunk)
        step *= 2
    picked.sort(key=lambda t: t[0])
    return sorted((s for _, s in picked[:n]), key=lambda s: s.row)


def collection_samples(collection: Any, space_id: str, n: int = DEFAULT_SAMPLES, seed: int = 0) -> list[Sample]:
    """A random sample (fixed ``seed``) of up to ``n`` items that ``space_id`` serves and whose
    source is readable, with their stored vectors (read from the space's store): what ``verify
    --model-check`` re-embeds with the space's model."""
    from ..catalog.catalog import unsourced_sql

    cat = collection.catalog
    rows = cat.query(f"SELECT rid, id, modality, key, source FROM items WHERE space = ? AND NOT "
                     f"{unsourced_sql(cat.dialect)}", (space_id,))
    order = np.random.default_rng(seed).permutation(len(rows))
    picked: list[tuple[int, str, str, str, str]] = []
    import json

    for i in order:
        rid, item_id, modality, key, source = rows[int(i)]
        payload = _readable(modality, json.loads(source))
        if payload:
            picked.append((int(rid), item_id, modality, key, payload))
            if len(picked) >= n:
                break
    store = collection.gallery(space_id)
    out: list[Sample] = []
    for modality in ("image", "text"):
        mine = [p for p in picked if p[2] == modality]
        if mine:
            vecs = store.get_vectors(modality, [p[3] for p in mine])
            out += [Sample(modality, p[4], v, p[0], p[1]) for p, v in zip(mine, vecs)]
    return sorted(out, key=lambda s: s.row)
