"""Crash-safe files: atomic writes (:mod:`nobackfill._atomic`, with the test-only crash points
between their steps), files written ahead of their commit, tagged JSON manifests, sha256 of bytes and files, and the
advisory writer lock of a directory. Shared by the gallery, the catalog and every other on-disk
format of nobackfill."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from .._atomic import TMP_PREFIX, atomic_write_bytes, atomic_write_stream, publish as _publish
from .._atomic import fsync_dir as _fsync_dir

try:  # POSIX advisory locks; elsewhere a gallery is single-writer by convention
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["AheadFile", "atomic_write_bytes", "atomic_write_stream", "file_sha256", "flock", "lock_holder", "pid_alive", "read_tagged_json", "record_holder",
           "stale_ahead_files"]

LOCK = ".lock"
_TMP = TMP_PREFIX


#: the folder (beside a store's files) of files written ahead of their commit (:class:`AheadFile`)
AHEAD = ".ahead"


class AheadFile:
    """A file written ahead of its commit, in the folder :data:`AHEAD` under a name that holds its
    writer's process id (no sweep of stray ``.tmp-`` files takes it while that process lives), its
    write-back to disk started as it is written; :meth:`name` makes it durable under its path as
    :func:`atomic_write_bytes` would (fsync, rename, directory fsync), :meth:`close` drops it.
    A writer killed meanwhile leaves it behind: :func:`stale_ahead_files` finds those."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    @classmethod
    def write(cls, folder: str | Path, data: "bytes | Sequence[bytes | memoryview]") -> "AheadFile":
        """Write ``data`` (bytes, or consecutive buffers) to a new file in ``folder`` / :data:`AHEAD`."""
        ahead = Path(folder) / AHEAD
        ahead.mkdir(exist_ok=True)
        path = ahead / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        made = cls(path, fd)
        try:
            for part in [data] if isinstance(data, bytes) else data:
                view = memoryview(part).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            if hasattr(os, "posix_fadvise"):  # Linux starts writing the pages out: fsync finds less to do
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            made.close()
            raise
        return made

    def name(self, path: str | Path) -> None:
        """Make the file durable as ``path`` (on the same file system); closes it."""
        if self._fd is None:
            raise ValueError(f"{self.path} was closed")
        try:
            os.fsync(self._fd)
        except BaseException:
            self.close()
            raise
        fd, self._fd = self._fd, None
        os.close(fd)
        try:
            _publish(self.path, Path(path))
        except BaseException:
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise

    def close(self) -> None:
        """Drop the file (unless it was named)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def stale_ahead_files(folder: str | Path) -> list[Path]:
    """Files in ``folder`` / :data:`AHEAD` whose writer is gone (crash leftovers of :class:`AheadFile`)."""
    ahead = Path(folder) / AHEAD
    if not ahead.is_dir():
        return []
    out = []
    for p in ahead.iterdir():
        pid = p.name.split("-", 1)[0]
        if not (pid.isdigit() and pid_alive(int(pid))):
            out.append(p)
    return sorted(out)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (another user's live process counts)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def read_tagged_json(path: str | Path, fmt: str, *, error: type[Exception] = ValueError,
                     version_key: str = "version", max_version: int | None = None) -> dict[str, Any]:
    """Read a JSON file tagged ``{"format": fmt, version_key: n, ...}`` (gallery, token-store, memory,
    RECO and upgrade manifests). Raises ``error`` naming ``path`` for an unreadable file or JSON, a
    wrong format tag, or a version outside ``1..max_version`` (not checked when ``max_version`` is
    None). Callers check that the file exists first, with their own hint on how to make one."""
    path = Path(path)
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path}: unreadable ({e})") from e
    if not isinstance(m, dict) or m.get("format") != fmt:
        raise error(f"{path}: not a {fmt} file")
    if max_version is not None:
        version = m.get(version_key)
        if not isinstance(version, int) or not 1 <= version <= max_version:
            raise error(f"{path}: unsupported {version_key} {version!r} (this nobackfill reads <= {max_version})")
    return m


def _sha256(data: "bytes | Sequence[bytes | memoryview]") -> str:
    """The SHA-256 of ``data`` (bytes, or consecutive buffers)."""
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    h = hashlib.sha256()
    for part in data:
        h.update(part)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def _dir_lock(root: Path, blocking: bool = True) -> Iterator[bool]:
    """Exclusive advisory lock on ``root/.lock``; yields False if not taken (non-blocking/read-only)."""
    if fcntl is None:  # pragma: no cover
        yield True
        return
    try:
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if blocking:
            raise
        fd = -1
    try:
        taken = fd >= 0
        if taken:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                taken = False
        yield taken
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


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


def lock_holder(root: Path, name: str) -> str:
    """Who holds the directory lock ``name`` under ``root`` (as :func:`record_holder` wrote it)."""
    try:
        info = json.loads((root / f".{name}-lock.holder").read_text())
        return f"process {info['pid']} (started {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def record_holder(root: Path, name: str) -> None:
    """Record this process as the holder of the directory lock ``name`` under ``root``."""
    info = {"pid": os.getpid(), "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with contextlib.suppress(OSError):
        (root / f".{name}-lock.holder").write_text(json.dumps(info))
