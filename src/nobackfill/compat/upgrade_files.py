"""An upgrade directory's files: its kinds, the manifest ``upgrade.json`` (with the sha256 of every
file written before it) and the atomic write of the whole directory. Shared by the upgrades of
:mod:`nobackfill.compat.upgrade` and the fitted bridges of :mod:`nobackfill.compat.fitted`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from ..encoders.hf import atomic_model_dir

__all__ = ["ADAPTER_KINDS", "ENCODER_KINDS", "FORMAT", "KINDS", "TEXT_KINDS", "UPGRADE_FILE", "VECTOR_KINDS", "VERSION",
           "atomic_dir", "write_manifest"]

UPGRADE_FILE = "upgrade.json"
FORMAT = "nobackfill-upgrade"
VERSION = 1
ADAPTER_KINDS = ("xbt", "xbt-text", "direct-lora", "direct-base")
#: kinds whose model is text-only (no image tower): applied, they give a :class:`TextUpgradedEncoder`
TEXT_KINDS = ("xbt-text",)
ENCODER_KINDS = ADAPTER_KINDS + ("direct-full",)
VECTOR_KINDS = ("phi", "procrustes", "fitted")
KINDS = ENCODER_KINDS + VECTOR_KINDS


def atomic_dir(directory: str | Path, write) -> Path:
    """Write an upgrade directory atomically (:func:`nobackfill.encoders.hf.atomic_model_dir`),
    ``upgrade.json`` last, so a reader sees the old manifest or a complete new upgrade."""
    return atomic_model_dir(directory, write, commit_last=UPGRADE_FILE)


def _file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file of an upgrade directory but its manifest and training logs."""
    from ..gallery.atomic_files import file_sha256
    from ..train.checkpoint import CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE

    skip = {UPGRADE_FILE, "train_log.jsonl", CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE}
    return {str(p.relative_to(directory)): file_sha256(p) for p in sorted(Path(directory).rglob("*"))
            if p.is_file() and p.name not in skip and not p.name.startswith(".")
            and p.relative_to(directory).parts[0] != "stage1"}


def write_manifest(directory: Path, kind: str, source: dict, target: dict, **extra) -> None:
    """``upgrade.json``, with the sha256 of every file written before it (checked on load)."""
    if kind not in KINDS:
        raise ValueError(f"unknown upgrade kind {kind!r}; kinds: {KINDS}")
    manifest = {"format": FORMAT, "version": VERSION, "kind": kind, "source": source, "target": target,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                **{k: v for k, v in extra.items() if v is not None}, "files": _file_hashes(Path(directory))}
    (Path(directory) / UPGRADE_FILE).write_text(json.dumps(manifest, indent=2, default=str))
