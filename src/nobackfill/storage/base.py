"""Where a collection lives: the storage behind :class:`~nobackfill.collection.collection.Collection`.

A collection needs, from its storage: a catalog (:mod:`nobackfill.catalog.catalog`: the items, the
plan, the backfill's documents and named locks, in SQLite or PostgreSQL) and one vector store per
embedding space. :class:`LocalStorage` keeps them in a directory (``catalog.sqlite``, a crash-safe
:class:`~nobackfill.gallery.gallery.Gallery` per space); :mod:`nobackfill.milvus` keeps the vectors
in Milvus. A collection is opened by a URI (:func:`~nobackfill.collection.uri.parse_uri`): a local path,
``milvus-lite:PATH#NAME`` or ``milvus://HOST:PORT[/DB]#NAME``; any of them may name a PostgreSQL
catalog with ``?catalog=postgresql://USER@HOST:PORT/DB`` (a collection shared by several machines;
a Milvus server needs one).

A space's vector store (:class:`SpaceStore`) holds rows keyed by an item version's key, per
modality, in insertion order; a search takes a mask over that order (the rows this space serves
in the reader's snapshot).
"""

from __future__ import annotations

import abc
import contextlib
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..gallery.gallery import Gallery
from ..gallery.types import SearchResult, VerifyReport

if TYPE_CHECKING:
    from ..catalog.catalog import Catalog

__all__ = ["MANIFEST_FILE", "SpaceStore", "Storage"]

MANIFEST_FILE = "collection.json"


@runtime_checkable
class SpaceStore(Protocol):
    """The vectors of one embedding space (a :class:`~nobackfill.gallery.gallery.Gallery` is one)."""

    space_id: str

    @property
    def dim(self) -> int: ...

    def ids(self, modality: str) -> list[str]: ...

    def positions(self, modality: str, keys: Sequence[str]) -> dict[str, int]:
        """Row of each of ``keys`` that the store holds (absent keys are left out)."""
        ...

    def count(self, modality: str) -> int: ...

    def __contains__(self, item: tuple[str, str]) -> bool: ...

    def add(self, modality: str, ids: Sequence[str], vectors: np.ndarray, metadata: Any = None, *,
            space_id: str, skip_existing: bool = False) -> int: ...

    def vectors(self, modality: str) -> np.ndarray: ...

    def search(self, modality: str, queries: np.ndarray, k: int = 10, *, space_id: str,
               mask: np.ndarray | None = None) -> SearchResult: ...

    def refresh(self) -> bool: ...

    def verify(self) -> VerifyReport: ...


class Storage(abc.ABC):
    """Where a collection lives: its catalog (:mod:`nobackfill.catalog.catalog`) and one vector store
    per space (see the module doc)."""

    #: the URI or path this storage was opened from (messages name it)
    location: str
    #: why only one process at a time may open this storage's vectors (None: any number may): a
    #: backfill then runs its workers in that process only
    one_process: str | None = None

    def __str__(self) -> str:
        return self.location

    # the catalog
    @abc.abstractmethod
    def catalog(self) -> "Catalog | None":
        """The collection's catalog, or None if there is none yet."""

    @abc.abstractmethod
    def create_catalog(self, header: dict[str, Any], fill: Any = None) -> "Catalog":
        """Create the catalog (``fill(writer)`` adds rows in the same transaction); atomic."""

    def migration_lock(self) -> contextlib.AbstractContextManager[bool]:
        """Held while a collection of the previous format is converted."""
        return contextlib.nullcontext(True)

    # spaces
    @abc.abstractmethod
    def create_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str) -> SpaceStore:
        """Create (or resume) the vector store ``directory`` of a space."""

    def adopt_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str,
                    external: Mapping[str, Any]) -> SpaceStore:
        """Register a vector collection the user already has (``external``: where it is and which
        fields hold the vectors, ids and sources) as the read-only store ``directory`` of a space:
        nothing is copied, written to it or dropped from it (``drop_space`` forgets it)."""
        raise ValueError(f"{self} cannot adopt a vector store in place (only Milvus storage can: a collection "
                         "URI milvus://HOST:PORT#NAME?catalog=...)")

    @abc.abstractmethod
    def open_space(self, directory: str) -> SpaceStore: ...

    @abc.abstractmethod
    def has_space(self, directory: str) -> bool: ...

    @abc.abstractmethod
    def drop_space(self, directory: str) -> None:
        """Delete a space's vectors (retire)."""

    # the previous format (read once, when converting; see :mod:`nobackfill.collection.migrate`)
    def read_manifest(self) -> bytes | None:
        """``collection.json`` of format 1, or None."""
        return None

    def read_chunk(self, name: str) -> bytes:
        """A format-1 log chunk; ``OSError`` if it is missing."""
        raise FileNotFoundError(name)

    def read_doc(self, name: str) -> bytes | None:
        """A format-1 document (the backfill's job), or None."""
        return None

    def list_docs(self, prefix: str) -> list[str]:
        return []

    def retire_v1(self) -> None:
        """After a conversion: set the format-1 files aside (kept, never read again)."""

    # existence
    @abc.abstractmethod
    def stray_entries(self, own_space_dir: str) -> list[str]:
        """What a new collection here would clobber (empty: a new location, or what a killed
        create of the same collection left)."""

    def legacy_gallery(self) -> Gallery | None:
        """A plain single-space gallery stored here (local directories only), else None."""
        return None

    def exists(self) -> bool:
        return self.catalog() is not None or self.read_manifest() is not None or self.legacy_gallery() is not None

    def why_not_a_collection(self) -> str | None:
        """Why this location cannot hold a collection as given (None: it can), e.g. a Milvus server
        URI that names no catalog."""
        return None

    def check_creatable(self) -> None:
        """Refuse (``ValueError``) a location a collection cannot be created at, before anything is
        written there."""

    def backfill_workers(self, workers: int, engine: str, log: Callable[[str], None] | None = None) -> int:
        """The worker processes a backfill that asked for ``workers`` runs on this storage: all of
        them, unless one process only may open it (:attr:`one_process`): then one, in the process
        that holds it (``log`` says why), and the ray engine (``engine``), whose actors open it in
        processes of their own, is refused (a ``ValueError`` of field ``engine``)."""
        if not self.one_process:
            return workers
        if engine == "ray":
            refused = ValueError(f"the ray engine opens {self.location} in processes of its own, and "
                                 f"{self.one_process}")
            refused.field = "engine"  # type: ignore[attr-defined]  # (as the HTTP API names it)
            raise refused
        if workers > 1 and log is not None:
            log(f"running 1 worker, not {workers}: {self.one_process}")
        return 1

    def close(self) -> None:
        """Release connections (no-op for files)."""
