"""What a :class:`~nobackfill.client.Client` returns, the same in process and over HTTP: small
dataclasses for results a caller reads field by field, and JSON-shaped dicts (the service's response
models) for the status of a collection and of its backfill."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import ClientError

__all__ = ["AddResult", "ClientError", "ImportResult", "ItemInfo", "SearchHit", "SearchResults", "UpgradeResult"]


class _Result:
    """``from_dict`` (unknown keys ignored: a newer server may say more) and ``to_dict``."""

    @classmethod
    def from_dict(cls, obj: dict[str, Any]):
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in obj.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass
class SearchHit(_Result):
    """One hit: the item, its score under the route that answered, the space that holds its vector."""

    rank: int
    score: float
    id: str
    space: str
    route: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchResults(_Result):
    """The hits of one query (``modality``: what was searched)."""

    query: str
    modality: str
    hits: list[SearchHit]

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "SearchResults":
        own = ("rank", "score", "id", "space", "route")
        hits = [SearchHit(**{k: h[k] for k in own}, metadata=dict(h["metadata"]) if isinstance(h.get("metadata"), dict)
                          else {k: v for k, v in h.items() if k not in own})  # (a server that flattened it only)
                for h in obj.get("hits", [])]
        return cls(query=obj["query"], modality=obj["modality"], hits=hits)

    def to_dict(self) -> dict[str, Any]:
        """The service's JSON form (:func:`~nobackfill.search.searcher.hit_json`: a hit's metadata whole
        under ``metadata``, its keys also beside the hit's own fields but for those of their names)."""
        from ..search.searcher import hit_json

        return {"query": self.query, "modality": self.modality,
                "hits": [hit_json(h.rank, h.score, h.id, h.space, h.route, h.metadata) for h in self.hits]}

    to_json = to_dict  # the name the command line's printer reads (as a searcher's response has it)


@dataclass
class ItemInfo(_Result):
    """One item: modality, metadata and the space whose vector serves it (None: no space does)."""

    id: str
    modality: str
    metadata: dict[str, Any]
    space: str | None


@dataclass
class AddResult(_Result):
    """What an add did: items embedded and committed (of them ``replaced``: new content under an id
    the collection held, an upsert), already there, metadata updated, recovered from an interrupted
    run, skipped (unreadable), and the ids of the items given."""

    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    metadata_updated: int = 0
    recovered: int = 0
    skipped: int = 0
    ids: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped_images: dict[str, str] = field(default_factory=dict)  # image (as given) -> why it was skipped
    uncaptioned: int = 0  # a folder's images that no caption mentions (added too)

    def __repr__(self) -> str:
        """Every field, its lists and dicts cut to their first few entries (an add of a folder holds
        thousands of ids: trial AK printed 400 KB)."""
        return f"AddResult({', '.join(f'{f.name}={_short(getattr(self, f.name))}' for f in fields(self))})"


def _short(value: Any, shown: int = 3) -> str:
    """``repr(value)``, a list or dict of more than ``shown`` + 1 entries cut after ``shown`` with the
    number left out."""
    if not isinstance(value, (list, dict)) or len(value) <= shown + 1:
        return repr(value)
    more = f"... ({len(value) - shown} more)"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in list(value.items())[:shown]) + f", {more}}}"
    return "[" + ", ".join(repr(v) for v in value[:shown]) + f", {more}]"


@dataclass
class ImportResult(_Result):
    """What an import did: items read, added, already there, seconds, the model check's verdict."""

    items: int = 0
    added: int = 0
    unchanged: int = 0
    seconds: float = 0.0
    model_check: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    source: str = ""
    stored: int | None = None  # vectors written; the rest of ``added`` had theirs stored already
    replaced: int = 0  # of ``added``: ids the collection held with another vector

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0


@dataclass
class UpgradeResult(_Result):
    """The plan after an upgrade: the current space, every space, the merge, the routes."""

    current: str
    spaces: list[str]
    merge: str | None
    routes: dict[str, Any] = field(default_factory=dict)
