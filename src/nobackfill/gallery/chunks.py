"""The chunks of a gallery: reading committed chunks (each checked against the manifest's sha256)
into the in-memory columns, and committing new ones (:meth:`GalleryChunks.add`), plus the removal of
the uncommitted files a crash leaves. A mixin of :class:`~nobackfill.gallery.gallery.Gallery`."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .atomic_files import _TMP, AheadFile, _dir_lock, _now, _sha256, atomic_write_bytes, stale_ahead_files
from .manifest import (_CHUNK_RE, CHUNK_DIR, MODALITIES, _check_modality, _Columns, _manifest_stat, _copy_manifest,
                       _read_manifest, _write_manifest)
from ..ann.key_index import key_hashes
from .npz_bytes import npz_parts
from ..ann.vector_index import all_finite
from .types import CorruptGalleryError, DuplicateIdError, SpaceMismatchError

__all__ = ["GalleryChunks", "PreparedChunk"]

log = logging.getLogger("nobackfill.gallery.gallery")


def _chunk_files(ids: list[str], vecs: np.ndarray, metas: list[dict[str, Any]] | None
                 ) -> tuple[list[bytes | memoryview], str, bytes, str]:
    """A chunk's two files and their SHA-256: the ``.npz`` of its vectors and ids (in parts:
    :func:`~nobackfill.gallery.npz_bytes.npz_parts`), the JSON lines of its metadata (``metas``
    None: none)."""
    npz = npz_parts({"vectors": vecs, "ids": np.asarray(ids, dtype=str)})
    try:
        meta = b"{}\n" * len(ids) if metas is None else \
            "".join(json.dumps(m, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n" if m else "{}\n"
                    for m in metas).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ValueError(f"metadata must be JSON-serialisable: {e}") from e
    return npz, _sha256(npz), meta, _sha256(meta)


@dataclass
class PreparedChunk:
    """The rows of an add, checked and hashed, with the files of their chunk
    (:meth:`GalleryChunks.prepare_rows`)."""

    ids: list[str]
    vectors: np.ndarray
    hashes: tuple[np.ndarray, np.ndarray]
    npz: list[bytes | memoryview]
    npz_sha256: str
    meta: bytes
    meta_sha256: str
    #: the ``.npz`` written ahead (None: written at the commit)
    npz_file: AheadFile | None = None

    def discard(self) -> None:
        """Drop the file written ahead (the commit wrote other files, or none)."""
        if self.npz_file is not None:
            self.npz_file.close()


class CheckedIds(list):
    """Ids their maker has checked as an add checks them (distinct, non-empty strings without NUL):
    an add is given them as they are, without a set and a pass over them (an import's keys, made
    from its checked item ids: see :func:`~nobackfill.adopt.importing._checked_batch`)."""

    __slots__ = ()


#: float32's dtype (one object: a query's dtype is compared by identity)
_F32 = np.dtype(np.float32)


class GalleryChunks:
    """Reading and committing the chunks of a :class:`~nobackfill.gallery.gallery.Gallery` (which sets
    ``path``, ``_manifest``, ``_cols``, ``_stat``, ``_lock`` and ``_check_open``). A commit and the
    readers of the id cache hold ``_lock``: one thread may add while another looks keys up."""

    def _chunks(self, modality: str) -> list[dict[str, Any]]:
        return self._manifest["modalities"][modality]["chunks"]

    def _sync(self, modality: str) -> _Columns:
        """Bring the id cache of ``modality`` up to the manifest (loads only new chunks; under the
        gallery's lock, which a commit holds while it grows the cache)."""
        self._check_open()
        _check_modality(modality)
        with self._lock:
            chunks = self._chunks(modality)
            cols = self._cols[modality]
            if cols.chunks != [c["name"] for c in chunks[: len(cols.chunks)]]:
                cols = self._cols[modality] = _Columns()  # history changed under us: reload
            for entry in chunks[len(cols.chunks):]:
                ids = self._load_npz(entry, "ids")
                cols.keys.add(ids, cols.count)
                if cols.ids is not None:
                    cols.ids.extend(ids.tolist())
                cols.chunks.append(entry["name"])
                cols.count += len(ids)
            return cols

    def _read_checked(self, entry: dict[str, Any], kind: str) -> bytes:
        """The bytes of a committed chunk file (``kind`` "npz" or "meta"), checked against the
        manifest's sha256: a damaged or edited chunk is never served."""
        path = self.path / entry[kind]
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptGalleryError(f"cannot read committed chunk {path}: {e.strerror or e}; "
                                      f"{self._what_to_run()}") from e
        if _sha256(data) != entry[f"{kind}_sha256"]:
            raise CorruptGalleryError(f"{path} was changed or damaged after it was committed (sha256 "
                                      f"{_sha256(data)[:12]}… != manifest {entry[f'{kind}_sha256'][:12]}…); "
                                      f"{self._what_to_run()}")
        return data

    def _what_to_run(self) -> str:
        return (f"run `nobackfill verify {self.path}` to list every problem, `--repair` to drop the damaged chunks "
                "and learn which items to add again")

    def _load_npz(self, entry: dict[str, Any], key: str) -> np.ndarray:
        """Array ``key`` ("ids" or "vectors") of a committed chunk, hash- and shape-checked."""
        path = self.path / entry["npz"]
        data = self._read_checked(entry, "npz")
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                arr = z[key]
        except Exception as e:  # a zip that matches its hash but not the format (written by a bug)
            raise CorruptGalleryError(f"cannot read committed chunk {path}: {type(e).__name__}: {e}; "
                                      f"{self._what_to_run()}") from e
        want = (entry["count"],) if key == "ids" else (entry["count"], self.dim)
        if arr.shape != want:
            raise CorruptGalleryError(f"chunk {path}: {key} has shape {arr.shape}, manifest implies {want}")
        return arr if key == "ids" else arr.astype(np.float32, copy=False)

    def _load_meta(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        path = self.path / entry["meta"]
        data = self._read_checked(entry, "meta")
        try:
            rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptGalleryError(f"cannot read committed metadata {path}: {e}; {self._what_to_run()}") from e
        if len(rows) != entry["count"]:
            raise CorruptGalleryError(f"{path} has {len(rows)} rows, manifest says {entry['count']}")
        return rows

    def ids(self, modality: str) -> list[str]:
        """Ids in insertion order (row ``i`` of :meth:`vectors`)."""
        return list(self._ids(modality))

    def _ids(self, modality: str) -> list[str]:
        """The cached ids of ``modality`` in row order (not a copy), read from the chunks the first
        time they are asked for (most uses of a store ask only :meth:`positions`)."""
        with self._lock:  # a commit meanwhile would extend a cache that is not there yet
            cols = self._sync(modality)
            if cols.ids is None:
                cols.ids = [i for e in self._chunks(modality)[:len(cols.chunks)]
                            for i in self._load_npz(e, "ids").tolist()]
            return cols.ids

    #: a row keeps its position for ever (rows are only appended): a catalog may record it
    stable_positions = True

    def positions(self, modality: str, keys: Sequence[str]) -> dict[str, int]:
        """Row of each of ``keys`` held (absent keys are left out)."""
        with self._lock:
            rows = self._sync(modality).keys.rows(keys).tolist()
        return {k: r for k, r in zip(keys, rows) if r >= 0}

    def __contains__(self, item: tuple[str, str]) -> bool:
        """``("image", "id7") in gallery``."""
        modality, id_ = item
        with self._lock:
            return bool(self._sync(modality).keys.rows([id_])[0] >= 0)

    def vectors(self, modality: str) -> np.ndarray:
        """All vectors of ``modality``, float32 ``(N, dim)``, read-only."""
        cols = self._sync(modality)
        new = [self._load_npz(e, "vectors") for e in self._chunks(modality)[cols.vec_chunks:]]
        if new or cols.vectors is None:
            parts = ([cols.vectors] if cols.vectors is not None else []) + new
            cat = np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)
            cat.flags.writeable = False
            cols.vectors, cols.vec_chunks = cat, len(cols.chunks)
        return cols.vectors

    def get_vectors(self, modality: str, keys: Sequence[str]) -> np.ndarray:
        """The vectors of ``keys`` (all held: ``KeyError`` naming one that is not), reading only
        the chunks that hold them (hash-checked), not the whole store."""
        with self._lock:
            cols = self._sync(modality)
            rows = cols.keys.rows(keys)
        if (rows < 0).any():
            raise KeyError(f"gallery {self.path} holds no {modality} vector {keys[int(np.argmax(rows < 0))]!r}")
        if cols.vectors is not None and len(cols.vectors) > (rows.max() if len(rows) else -1):
            return np.array(cols.vectors[rows])
        chunks = self._chunks(modality)
        ends = np.cumsum([c["count"] for c in chunks])
        which = np.searchsorted(ends, rows, side="right")
        out = np.zeros((len(rows), self.dim), np.float32)
        for c in np.unique(which):
            sel = which == c
            start = int(ends[c] - chunks[c]["count"])
            out[sel] = self._load_npz(chunks[c], "vectors")[rows[sel] - start]
        return out

    def metadata(self, modality: str) -> list[dict[str, Any]]:
        """Metadata dicts in insertion order (copies)."""
        cols = self._sync(modality)
        for entry in self._chunks(modality)[cols.meta_chunks:]:
            cols.metadata.extend(self._load_meta(entry))
            cols.meta_chunks += 1
        return [dict(m) for m in cols.metadata]

    # ------------------------------------------------------------------ writing


    def _check_rows(self, x: np.ndarray, what: str, n: int | None = None) -> np.ndarray:
        if type(x) is np.ndarray and x.dtype is _F32 and x.ndim == 2 and x.shape[1] == self._manifest["dim"] and \
                n is None and x.flags.c_contiguous:  # the common case (a search's query), checked cheaply
            if not all_finite(x):
                raise ValueError(f"{what} contain NaN or infinite values")
            return x
        arr = np.asarray(x)
        if arr.ndim == 1 and n is None:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.dim or (n is not None and arr.shape[0] != n):
            want = f"({n if n is not None else 'N'}, {self.dim})"
            raise ValueError(f"{what} must have shape {want} for gallery {self.path}, got {arr.shape}")
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{what} must be numeric, got dtype {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not all_finite(arr):
            raise ValueError(f"{what} contain NaN or infinite values")
        return arr

    def add(
        self,
        modality: str,
        ids: Sequence[str],
        vectors: np.ndarray,
        metadata: Sequence[dict[str, Any]] | None = None,
        *,
        space_id: str,
        skip_existing: bool = False,
    ) -> int:
        """Commit one chunk of rows; returns how many rows were added.

        ``space_id`` must be the gallery's (:class:`SpaceMismatchError` otherwise). Ids must be
        unique strings; ids already in the gallery raise :class:`DuplicateIdError` unless
        ``skip_existing``, which drops those rows. The chunk is durable once this returns.
        """
        return self._add(modality, ids, vectors, metadata, space_id=space_id, skip_existing=skip_existing)[0]

    def add_rows(self, modality: str, ids: Sequence[str], vectors: np.ndarray, *,
                 space_id: str, prepared: "PreparedChunk | None" = None) -> tuple[int, np.ndarray]:
        """:meth:`add` with ``skip_existing``, also returning each id's row (held already, or
        added now): :meth:`positions` of the batch without hashing its keys again. ``prepared``:
        these rows' :meth:`prepare_rows` (made ahead, by another thread), whose files are written
        as they are when none of the ids is held."""
        return self._add(modality, ids, vectors, None, space_id=space_id, skip_existing=True, prepared=prepared)

    def prepare_rows(self, modality: str, ids: Sequence[str], vectors: np.ndarray) -> "PreparedChunk":
        """The checks of :meth:`add_rows` and the files of the chunk its rows would make, with no
        lock taken and nothing written: the hashing and packing, done ahead of the commit."""
        _check_modality(modality)
        ids, vecs, _, hashes = self._checked(ids, vectors, None)
        npz, npz_sha256, meta, meta_sha256 = _chunk_files(ids, vecs, None)
        return PreparedChunk(ids, vecs, hashes, npz, npz_sha256, meta, meta_sha256,
                             AheadFile.write(self.path, npz))

    def _checked(self, ids: Sequence[str], vectors: np.ndarray, metadata: Sequence[dict[str, Any]] | None
                 ) -> tuple[list[str], np.ndarray, list[dict[str, Any]] | None, tuple[np.ndarray, np.ndarray]]:
        """Ids, vectors and metadata of an add, checked (no lock needed), and the ids' hashes."""
        distinct: set | None = None  # None: checked by their maker (CheckedIds)
        if type(ids) is not CheckedIds:
            ids = list(ids)
            try:
                distinct = set(ids)
            except TypeError:
                distinct = {None}  # an unhashable id: refused below
            if not set(map(type, distinct)) <= {str} or "" in distinct or "\0" in "".join(distinct):
                bad = [i for i in ids if not isinstance(i, str) or not i or "\0" in i]
                raise ValueError(f"ids must be non-empty strings without NUL characters, got {bad[:3]!r}")
        vecs = self._check_rows(vectors, "vectors", n=len(ids))
        metas = None if metadata is None else list(metadata)
        if metas is not None and len(metas) != len(ids):
            raise ValueError(f"got {len(metas)} metadata rows for {len(ids)} ids")
        if metas is not None and not all(isinstance(m, dict) for m in metas):
            raise ValueError("metadata rows must be dicts")
        if distinct is not None and len(distinct) < len(ids):
            seen: set[str] = set()
            dups = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
            raise DuplicateIdError(f"ids repeated within one batch: {sorted(set(dups))[:5]}")
        return ids, vecs, metas, key_hashes(ids)

    def _add(self, modality: str, ids: Sequence[str], vectors: np.ndarray, metadata: Sequence[dict[str, Any]] | None,
             *, space_id: str, skip_existing: bool, prepared: "PreparedChunk | None" = None) -> tuple[int, np.ndarray]:
        self._check_open()
        _check_modality(modality)
        if space_id != self.space_id:
            raise SpaceMismatchError(self.space_id, space_id, f"add {modality} vectors to gallery {self.path}",
                                     what="vectors", hint="a gallery holds one embedding space")
        usable = prepared is not None and metadata is None and prepared.ids == list(ids) and \
            (prepared.vectors is vectors or np.array_equal(prepared.vectors, vectors))
        try:
            if usable:
                ids, vecs, metas, hashes = prepared.ids, prepared.vectors, None, prepared.hashes
            else:
                ids, vecs, metas, hashes = self._checked(ids, vectors, metadata)
            return self._add_checked(modality, ids, vecs, metas, hashes, skip_existing, prepared if usable else None)
        finally:
            if prepared is not None:
                prepared.discard()  # (a no-op once the commit named its file)

    def _add_checked(self, modality: str, ids: list[str], vecs: np.ndarray, metas: list[dict[str, Any]] | None,
                     hashes: tuple[np.ndarray, np.ndarray], skip_existing: bool,
                     prepared: "PreparedChunk | None") -> tuple[int, np.ndarray]:
        """:meth:`_add` under the gallery's lock, its rows checked."""
        with _dir_lock(self.path):
            with self._lock:
                self._manifest = _read_manifest(self.path)  # another writer may have committed
                cols = self._sync(modality)
                rows = cols.keys.rows_of(*hashes)
                first = cols.count
            held = rows >= 0
            rows[~held] = np.arange(first, first + int((~held).sum()), dtype=np.int64)  # appended in order
            if held.any():
                if not skip_existing:
                    present = [i for i, h in zip(ids, held.tolist()) if h]
                    raise DuplicateIdError(
                        f"{len(present)} {modality} ids already in gallery {self.path}: {present[:5]} "
                        "(pass skip_existing=True to drop them)")
                keep = (~held).tolist()
                ids = [i for i, k in zip(ids, keep) if k]
                metas = None if metas is None else [m for m, k in zip(metas, keep) if k]
                vecs = vecs[~held]
                hashes = (hashes[0][~held], hashes[1][~held])
                prepared = None  # its files hold every row
            if not ids:
                return 0, rows
            if prepared is not None:
                files, npz_file = (prepared.npz, prepared.npz_sha256, prepared.meta, prepared.meta_sha256), \
                    prepared.npz_file
            else:
                files, npz_file = _chunk_files(ids, vecs, metas), None
            self._commit_chunk(modality, ids, hashes, files, npz_file)
        return len(ids), rows

    def _commit_chunk(self, modality: str, ids: list[str], hashes: tuple[np.ndarray, np.ndarray],
                      files: tuple[list[bytes | memoryview], str, bytes, str],
                      npz_file: AheadFile | None = None) -> None:
        """Write a chunk's files (:func:`_chunk_files`; the ``.npz`` is ``npz_file`` when it was
        written ahead), then the manifest that names them (caller holds the lock); ``hashes``:
        the ids' :func:`~nobackfill.ann.key_index.key_hashes`."""
        chunks = self._chunks(modality)
        # one past the highest number (not the count: repair may have dropped a chunk)
        name = f"{modality}-{1 + max((int(c['name'].rsplit('-', 1)[1]) for c in chunks), default=-1):05d}"
        npz, npz_sha256, meta, meta_sha256 = files
        entry = {
            "name": name,
            "count": len(ids),
            "npz": f"{CHUNK_DIR}/{name}.npz",
            "npz_sha256": npz_sha256,
            "meta": f"{CHUNK_DIR}/{name}.jsonl",
            "meta_sha256": meta_sha256,
        }
        (self.path / CHUNK_DIR).mkdir(exist_ok=True)
        if npz_file is not None:
            npz_file.name(self.path / entry["npz"])
        else:
            atomic_write_bytes(self.path / entry["npz"], npz)
        atomic_write_bytes(self.path / entry["meta"], meta)
        manifest = _copy_manifest(self._manifest)
        mod = manifest["modalities"][modality]
        mod["chunks"].append(entry)
        mod["count"] += len(ids)
        manifest["updated"] = _now()
        _write_manifest(self.path, manifest)  # <- the commit point
        with self._lock:  # readers of other threads see the manifest and the cache grown together
            self._manifest, self._stat = manifest, _manifest_stat(self.path)
            cols = self._cols[modality]  # vectors / metadata of the new chunk load lazily
            if cols.chunks[-1:] != [name]:  # (a refresh by another thread may have loaded it already)
                cols.keys.add_hashes(*hashes, cols.count)
                if cols.ids is not None:
                    cols.ids.extend(ids)
                cols.chunks.append(name)
                cols.count += len(ids)

    def _orphans(self) -> list[Path]:
        """Files that look like ours but are not committed (crash leftovers)."""
        committed = {c[k] for m in MODALITIES for c in self._chunks(m) for k in ("npz", "meta")}
        found: list[Path] = []
        chunk_dir = self.path / CHUNK_DIR
        if chunk_dir.is_dir():
            found += [p for p in chunk_dir.iterdir() if p.name.startswith(_TMP)
                      or (_CHUNK_RE.match(p.name) and f"{CHUNK_DIR}/{p.name}" not in committed)]
        found += [p for p in self.path.iterdir() if p.name.startswith(_TMP)]
        return sorted(found + stale_ahead_files(self.path))

    def _collect_garbage_locked(self) -> None:
        """Delete crash leftovers; caller holds the lock and has just re-read the manifest."""
        for p in self._orphans():
            log.info("removing uncommitted file %s", p)
            with contextlib.suppress(OSError):
                p.unlink()
