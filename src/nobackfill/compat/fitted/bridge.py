"""A fitted bridge as a vector bridge and as an upgrade directory (kind ``fitted``).

:class:`FittedBridge` is a :class:`~nobackfill.compat.bridges.VectorBridge`: ``bridge(q_new)`` gives
unit vectors of the old space, so the Searcher routes through it like a Procrustes or phi bridge.
It is saved as an upgrade directory (:mod:`nobackfill.compat.upgrade`)::

    upgrade.json        {"kind": "fitted", "source", "target",
                         "fitted": {"family", "pairs", "pair_modalities", "directions",
                                    "heldout": {...}, "fitted_at", "version", ...}}
    fitted.safetensors  the family's float32 tensors (never pickle); an ensemble's members' tensors
                        prefixed "<i>." (their families: "member_families" of the manifest)
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..bridges import VectorBridge
from .families import ENSEMBLE, FAMILIES, FittedMap, check_tensors

TENSORS_FILE = "fitted.safetensors"


class FittedBridge(VectorBridge):
    """A :class:`~.families.FittedMap` from space ``source`` (new model) to ``target`` (old).
    ``info`` is what the manifest records (family, pairs, held-out score, when, ...)."""

    kind = "fitted"

    def __init__(self, fitted: FittedMap, source: str, target: str, info: Mapping[str, Any] | None = None,
                 name: str = "") -> None:
        super().__init__(source, target, fitted.in_dim, fitted.out_dim, name or f"fitted-{fitted.family}")
        self.fitted = fitted
        self.info = dict(info or {})

    @property
    def family(self) -> str:
        return self.fitted.family

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        return self.fitted(self._check(queries))

    def manifest_info(self) -> dict[str, Any]:
        return {"family": self.family, **{k: v for k, v in self.fitted.meta.items() if k != "fit_s"},
                "fit_s": self.fitted.meta.get("fit_s"),
                "fitted_at": self.info.get("fitted_at") or datetime.now(timezone.utc).isoformat(timespec="seconds"),
                **self.info}

    def save(self, directory: str | Path, source: Mapping[str, Any] | None = None,
             target: Mapping[str, Any] | None = None) -> Path:
        """Write the upgrade directory atomically (``upgrade.json`` last)."""
        from ..._safetensors import save_tensors

        from ..upgrade_files import atomic_dir, write_manifest

        src = dict(source or {"space_id": self.source, "name": "", "embed_dim": self.source_dim})
        tgt = dict(target or {"space_id": self.target, "name": "", "embed_dim": self.target_dim})

        def write(tmp: Path) -> None:
            save_tensors({k: np.ascontiguousarray(v) for k, v in self.fitted.tensors.items()}, str(tmp / TENSORS_FILE))
            write_manifest(tmp, "fitted", src, tgt, fitted=self.manifest_info())

        return atomic_dir(directory, write)

    @classmethod
    def load(cls, directory: str | Path, source: str, target: str,
             info: Mapping[str, Any] | None = None) -> "FittedBridge":
        """Read ``fitted.safetensors``; ``info``: the manifest's ``fitted`` entry (its family)."""
        from safetensors.numpy import load_file

        info = dict(info or {})
        family = info.get("family")
        if family not in (*FAMILIES, ENSEMBLE):
            raise ValueError(f"{directory}: upgrade.json fitted.family is {family!r}; families: {(*FAMILIES, ENSEMBLE)}")
        meta = {k: v for k, v in info.items() if k not in ("family",)}
        tensors = load_file(str(Path(directory) / TENSORS_FILE))
        missing = check_tensors(family, tensors, meta)
        if missing:
            raise ValueError(f"{directory}/{TENSORS_FILE}: missing tensors {missing} (fitted.family {family})")
        return cls(FittedMap(family, dict(tensors), meta), source, target, info, name=Path(directory).name)


__all__ = ["FittedBridge", "TENSORS_FILE"]
