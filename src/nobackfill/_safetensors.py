"""Tensors written as safetensors with the file mode of every other file we write.

``safetensors``' ``save_file`` creates its file with mode 0600, whatever the umask: a model directory
then held one file (``lingual.safetensors``, a bridge's or an adapter's weights) that a service
running as another user could not read, beside 0644 files (trial R). :func:`save_tensors` serialises
in memory and writes the bytes through :func:`open`, which honours the umask. Cheap to import."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Mapping

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
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
