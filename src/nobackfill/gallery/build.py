"""Embed images and texts into a :class:`~nobackfill.gallery.gallery.Gallery`, resumably.

Each chunk of ``chunk_size`` items is embedded and committed on its own, so a run that dies is
resumed by calling :func:`build_gallery` again with the same inputs: committed ids are skipped.

``on_commit(n)`` is called after the n-th chunk of the run is committed (progress reporting, or a
test that kills the process there to check that nothing committed is lost or duplicated on resume).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from ..progress import progress_bar
from .atomic_files import flock, lock_holder, record_holder
from .gallery import Gallery
from .types import DuplicateIdError

if TYPE_CHECKING:  # importing the encoder module pulls in torch
    from ..encoders.base import DualEncoder

__all__ = ["build_gallery", "StoreBusyError"]


@dataclass
class _Job:
    """Items of one modality: ids, what the encoder takes, metadata rows."""

    modality: str
    ids: list[str]
    payloads: list[Any]
    metadata: list[dict[str, Any]]
    encode: Callable[[list[Any]], np.ndarray]


def _check_unique(modality: str, ids: list[str]) -> None:
    seen: set[str] = set()
    dups = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    if dups:
        raise DuplicateIdError(f"{modality} inputs repeat ids: {dups[:5]}")


def build_gallery(
    encoder: "DualEncoder",
    out: str | Path,
    *,
    images: Sequence[tuple[str, str | Path] | tuple[str, str | Path, dict[str, Any]]] = (),
    texts: Sequence[tuple[str, str, dict[str, Any]]] = (),
    model_ref: str,
    backend: str = "flat",
    chunk_size: int = 512,
    progress: bool = True,
    wait: bool = False,
    on_commit: Callable[[int], None] | None = None,
) -> Gallery:
    """Embed ``images`` (id, path[, metadata]) and ``texts`` (id, text, metadata) into the gallery at ``out``.

    Creates the gallery (space and dim from ``encoder``, ``model_ref`` recorded as its model) or
    resumes it: ids already committed are skipped. Image metadata is ``{"path": str(path), **metadata}``;
    text metadata is ``{"text": text, **metadata}``. Returns the open gallery.

    One build at a time per gallery: another process building into ``out`` makes this one raise
    :class:`StoreBusyError` naming it, or (``wait``) queue behind it. A model that cannot embed a
    modality given (a text-only model and images) is refused before anything is created.
    ``on_commit(n)``: called after the run's n-th chunk is committed.
    """
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    can = tuple(getattr(encoder, "modalities", ("image", "text")))
    for modality, given in (("image", images), ("text", texts)):
        if given and modality not in can:
            raise ValueError(f"{model_ref}: the model embeds only {', '.join(can)} (it has no {modality} tower): "
                             f"cannot index {len(given)} {modality}(s); nothing was written")
    space = encoder.space_id
    with _build_lock(Path(out), wait):
        gallery = Gallery.create(out, space_id=space, dim=encoder.embed_dim, model=model_ref, backend=backend)
        _embed_into(gallery, encoder, images, texts, chunk_size, progress, on_commit)
    return gallery


class StoreBusyError(RuntimeError):
    """Another process is adding to the same gallery."""


@contextlib.contextmanager
def _build_lock(root: Path, wait: bool) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with flock(root / ".ingest-lock", blocking=wait) as taken:  # the lock LocalStorage.lock("ingest") takes
        if not taken:
            raise StoreBusyError(f"{root} is busy: {lock_holder(root, 'ingest')} is adding to it; wait for it to "
                                 "finish, or queue behind it (--wait; wait=True in Python)")
        record_holder(root, "ingest")
        yield


def _embed_into(gallery: Gallery, encoder: "DualEncoder", images, texts, chunk_size: int, progress: bool,
                on_commit: Callable[[int], None] | None) -> None:
    space = gallery.space_id

    jobs = [
        _Job("image", [str(t[0]) for t in images], [Path(t[1]) for t in images],
             [{"path": str(t[1]), **(t[2] if len(t) > 2 else {})} for t in images],  # type: ignore[misc]
             lambda batch: encoder.encode_images(batch, progress=False)),
        _Job("text", [str(t[0]) for t in texts], [t[1] for t in texts],
             [{"text": t[1], **(t[2] or {})} for t in texts],
             lambda batch: encoder.encode_texts(batch, progress=False)),
    ]
    committed = 0
    for job in jobs:
        _check_unique(job.modality, job.ids)
        todo = [i for i, id_ in enumerate(job.ids) if (job.modality, id_) not in gallery]
        if not todo:
            continue
        with progress_bar(progress, f"embedding {job.modality}s", len(todo)) as advance:
            for start in range(0, len(todo), int(chunk_size)):
                rows = todo[start:start + int(chunk_size)]
                vectors = job.encode([job.payloads[i] for i in rows])
                gallery.add(job.modality, [job.ids[i] for i in rows], vectors,
                            [job.metadata[i] for i in rows], space_id=space)
                committed += 1
                advance(len(rows))
                if on_commit is not None:
                    on_commit(committed)
