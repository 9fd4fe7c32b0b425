"""A training run's state on disk, without pickle: ``checkpoint.safetensors``.

The loop's checkpoint holds the method's and the optimiser's state, the random generators' states,
the log so far and the settings: tensors and JSON values nested in dicts, lists and tuples. It is
written as one safetensors file: every tensor under a numbered key, and the structure around them
as JSON in the file's metadata (a tensor's place marked ``{"__tensor__": key}``; a tuple, a numpy
array and a dict whose keys are not all plain strings marked likewise), with a sha256 of the tensors
and the structure that a read checks (a damaged byte is refused, not resumed). Reading it runs no code, so
a checkpoint from elsewhere is as safe to resume as a model's weights (the earlier ``checkpoint.pt``
was a pickle that ``torch.load(weights_only=False)`` would have run). :func:`data_digest` names what a
run trains on, in its settings, so that a resume on other data is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._safetensors import save_tensors

__all__ = ["CHECKPOINT_FILE", "LEGACY_CHECKPOINT_FILE", "NotRunState", "data_digest", "data_settings", "load_state",
           "save_state"]

#: the file a run's checkpoint is kept in, in its output folder
CHECKPOINT_FILE = "checkpoint.safetensors"
#: the pickled checkpoint of earlier versions: recognised, never read
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"
_META_KEY = "nobackfill.state"
_SUM_KEY = "nobackfill.sha256"
_MARKS = ("__tensor__", "__tuple__", "__ndarray__", "__items__")


class NotRunState(ValueError):
    """A readable safetensors file that holds no run state (a model's weights, say)."""


def save_state(state: Any, path: str | Path) -> None:
    """Write ``state`` (tensors, numpy arrays and JSON values in dicts, lists and tuples) to ``path``
    atomically (a temporary file beside it, renamed). ``TypeError`` names a value of another kind."""
    tensors: dict[str, torch.Tensor] = {}
    tree = json.dumps(_pack(state, tensors, set()))
    meta = {_META_KEY: tree, _SUM_KEY: _checksum(tensors, tree)}
    save_tensors(tensors, path, metadata=meta)  # (of the umask's mode: safetensors' own file is 0600)


def load_state(path: str | Path) -> Any:
    """What :func:`save_state` wrote to ``path`` (tensors on the CPU). :class:`NotRunState` when the
    file is a safetensors file that holds no run state."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = (f.metadata() or {}).get(_META_KEY)
        if meta is None:
            raise NotRunState("a safetensors file without a training run's state")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        kept = (f.metadata() or {}).get(_SUM_KEY)
    if kept is not None and kept != _checksum(tensors, meta):  # (trial AB: a flipped bit resumed, nan loss)
        raise ValueError("its tensors or run state do not match the checksum written with them")
    return _unpack(json.loads(meta), tensors)


def _checksum(tensors: dict[str, torch.Tensor], tree: str) -> str:
    """sha256 of the run state's JSON and every tensor's name, dtype, shape and bytes, in key order."""
    h = hashlib.sha256(tree.encode())
    for k in sorted(tensors):
        t = tensors[k]
        h.update(f"{k}:{t.dtype}:{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def data_digest(*parts: Any) -> str:
    """A short sha256 of what a run trains on (strings, numbers, arrays, paths, nested in lists): kept
    in a run's settings (``"data contents"``) so that a resume on other data is refused, as one of
    other settings is (trial AB: a rerun on another folder trained on both and recorded one)."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, (list, tuple)):
            h.update(f"[{len(x)}".encode())
            for v in x:
                feed(v)
        else:
            h.update(f"{type(x).__name__}:{x}\x00".encode())

    for part in parts:
        feed(part)
    return h.hexdigest()[:16]


def data_settings(path: str | Path | None, *parts: Any) -> dict[str, Any]:
    """A run's settings of what it trains on: where it was read (``data``, resolved: free to change on a
    resume, named when the contents differ) and :func:`data_digest` of ``parts`` (``data contents``)."""
    return {"data": str(Path(path).resolve()) if path else None, "data contents": data_digest(*parts)}


def _pack(obj: Any, tensors: dict[str, torch.Tensor], storages: set[int]) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        where = t.untyped_storage().data_ptr() if t.numel() else None
        if not t.is_contiguous() or where in storages:  # safetensors keeps neither views nor shared storage
            t = t.contiguous().clone()
            where = t.untyped_storage().data_ptr() if t.numel() else None
        if where is not None:
            storages.add(where)
        key = str(len(tensors))
        tensors[key] = t
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _MARKS for k in obj):
            return {k: _pack(v, tensors, storages) for k, v in obj.items()}
        return {"__items__": [[_pack(k, tensors, storages), _pack(v, tensors, storages)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_pack(v, tensors, storages) for v in obj]}
    if isinstance(obj, list):
        return [_pack(v, tensors, storages) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"a checkpoint holds tensors, arrays and JSON values, not {type(obj).__name__} ({obj!r:.80})")


def _unpack(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, list):
        return [_unpack(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        return tensors[tree["__tensor__"]]
    if "__ndarray__" in tree:
        return np.asarray(tree["__ndarray__"], dtype=tree["dtype"])
    if "__tuple__" in tree:
        return tuple(_unpack(v, tensors) for v in tree["__tuple__"])
    if "__items__" in tree:
        return {_unpack(k, tensors): _unpack(v, tensors) for k, v in tree["__items__"]}
    return {k: _unpack(v, tensors) for k, v in tree.items()}
