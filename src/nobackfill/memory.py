"""This process's memory (resident set), as the benchmarks measure it: the current RSS, the peak
(``VmHWM``: unlike ``ru_maxrss``, not inherited from the parent across fork + exec) and a reset of
the peak to the current RSS, so that the rise of one call can be measured. Linux ``/proc`` first;
elsewhere ``ru_maxrss`` (the peak only). And :func:`cyclic_gc_paused`, for bulk work that makes
millions of short-lived objects."""

from __future__ import annotations

import contextlib
import gc
import resource
import sys
from pathlib import Path
from typing import Iterator

_STATUS = Path("/proc/self/status")


def _status_mb(field: str) -> float | None:
    """A ``kB`` field of ``/proc/self/status`` in MB (None where there is no such file or field)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """The resident set now (MB; 0.0 where it cannot be read)."""
    return _status_mb("VmRSS") or 0.0


def peak_rss_mb() -> float:
    """The peak resident set of this process (MB): ``VmHWM``, else ``ru_maxrss``."""
    peak = _status_mb("VmHWM")
    if peak is not None:
        return peak
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024  # bytes on macOS, kB on Linux


def reset_peak_rss() -> None:
    """Reset the peak (``VmHWM``) to the current RSS (Linux: ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


__all__ = ["cyclic_gc_paused", "peak_rss_mb", "reset_peak_rss", "rss_mb"]


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, when it was on (back on after it, also
    on an error). A bulk import makes millions of short-lived lists, tuples and dicts that hold no
    cycle (reference counting frees them at once); each 700 of them start a collection that walks
    the young objects, and some walk every object kept: about a tenth of a 1M-row import's time.
    The switch is process-wide: cycles made meanwhile by other threads wait for the block's end."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
