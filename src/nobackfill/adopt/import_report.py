"""What an import did (:func:`~.importing.import_source`'s report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ImportReport"]


@dataclass
class ImportReport:
    """What :func:`~.importing.import_source` did."""

    source: str
    collection: str
    created: bool
    items: int = 0  # items read from the source
    added: int = 0
    unchanged: int = 0
    stored: int = 0
    replaced: int = 0  # of the added: ids the collection held with other content (a new vector)
    seconds: float = 0.0
    model_check: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: the peak resident memory (MB) of the process that committed the catalog's rows, when one did
    commit_worker_peak_rss_mb: float = 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "collection": self.collection, "created": self.created, "items": self.items,
                "added": self.added, "unchanged": self.unchanged, "stored": self.stored, "replaced": self.replaced,
                "seconds": round(self.seconds, 3), "items_per_s": round(self.items_per_s, 1),
                "model_check": self.model_check, "warnings": list(self.warnings)}
