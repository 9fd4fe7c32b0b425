"""A gallery on disk: embeddings of one embedding space, append-only and crash-safe.

Layout of a gallery directory::

    manifest.json               the only source of truth (format, space_id, dim, model, backend,
                                committed chunks per modality with counts and sha256)
    chunks/<modality>-<nnnnn>.npz    vectors (float32) + ids of one ``add`` call
    chunks/<modality>-<nnnnn>.jsonl  one metadata dict per row
    index-<modality>.faiss      cached search index (derived data, rebuilt when chunks change)
    index-<modality>.json       which chunk list that cached index was built from, and its sha256
    .lock                       advisory lock taken by writers

Every file is written to a temporary name in its directory, fsynced, renamed into place and the
directory fsynced. A chunk is committed only when the manifest naming it has been replaced, so a
process killed at any point leaves either the old or the new gallery, never half of one; chunk
files the manifest does not list are ignored and removed by the next writer.

Every read checks what it reads: a chunk's bytes against the manifest's sha256 (a damaged or
edited chunk is an error naming the file and what to run, never data served), a cached index against
the chunk list it was built from and its own sha256 (a damaged one is rebuilt). :meth:`Gallery.verify`
reports every problem; :meth:`Gallery.repair` rebuilds what is derived and takes damaged chunks out
of the manifest, listing the ids that must be added again.

Vectors carry the gallery's ``space_id``: adding or searching with another space raises
:class:`SpaceMismatchError` unless a bridge that maps the query space into the gallery space is
given to :meth:`Gallery.search`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from .backends import AutoIndex, VectorIndex, load_index, make_index, validate_spec

try:  # POSIX advisory locks; elsewhere a gallery is single-writer by convention
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MODALITIES",
    "FORMAT_VERSION",
    "Bridge",
    "Gallery",
    "GalleryError",
    "NotAGalleryError",
    "CorruptGalleryError",
    "SpaceMismatchError",
    "DuplicateIdError",
    "SearchResult",
    "VerifyReport",
    "RepairReport",
    "VerifyReport",
    "atomic_write_bytes",
]

log = logging.getLogger(__name__)

MODALITIES = ("image", "text")
FORMAT_VERSION = 1
FORMAT_NAME = "nobackfill-gallery"
MANIFEST = "manifest.json"
CHUNK_DIR = "chunks"
LOCK = ".lock"
_TMP = ".tmp-"
_CHUNK_RE = re.compile(r"^(image|text)-\d{5,}\.(npz|jsonl)$")


class GalleryError(Exception):
    """Base class for gallery problems."""


class NotAGalleryError(GalleryError, FileNotFoundError):
    """The directory holds no gallery."""


class CorruptGalleryError(GalleryError):
    """The manifest or a committed chunk is unreadable or inconsistent."""


class SpaceMismatchError(ValueError):
    """Vectors or queries from one embedding space were used against a gallery of another."""

    def __init__(self, gallery_space: str, other_space: str, action: str, *, what: str, hint: str = "",
                 expected: str = "gallery", expected_name: str = "", other_name: str = "") -> None:
        self.gallery_space, self.other_space = gallery_space, other_space
        named = lambda sid, name: f"{sid} ({name})" if name else sid  # noqa: E731
        msg = (f"cannot {action}: the {expected} is in embedding space {named(gallery_space, expected_name)} "
               f"but the {what} are in space {named(other_space, other_name)}")
        super().__init__(msg + (f"; {hint}" if hint else ""))


class DuplicateIdError(ValueError):
    """An id occurs twice in a batch, or is already in the gallery."""


@runtime_checkable
class Bridge(Protocol):
    """Maps queries from space ``source`` into space ``target`` (e.g. a new model onto an old gallery)."""

    source: str
    target: str

    def __call__(self, queries: np.ndarray) -> np.ndarray: ...


class SearchResult:
    """Top-k hits per query; rows are sorted by descending score. ``scores``: float32 (Q, k);
    ``positions``: int64 (Q, k), rows of ``Gallery.vectors(modality)``; ``ids``: the row keys, given
    or looked up from ``names`` (the store's keys by row) the first time they are asked for."""

    def __init__(self, scores: np.ndarray, ids: list[list[str]] | None = None, positions: np.ndarray | None = None,
                 *, names: Any = None) -> None:
        self.scores = scores
        self.positions = positions if positions is not None else np.zeros(scores.shape, np.int64)
        self._ids = ids
        self._names = names

    @property
    def ids(self) -> list[list[str]]:
        if self._ids is None:
            names = self._names() if callable(self._names) else self._names
            self._ids = [[names[p] for p in row if p >= 0] for row in self.positions.tolist()]
        return self._ids

    def __repr__(self) -> str:
        return f"SearchResult(scores={self.scores!r}, positions={self.positions!r})"


@dataclass
class VerifyReport:
    """Outcome of :meth:`Gallery.verify`; ``orphans`` are uncommitted files (harmless)."""

    problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    checked_chunks: int = 0
    #: ``modality:chunk`` of every committed chunk that fails its checks (``repair`` drops them)
    damaged_chunks: list[str] = field(default_factory=list)
    #: problems of derived files (cached indexes): never served, rebuilt by ``repair``
    derived: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class RepairReport:
    """Outcome of :meth:`Gallery.repair`: derived files rebuilt, damaged chunks dropped and the ids
    they held (to be added again)."""

    rebuilt: list[str] = field(default_factory=list)
    lost_chunks: list[str] = field(default_factory=list)
    lost_ids: dict[str, list[str]] = field(default_factory=lambda: {"image": [], "text": []})
    lost_counts: dict[str, int] = field(default_factory=lambda: {"image": 0, "text": 0})


# --------------------------------------------------------------------------- atomic file helpers


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, *, tmp_prefix: str = _TMP) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    The data goes to ``<tmp_prefix><name>.<random>`` in the same directory first (a gallery removes
    stray ``.tmp-`` files as crash leftovers; other owners of a directory pass their own prefix)."""
    path = Path(path)
    tmp = path.with_name(f"{tmp_prefix}{path.name}.{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _crash_point("before")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    _crash_point("after")


_WRITES = 0


def _crash_point(when: str) -> None:
    """Test-only crash injection (not an API): with ``NOBACKFILL_TEST_KILL_AT_WRITE=N`` the process
    SIGKILLs itself just before the N-th atomic rename of its life, with ``N+`` just after it, so
    tests can stop a writer between any two steps of a commit."""
    global _WRITES
    spec = os.environ.get("NOBACKFILL_TEST_KILL_AT_WRITE")
    if not spec:
        return
    if when == "before":
        _WRITES += 1
    after = spec.endswith("+")
    if int(spec.rstrip("+")) == _WRITES and after == (when == "after"):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def read_tagged_json(path: str | Path, fmt: str, *, error: type[Exception] = ValueError,
                     version_key: str = "version", max_version: int | None = None) -> dict[str, Any]:
    """Read a JSON file tagged ``{"format": fmt, version_key: n, ...}`` (gallery, token-store, memory,
    RECO and upgrade manifests). Raises ``error`` naming ``path`` for an unreadable file or JSON, a
    wrong format tag, or a version outside ``1..max_version`` (not checked when ``max_version`` is
    None). Callers check that the file exists first, with their own hint on how to make one."""
    path = Path(path)
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path}: unreadable ({e})") from e
    if not isinstance(m, dict) or m.get("format") != fmt:
        raise error(f"{path}: not a {fmt} file")
    if max_version is not None:
        version = m.get(version_key)
        if not isinstance(version, int) or not 1 <= version <= max_version:
            raise error(f"{path}: unsupported {version_key} {version!r} (this nobackfill reads <= {max_version})")
    return m


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def _dir_lock(root: Path, blocking: bool = True) -> Iterator[bool]:
    """Exclusive advisory lock on ``root/.lock``; yields False if not taken (non-blocking/read-only)."""
    if fcntl is None:  # pragma: no cover
        yield True
        return
    try:
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if blocking:
            raise
        fd = -1
    try:
        taken = fd >= 0
        if taken:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                taken = False
        yield taken
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


# --------------------------------------------------------------------------- manifest


def _check_modality(modality: str) -> str:
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return modality


def _read_manifest(root: Path) -> dict[str, Any]:
    """Load and validate ``root/manifest.json``; errors name the file."""
    path = root / MANIFEST
    if not root.is_dir():
        raise NotAGalleryError(f"{root} is not a gallery: no such directory")
    if not path.is_file():
        raise NotAGalleryError(f"{root} is not a gallery: {path} does not exist")
    m = read_tagged_json(path, FORMAT_NAME, error=CorruptGalleryError, version_key="format_version",
                         max_version=FORMAT_VERSION)
    try:
        for key, typ in (("space_id", str), ("dim", int), ("model", str), ("backend", str)):
            if not isinstance(m.get(key), typ):
                raise ValueError(f"field {key!r} missing or not {typ.__name__}")
        if m["dim"] <= 0:
            raise ValueError(f"dim must be positive, got {m['dim']}")
        validate_spec(m["backend"])
        mods = m.get("modalities")
        if not isinstance(mods, dict) or set(mods) != set(MODALITIES):
            raise ValueError(f"'modalities' must have exactly the keys {MODALITIES}")
        for name, mod in mods.items():
            chunks = mod.get("chunks") if isinstance(mod, dict) else None
            if not isinstance(chunks, list):
                raise ValueError(f"modalities.{name}.chunks must be a list")
            for c in chunks:
                if not isinstance(c, dict) or not all(
                    isinstance(c.get(k), t) for k, t in _CHUNK_FIELDS.items()
                ):
                    raise ValueError(f"bad chunk entry in modalities.{name}: {c!r}")
            if mod.get("count") != sum(c["count"] for c in chunks):
                raise ValueError(f"modalities.{name}.count does not match its chunks")
    except ValueError as e:
        raise CorruptGalleryError(f"corrupt gallery manifest {path}: {e}") from e
    return m


_CHUNK_FIELDS = {"name": str, "count": int, "npz": str, "npz_sha256": str, "meta": str, "meta_sha256": str}


def _manifest_stat(root: Path | str) -> tuple[int, int, int] | None:
    """(inode, size, mtime_ns) of the manifest (``root``: the gallery directory, or the manifest's
    path as a string: the hot path of every search builds no path object): changes whenever a
    writer replaces it."""
    try:
        st = os.stat(root if isinstance(root, str) else root / MANIFEST)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    data = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    atomic_write_bytes(root / MANIFEST, data)


def _chunk_key(manifest: dict[str, Any], modality: str, upto: int | None = None) -> str:
    """Fingerprint of what a cached index of ``modality`` must contain (its first ``upto`` chunks:
    a cache of a prefix is extended with the chunks appended since)."""
    chunks = [(c["name"], c["npz_sha256"], c["count"]) for c in manifest["modalities"][modality]["chunks"][:upto]]
    blob = json.dumps({"backend": manifest["backend"], "dim": manifest["dim"], "chunks": chunks})
    return _sha256(blob.encode())


@dataclass
class _Columns:
    """In-memory copy of one modality, loaded chunk by chunk (chunks are append-only)."""

    chunks: list[str] = field(default_factory=list)  # chunk names whose ids are loaded
    ids: list[str] = field(default_factory=list)
    pos: dict[str, int] = field(default_factory=dict)  # id -> row
    vectors: np.ndarray | None = None  # rows of the first ``vec_chunks`` chunks, read-only
    vec_chunks: int = 0
    metadata: list[dict[str, Any]] = field(default_factory=list)  # rows of the first ``meta_chunks``
    meta_chunks: int = 0


# --------------------------------------------------------------------------- gallery


class Gallery:
    """Embeddings of images and texts in one embedding space, stored under one directory.

    Open with :meth:`create` (new or resume) or :meth:`open`. One writer at a time per directory
    (enforced with an advisory lock while a chunk is committed); any number of readers.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        """Internal; use :meth:`create` or :meth:`open`."""
        self.path = path
        self._manifest_path = str(path / MANIFEST)
        self._manifest = manifest
        self._cols: dict[str, _Columns] = {m: _Columns() for m in MODALITIES}
        # modality -> (chunk key, chunk names, index, ntotal last written to the on-disk cache)
        self._indexes: dict[str, tuple[str, list[str], VectorIndex, int]] = {}
        self._index_manifest: dict[str, dict[str, Any]] = {}  # modality -> the manifest its index matches
        self._lock = threading.RLock()  # one thread at a time grows or searches an index
        self._stat = _manifest_stat(path)
        self._closed = False

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, path: str | Path, *, space_id: str, dim: int, model: str, backend: str = "flat") -> "Gallery":
        """Create a gallery at ``path``, or resume the one there if it has the same ``space_id``.

        Raises :class:`SpaceMismatchError` if a gallery of another space exists there, and
        ``ValueError`` for a different ``dim`` or a non-empty directory that is not a gallery.
        A different ``backend`` on resume replaces the stored one (the index is derived data).
        """
        if not isinstance(space_id, str) or not space_id:
            raise ValueError("space_id must be a non-empty string")
        if int(dim) <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        backend = validate_spec(backend)
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        with _dir_lock(root):
            if (root / MANIFEST).exists():
                manifest = _read_manifest(root)
                if manifest["space_id"] != space_id:
                    raise SpaceMismatchError(manifest["space_id"], space_id, f"resume gallery {root}",
                                             what="model's embeddings",
                                             hint="use a new directory for a new embedding space")
                if manifest["dim"] != int(dim):
                    raise ValueError(f"gallery {root} has dim {manifest['dim']}, asked for {dim}")
                if manifest["backend"] != backend:
                    manifest["backend"], manifest["updated"] = backend, _now()
                    _write_manifest(root, manifest)
            else:
                stray = [p.name for p in root.iterdir() if not p.name.startswith(".") and p.name != CHUNK_DIR]
                if stray:
                    raise ValueError(f"{root} is not empty and not a gallery (found {', '.join(sorted(stray)[:5])})")
                now = _now()
                manifest = {
                    "format": FORMAT_NAME,
                    "format_version": FORMAT_VERSION,
                    "space_id": space_id,
                    "dim": int(dim),
                    "model": str(model),
                    "backend": backend,
                    "created": now,
                    "updated": now,
                    "modalities": {m: {"count": 0, "chunks": []} for m in MODALITIES},
                }
                (root / CHUNK_DIR).mkdir(exist_ok=True)
                _write_manifest(root, manifest)
            gallery = cls(root, manifest)
            gallery._collect_garbage_locked()
        return gallery

    @classmethod
    def open(cls, path: str | Path) -> "Gallery":
        """Open an existing gallery; uncommitted leftovers of a crash are removed if possible."""
        root = Path(path)
        gallery = cls(root, _read_manifest(root))
        with contextlib.suppress(OSError), _dir_lock(root, blocking=False) as taken:
            if taken:
                gallery._manifest, gallery._stat = _read_manifest(root), _manifest_stat(root)
                gallery._collect_garbage_locked()
        return gallery

    def refresh(self) -> bool:
        """Re-read the manifest if another process committed since it was read; True if it changed.
        Cheap when nothing changed (one ``stat``); loaded chunks and indexes are kept and grown."""
        self._check_open()
        st = _manifest_stat(self._manifest_path)
        if st == self._stat:
            return False
        with self._lock:
            self._manifest, self._stat = _read_manifest(self.path), st
        return True

    def close(self) -> None:
        """Drop cached vectors and indexes; the object is unusable afterwards."""
        self._cols.clear()
        self._indexes.clear()
        self._index_manifest.clear()
        self._closed = True

    def __enter__(self) -> "Gallery":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ properties

    @property
    def space_id(self) -> str:
        return self._manifest["space_id"]

    @property
    def dim(self) -> int:
        return self._manifest["dim"]

    @property
    def model(self) -> str:
        return self._manifest["model"]

    @property
    def backend(self) -> str:
        return self._manifest["backend"]

    @property
    def manifest(self) -> dict[str, Any]:
        """A copy of the committed manifest."""
        return json.loads(json.dumps(self._manifest))

    def count(self, modality: str) -> int:
        return self._manifest["modalities"][_check_modality(modality)]["count"]

    def __len__(self) -> int:
        return sum(self.count(m) for m in MODALITIES)

    def __repr__(self) -> str:
        counts = ", ".join(f"{m}={self.count(m)}" for m in MODALITIES)
        return f"Gallery({str(self.path)!r}, space={self.space_id[:12]}, dim={self.dim}, {counts})"

    # ------------------------------------------------------------------ reading

    def _check_open(self) -> None:
        if self._closed:
            raise GalleryError(f"gallery {self.path} is closed")

    def _chunks(self, modality: str) -> list[dict[str, Any]]:
        return self._manifest["modalities"][modality]["chunks"]

    def _sync(self, modality: str) -> _Columns:
        """Bring the id cache of ``modality`` up to the manifest (loads only new chunks)."""
        self._check_open()
        _check_modality(modality)
        chunks = self._chunks(modality)
        cols = self._cols[modality]
        if cols.chunks != [c["name"] for c in chunks[: len(cols.chunks)]]:
            cols = self._cols[modality] = _Columns()  # history changed under us: reload
        for entry in chunks[len(cols.chunks):]:
            ids = [str(i) for i in self._load_npz(entry, "ids")]
            cols.chunks.append(entry["name"])
            cols.pos.update(zip(ids, range(len(cols.ids), len(cols.ids) + len(ids))))
            cols.ids.extend(ids)
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
        return list(self._sync(modality).ids)

    #: a row keeps its position for ever (rows are only appended): a catalog may record it
    stable_positions = True

    def positions(self, modality: str, keys: Sequence[str]) -> dict[str, int]:
        """Row of each of ``keys`` held (absent keys are left out)."""
        pos = self._sync(modality).pos
        return {k: pos[k] for k in keys if k in pos}

    def __contains__(self, item: tuple[str, str]) -> bool:
        """``("image", "id7") in gallery``."""
        modality, id_ = item
        return id_ in self._sync(modality).pos

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
        cols = self._sync(modality)
        missing = [k for k in keys if k not in cols.pos]
        if missing:
            raise KeyError(f"gallery {self.path} holds no {modality} vector {missing[0]!r}")
        rows = np.asarray([cols.pos[k] for k in keys], np.int64)
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
        if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == self.dim and \
                n is None and x.flags.c_contiguous:  # the common case, checked cheaply
            if not np.isfinite(x).all():
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
        if not np.isfinite(arr).all():
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
        self._check_open()
        _check_modality(modality)
        if space_id != self.space_id:
            raise SpaceMismatchError(self.space_id, space_id, f"add {modality} vectors to gallery {self.path}",
                                     what="vectors", hint="a gallery holds one embedding space")
        ids = list(ids)
        bad = [i for i in ids if not isinstance(i, str) or not i]
        if bad:
            raise ValueError(f"ids must be non-empty strings, got {bad[:3]!r}")
        vecs = self._check_rows(vectors, "vectors", n=len(ids))
        metas = [{} for _ in ids] if metadata is None else list(metadata)
        if len(metas) != len(ids):
            raise ValueError(f"got {len(metas)} metadata rows for {len(ids)} ids")
        if not all(isinstance(m, dict) for m in metas):
            raise ValueError("metadata rows must be dicts")
        seen: set[str] = set()
        dups = [i for i in ids if i in seen or seen.add(i)]  # type: ignore[func-returns-value]
        if dups:
            raise DuplicateIdError(f"ids repeated within one batch: {sorted(set(dups))[:5]}")

        with _dir_lock(self.path):
            self._manifest = _read_manifest(self.path)  # another writer may have committed
            cols = self._sync(modality)
            present = [i for i in ids if i in cols.pos]
            if present and not skip_existing:
                raise DuplicateIdError(
                    f"{len(present)} {modality} ids already in gallery {self.path}: {present[:5]} "
                    "(pass skip_existing=True to drop them)")
            if present:
                keep = [i not in cols.pos for i in ids]
                ids = [i for i, k in zip(ids, keep) if k]
                metas = [m for m, k in zip(metas, keep) if k]
                vecs = vecs[np.asarray(keep, dtype=bool)]
            if not ids:
                return 0
            self._commit_chunk(modality, ids, vecs, metas)
        return len(ids)

    def _commit_chunk(self, modality: str, ids: list[str], vecs: np.ndarray, metas: list[dict[str, Any]]) -> None:
        """Write chunk files, then the manifest that names them (caller holds the lock)."""
        chunks = self._chunks(modality)
        # one past the highest number (not the count: repair may have dropped a chunk)
        name = f"{modality}-{1 + max((int(c['name'].rsplit('-', 1)[1]) for c in chunks), default=-1):05d}"
        buf = io.BytesIO()
        np.savez(buf, vectors=vecs, ids=np.asarray(ids, dtype=str))
        npz = buf.getvalue()
        try:
            meta = "".join(json.dumps(m, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n" if m else "{}\n"
                           for m in metas).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata must be JSON-serialisable: {e}") from e
        entry = {
            "name": name,
            "count": len(ids),
            "npz": f"{CHUNK_DIR}/{name}.npz",
            "npz_sha256": _sha256(npz),
            "meta": f"{CHUNK_DIR}/{name}.jsonl",
            "meta_sha256": _sha256(meta),
        }
        (self.path / CHUNK_DIR).mkdir(exist_ok=True)
        atomic_write_bytes(self.path / entry["npz"], npz)
        atomic_write_bytes(self.path / entry["meta"], meta)
        manifest = json.loads(json.dumps(self._manifest))
        mod = manifest["modalities"][modality]
        mod["chunks"].append(entry)
        mod["count"] += len(ids)
        manifest["updated"] = _now()
        _write_manifest(self.path, manifest)  # <- the commit point
        self._manifest, self._stat = manifest, _manifest_stat(self.path)
        cols = self._cols[modality]  # vectors / metadata of the new chunk load lazily
        cols.chunks.append(name)
        cols.pos.update(zip(ids, range(len(cols.ids), len(cols.ids) + len(ids))))
        cols.ids.extend(ids)

    def _orphans(self) -> list[Path]:
        """Files that look like ours but are not committed (crash leftovers)."""
        committed = {c[k] for m in MODALITIES for c in self._chunks(m) for k in ("npz", "meta")}
        found: list[Path] = []
        chunk_dir = self.path / CHUNK_DIR
        if chunk_dir.is_dir():
            found += [p for p in chunk_dir.iterdir() if p.name.startswith(_TMP)
                      or (_CHUNK_RE.match(p.name) and f"{CHUNK_DIR}/{p.name}" not in committed)]
        found += [p for p in self.path.iterdir() if p.name.startswith(_TMP)]
        return sorted(found)

    def _collect_garbage_locked(self) -> None:
        """Delete crash leftovers; caller holds the lock and has just re-read the manifest."""
        for p in self._orphans():
            log.info("removing uncommitted file %s", p)
            with contextlib.suppress(OSError):
                p.unlink()

    # ------------------------------------------------------------------ search

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
                if index.ntotal >= 1.25 * max(saved, 1):  # keep the on-disk cache roughly current
                    self._save_cached_index(modality, key, index, len(names))
                    saved = index.ntotal
                self._indexes[modality] = (key, names, index, saved)
                self._index_manifest[modality] = manifest
                self._watch(modality, index)
                return index
        index, saved = self._load_cached_index(modality)
        if index is None:
            index = make_index(self.backend, self.dim)
            index.add(self.vectors(modality))
            self._save_cached_index(modality, key, index, len(names))
            saved = index.ntotal
        elif index.ntotal >= 1.25 * max(saved, 1):  # a cache of a prefix, extended by many rows
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

    def build_index(self, modality: str | None = None) -> dict[str, dict[str, Any]]:
        """Build (and cache) the search index of ``modality`` (default: every modality with
        rows) now, waiting for it: for an ``auto`` space past its threshold, the graph index.
        Returns :meth:`index_info`. Searches in other threads keep running meanwhile."""
        mods = [modality] if modality else [m for m in MODALITIES if self.count(m)]
        for m in mods:
            with self._lock:
                index = self._index(m)
            if isinstance(index, AutoIndex):
                index.build()
        return self.index_info()

    def index_info(self) -> dict[str, dict[str, Any]]:
        """Per modality with rows: the backend spec, the index answering searches now (``Flat`` or a
        graph's factory string; None before the first search of this process loaded it), whether a
        graph index is being built, and the row count."""
        out: dict[str, dict[str, Any]] = {}
        for m in MODALITIES:
            n = self.count(m)
            if not n:
                continue
            cached = self._indexes.get(m)
            index = cached[2] if cached else None
            if isinstance(index, AutoIndex):
                in_use, building = index.in_use, index.building
            elif index is not None:
                in_use, building = self.backend, False
            else:
                in_use, building = self._cached_kind(m), False
            out[m] = {"backend": self.backend, "in_use": in_use, "building": building, "count": n}
        return out

    def _cached_kind(self, modality: str) -> str | None:
        """What the on-disk index cache of ``modality`` holds (its stamp), without loading it."""
        if not self.backend.startswith("auto"):
            return self.backend
        try:
            stamp = json.loads(self._index_paths(modality)[1].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return stamp.get("in_use")

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
            data = data_path.read_bytes()
            if stamp.get("sha256") != _sha256(data):
                log.warning("cached index %s does not match its sha256: rebuilding it", data_path)
                return None, 0
            index = load_index(self.backend, self.dim, data)
        except Exception as e:  # any problem with a cache means: rebuild it
            if not isinstance(e, FileNotFoundError):
                log.warning("ignoring cached index %s: %s", data_path, e)
            return None, 0
        if index.ntotal != sum(c["count"] for c in chunks[:upto]):
            return None, 0
        saved = index.ntotal
        for entry in chunks[upto:]:  # appended since the cache was written
            index.add(self._load_npz(entry, "vectors"))
        return index, saved

    def _save_cached_index(self, modality: str, key: str, index: VectorIndex, n_chunks: int) -> None:
        """Write ``index`` (the rows of the first ``n_chunks`` chunks, fingerprint ``key``) as the
        on-disk cache of ``modality``."""
        data = index.to_bytes()
        if data is None:
            return
        data_path, key_path = self._index_paths(modality)
        try:
            with _dir_lock(self.path, blocking=False) as taken:
                if not taken:
                    return  # a writer is busy (or read-only): keep the index in memory only
                # key file gone first, so a crash can never pair the old key with a new index
                with contextlib.suppress(FileNotFoundError):
                    key_path.unlink()
                _fsync_dir(self.path)
                atomic_write_bytes(data_path, data)
                stamp = {"key": key, "chunks": int(n_chunks), "backend": self.backend, "ntotal": index.ntotal,
                         "sha256": _sha256(data), "written": _now()}
                if isinstance(index, AutoIndex):
                    stamp["in_use"] = index.in_use
                atomic_write_bytes(key_path, json.dumps(stamp).encode("utf-8"))
        except OSError as e:
            log.warning("could not cache index %s: %s", data_path, e)

    def search(
        self,
        modality: str,
        queries: np.ndarray,
        k: int = 10,
        *,
        space_id: str,
        bridge: Bridge | None = None,
        mask: np.ndarray | None = None,
    ) -> SearchResult:
        """Top-``k`` rows of ``modality`` by inner product for each query row.

        ``space_id`` is the space the queries were embedded in. If it is not the gallery's, a
        ``bridge`` with ``bridge.source == space_id`` and ``bridge.target == gallery.space_id``
        maps the queries across; otherwise :class:`SpaceMismatchError` is raised. ``mask`` (bool,
        one per row in insertion order) restricts the search to the rows where it is True; rows
        committed after the mask was made count as False (a reader's snapshot never sees them).
        """
        self._check_open()
        _check_modality(modality)
        q = np.asarray(queries)
        if space_id != self.space_id:
            action = f"search {modality} gallery {self.path}"
            if bridge is None:
                raise SpaceMismatchError(self.space_id, space_id, action, what="queries", expected_name=self.model,
                                         hint="embed them with the gallery's model or pass a bridge")
            name = getattr(bridge, "name", "") or type(bridge).__name__
            if (bridge.source, bridge.target) != (space_id, self.space_id):
                raise SpaceMismatchError(self.space_id, space_id, action, what="queries", expected_name=self.model,
                                         hint=f"the bridge {name} maps {bridge.source} (its source) -> "
                                              f"{bridge.target} (its target)")
            q = np.asarray(bridge(q))
            if q.ndim == 2 and q.shape[1] != self.dim:
                raise ValueError(f"bridge {name} outputs {q.shape[1]}-d vectors but gallery {self.path} holds "
                                 f"{self.dim}-d vectors: the bridge was fitted for another model")
        q = self._check_rows(q, "queries")
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock:
            index = self._index(modality)
            scores, positions = index.search(q, int(k), mask=mask, checked=True)  # a shorter mask: padded
            # inner products of unit vectors: a score outside [-1, 1] can only be rounding
            np.clip(scores, -1.0, 1.0, out=scores)
            return SearchResult(scores=scores, positions=positions, names=self._names_at(modality))

    def _names_at(self, modality: str) -> Any:
        """The row keys of ``modality`` as committed now, read only when asked for (a search result
        names its hits lazily: most callers map positions, and a large gallery's keys are not
        loaded for them), even after the gallery was closed."""
        manifest = self._manifest  # replaced, never changed, by a commit: it stands for this moment

        def names() -> list[str]:
            if not self._closed:
                return self._sync(modality).ids
            return [str(i) for e in manifest["modalities"][modality]["chunks"] for i in self._load_npz(e, "ids")]

        return names

    # ------------------------------------------------------------------ integrity

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
        with self._lock, _dir_lock(self.path):
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
