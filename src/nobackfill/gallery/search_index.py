"""The search index of a gallery: built or loaded lazily per modality, grown in place when chunks
are appended, cached on disk (``index-<modality>.faiss`` and its stamp) and, for an ``auto`` space,
swapped to its graph in the background. A mixin of :class:`~nobackfill.gallery.gallery.Gallery`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Callable

from .atomic_files import _dir_lock, _fsync_dir, _now, atomic_write_bytes, atomic_write_stream
from ..ann.auto_index import AUTO_GRAPH_AT
from ..ann.backends import AutoIndex, VectorIndex, load_index, make_index, parse_spec
from ..ann.faiss_indexes import needs_training
from .manifest import MODALITIES, _chunk_key

__all__ = ["GalleryIndex"]

log = logging.getLogger("nobackfill.gallery.gallery")


class GalleryIndex:
    """The search indexes of a :class:`~nobackfill.gallery.gallery.Gallery` (which sets ``path``,
    ``_manifest``, ``_indexes``, ``_index_manifest`` and ``_lock``)."""

    def _index(self, modality: str) -> VectorIndex:
        """The search index of ``modality`` (built or loaded lazily; grown in place when chunks were
        appended since it was built). Caller holds ``_lock``."""
        cached = self._indexes.get(modality)
        if cached is not None and self._index_manifest.get(modality) is self._manifest:
            return cached[2]  # nothing committed since: the hot path
        key = _chunk_key(self._manifest, modality)
        chunks = self._chunks(modality)
        names = [c["name"] for c in chunks]
        manifest = self._manifest
        if cached is not None:
            ckey, cnames, index, saved = cached
            if ckey == key:
                return index
            if names[:len(cnames)] == cnames and index.ntotal == sum(c["count"] for c in chunks[:len(cnames)]):
                for entry in chunks[len(cnames):]:  # appended chunks only
                    index.add(self._load_npz(entry, "vectors"))
                return self._keep(modality, key, names, index, saved, manifest)
        index, saved = self._load_cached_index(modality)
        if index is None:
            index = make_index(self.backend, self.dim)
            for entry in chunks:  # chunk by chunk: no copy of every vector beside the index's own
                index.add(self._load_npz(entry, "vectors"))
            self._save_cached_index(modality, key, index, len(names))
            saved = index.ntotal
        return self._keep(modality, key, names, index, saved, manifest)

    def _keep(self, modality: str, key: Any, names: list[str], index: VectorIndex, saved: int,
              manifest: Any) -> VectorIndex:
        """Hold ``index`` for ``modality``; its on-disk cache (of ``saved`` rows) rewritten once the
        index has grown by a quarter, so the cache stays roughly current."""
        if index.ntotal >= 1.25 * max(saved, 1):
            self._save_cached_index(modality, key, index, len(names))
            saved = index.ntotal
        self._indexes[modality] = (key, names, index, saved)
        self._index_manifest[modality] = manifest
        self._watch(modality, index)
        return index

    def _watch(self, modality: str, index: VectorIndex) -> None:
        """An ``auto`` index past its threshold starts its graph in the background."""
        if isinstance(index, AutoIndex):
            if index.on_built is None:
                index.on_built = lambda built, m=modality: self._index_built(m, built)
            if self.build_in_background and index.needs_graph:
                index.start_build()

    #: start an ``auto`` space's graph index in a background thread when a search needs it (a
    #: one-shot command turns this off: it would exit before the build ends; see :meth:`build_index`)
    build_in_background = True

    def _index_built(self, modality: str, index: VectorIndex) -> None:
        """An ``auto`` index swapped to its graph: cache the graph on disk (if still current)."""
        with self._lock:
            cached = self._indexes.get(modality)
            if cached is None or cached[2] is not index:
                return
            key, n_chunks = cached[0], len(cached[1])
        # outside the gallery's lock: searches go on (a row appended meanwhile makes the cache's
        # row count disagree with its chunks, and such a cache is never loaded)
        self._save_cached_index(modality, key, index, n_chunks)
        with self._lock:
            cached = self._indexes.get(modality)
            if cached is not None and cached[2] is index:
                self._indexes[modality] = (cached[0], cached[1], index, index.ntotal)

    def build_index(self, modality: str | None = None,
                    progress: Callable[[int], Any] | None = None) -> dict[str, dict[str, Any]]:
        """Build (and cache) the search index of ``modality`` (default: every modality with
        rows) now, waiting for it: for an ``auto`` space past its threshold, the graph index
        (``progress(n)``: told of each block of ``n`` rows it takes in). Returns
        :meth:`index_info`. Searches in other threads keep running meanwhile."""
        mods = [modality] if modality else [m for m in MODALITIES if self.count(m)]
        for m in mods:
            with self._lock:
                index = self._index(m)
            if isinstance(index, AutoIndex):
                index.build(progress)
        return self.index_info()

    def index_info(self) -> dict[str, dict[str, Any]]:
        """Per modality with rows: the backend spec, the index answering searches now (``Flat`` or a
        graph's factory string; an auto index past its threshold: None before the first search of
        this process loaded it), whether a graph index is being built, and the row count."""
        out: dict[str, dict[str, Any]] = {}
        for m in MODALITIES:
            n = self.count(m)
            if not n:
                continue
            cached = self._indexes.get(m)
            index = cached[2] if cached else None
            waiting = getattr(index, "waiting", None)  # a factory index too small to train yet: searched exactly
            if isinstance(index, AutoIndex):
                in_use, building = index.in_use, index.building
            elif index is not None:
                in_use, building = ("Flat" if waiting else self.backend), False
            else:
                (in_use, waiting), building = self._cached_kind(m), False
            out[m] = {"backend": self.backend, "in_use": in_use, "building": building, "count": n,
                      **({"waiting": waiting} if waiting else {})}
        return out

    def _cached_kind(self, modality: str) -> tuple[str | None, str | None]:
        """What the on-disk index cache of ``modality`` holds (its stamp), without loading it, and
        why it is searched exactly (a factory index too small to train), if it is."""
        try:
            stamp = json.loads(self._index_paths(modality)[1].read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none written: below its threshold, auto searches exactly
            if not self.backend.startswith("auto"):  # (an index to train is not named before it is built:
                kind, opts = parse_spec(self.backend)
                trained_later = kind == "faiss" and needs_training(opts["factory"], self.dim)
                return (None if trained_later else self.backend), None  # trial AF)
            _kind, opts = parse_spec(self.backend)
            return ("Flat" if self.count(modality) < int(opts.get("at", AUTO_GRAPH_AT)) else None), None
        if not self.backend.startswith("auto") and "in_use" not in stamp:
            return self.backend, None
        return stamp.get("in_use"), stamp.get("waiting")

    def _index_paths(self, modality: str) -> tuple[Path, Path]:
        return self.path / f"index-{modality}.faiss", self.path / f"index-{modality}.json"

    def _load_cached_index(self, modality: str) -> tuple[VectorIndex | None, int]:
        """The on-disk index of ``modality`` and the rows it held on disk, extended with the chunks
        committed after it was written; ``(None, 0)`` when there is none or it does not fit."""
        data_path, key_path = self._index_paths(modality)
        chunks = self._chunks(modality)
        try:
            stamp = json.loads(key_path.read_text(encoding="utf-8"))
            upto = stamp.get("chunks", len(chunks))  # older caches cover every chunk of their key
            if not isinstance(upto, int) or not 0 <= upto <= len(chunks) or \
                    stamp.get("key") != _chunk_key(self._manifest, modality, upto):
                return None, 0
            index = _read_checked(self.backend, self.dim, data_path, stamp.get("sha256"))
            if index is None:
                log.warning("cached index %s does not match its sha256: rebuilding it", data_path)
                return None, 0
        except Exception as e:  # any problem with a cache means: rebuild it
            if not isinstance(e, FileNotFoundError):  # (faiss' C++ message says nothing to an operator: -v)
                log.warning("ignoring the damaged cached index %s: unreadable, rebuilt from the vector chunks",
                            data_path)
                log.debug("the cached index %s: %s", data_path, e)
            return None, 0
        if index.ntotal != sum(c["count"] for c in chunks[:upto]):
            return None, 0
        saved = index.ntotal
        for entry in chunks[upto:]:  # appended since the cache was written
            index.add(self._load_npz(entry, "vectors"))
        return index, saved

    def _save_cached_index(self, modality: str, key: str, index: VectorIndex, n_chunks: int) -> None:
        """Write ``index`` (the rows of the first ``n_chunks`` chunks, fingerprint ``key``) as the
        on-disk cache of ``modality``: streamed to a temporary file renamed into place (no copy of
        the serialised index in memory), its stamp written only after it, so a build or write
        killed at any point leaves the previous cache (or none), never a half-written one."""
        data_path, key_path = self._index_paths(modality)
        try:
            with _dir_lock(self.path, blocking=False) as taken:
                if not taken:
                    return  # a writer is busy (or read-only): keep the index in memory only
                # key file gone first, so a crash can never pair the old key with a new index
                with contextlib.suppress(FileNotFoundError):
                    key_path.unlink()
                _fsync_dir(self.path)
                digest = atomic_write_stream(data_path, index.write_to)
                if digest is None:
                    return  # not a file-backed backend
                stamp = {"key": key, "chunks": int(n_chunks), "backend": self.backend, "ntotal": index.ntotal,
                         "sha256": digest, "written": _now()}
                if isinstance(index, AutoIndex):
                    stamp["in_use"] = index.in_use
                elif getattr(index, "waiting", None):  # (status, in another process, says so)
                    stamp.update(in_use="Flat", waiting=index.waiting)
                atomic_write_bytes(key_path, json.dumps(stamp).encode("utf-8"))
        except OSError as e:
            log.warning("could not cache index %s: %s", data_path, e)


def _read_checked(backend: str, dim: int, path: Path, sha256: Any) -> VectorIndex | None:
    """The index cached in ``path``, read piece by piece (never held whole beside the index) while
    its SHA-256 is computed; None when that does not match ``sha256`` (its stamp's)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        def read(n: int) -> bytes:
            piece = f.read(n)
            h.update(piece)
            return piece

        index = load_index(backend, dim, read)
        for rest in iter(lambda: f.read(1 << 20), b""):  # (a file longer than its index does not match)
            h.update(rest)
    return index if h.hexdigest() == sha256 else None
