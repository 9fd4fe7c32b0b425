"""Adopting vectors computed elsewhere: :func:`import_source` and its bulk path :func:`add_vectors`.

:func:`import_source` reads an :class:`~nobackfill.adopt.sources.ImportSource` (clip-retrieval's
output, npy / npz / faiss with a table) batch by batch into a collection whose current model is the
declared one, after the model check (:mod:`.model_check`: a random sample re-embedded with the
declared model must match the stored vectors) has accepted the vectors; nothing is created or
committed when it refuses. Killed at any point, the same call again finishes the job: committed
batches are found unchanged, vectors stored by a killed batch are served without being stored
again. The plan records each import (where from, how many, the check's verdict or that it was
skipped).

:func:`add_vectors` stores one batch of precomputed vectors in the collection's current space and
commits their items in one catalog transaction. An item's vector key is its id plus a hash of its
vector's bytes, so the same batch given again changes nothing, a changed vector under an existing
id replaces it (an upsert), and vectors stored by a run killed before its commit are served by the
next run without being stored twice (the same guarantees as
:func:`~nobackfill.collection.ingest.add_items`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..memory import cyclic_gc_paused
from ..progress import progress_bar
from ..collection.collection import Collection, is_collection
from ..collection.commit_worker import CommitWorker
from ..catalog.items import JsonRows, id_problem, plain_ids, rows_json
from .model_check import DEFAULT_SAMPLES, DEFAULT_THRESHOLD, check_model, sample_rows, skipped_check
from ..gallery.chunks import CheckedIds
from ..gallery.manifest import MODALITIES
from ..gallery.types import DuplicateIdError, SpaceMismatchError, other_modality_error
from ..ann.vector_index import all_finite
from .import_report import ImportReport

if TYPE_CHECKING:  # the encoder module pulls in torch
    from ..encoders.base import DualEncoder
    from .sources import ImportSource

__all__ = ["ImportReport", "ModelCheckRefused", "VectorsReport", "add_vectors", "import_source", "vector_rev"]


class ModelCheckRefused(ValueError):
    """The stored vectors were not made by the declared model (the message gives the numbers);
    nothing was created or committed."""


@dataclass
class VectorsReport:
    """What :func:`add_vectors` did with one batch."""

    added: int = 0  # committed: new ids, new vectors under existing ids, or new sources / metadata
    unchanged: int = 0  # already held with the same vector, source and metadata
    stored: int = 0  # vectors written to the store (fewer when held already, e.g. stored by a killed run)
    replaced: int = 0  # of the added: ids held with another vector (counted with ``check_held``)

    def merge(self, other: "VectorsReport") -> None:
        for k in ("added", "unchanged", "stored", "replaced"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def to_dict(self) -> dict[str, int]:
        return {"added": self.added, "unchanged": self.unchanged, "stored": self.stored}


_MIX = np.random.default_rng(0x5EED).integers(1, 2**63, size=1 << 15, dtype=np.uint64) | np.uint64(1)


def vector_rev(vectors: np.ndarray, prefix: str = "") -> list[str]:
    """Per row, 16 hex digits that change when any bit of its float32 vector does (the version part
    of an imported item's vector key), after ``prefix`` (ASCII): a multiply-sum of its 64-bit words
    with fixed odd constants, finalised with splitmix64's mixer (vectorised: a million rows take
    about a second)."""
    v = np.ascontiguousarray(vectors, np.float32)
    if v.shape[1] % 2:  # whole 64-bit words: pad with a zero column
        v = np.concatenate([v, np.zeros((len(v), 1), np.float32)], axis=1)
    words = v.view(np.uint64)
    if words.shape[1] > len(_MIX):
        raise ValueError(f"vectors wider than {2 * len(_MIX)} dimensions are not supported")
    with np.errstate(over="ignore"):
        h = np.einsum("ij,j->i", words, _MIX[:words.shape[1]])  # the multiply-sum, without a temporary
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    # big-endian words: each row's 16 digits, most significant first, in lines cut apart in C
    digits = np.frombuffer(h.astype(">u8").tobytes().hex().encode("ascii"), np.uint8).reshape(-1, 16)
    lines = np.empty((len(h), len(prefix) + 17), np.uint8)
    lines[:, :len(prefix)] = np.frombuffer(prefix.encode("ascii"), np.uint8)
    lines[:, len(prefix):-1] = digits
    lines[:, -1] = ord("\n")
    return lines.tobytes().decode("ascii").split("\n")[:-1]


def add_vectors(collection: Collection, ids: Sequence[str], vectors: np.ndarray, *,
                modality: str | Sequence[str], sources: Sequence[Mapping[str, Any]] | None = None,
                metadata: Sequence[Mapping[str, Any]] | None = None, space_id: str | None = None,
                where: str = "batch", check_held: bool = False) -> VectorsReport:
    """Add one batch of items with their precomputed vectors (of the collection's current model).

    ``modality``: one for the batch or one per row; ``sources``: per row, what the item can be
    embedded again from (an image ``{"path": ...}``, a text ``{"text": ...}``; empty when there
    is none: the item is searchable but cannot be backfilled); ``metadata``: per row, returned with
    hits and filterable. ``space_id`` (default: the current one) must be the current space.
    ``where`` names the batch in errors. Raises ``ValueError`` (nothing written) for a bad id, an id
    given twice in the batch, lengths that differ, or vectors that are not finite ``(n, dim)``.
    ``check_held``: count the ids held with another vector, refuse one holding the other modality."""
    staged = _stage_vectors(collection, ids, vectors, modality=modality, sources=sources, metadata=metadata,
                            space_id=space_id, where=where, check_held=check_held)
    report = VectorsReport(stored=staged.stored, replaced=staged.replaced)
    rows = staged.rows()
    if rows:
        hint = {k: p for k, p in zip(staged.keys, staged.positions) if p is not None}
        report.added = collection.commit_rows(rows, stored=(staged.space, hint), skip_unchanged=True)
    report.unchanged = len(rows) - report.added
    return report


def _replaced(collection: Collection, ids: list[str], keys: Sequence[str], mods: list[str], where: str) -> int:
    """How many of ``ids`` the collection holds under another key (another vector: what the batch
    replaces, counted and said); an id holding an item of the other modality is refused, as ``add``
    refuses it (trial AH: an import turned image ``000005`` into a text, "added 200, already there 0")."""
    old = collection.catalog.rows_by_id(ids)
    other = [j for j, i in enumerate(ids) if i in old and old[i].modality != mods[j]]
    if other:
        j = other[0]
        raise other_modality_error(ids[j], old[ids[j]].modality, mods[j], len(other) - 1, f"{where}: row {j + 1}")
    return sum(i in old and old[i].key != k for i, k in zip(ids, keys))


@dataclass
class _Staged:
    """One batch of :func:`add_vectors` with its vectors stored, its catalog rows still to commit
    (column by column)."""

    ids: list[str]
    modality: list[str]
    keys: list[str]
    sources: list[str]  # JSON
    metadata: list[str]  # JSON
    space: str
    positions: list[int | None]  # each row's row in the space's store (None: the store does not say)
    stored: int = 0  # vectors written (the others were held already)
    replaced: int = 0  # ids held under another key (counted where asked: ``check_held``)

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """The rows :meth:`~nobackfill.collection.collection.Collection.commit_rows` takes."""
        return list(zip(self.ids, self.modality, self.keys, self.sources, self.metadata))

    def columns(self) -> tuple[list[Any], ...]:
        """The placed rows column by column, without the space (what a commit worker takes:
        :meth:`~nobackfill.collection.collection.Collection.commit_placed_columns`)."""
        return self.ids, self.modality, self.keys, self.sources, self.metadata, self.positions


def _stage_vectors(collection: Collection, ids: Sequence[str], vectors: np.ndarray, *,
                   modality: str | Sequence[str], sources: Sequence[Mapping[str, Any]] | None,
                   metadata: Sequence[Mapping[str, Any]] | None, space_id: str | None, where: str,
                   check_held: bool = False) -> _Staged:
    """The checks of :func:`add_vectors`, then the batch's vectors stored: what is left to commit."""
    staged, v = _checked_batch(collection, ids, vectors, modality=modality, sources=sources, metadata=metadata,
                               space_id=space_id, where=where, check_held=check_held)
    _store_batch(collection, staged, v)
    return staged


def _checked_batch(collection: Collection, ids: Sequence[str], vectors: np.ndarray, *,
                   modality: str | Sequence[str], sources: Sequence[Mapping[str, Any]] | None,
                   metadata: Sequence[Mapping[str, Any]] | None, space_id: str | None,
                   where: str, check_held: bool = False) -> tuple[_Staged, np.ndarray]:
    """The checks of :func:`add_vectors`, keys and JSON: the batch ready to store (its vectors as
    checked float32 rows beside it), nothing written yet; ``check_held``: :func:`_replaced` too."""
    n = len(ids)
    current = collection.current_space
    if space_id is not None and space_id != current:
        raise SpaceMismatchError(current, space_id, f"add vectors to collection {collection.path}",
                                 what="given vectors", hint="import vectors of the collection's current model")
    entry = collection.space(current)
    mods = [modality] * n if isinstance(modality, str) else list(modality)
    srcs = [{} for _ in range(n)] if sources is None else sources if isinstance(sources, JsonRows) else list(sources)
    metas = [{} for _ in range(n)] if metadata is None else metadata if isinstance(metadata, JsonRows) else \
        list(metadata)
    for name, col in (("modality", mods), ("sources", srcs), ("metadata", metas)):
        if len(col) != n:
            raise ValueError(f"{where}: {len(col)} {name} rows for {n} ids")
    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[0] != n:
        raise ValueError(f"{where}: vectors must be ({n}, {entry.dim}), got {tuple(v.shape)}")
    if v.shape[1] != entry.dim:
        raise ValueError(f"{where}: vectors are {v.shape[1]}-d but the current model of collection "
                         f"{collection.path} ({entry.name}) embeds {entry.dim}-d")
    v = np.ascontiguousarray(v, np.float32)
    if not all_finite(v):
        row = int(np.flatnonzero(~np.isfinite(v).all(axis=1))[0])
        raise ValueError(f"{where}: row {row + 1} holds NaN or inf")
    for m in set(mods):
        if m not in MODALITIES:
            raise ValueError(f"{where}: modality must be one of {MODALITIES}, got {m!r}")
        if not entry.embeds(m):
            raise ValueError(f"{where}: the current model of collection {collection.path} ({entry.name}) embeds "
                             f"only {', '.join(entry.modalities)}: cannot add {m} items")
    ids = list(ids)
    if ids and not plain_ids(ids):
        for row, i in enumerate(ids):  # the cheap test failed: find the row (non-printable is not always bad)
            problem = id_problem(i)
            if problem:
                raise ValueError(f"{where}: row {row + 1}: {problem}")
    if len(set(ids)) < n:
        seen: dict[str, int] = {}
        for row, i in enumerate(ids):
            if seen.setdefault(i, row) != row:
                raise DuplicateIdError(f"{where}: id {i!r} is given twice (rows {seen[i] + 1} and {row + 1})")
    # distinct ids, each printable: their keys are distinct non-empty strings without NUL
    keys = CheckedIds(map(str.__add__, ids, vector_rev(v, prefix="#")))
    replaced = _replaced(collection, ids, keys, mods, where) if check_held else 0
    try:
        return _Staged(ids, mods, keys, rows_json(srcs), rows_json(metas), current, [], replaced=replaced), v
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: sources and metadata must be JSON objects of JSON values: {e}") from None


def _prepared(collection: Collection, staged: _Staged, v: np.ndarray) -> Any:
    """The chunk a one-modality batch would make in a local store, packed and hashed ahead of
    storing (:meth:`~nobackfill.gallery.chunks.GalleryChunks.prepare_rows`); None elsewhere."""
    g = collection.gallery(staged.space)
    if not staged.ids or len(set(staged.modality)) != 1 or not hasattr(g, "prepare_rows"):
        return None
    return g.prepare_rows(staged.modality[0], staged.keys, v)


def _store_batch(collection: Collection, staged: _Staged, v: np.ndarray, prepared: Any = None) -> None:
    """Store the vectors ``v`` of a checked batch in its space (held keys are skipped), noting
    how many were written and each one's row; ``prepared``: the batch's :func:`_prepared`."""
    n, mods, keys, space = len(staged.ids), staged.modality, staged.keys, staged.space
    if not n:
        return
    g = collection.gallery(space)
    if len(set(mods)) == 1:
        staged.stored, staged.positions = _store(g, mods[0], keys, v, space, prepared)
        return
    staged.positions = [None] * n
    for m in dict.fromkeys(mods):  # vectors first (held keys are skipped), then the items: one commit
        sel = [j for j in range(n) if mods[j] == m]
        added, at = _store(g, m, [keys[j] for j in sel], v[sel], space)
        staged.stored += added
        for j, p in zip(sel, at):
            staged.positions[j] = p


def _store(g: Any, modality: str, keys: list[str], vectors: np.ndarray, space: str,
           prepared: Any = None) -> tuple[int, list[int | None]]:
    """Store ``vectors`` under ``keys`` (held keys skipped): (how many were written, each key's row)."""
    if hasattr(g, "add_rows"):  # a local store says where each key is as it stores the batch
        added, at = g.add_rows(modality, keys, vectors, space_id=space, prepared=prepared)
        return added, at.tolist()
    added = g.add(modality, keys, vectors, None, space_id=space, skip_existing=True)
    pos = g.positions(modality, keys)
    return added, [pos.get(k) for k in keys]  # (None: a store that does not say)


def _prefetched(batches: Iterator[Any]) -> Iterator[Any]:
    """``batches``, the next one read by a background thread while the caller writes this one
    (reading -- parquet decoding, normalising -- and the catalog's inserts release the GIL)."""
    box: queue.Queue = queue.Queue(maxsize=1)
    done = object()
    stop = threading.Event()

    def read() -> None:
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        box.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put(done)
        except BaseException as e:  # handed to the caller, raised there
            box.put(e)

    t = threading.Thread(target=read, name="import-reader", daemon=True)
    t.start()
    try:
        while True:
            b = box.get()
            if b is done:
                return
            if isinstance(b, BaseException):
                raise b
            yield b
    finally:
        stop.set()
        t.join(timeout=5)


class _StoreAndHandOver:
    """A thread that stores each checked batch's vectors, then hands its rows to a commit worker
    (in the order given: a batch's vectors are durable before its rows leave), while the import
    checks and packs the next batch. Storing is mostly writing and fsyncing a chunk, which run
    without the GIL: they overlap the next batch's checks, keys, JSON and packing."""

    def __init__(self, collection: Collection, worker: CommitWorker) -> None:
        self.collection, self.worker = collection, worker
        self.stored = 0  # vectors written
        self._todo: queue.Queue = queue.Queue(maxsize=1)  # one batch checked ahead of the one stored
        self._committed: queue.Queue = queue.Queue()  # numbers of the batches the worker committed
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="import-store", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                job = self._todo.get()
                if job is None:
                    return
                staged, v, prepared = job
                _store_batch(self.collection, staged, v, prepared)
                self.stored += staged.stored
                for k in self.worker.submit(staged.space, staged.columns()):
                    self._committed.put(k)
        except BaseException as e:  # raised by the import at its next call
            self._error = e
            while self._todo.get() is not None:  # the import's next batches are dropped until it ends
                pass

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def committed(self) -> list[int]:
        """The numbers of the batches committed since the last call."""
        out = []
        while True:
            try:
                out.append(self._committed.get_nowait())
            except queue.Empty:
                return out

    def put(self, staged: _Staged, v: np.ndarray) -> list[int]:
        """Pack a checked batch's chunk (:func:`_prepared`: in the calling thread, which has time
        to spare while this one writes) and queue it (waits while one is queued already); returns
        :meth:`committed`."""
        self._raise()
        self._todo.put((staged, v, _prepared(self.collection, staged, v)))
        return self.committed()

    def close(self) -> list[int]:
        """Store and hand over what is queued, then wait for the worker: the batches committed since
        the last call."""
        self._todo.put(None)
        self._thread.join()
        self._raise()
        return self.committed() + self.worker.close()

    def abort(self) -> None:
        """Stop the worker (a storing thread waiting on it then ends with its error) and the thread."""
        self.worker.abort()
        with contextlib.suppress(queue.Full):  # taken at once by a thread that failed (it drains)
            self._todo.put(None, timeout=30)
        self._thread.join(timeout=30)


#: sources of at least this many items commit their catalog rows in a process of their own
COMMIT_APART_ROWS = 200_000


def _commit_apart(c: Collection, source: "ImportSource", asked: bool | None) -> bool:
    """Whether an import commits in a :class:`~.commit_worker.CommitWorker` (a local directory
    with an SQLite catalog only: the worker opens the collection by its path)."""
    local = isinstance(c.path, Path) and c.catalog.dialect == "sqlite"
    if asked is None:
        return local and int(source.rows) >= COMMIT_APART_ROWS
    if asked and not local:
        raise ValueError(f"collection {c.path}: only a local collection with an embedded catalog commits an import "
                         "in a process of its own")
    return asked


def run_model_check(source: "ImportSource", encoder: "DualEncoder", model: str, *, samples: int = DEFAULT_SAMPLES,
                    threshold: float = DEFAULT_THRESHOLD, seed: int = 0) -> dict[str, Any]:
    """The model check of ``source`` against ``encoder`` (see :mod:`.model_check`); returns its
    verdict as JSON, or raises :class:`ModelCheckRefused` naming the numbers."""
    picked = sample_rows(source, samples, seed)
    if not picked:
        raise ModelCheckRefused(f"no item of {source.describe()} has a readable source (an image file that exists, "
                                f"a caption) to check that {model} made its vectors; pass --trust-model (trust_model=True) "
                                "to import them unchecked (the plan records that the check was skipped)")
    verdict = check_model(encoder, picked, threshold=threshold, model=model, round_trip=source.round_trip,
                          compression=source.compression)
    if not verdict.accepted:
        raise ModelCheckRefused(verdict.message + " (nothing was imported; --trust-model, trust_model=True in "
                                                  "Python, skips the check)")
    return verdict.to_json()


def import_source(target: "str | Path | Collection", source: "ImportSource", encoder: "DualEncoder", *, model: str,
                  trust_model: bool = False, samples: int = DEFAULT_SAMPLES, threshold: float = DEFAULT_THRESHOLD,
                  backend: str = "auto", progress: bool = True, wait: bool = False,
                  on_batch: Callable[[int], None] | None = None, commit_process: bool | None = None) -> ImportReport:
    """Import ``source`` into the collection ``target`` (created with ``encoder`` as its model when
    it does not exist; otherwise its current model must be ``encoder``'s space). ``model`` is where
    the declared model lives (recorded in the plan). ``on_batch(n)``: called after the n-th batch is
    committed. ``commit_process``: commit the catalog's rows in a child process
    (:mod:`.commit_worker`) while this one reads and stores the next batches; by default for a
    source of at least :data:`COMMIT_APART_ROWS` items into an embedded (SQLite) catalog. Python's
    cyclic garbage collector is paused while the batches go in
    (:func:`~nobackfill.memory.cyclic_gc_paused`). Raises :class:`ModelCheckRefused`, or ``ValueError`` for vectors that do not fit the model (nothing
    created or committed in both cases); see the module doc."""
    t0 = time.perf_counter()
    dim = int(encoder.embed_dim)
    if int(source.dim) != dim:
        raise ValueError(f"{source.describe()}: vectors are {source.dim}-d but {model} embeds {dim}-d vectors")
    where = str(target.path) if isinstance(target, Collection) else str(target)
    existing = target if isinstance(target, Collection) else Collection.open(target) if is_collection(target) else None
    if existing is not None and existing.current_space != encoder.space_id:
        cur = existing.space(existing.current_space)
        raise SpaceMismatchError(cur.space_id, encoder.space_id, f"import vectors into collection {where}",
                                 what=f"vectors declared as {model}'s", expected_name=cur.name,
                                 hint="import into a new collection, or declare the collection's current model")
    if hasattr(source, "check_ids"):  # a repeated, empty or bad id in the id column: refused before any commit
        source.check_ids(where)
    check = skipped_check(model) if trust_model else \
        run_model_check(source, encoder, model, samples=samples, threshold=threshold)
    c = existing if existing is not None else \
        Collection.create(target, space_id=encoder.space_id, dim=dim, model=model, name=getattr(encoder, "name", ""),
                          backend=backend, modalities=list(getattr(encoder, "modalities", MODALITIES)))
    report = ImportReport(source=source.describe(), collection=where, created=existing is None, model_check=check)
    total = VectorsReport()
    held_items = existing is not None and existing.count() > 0  # (ids can collide only with what was there)
    with c.ingesting(wait=wait), cyclic_gc_paused(), \
            progress_bar(progress, f"importing {Path(where).name}", int(source.rows)) as advance:
        apart = _StoreAndHandOver(c, CommitWorker(c.path)) if _commit_apart(c, source, commit_process) else None
        ends: dict[int, tuple[int, int]] = {}  # batch number -> (its end row, its items)
        stayed = [0, 0]  # rows up to the last batch committed, items committed

        def tell(k: int) -> None:
            stayed[0], stayed[1] = ends[k][0], stayed[1] + ends[k][1]
            (on_batch or (lambda _n: None))(k)

        try:
            done = 0
            for n, batch in enumerate(_prefetched(source.batches()), start=1):
                at = f"{source.describe()} rows {batch.row0 + 1}-{batch.row_end}"
                ends[n] = (batch.row_end, len(batch))
                if apart is None:
                    total.merge(add_vectors(c, batch.ids, batch.vectors, modality=batch.modality,
                                            sources=batch.sources, metadata=batch.metadata,
                                            space_id=encoder.space_id, where=at, check_held=held_items))
                    committed = [n]
                else:
                    staged, v = _checked_batch(c, batch.ids, batch.vectors, modality=batch.modality,
                                               sources=batch.sources, metadata=batch.metadata,
                                               space_id=encoder.space_id, where=at, check_held=held_items)
                    total.replaced += staged.replaced
                    committed = apart.put(staged, v)
                report.items += len(batch)
                advance(batch.row_end - done)
                done = batch.row_end
                for k in committed:
                    tell(k)
            if apart is not None:
                for k in apart.close():
                    tell(k)
                worker = apart.worker
                total.stored = apart.stored
                total.added, total.unchanged = worker.added, report.items - worker.added
                report.commit_worker_peak_rss_mb = worker.peak_rss_mb
        except BaseException as e:
            if apart is not None:
                apart.abort()
            if isinstance(e, Exception) and e.args and isinstance(e.args[0], str):  # what stayed, and how to finish
                e.args = (e.args[0] + source.committed_note(*stayed, where, unsure=apart is not None,
                                                            table=isinstance(e, ValueError)), *e.args[1:])
            raise
        record = {"from": source.describe(), "items": report.items, "added": total.added, "model_check": check,
                  "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if total.added or not any(r.get("from") == record["from"] for r in c.plan.space(encoder.space_id).imports):
            c.set_plan(lambda p: p.with_import(encoder.space_id, record))  # (a run that changed nothing: no record)
    report.added, report.unchanged, report.stored, report.replaced = total.added, total.unchanged, total.stored, \
        total.replaced
    report.warnings = list(source.warnings)
    report.seconds = time.perf_counter() - t0
    return report
