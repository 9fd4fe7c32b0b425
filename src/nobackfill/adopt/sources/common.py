"""What every reader of :mod:`nobackfill.adopt.sources` shares: :class:`SourceError`,
:class:`ImportBatch` and the limits and column names the readers use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

#: a vector whose norm differs from 1 by more than this is counted as "normalised"
NORM_TOLERANCE = 1e-3
#: the faiss index types whose vectors are reconstructed exactly (also inside an IndexIDMap(2))
FAISS_EXACT = ("IndexFlat", "IndexFlatIP", "IndexFlatL2", "IndexHNSWFlat", "IndexIVFFlat")
_SCAN_ROWS = 65536
_MODALITIES = ("image", "text")
_IMAGE_SOURCE_COLUMNS = ("image_path", "path", "image", "filepath", "file", "url")
_TEXT_SOURCE_COLUMNS = ("caption", "text")


class SourceError(ValueError):
    """A source that cannot be imported as it is; the message names the file and the row."""

    def __init__(self, message: str, path: str | Path | None = None, row: int | None = None, *,
                 where: str | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.row = row
        loc = where if where is not None else ("" if row is None else f"row {row}")
        head = " ".join(x for x in (str(path) if path is not None else "", loc) if x)
        super().__init__(f"{head}: {message}" if head else message)


class SourceNotFound(SourceError, FileNotFoundError):
    """A source's file or folder that is not there (a client's ``NotFound``, 404, as any missing file)."""


@dataclass
class ImportBatch:
    """Consecutive items of a source (rows ``row0`` .. ``row_end - 1``; a row whose derived id
    repeats an earlier one is left out, so ``len(ids)`` may be less than ``row_end - row0``)."""

    row0: int
    ids: list[str]
    modality: list[str]
    #: per item (a :class:`~nobackfill.catalog.items.JsonRows` where the reader wrote their JSON already)
    sources: Sequence[dict]
    metadata: Sequence[dict]
    #: float32 ``(n, dim)``, unit rows
    vectors: np.ndarray
    #: each item's row (0-based, in the source's item order)
    rows: list[int] = field(default_factory=list)
    #: the row after the last one this batch covers: resume with ``batches(start_row=row_end)``
    row_end: int = 0

    def __len__(self) -> int:
        return len(self.ids)
