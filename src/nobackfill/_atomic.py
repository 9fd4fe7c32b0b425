"""Atomic file writes, the one way nobackfill writes a file that a reader or a crash may meet half
done: the data goes to a temporary file beside the target, is fsynced, renamed over the target
(``os.replace``) and the directory fsynced, so readers see the old file or the whole new one, and a
failed or killed write leaves the target as it was (the temporary file is removed on failure).

The gallery, the catalog and the chunk files pass ``crash_points=True``: the test-only kill points
between those steps (:func:`_crash_point`) count their renames; every other writer (reports, model
caches, safetensors, training checkpoints) leaves the count alone. Cheap to import (stdlib only)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Sequence

__all__ = ["atomic_write_bytes", "atomic_write_stream", "atomic_write_text", "file_above", "fsync_dir",
           "write_atomically"]

#: the prefix of the temporary files of the gallery's writes (a gallery sweeps stray ones)
TMP_PREFIX = ".tmp-"


def fsync_dir(path: str | Path) -> None:
    """fsync the directory ``path`` (a rename in it is then durable); a no-op where directories
    cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_atomically(path: str | Path, fill: Callable[[IO[bytes]], Any], *, tmp_prefix: str = TMP_PREFIX,
                     crash_points: bool = False) -> bool:
    """``fill(file)`` writes into a temporary binary file beside ``path`` (named
    ``<tmp_prefix><name>.<random>``), which is fsynced and renamed to ``path``; when ``fill``
    returns False nothing is written. Returns whether ``path`` was written. The file's mode follows
    the umask (as :func:`open`)."""
    path = Path(path)
    tmp = path.with_name(f"{tmp_prefix}{path.name}.{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as f:
            written = fill(f) is not False
            if written:
                f.flush()
                os.fsync(f.fileno())
        if not written:
            tmp.unlink()
            return False
        publish(tmp, path, crash_points=crash_points)
        return True
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        interrupt = _interrupt_within(e)
        if interrupt is not None and interrupt is not e:
            raise interrupt from None  # a writer's clean-up failed on the half-written file: the cause is the interrupt
        raise


def _interrupt_within(e: BaseException | None) -> KeyboardInterrupt | None:
    """The Ctrl-C / SIGTERM that ``e`` was raised during, if any (``torch.save``'s zip writer,
    interrupted, fails again on closing with "unexpected pos", which would hide it)."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return e
        e = e.__context__
    return None


def atomic_write_bytes(path: str | Path, data: "bytes | Sequence[bytes | memoryview]", *,
                       tmp_prefix: str = TMP_PREFIX, crash_points: bool = True) -> None:
    """Write ``data`` (bytes, or consecutive buffers) to ``path`` atomically (module doc)."""
    write_atomically(path, lambda f: f.write(data) if isinstance(data, bytes) else f.writelines(data),
                     tmp_prefix=tmp_prefix, crash_points=crash_points)


def atomic_write_text(path: str | Path, text: str, *, tmp_prefix: str = ".", encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (module doc); no test kill point."""
    atomic_write_bytes(path, text.encode(encoding), tmp_prefix=tmp_prefix, crash_points=False)


def atomic_write_stream(path: str | Path, fill: Callable[[Callable[[bytes], Any]], bool]) -> str | None:
    """As :func:`atomic_write_bytes`, the data given piece by piece: ``fill(write)`` calls
    ``write(piece)`` for each (nothing holds the whole file in memory) and returns whether it wrote
    anything (False: no file is written). Returns the SHA-256 of what was written, or None."""
    h = hashlib.sha256()

    def fill_file(f: IO[bytes]) -> bool:
        def write(piece: bytes) -> None:
            h.update(piece)
            f.write(piece)

        return fill(write)

    return h.hexdigest() if write_atomically(path, fill_file, crash_points=True) else None


def publish(written: Path, path: Path, *, crash_points: bool = True) -> None:
    """Rename the fsynced file ``written`` to ``path`` and fsync its directory (the commit step),
    between the test-only crash points when ``crash_points``."""
    if crash_points:
        _crash_point("before")
    os.replace(written, path)
    fsync_dir(path.parent)
    if crash_points:
        _crash_point("after")


_WRITES = 0


def _crash_point(when: str) -> None:
    """Test-only crash injection (not an API): with ``NOBACKFILL_TEST_KILL_AT_WRITE=N`` the process
    SIGKILLs itself just before the N-th atomic rename of its life, with ``N+`` just after it, so
    tests can stop a writer between any two steps of a commit."""
    global _WRITES
    spec = os.environ.get("NOBACKFILL_TEST_KILL_AT_WRITE")
    if not spec:
        return
    if when == "before":
        _WRITES += 1
    after = spec.endswith("+")
    if int(spec.rstrip("+")) == _WRITES and after == (when == "after"):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def file_above(path: str | os.PathLike) -> Path | None:
    """The file that stands where a folder above ``path`` must be (the first existing path above it,
    when that is no folder): an output under it can never be made, and a command says so before its
    work (trial AA: ``index --out model.safetensors/g`` read all its data first)."""
    above = Path(path).parent
    while not above.exists() and above != above.parent:
        above = above.parent
    return above if above.exists() and not above.is_dir() else None
