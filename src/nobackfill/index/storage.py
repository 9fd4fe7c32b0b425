"""Where a collection lives: the storage behind :class:`~nobackfill.index.collection.Collection`.

A collection needs, from its storage: a catalog (:mod:`nobackfill.index.catalog`: the items, the
plan, the backfill's documents and named locks, in SQLite or PostgreSQL) and one vector store per
embedding space. :class:`LocalStorage` keeps them in a directory (``catalog.sqlite``, a crash-safe
:class:`~nobackfill.index.gallery.Gallery` per space); :mod:`nobackfill.index.milvus` keeps the vectors
in Milvus. A collection is opened by a URI (:func:`parse_uri`): a local path,
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
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from .gallery_manifest import MANIFEST as GALLERY_MANIFEST
from .gallery import Gallery
from .gallery_types import SearchResult, VerifyReport

if TYPE_CHECKING:
    from .catalog import Catalog

try:  # POSIX advisory locks
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["LocalStorage", "SpaceStore", "Storage", "open_storage", "parse_uri"]

MANIFEST_FILE = "collection.json"


@runtime_checkable
class SpaceStore(Protocol):
    """The vectors of one embedding space (a :class:`~nobackfill.index.gallery.Gallery` is one)."""

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
    """Where a collection lives: its catalog (:mod:`nobackfill.index.catalog`) and one vector store
    per space (see the module doc)."""

    #: the URI or path this storage was opened from (messages name it)
    location: str

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

    # the previous format (read once, when converting; see :mod:`nobackfill.index.migrate`)
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

    def close(self) -> None:
        """Release connections (no-op for files)."""


# --------------------------------------------------------------------------- local files


@contextlib.contextmanager
def flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """Exclusive advisory lock on ``path``; yields False if it was not taken (non-blocking)."""
    if fcntl is None:  # pragma: no cover
        yield True
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            taken = True
        except BlockingIOError:
            taken = False
        yield taken
    finally:
        os.close(fd)


class LocalStorage(Storage):
    """A collection in a directory: ``catalog.sqlite`` and ``spaces/<space>/`` galleries."""

    def __init__(self, root: str | Path, catalog_uri: str | None = None) -> None:
        self.root = Path(root)
        self.location = str(self.root)
        self._catalog_uri = catalog_uri  # a PostgreSQL catalog for a directory shared by several machines
        self._catalog: Catalog | None = None

    # catalog
    def _catalog_path(self) -> Path:
        from .catalog import CATALOG_FILE

        return self.root / CATALOG_FILE

    def catalog(self) -> "Catalog | None":
        if self._catalog is not None:
            return self._catalog
        from .catalog import open_catalog, sqlite_catalog

        if self._catalog_uri:
            cat = open_catalog(self._catalog_uri)
            if not cat.exists():
                return None
        elif self._catalog_path().is_file():
            cat = sqlite_catalog(self._catalog_path())
        else:
            return None
        self._catalog = cat
        return cat

    def create_catalog(self, header: dict[str, Any], fill: Any = None) -> "Catalog":
        from .catalog import create_sqlite, open_catalog

        self.root.mkdir(parents=True, exist_ok=True)
        if self._catalog_uri:
            cat = open_catalog(self._catalog_uri)
            cat.create(header, fill)
        else:
            cat = create_sqlite(self._catalog_path(), header, fill)
        self._catalog = cat
        return cat

    def migration_lock(self) -> contextlib.AbstractContextManager[bool]:
        return flock(self.root / ".migrate-lock") if self.root.is_dir() else contextlib.nullcontext(True)

    # the previous format
    def read_manifest(self) -> bytes | None:
        try:
            return (self.root / MANIFEST_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_chunk(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def read_doc(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def list_docs(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def retire_v1(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.root / MANIFEST_FILE, self.root / f"{MANIFEST_FILE}.v1")

    # spaces
    def create_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str) -> Gallery:
        return Gallery.create(self.root / directory, space_id=space_id, dim=int(dim), model=str(model), backend=backend)

    def open_space(self, directory: str) -> Gallery:
        return Gallery.open(self.root / directory)

    def has_space(self, directory: str) -> bool:
        return (self.root / directory / GALLERY_MANIFEST).is_file()

    def drop_space(self, directory: str) -> None:
        import shutil

        if directory in (".", ""):  # an old gallery that is the collection's root keeps its files
            return
        shutil.rmtree(self.root / directory, ignore_errors=True)

    # directory locks (a plain gallery's build; a collection's locks are its catalog's)
    def lock(self, name: str, blocking: bool = True) -> contextlib.AbstractContextManager[bool]:
        return flock(self.root / f".{name}-lock", blocking=blocking)

    def lock_holder(self, name: str) -> str:
        try:
            info = json.loads((self.root / f".{name}-lock.holder").read_text())
            return f"process {info['pid']} (started {info['since']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def record_holder(self, name: str) -> None:
        info = {"pid": os.getpid(), "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with contextlib.suppress(OSError):
            (self.root / f".{name}-lock.holder").write_text(json.dumps(info))

    # existence
    def stray_entries(self, own_space_dir: str) -> list[str]:
        if not self.root.exists():
            return []
        if not self.root.is_dir():
            return [self.root.name]
        top, sub = own_space_dir.split("/", 1) if "/" in own_space_dir else (own_space_dir, "")
        stray = [p.name for p in self.root.iterdir() if not p.name.startswith(".") and p.name != top]
        if (self.root / top).is_dir() and sub:
            stray += [f"{top}/{p.name}" for p in (self.root / top).iterdir() if p.name != sub]
        return stray

    def legacy_gallery(self) -> Gallery | None:
        if (self.root / GALLERY_MANIFEST).is_file():
            return Gallery.open(self.root)
        return None

    def exists(self) -> bool:
        return self.catalog() is not None or (self.root / MANIFEST_FILE).is_file() or \
            (self.root / GALLERY_MANIFEST).is_file()

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.close()


# --------------------------------------------------------------------------- URIs


def parse_uri(uri: str | Path) -> tuple[str, dict[str, str]]:
    """``("local", {"path"})``, ``("milvus-lite", {"path", "name"})`` or ``("milvus", {"uri", "db",
    "name"})``, each with ``"catalog"`` when the URI ends in ``?catalog=postgresql://...``. A
    collection in Milvus is named by the URI's fragment (``#photos``; default ``default``):
    ``milvus-lite:/data/m.db#photos``, ``milvus://127.0.0.1:19530/db1#photos?catalog=postgresql://
    nb@db-host:5432/nb``. A Milvus collection's PostgreSQL catalog is named by the same fragment
    (unless the catalog URL names its own): two collections may share one database."""
    s = str(uri)
    s, sep, catalog = s.partition("?catalog=")
    extra = {"catalog": catalog} if sep else {}
    if sep and not catalog.startswith(("postgresql://", "postgres://")):
        raise ValueError(f"{uri}: the catalog must be a postgresql:// URL, got {catalog!r}")
    if s.startswith("milvus-lite:"):
        rest = s[len("milvus-lite:"):]
        path, _, name = rest.partition("#")
        if not path:
            raise ValueError(f"{s}: a milvus-lite URI needs a path (milvus-lite:PATH#NAME)")
        return "milvus-lite", {"path": path, "name": name or "default", **_named(extra, name)}
    if s.startswith("milvus://"):
        rest = s[len("milvus://"):]
        rest, _, name = rest.partition("#")
        hostport, _, db = rest.partition("/")
        if not hostport:
            raise ValueError(f"{s}: a milvus URI needs a host and port (milvus://HOST:PORT[/DB]#NAME)")
        return "milvus", {"uri": f"http://{hostport}", "db": db or "default", "name": name or "default",
                          **_named(extra, name)}
    if "://" in s:
        raise ValueError(f"{s}: unknown storage URI scheme (use a local path, milvus-lite:PATH#NAME or "
                         "milvus://HOST:PORT[/DB]#NAME, optionally ?catalog=postgresql://...)")
    return "local", {"path": s, **extra}


def _named(extra: dict[str, str], name: str) -> dict[str, str]:
    """``extra``'s catalog URL named ``#name`` when it names no catalog itself."""
    if "catalog" in extra and "#" not in extra["catalog"]:
        return {**extra, "catalog": f"{extra['catalog']}#{name or 'default'}"}
    return extra


def open_storage(uri: str | Path) -> Storage:
    """The storage a URI names (:func:`parse_uri`)."""
    kind, parts = parse_uri(uri)
    if kind == "local":
        return LocalStorage(parts["path"], parts.get("catalog"))
    from .milvus import MilvusStorage

    return MilvusStorage.from_uri(str(uri), kind, parts)
