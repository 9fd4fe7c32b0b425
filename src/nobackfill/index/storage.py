"""Where a collection keeps its state: the storage behind :class:`~nobackfill.index.collection.Collection`.

A collection needs, from its storage: one small manifest that is replaced atomically (the commit
point), write-once log chunks, one vector store per embedding space, small named documents (the
backfill's job, order and leases) and named locks. :class:`LocalStorage` keeps them in a
directory (files written atomically, ``flock`` locks, a crash-safe
:class:`~nobackfill.index.store.Gallery` per space); :mod:`nobackfill.index.milvus` keeps them in
Milvus. A collection is opened by a URI (:func:`parse_uri`): a local path, ``milvus-lite:PATH#NAME``
or ``milvus://HOST:PORT[/DB]#NAME``.

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
from typing import Any, Hashable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from .store import MANIFEST as GALLERY_MANIFEST
from .store import Gallery, SearchResult, VerifyReport, atomic_write_bytes

try:  # POSIX advisory locks
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["LocalStorage", "SpaceStore", "Storage", "open_storage", "parse_uri"]

MANIFEST_FILE = "collection.json"
_TMP = ".coll-tmp-"


@runtime_checkable
class SpaceStore(Protocol):
    """The vectors of one embedding space (a :class:`~nobackfill.index.store.Gallery` is one)."""

    space_id: str

    @property
    def dim(self) -> int: ...

    def ids(self, modality: str) -> list[str]: ...

    def count(self, modality: str) -> int: ...

    def __contains__(self, item: tuple[str, str]) -> bool: ...

    def add(self, modality: str, ids: Sequence[str], vectors: np.ndarray, metadata: Any = None, *,
            space_id: str, skip_existing: bool = False) -> int: ...

    def vectors(self, modality: str) -> np.ndarray: ...

    def search(self, modality: str, queries: np.ndarray, k: int = 10, *, space_id: str, bridge: Any = None,
               mask: np.ndarray | None = None) -> SearchResult: ...

    def refresh(self) -> bool: ...

    def verify(self) -> VerifyReport: ...


class Storage(abc.ABC):
    """What a collection stores and where (see the module doc)."""

    #: the URI or path this storage was opened from (messages name it)
    location: str

    def __str__(self) -> str:
        return self.location

    # manifest: the single commit point
    @abc.abstractmethod
    def read_manifest(self) -> bytes | None:
        """The manifest's bytes, or None if there is none yet."""

    @abc.abstractmethod
    def write_manifest(self, data: bytes) -> None:
        """Replace the manifest atomically (readers see the old or the new one)."""

    @abc.abstractmethod
    def manifest_token(self) -> Hashable:
        """Changes whenever the manifest was replaced (cheap: a stat, a version)."""

    # write-once log chunks
    @abc.abstractmethod
    def write_chunk(self, name: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def read_chunk(self, name: str) -> bytes:
        """A log chunk's bytes; ``OSError`` if it is missing."""

    @abc.abstractmethod
    def remove_unlisted_chunks(self, listed: set[str]) -> None:
        """Remove chunks the manifest does not list (what a killed commit left)."""

    # spaces
    @abc.abstractmethod
    def create_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str) -> SpaceStore:
        """Create (or resume) the vector store ``directory`` of a space."""

    @abc.abstractmethod
    def open_space(self, directory: str) -> SpaceStore: ...

    @abc.abstractmethod
    def has_space(self, directory: str) -> bool: ...

    @abc.abstractmethod
    def drop_space(self, directory: str) -> None:
        """Delete a space's vectors (retire)."""

    # small documents (the backfill job)
    @abc.abstractmethod
    def read_doc(self, name: str) -> bytes | None: ...

    @abc.abstractmethod
    def write_doc(self, name: str, data: bytes) -> None:
        """Replace document ``name`` atomically."""

    @abc.abstractmethod
    def delete_doc(self, name: str) -> None: ...

    @abc.abstractmethod
    def list_docs(self, prefix: str) -> list[str]: ...

    # locks
    @abc.abstractmethod
    def lock(self, name: str, blocking: bool = True) -> contextlib.AbstractContextManager[bool]:
        """An exclusive lock; yields False when not taken (``blocking=False`` and held)."""

    def lock_holder(self, name: str) -> str:
        """Who holds lock ``name`` (as recorded by :meth:`record_holder`)."""
        data = self.read_doc(f"locks/{name}.holder")
        try:
            info = json.loads(data or b"")
            return f"process {info['pid']} on {info.get('host', '?')} (since {info['since']})"
        except (ValueError, KeyError, TypeError):
            return "another process"

    def record_holder(self, name: str) -> None:
        import socket

        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with contextlib.suppress(OSError):
            self.write_doc(f"locks/{name}.holder", json.dumps(info).encode())

    # existence
    @abc.abstractmethod
    def stray_entries(self, own_space_dir: str) -> list[str]:
        """What a new collection here would clobber (empty: a new location, or what a killed
        create of the same collection left)."""

    def legacy_gallery(self) -> Gallery | None:
        """A plain single-space gallery stored here (local directories only), else None."""
        return None

    def exists(self) -> bool:
        return self.read_manifest() is not None or self.legacy_gallery() is not None

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
    """A collection in a directory (the layout of :mod:`nobackfill.index.collection`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.location = str(self.root)
        self._manifest_path = str(self.root / MANIFEST_FILE)  # stat()ed by every snapshot: no Path ops

    # manifest
    def read_manifest(self) -> bytes | None:
        try:
            return (self.root / MANIFEST_FILE).read_bytes()
        except FileNotFoundError:
            return None

    def write_manifest(self, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.root / MANIFEST_FILE, data, tmp_prefix=_TMP)

    def manifest_token(self) -> Hashable:
        try:
            st = os.stat(self._manifest_path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    # log chunks
    def write_chunk(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, tmp_prefix=_TMP)

    def read_chunk(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def remove_unlisted_chunks(self, listed: set[str]) -> None:
        dirs = {str(Path(n).parent) for n in listed} | {"log"}
        doomed = [p for p in self.root.glob(f"{_TMP}*")]
        for d in dirs:
            folder = self.root / d
            if folder.is_dir():
                doomed += [p for p in folder.iterdir() if p.name.startswith(_TMP) or
                           (p.suffix == ".jsonl" and f"{d}/{p.name}" not in listed)]
        for p in doomed:
            with contextlib.suppress(OSError):
                p.unlink()

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

    # documents
    def read_doc(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def write_doc(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, tmp_prefix=_TMP)

    def delete_doc(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / name).unlink()

    def list_docs(self, prefix: str) -> list[str]:
        base = self.root / prefix
        folder = base if base.is_dir() else base.parent
        if not folder.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in folder.iterdir()
                      if p.is_file() and str(p.relative_to(self.root)).startswith(prefix) and not p.name.startswith("."))

    # locks
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
        if (self.root / GALLERY_MANIFEST).is_file() and not (self.root / MANIFEST_FILE).is_file():
            return Gallery.open(self.root)
        return None

    def exists(self) -> bool:
        return (self.root / MANIFEST_FILE).is_file() or (self.root / GALLERY_MANIFEST).is_file()


# --------------------------------------------------------------------------- URIs


def parse_uri(uri: str | Path) -> tuple[str, dict[str, str]]:
    """``("local", {"path"})``, ``("milvus-lite", {"path", "name"})`` or ``("milvus", {"uri", "db",
    "name"})``. A collection in Milvus is named by the URI's fragment (``#photos``; default
    ``default``): ``milvus-lite:/data/m.db#photos``, ``milvus://127.0.0.1:19530/db1#photos``."""
    s = str(uri)
    if s.startswith("milvus-lite:"):
        rest = s[len("milvus-lite:"):]
        path, _, name = rest.partition("#")
        if not path:
            raise ValueError(f"{s}: a milvus-lite URI needs a path (milvus-lite:PATH#NAME)")
        return "milvus-lite", {"path": path, "name": name or "default"}
    if s.startswith("milvus://"):
        rest = s[len("milvus://"):]
        rest, _, name = rest.partition("#")
        hostport, _, db = rest.partition("/")
        if not hostport:
            raise ValueError(f"{s}: a milvus URI needs a host and port (milvus://HOST:PORT[/DB]#NAME)")
        return "milvus", {"uri": f"http://{hostport}", "db": db or "default", "name": name or "default"}
    if "://" in s:
        raise ValueError(f"{s}: unknown storage URI scheme (use a local path, milvus-lite:PATH#NAME or "
                         "milvus://HOST:PORT[/DB]#NAME)")
    return "local", {"path": s}


def open_storage(uri: str | Path) -> Storage:
    """The storage a URI names (:func:`parse_uri`)."""
    kind, parts = parse_uri(uri)
    if kind == "local":
        return LocalStorage(parts["path"])
    from .milvus import MilvusStorage

    return MilvusStorage.from_uri(str(uri), kind, parts)
