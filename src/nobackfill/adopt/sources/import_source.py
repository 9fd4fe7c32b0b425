""":class:`ImportSource`, the streaming reader every layout derives from (batches, rows read
back, image sources, duplicate ids), and :class:`_SeenIds`, the ids read so far."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ...collection.ingest import image_id
from ...gallery.atomic_files import file_sha256
from ...ann.key_index import KeyIndex, key_hashes
from .common import ImportBatch, SourceError
from ...catalog.items import id_problem, plain_ids
from .items import _Items, _own_ids, _Segment, _text, _texts
from .tables import _Chunk
from .vectors import _unit

#: a path with one of these is normalised (``os.path.normpath``)
_DOT, _DOUBLE = os.sep + ".", os.sep * 2
#: first characters of a path cell that :meth:`ImportSource._image_sources` leaves to :meth:`ImportSource._image`:
#: empty, '~' (a home), '.' or a separator (normalised, or absolute) and spaces (perhaps a blank cell; no
#: character past U+3000 is a space to ``str.strip``)
_ODD_FIRST = frozenset({"", "~", ".", os.sep} | {c for c in map(chr, range(0x3001)) if c.isspace()})


class ImportSource:
    """Vectors embedded elsewhere, with their ids and sources, read in batches (see the module
    docstring for the order of rows, the id rule and the checks)."""

    kind = "source"
    #: with an id column, every item's id is that column's (a clip-retrieval caption's is derived)
    _column_ids_only = False
    _ids_checked = False  # check_ids found the id column's ids unique
    #: for vectors a lossy index gave back: its codec (vectors encoded as it stores them, then decoded), and its name
    round_trip: Any = None
    compression = ""

    def __init__(self, segments: list[_Segment], *, batch_rows: int, description: str,
                 ids_from_column: bool, images_root: Path) -> None:
        if int(batch_rows) < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        off = 0
        for seg in segments:
            seg.offset = off
            off += seg.n * seg.k
        self._segments = segments
        self.batch_rows = int(batch_rows)
        self._description = description
        self._ids_from_column = ids_from_column
        self._root_str = os.path.join(os.path.abspath(images_root), "")
        self._dirs: dict[str, bool] = {}
        #: human messages about what was changed or cannot be done (normalised rows, repeats, ...)
        self.warnings: list[str] = []
        self._repeats_note: str | None = None
        dims = {(seg.layers[0].vectors.dim if seg.layers else 0) for seg in segments}
        self.dim = int(next(iter(dims))) if dims else 0

    @property
    def rows(self) -> int:
        """Items in the source (image and caption items of a clip-retrieval row count apart)."""
        return sum(seg.n * seg.k for seg in self._segments)

    def describe(self) -> str:
        """One line for humans: what the source is."""
        return self._description

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._description}>"

    # -- image sources, shared by every layout
    def _abspath(self, raw: str) -> str:
        if raw.startswith("~"):
            raw = os.path.expanduser(raw)
        path = raw if raw.startswith(os.sep) else self._root_str + raw
        if _DOT in path or _DOUBLE in path:
            path = os.path.normpath(path)
        return path

    def _is_file(self, path: str) -> bool:
        """``os.path.isfile``, skipping the stat in folders already known not to exist."""
        folder = path.rpartition(os.sep)[0]
        known = self._dirs.get(folder)
        if known is None:
            if len(self._dirs) > 65536:
                self._dirs.clear()
            known = self._dirs[folder] = os.path.isdir(folder)
        return known and os.path.isfile(path)

    def _image(self, raw_path: str, url: str, cheap: bool, need_id: bool = True) -> tuple[str, dict]:
        """(derived id, source) of an image given its path (as written) and / or url. With
        ``cheap``, no file is read and the id is "" when the file's bytes would give it; without
        ``need_id`` (the table names the ids) no file is touched at all: an import of a million
        images with their ids neither stats nor hashes a million files (the backfill reads each one
        when it embeds it, and counts those it cannot read)."""
        if raw_path and "://" in raw_path:  # a url in the path column
            url, raw_path = url or raw_path, ""
        source: dict[str, Any] = {"path": ""}
        if url:
            source["url"] = url
        digest = None
        if raw_path:
            path = self._abspath(raw_path)
            source["path"] = path
            if not need_id:
                return "", source
            if self._is_file(path):
                if cheap:
                    return "", source
                try:
                    digest = file_sha256(Path(path))
                except OSError:
                    digest = None
                if digest is not None:
                    source["sha256"] = digest
        if digest is not None:
            return image_id(digest), source
        name = raw_path or url
        if not name or not need_id:
            return "", source
        return image_id(hashlib.sha256(name.encode("utf-8")).hexdigest()), source

    def _image_sources(self, paths: list, urls: list | None) -> list[dict]:
        """The sources of image rows whose ids the table gives, from their path and url cells:
        ``_image(_text(path), _text(url), need_id=False)``, or {} for a row with neither. Column by
        column: paths relative to a plain root, absolute paths that need no normalising and urls in
        the path column in one pass; each other row (blank, '~', '.', '//', not text) by ``_image``."""
        root = self._root_str
        rel = _DOT not in root and _DOUBLE not in root  # root + a plain relative path needs no normpath
        out = [({"path": "", "url": r} if "://" in r
                else {"path": root + r} if rel and r[:1] not in _ODD_FIRST and _DOUBLE not in r and _DOT not in r
                else {"path": r} if r[:1] == os.sep and _DOUBLE not in r and _DOT not in r
                else None) if r.__class__ is str else None for r in paths]
        if urls is not None:
            for source, url in zip(out, _texts(urls)):
                if url and source is not None:
                    source["url"] = url  # after "path", as _image sets them; it wins over a url in the path column
        for j in [j for j, source in enumerate(out) if source is None]:
            raw, url = _text(paths[j]), _text(urls[j]) if urls is not None else ""
            out[j] = self._image(raw, url, False, need_id=False)[1] if raw or url else {}
        return out

    # -- items, chunk by chunk
    def _chunk_items(self, seg: _Segment, chunk: _Chunk, m: int, skip: int, cheap: bool = False,
                     layers: Sequence[Sequence[int]] | None = None) -> _Items:
        """The items of table rows ``m`` .. ``m + len(chunk) - 1`` of ``seg``: each row's layers
        (the first row's from ``skip`` on), or ``layers[j]`` for row ``j``. With ``cheap``, no
        file is read and an id that needs a file's bytes is ""."""
        raise NotImplementedError

    def _chunks(self, seg: _Segment, start: int, size: int) -> Iterator[_Chunk]:
        if seg.table is not None:
            yield from seg.table.chunks(start, size)
            return
        for s in range(start, seg.n, size):
            yield _Chunk(min(size, seg.n - s))

    # -- streaming
    def batches(self, start_row: int = 0) -> Iterator[ImportBatch]:
        """Batches of at most ``batch_rows`` items from row ``start_row`` (0-based) on; a batch
        never spans two shards. Raises :class:`SourceError` at the first duplicate id."""
        start_row = int(start_row)
        if not 0 <= start_row <= self.rows:
            raise ValueError(f"start_row must be in 0..{self.rows}, got {start_row}")
        seen = _SeenIds()
        # ids that check_ids found unique, every one from the column: nothing to look up while streaming
        checked, no_hits = self._ids_checked and self._column_ids_only, (lambda n: np.zeros(n, bool))
        if start_row and self._ids_from_column and not checked:
            self._seed(start_row, seen)
        repeats = 0
        for seg in self._segments:
            if seg.end <= start_row:
                continue
            k = seg.k
            m, skip = divmod(max(0, start_row - seg.offset), k)
            for chunk in self._chunks(seg, m, max(1, self.batch_rows // k)):
                stop = m + len(chunk)
                vecs = [layer.vectors.unit(m, stop) for layer in seg.layers]
                items = self._chunk_items(seg, chunk, m, skip)
                hits = no_hits(len(items.ids)) if checked else seen.add(items.ids)
                keep = None
                if hits.any():
                    keep = ~hits
                    for i in np.flatnonzero(hits).tolist():
                        if items.derived[i]:  # the same content again
                            repeats += 1
                            continue
                        err = self._duplicate(items.ids[i], seg, m + items.j[i])
                        if err is not None:  # (None: two ids with one hash, not a duplicate)
                            raise err
                        keep[i] = True
                    if keep.all():
                        keep = None
                yield items.batch(seg, m, vecs, self.dim, keep, row0=seg.offset + m * k + skip,
                                  row_end=seg.offset + stop * k)
                skip, m = 0, stop
        self._note_repeats(repeats)

    def _note_repeats(self, repeats: int) -> None:
        if self._repeats_note is not None and self._repeats_note in self.warnings:
            self.warnings.remove(self._repeats_note)
            self._repeats_note = None
        if repeats:
            self._repeats_note = (f"{repeats} rows repeat an item read before (same image bytes, path or url, or the "
                                  "same caption of the same image): each item is imported once")
            self.warnings.append(self._repeats_note)

    def read_rows(self, rows: Sequence[int]) -> ImportBatch:
        """The items of ``rows`` (0-based item rows, any order; returned ascending, no duplicate
        check): reads only those table rows and vectors."""
        want = sorted({int(r) for r in rows})
        if want and (want[0] < 0 or want[-1] >= self.rows):
            raise ValueError(f"rows must be in 0..{self.rows - 1}")
        parts: list[ImportBatch] = []
        for seg in self._segments:
            sel = [r for r in want if seg.offset <= r < seg.end]
            if not sel:
                continue
            by_meta: dict[int, list[int]] = {}
            for r in sel:
                mm, layer = divmod(r - seg.offset, seg.k)
                by_meta.setdefault(mm, []).append(layer)
            metas = sorted(by_meta)
            chunk = seg.table.take(metas) if seg.table is not None else _Chunk(len(metas))
            vecs = [_unit(layer.vectors.take(np.asarray(metas))) for layer in seg.layers]
            items = self._chunk_items_at(seg, chunk, metas, [by_meta[mm] for mm in metas])
            parts.append(items.batch(seg, 0, vecs, self.dim, None, row0=0, row_end=0, metas=metas))
        out = ImportBatch(row0=want[0] if want else 0, ids=[], modality=[], sources=[], metadata=[],
                          vectors=np.zeros((0, self.dim), np.float32), row_end=want[-1] + 1 if want else 0)
        for b in parts:
            out.ids += b.ids
            out.modality += b.modality
            out.sources += b.sources
            out.metadata += b.metadata
            out.rows += b.rows
        if parts:
            out.vectors = np.concatenate([b.vectors for b in parts]).astype(np.float32, copy=False)
        return out

    def _chunk_items_at(self, seg: _Segment, chunk: _Chunk, metas: list[int], layers: list[list[int]]) -> _Items:
        """Items of scattered table rows ``metas`` (``chunk`` holds them, in that order)."""
        if all(b == a + 1 for a, b in zip(metas, metas[1:])):
            return self._chunk_items(seg, chunk, metas[0], 0, layers=layers)
        out = _Items()
        for j, mm in enumerate(metas):  # one row at a time: error messages name each row's own number
            sub = _Chunk(1, records=[chunk.records[j]])
            one = self._chunk_items(seg, sub, mm, 0, layers=[layers[j]])
            for i in range(len(one.ids)):
                out.add(one.layer[i], j, one.ids[i], one.modality[i], one.sources[i], one.metadata[i], one.derived[i])
        return out

    # -- duplicates
    def check_ids(self, where: str | None = None) -> None:
        """Read the id column alone (where the table names the ids) and raise the
        :class:`SourceError` that :meth:`batches` would raise at an empty id, an id that cannot be
        one (control characters, too long) or one that repeats an earlier row's (naming both
        rows): what an import calls before it commits anything, so that such a table is refused
        whole rather than after its first batches (``where``: the collection, which the message
        says nothing was committed to)."""
        column = getattr(self, "_id_col", None)
        if not column or not self._ids_from_column:
            return
        try:
            self._check_ids(column)
            self._ids_checked = True
        except SourceError as e:
            if where is not None:
                e.args = (e.args[0] + self.committed_note(0, 0, where), *e.args[1:])
            raise

    def _check_ids(self, column: str) -> None:
        seen = _SeenIds()
        for seg in self._segments:
            m = 0
            for chunk in seg.table.column_chunks(column, self.batch_rows) if seg.table is not None else ():
                own = _own_ids(chunk, column, seg.file, m)
                if not plain_ids(own):
                    for j, iid in enumerate(own):
                        if id_problem(iid):
                            raise SourceError(str(id_problem(iid)), seg.file, m + j + 1)
                hits = seen.add(own)
                for i in np.flatnonzero(hits).tolist():
                    err = self._duplicate(own[i], seg, m + i)
                    if err is not None:  # (None: two ids with one hash, not a duplicate)
                        raise err
                m += len(chunk)

    def committed_note(self, rows: int, items: int, where: str, *, unsure: bool = False, table: bool = True) -> str:
        """What an import that failed says of what it had committed (``items`` items, up to row
        ``rows`` of this source) and how to finish it (``table``: the source's rows were at fault,
        else the catalog, the store or the process: trial AH read "fix the table" after a database
        stopped)."""
        finish = ("fix the table and run" if table else "run") + " the same command again to finish the import (the " \
            "committed rows are found unchanged)"
        if not items:
            return (f"; any batch of {self._description} committed to {where} before this error stays there: {finish}"
                    if unsure else f" (nothing of {self._description} was committed to {where})")
        return (f"; rows 1-{rows} of {self._description} ({items} items{' or more' if unsure else ''}) were committed "
                f"to {where} before this error and stay there: {finish}")

    def _id_rows(self, stop_row: int | None = None) -> Iterator[tuple[str, _Segment, int, bool]]:
        """(id, segment, table row, derived) of every item before ``stop_row``, without reading
        image files (an image id that needs its bytes is left out)."""
        for seg in self._segments:
            if stop_row is not None and seg.offset >= stop_row:
                return
            m = 0
            for chunk in self._chunks(seg, 0, self.batch_rows):
                items = self._chunk_items(seg, chunk, m, 0, cheap=True)
                for i, iid in enumerate(items.ids):
                    row = seg.offset + (m + items.j[i]) * seg.k + items.layer[i]
                    if stop_row is not None and row >= stop_row:
                        return
                    if iid:
                        yield iid, seg, m + items.j[i], items.derived[i]
                m += len(chunk)

    def _seed(self, start_row: int, seen: "_SeenIds") -> None:
        ids: list[str] = []
        for iid, _seg, _row, _derived in self._id_rows(start_row):
            ids.append(iid)
            if len(ids) >= self.batch_rows:
                seen.add(ids)
                ids = []
        seen.add(ids)

    def _duplicate(self, iid: str, seg: _Segment, row: int) -> SourceError | None:
        """The error for ``iid`` at ``row`` of ``seg`` naming the earlier row with the same id, or
        None when no earlier row has it."""
        for other, oseg, orow, _derived in self._id_rows():
            if oseg is seg and orow == row:
                return None
            if other == iid:
                earlier = f"row {orow + 1}" if oseg is seg else f"{oseg.file} row {orow + 1}"
                return SourceError(f"id {iid!r} repeats the id of {earlier} (ids must be unique)", seg.file, row + 1)
        return None


class _SeenIds:
    """The ids read so far, in a :class:`~nobackfill.ann.key_index.KeyIndex` (24 bytes an id
    rather than a Python string each); a hit on a table id is confirmed against the table before it
    is called a duplicate."""

    def __init__(self) -> None:
        self._keys = KeyIndex()

    def add(self, ids: list[str]) -> np.ndarray:
        """Add ``ids``; True where an id was seen before (earlier, or earlier in ``ids``)."""
        hi, lo = key_hashes(ids)
        hit = self._keys.rows_of(hi, lo) >= 0
        if len(set(ids)) < len(ids):  # (a set of strings is quicker to build than a sort of hashes)
            order = np.lexsort((lo, hi))  # stable: of equal ids, the first keeps its place
            hit[order[1:]] |= (hi[order[1:]] == hi[order[:-1]]) & (lo[order[1:]] == lo[order[:-1]])
        self._keys.add_hashes(hi[~hit], lo[~hit], len(self._keys))
        return hit
