"""Adding vectors computed elsewhere: the bulk path (no model runs, no per-item objects).

:func:`add_vectors` stores one batch of precomputed vectors in the collection's current space and
commits their items in one catalog transaction. An item's vector key is its id plus a hash of its
vector's bytes, so the same batch given again changes nothing, a changed vector under an existing
id replaces it (an upsert), and vectors stored by a run killed before its commit are served by the
next run without being stored twice (the same guarantees as
:func:`~nobackfill.index.ingest.add_items`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .collection import MAX_ID_LENGTH, Collection, _JSON
from .store import MODALITIES, DuplicateIdError, SpaceMismatchError

__all__ = ["VectorsReport", "add_vectors", "vector_rev"]


@dataclass
class VectorsReport:
    """What :func:`add_vectors` did with one batch."""

    added: int = 0  # committed: new ids, new vectors under existing ids, or new sources / metadata
    unchanged: int = 0  # already held with the same vector, source and metadata
    stored: int = 0  # vectors written to the store (fewer when held already, e.g. stored by a killed run)

    def merge(self, other: "VectorsReport") -> None:
        for k in ("added", "unchanged", "stored"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def to_dict(self) -> dict[str, int]:
        return {"added": self.added, "unchanged": self.unchanged, "stored": self.stored}


def vector_rev(vectors: np.ndarray) -> list[str]:
    """Per row, the first 16 hex digits of the sha256 of its float32 bytes (the version part of an
    imported item's vector key)."""
    v = np.ascontiguousarray(vectors, np.float32)
    return [hashlib.sha256(row).hexdigest()[:16] for row in v.view(np.uint8).reshape(len(v), -1)]


def _id_problem(i: Any) -> str | None:
    if not isinstance(i, str) or not i.strip():
        return f"ids must be non-empty strings, got {i!r}"
    if len(i) > MAX_ID_LENGTH or (not i.isprintable() and any(ord(c) < 32 for c in i)):
        return f"id {i[:40]!r} is longer than {MAX_ID_LENGTH} characters or has control characters"
    return None


def add_vectors(collection: Collection, ids: Sequence[str], vectors: np.ndarray, *,
                modality: str | Sequence[str], sources: Sequence[Mapping[str, Any]] | None = None,
                metadata: Sequence[Mapping[str, Any]] | None = None, space_id: str | None = None,
                where: str = "batch") -> VectorsReport:
    """Add one batch of items with their precomputed vectors (of the collection's current model).

    ``modality``: one for the batch or one per row; ``sources``: per row, what the item can be
    embedded again from (an image ``{"path": ...}``, a text ``{"text": ...}``; ``""`` when there is
    none: the item is searchable but cannot be backfilled); ``metadata``: per row, returned with
    hits and filterable. ``space_id`` (default: the current one) must be the current space.
    ``where`` names the batch in errors. Raises ``ValueError`` (nothing written) for a bad id, an id
    given twice in the batch, lengths that differ, or vectors that are not finite ``(n, dim)``."""
    n = len(ids)
    current = collection.current_space
    if space_id is not None and space_id != current:
        raise SpaceMismatchError(current, space_id, f"add vectors to collection {collection.path}",
                                 what="given vectors", hint="import vectors of the collection's current model")
    entry = collection.space(current)
    mods = [modality] * n if isinstance(modality, str) else list(modality)
    srcs = [{} for _ in range(n)] if sources is None else list(sources)
    metas = [{} for _ in range(n)] if metadata is None else list(metadata)
    for name, col in (("modality", mods), ("sources", srcs), ("metadata", metas)):
        if len(col) != n:
            raise ValueError(f"{where}: {len(col)} {name} rows for {n} ids")
    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[0] != n:
        raise ValueError(f"{where}: vectors must be ({n}, {entry.dim}), got {tuple(v.shape)}")
    if v.shape[1] != entry.dim:
        raise ValueError(f"{where}: vectors are {v.shape[1]}-d but the current model of collection "
                         f"{collection.path} ({entry.name}) embeds {entry.dim}-d")
    v = np.ascontiguousarray(v, np.float32)
    if not np.isfinite(v).all():
        row = int(np.flatnonzero(~np.isfinite(v).all(axis=1))[0])
        raise ValueError(f"{where}: row {row + 1} holds NaN or inf")
    for m in set(mods):
        if m not in MODALITIES:
            raise ValueError(f"{where}: modality must be one of {MODALITIES}, got {m!r}")
        if not entry.embeds(m):
            raise ValueError(f"{where}: the current model of collection {collection.path} ({entry.name}) embeds "
                             f"only {', '.join(entry.modalities)}: cannot add {m} items")
    seen: dict[str, int] = {}
    for row, i in enumerate(ids):
        problem = _id_problem(i)
        if problem:
            raise ValueError(f"{where}: row {row + 1}: {problem}")
        if seen.setdefault(i, row) != row:
            raise DuplicateIdError(f"{where}: id {i!r} is given twice (rows {seen[i] + 1} and {row + 1})")
    keys = [f"{i}#{r}" for i, r in zip(ids, vector_rev(v))]
    try:
        rows = [(i, m, k, _JSON.encode(dict(s)), _JSON.encode(dict(me)))
                for i, m, k, s, me in zip(ids, mods, keys, srcs, metas)]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: sources and metadata must be JSON objects of JSON values: {e}") from None
    report = VectorsReport()
    if not n:
        return report
    g = collection.gallery(current)
    pos: dict[str, int] = {}
    for m in dict.fromkeys(mods):  # vectors first (held keys are skipped), then the items: one commit
        if len(set(mods)) > 1:
            sel = [j for j in range(n) if mods[j] == m]
            mk, mv = [keys[j] for j in sel], v[sel]
        else:
            mk, mv = keys, v
        report.stored += g.add(m, mk, mv, None, space_id=current, skip_existing=True)
        pos.update(g.positions(m, mk))
    report.added = collection.commit_rows(rows, stored=(current, pos), skip_unchanged=True)
    report.unchanged = n - report.added
    return report
