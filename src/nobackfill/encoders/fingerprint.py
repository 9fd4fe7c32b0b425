"""Stable fingerprints ("space ids") of models: a hash of the config and of every weight tensor.

Two models with any different weight or config value get different ids; saving and reloading keeps
the id (the hash reads canonical tensor bytes, not file bytes).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import torch

_VOLATILE_KEYS = {"transformers_version", "_name_or_path", "_commit_hash", "torch_dtype", "dtype",
                  "architectures", "_attn_implementation_autoset", "output_hidden_states",
                  "output_attentions", "return_dict", "use_return_dict"}


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in sorted(obj.items()) if k not in _VOLATILE_KEYS}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def fingerprint(kind: str, config: Mapping[str, Any], state: Mapping[str, torch.Tensor],
                extra: Mapping[str, Any] | None = None, length: int = 20) -> str:
    """``"<kind>-<hex>"`` over the cleaned config, ``extra`` (e.g. the vocabulary) and all tensors."""
    h = hashlib.sha256()
    h.update(kind.encode())
    h.update(json.dumps(_clean(dict(config)), sort_keys=True, default=str).encode())
    if extra:
        h.update(json.dumps(_clean(dict(extra)), sort_keys=True, default=str).encode())
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return f"{kind}-{h.hexdigest()[:length]}"
