"""Tensors written as safetensors with the file mode of every other file we write.

``safetensors``' ``save_file`` creates its file with mode 0600, whatever the umask: a model directory
then held one file (``lingual.safetensors``, a bridge's or an adapter's weights) that a service
running as another user could not read, beside 0644 files (trial R). :func:`save_tensors` serialises
in memory and writes the bytes through :func:`open`, which honours the umask. Cheap to import."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ._atomic import atomic_write_bytes

__all__ = ["save_tensors"]


def save_tensors(tensors: Mapping[str, Any], path: str | Path, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (torch tensors or numpy arrays, one kind) to ``path`` as safetensors,
    atomically (a temporary file beside it, renamed)."""
    first = next(iter(tensors.values()), None)
    if first is not None and type(first).__module__.startswith("torch"):
        from safetensors.torch import save
    else:
        from safetensors.numpy import save
    data = save(dict(tensors), metadata=dict(metadata) if metadata else None)
    atomic_write_bytes(path, data, tmp_prefix=".", crash_points=False)
