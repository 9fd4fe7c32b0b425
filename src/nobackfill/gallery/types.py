"""What a gallery raises and returns: its errors (:class:`SpaceMismatchError` and the
:class:`GalleryError` family), the :class:`Bridge` protocol, :class:`SearchResult` and the reports
of :meth:`~nobackfill.gallery.gallery.Gallery.verify` and :meth:`~nobackfill.gallery.gallery.Gallery.repair`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Bridge",
    "CorruptGalleryError",
    "DuplicateIdError",
    "GalleryError",
    "NotAGalleryError",
    "RepairReport",
    "SearchResult",
    "SpaceMismatchError",
    "VerifyReport",
]


class GalleryError(Exception):
    """Base class for gallery problems."""


class NotAGalleryError(GalleryError, FileNotFoundError):
    """The directory holds no gallery."""


class CorruptGalleryError(GalleryError):
    """The manifest or a committed chunk is unreadable or inconsistent."""


class SpaceMismatchError(ValueError):
    """Vectors or queries from one embedding space were used against a gallery of another."""

    def __init__(self, gallery_space: str, other_space: str, action: str, *, what: str, hint: str = "",
                 expected: str = "gallery", expected_name: str = "", other_name: str = "") -> None:
        self.gallery_space, self.other_space = gallery_space, other_space
        named = lambda sid, name: f"{sid} ({name})" if name else sid  # noqa: E731
        msg = (f"cannot {action}: the {expected} is in embedding space {named(gallery_space, expected_name)} "
               f"but the {what} are in space {named(other_space, other_name)}")
        super().__init__(msg + (f"; {hint}" if hint else ""))


class DuplicateIdError(ValueError):
    """An id occurs twice in a batch, or is already in the gallery."""


def other_modality_error(item_id: str, held: str, given: str, more: int = 0, where: str = "") -> DuplicateIdError:
    """The refusal of an item whose id holds a stored item of the other modality (``held``, where
    ``given`` came): an image's id never silently becomes a caption's, by ``add`` or ``import``;
    ``more``: how many other ids of the batch do the same; ``where``: the batch and row, said first."""
    return DuplicateIdError(f"{where + ': ' if where else ''}id {item_id!r} already holds a stored {held} item, not "
                            f"{'an image' if given == 'image' else 'a text'} one"
                            f"{f' (and {more} more ids)' if more else ''}: delete it first to replace it, or give "
                            "the new item another id")


@runtime_checkable
class Bridge(Protocol):
    """Maps queries from space ``source`` into space ``target`` (e.g. a new model onto an old gallery)."""

    source: str
    target: str

    def __call__(self, queries: np.ndarray) -> np.ndarray: ...


class SearchResult:
    """Top-k hits per query; rows are sorted by descending score. ``scores``: float32 (Q, k);
    ``positions``: int64 (Q, k), rows of ``Gallery.vectors(modality)``; ``ids``: the row keys, given
    or looked up from ``names`` (the store's keys by row) the first time they are asked for."""

    def __init__(self, scores: np.ndarray, ids: list[list[str]] | None = None, positions: np.ndarray | None = None,
                 *, names: Any = None) -> None:
        self.scores = scores
        self.positions = positions if positions is not None else np.zeros(scores.shape, np.int64)
        self._ids = ids
        self._names = names

    @property
    def ids(self) -> list[list[str]]:
        if self._ids is None:
            names = self._names() if callable(self._names) else self._names
            self._ids = [[names[p] for p in row if p >= 0] for row in self.positions.tolist()]
        return self._ids

    def __repr__(self) -> str:
        return f"SearchResult(scores={self.scores!r}, positions={self.positions!r})"


@dataclass
class VerifyReport:
    """Outcome of :meth:`Gallery.verify`; ``orphans`` are uncommitted files (harmless)."""

    problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    checked_chunks: int = 0
    #: ``modality:chunk`` of every committed chunk that fails its checks (``repair`` drops them)
    damaged_chunks: list[str] = field(default_factory=list)
    #: problems of derived files (cached indexes): never served, rebuilt by ``repair``
    derived: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class RepairReport:
    """Outcome of :meth:`Gallery.repair`: derived files rebuilt, damaged chunks dropped and the ids
    they held (to be added again)."""

    rebuilt: list[str] = field(default_factory=list)
    lost_chunks: list[str] = field(default_factory=list)
    lost_ids: dict[str, list[str]] = field(default_factory=lambda: {"image": [], "text": []})
    lost_counts: dict[str, int] = field(default_factory=lambda: {"image": 0, "text": 0})
