"""Checking and repairing a gallery: :meth:`GalleryIntegrity.verify` re-hashes every committed
chunk and checks the cached indexes; :meth:`GalleryIntegrity.repair` rebuilds what is derived and
takes damaged chunks out of the manifest, listing the ids to add again. A mixin of
:class:`~nobackfill.gallery.gallery.Gallery`."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .atomic_files import _dir_lock, _now, file_sha256
from .manifest import MODALITIES, _chunk_key, _Columns, _manifest_stat, _read_manifest, _write_manifest
from .types import CorruptGalleryError, RepairReport, VerifyReport

__all__ = ["GalleryIntegrity"]


class GalleryIntegrity:
    """:meth:`verify` and :meth:`repair` of a :class:`~nobackfill.gallery.gallery.Gallery`."""

    def verify(self) -> VerifyReport:
        """Re-hash every committed chunk, check counts, shapes and id uniqueness, and check the cached
        indexes against their stamps. Never raises on damage: every problem is reported."""
        self._check_open()
        report = VerifyReport()
        for modality in MODALITIES:
            seen: set[str] = set()
            for entry in self._chunks(modality):
                report.checked_chunks += 1
                try:
                    ids = [str(i) for i in self._load_npz(entry, "ids")]
                    self._load_npz(entry, "vectors")
                    self._load_meta(entry)
                except CorruptGalleryError as e:
                    report.problems.append(str(e).split("; run `nobackfill verify")[0])
                    report.damaged_chunks.append(f"{modality}:{entry['name']}")
                    continue
                dups = seen.intersection(ids)
                if dups:
                    report.problems.append(f"{entry['npz']}: ids also in an earlier chunk: {sorted(dups)[:5]}")
                seen.update(ids)
            problem = self._check_cached_index(modality)
            if problem:
                report.derived.append(problem)
        report.orphans = [str(p.relative_to(self.path)) for p in self._orphans()]
        return report

    def _check_cached_index(self, modality: str) -> str | None:
        """What is wrong with the cached index of ``modality`` (None: absent or sound)."""
        data_path, key_path = self._index_paths(modality)
        if not data_path.exists() and not key_path.exists():
            return None
        try:
            stamp = json.loads(key_path.read_text(encoding="utf-8"))
            if stamp.get("sha256") != file_sha256(data_path):
                return f"{data_path}: does not match its sha256 (derived: rebuilt on the next search or by --repair)"
            if stamp.get("key") != _chunk_key(self._manifest, modality):
                return None  # stale, not damaged: rebuilt on the next search
        except (OSError, ValueError) as e:
            return f"{data_path}: unreadable cache ({type(e).__name__}; derived: rebuilt by --repair)"
        return None

    def repair(self) -> "RepairReport":
        """Rebuild what is derived (the cached indexes) and take damaged chunks out of the manifest
        (one atomic manifest write; their files move to ``lost/``), so the gallery serves again.
        The report lists the ids that were in the damaged chunks: add those items again."""
        self._check_open()
        report = RepairReport()
        with _dir_lock(self.path), self._lock:  # the order of add: the file lock, then the thread lock
            self._manifest = _read_manifest(self.path)
            damaged: dict[str, list[dict[str, Any]]] = {m: [] for m in MODALITIES}
            for modality in MODALITIES:
                for entry in self._chunks(modality):
                    try:
                        self._load_npz(entry, "ids")
                        self._load_npz(entry, "vectors")
                        self._load_meta(entry)
                    except CorruptGalleryError:
                        damaged[modality].append(entry)
            if any(damaged.values()):
                lost_dir = self.path / "lost"
                lost_dir.mkdir(exist_ok=True)
                for modality, entries in damaged.items():
                    for entry in entries:
                        report.lost_chunks.append(entry["npz"])
                        report.lost_ids[modality].extend(self._readable_ids(entry))
                        report.lost_counts[modality] += int(entry["count"])
                manifest = json.loads(json.dumps(self._manifest))
                for modality, entries in damaged.items():
                    names = {e["name"] for e in entries}
                    mod = manifest["modalities"][modality]
                    mod["chunks"] = [c for c in mod["chunks"] if c["name"] not in names]
                    mod["count"] = sum(int(c["count"]) for c in mod["chunks"])
                manifest["updated"] = _now()
                _write_manifest(self.path, manifest)
                self._manifest = manifest
                self._stat = _manifest_stat(self.path)
                for entries in damaged.values():
                    for entry in entries:
                        for kind in ("npz", "meta"):
                            with contextlib.suppress(OSError):
                                os.replace(self.path / entry[kind], lost_dir / Path(entry[kind]).name)
            for modality in MODALITIES:
                for path in self._index_paths(modality):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        report.rebuilt.append(path.name)
            self._cols = {m: _Columns() for m in MODALITIES}
            self._indexes = {}
            self._index_manifest = {}
        for modality in MODALITIES:  # rebuild the caches now (outside the writer lock: it takes it)
            if self.count(modality):
                with self._lock:
                    self._index(modality)
        return report

    def _readable_ids(self, entry: dict[str, Any]) -> list[str]:
        """The ids of a damaged chunk as far as they can still be read (its metadata or its npz)."""
        with contextlib.suppress(Exception):
            with np.load(self.path / entry["npz"], allow_pickle=False) as z:
                return [str(i) for i in z["ids"]]
        with contextlib.suppress(Exception):
            rows = [json.loads(x) for x in (self.path / entry["meta"]).read_text("utf-8").splitlines() if x]
            return [str(r.get("id", "?")) for r in rows]
        return []
