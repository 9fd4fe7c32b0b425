"""Tables of ids, sources and metadata (parquet, JSONL, CSV / TSV) read in chunks, for
:mod:`nobackfill.adopt.sources`."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .common import SourceError, SourceNotFound


class _Chunk:
    """Consecutive rows of a table, read as records (dicts) or column by column (lists)."""

    def __init__(self, n: int, *, records: list[dict] | None = None, arrow: Any = None) -> None:
        self.n, self._records, self._arrow = n, records, arrow

    def __len__(self) -> int:
        return self.n

    @property
    def records(self) -> list[dict]:
        if self._records is None:
            self._records = self._arrow.to_pylist() if self._arrow is not None else [{} for _ in range(self.n)]
        return self._records

    @property
    def arrow(self) -> Any:
        """The rows as an Arrow table (None for a table read as records)."""
        return self._arrow

    @property
    def columns(self) -> list[str] | None:
        """The columns every row has (None: records may differ, as JSONL lines do)."""
        if self._arrow is not None:
            return list(self._arrow.column_names)
        return [] if self._records is None else None

    def column(self, name: str) -> list:
        if self._arrow is not None:
            if name in self._arrow.column_names:
                return self._arrow.column(name).to_pylist()
            return [None] * self.n
        if self._records is None:
            return [None] * self.n
        return [r.get(name) for r in self._records]


class _Table:
    """A table of ids / sources / metadata read in chunks."""

    path: Path
    columns: list[str]
    num_rows: int
    kind: str

    def chunks(self, start: int, size: int) -> Iterator[_Chunk]:
        """Rows ``start`` .. (0-based) in chunks of ``size`` (the last may be shorter)."""
        raise NotImplementedError

    def take(self, rows: Sequence[int]) -> _Chunk:
        """The rows ``rows`` (0-based, ascending, distinct)."""
        raise NotImplementedError

    def column_chunks(self, column: str, size: int) -> Iterator[_Chunk]:
        """Every row in chunks of about ``size``, holding ``column`` at least (a parquet file reads
        only that column)."""
        return self.chunks(0, size)

    def require(self, column: str, why: str) -> None:
        if column not in self.columns:
            raise SourceError(f"no column {column!r} ({why}); its columns: {', '.join(self.columns) or 'none'}",
                              self.path)


class _ParquetTable(_Table):
    kind = "parquet"

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path = path
        try:
            self._pf = pq.ParquetFile(str(path))
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError
            raise SourceError(f"not a readable parquet file ({e})", path) from None
        self.columns = [c for c in self._pf.schema_arrow.names if not c.startswith("__index_level_")]
        md = self._pf.metadata
        self.num_rows = int(md.num_rows)
        sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)

    def chunks(self, start: int, size: int) -> Iterator[_Chunk]:
        import pyarrow as pa

        if start >= self.num_rows:
            return
        g = int(np.searchsorted(self._starts, start, side="right") - 1)
        skip = int(start - self._starts[g])
        pending: list[Any] = []
        count = 0
        for rb in self._pf.iter_batches(batch_size=max(1, size), row_groups=list(range(g, len(self._starts) - 1)),
                                        columns=self.columns, use_pandas_metadata=False):
            if skip >= rb.num_rows:
                skip -= rb.num_rows
                continue
            if skip:
                rb, skip = rb.slice(skip), 0
            pending.append(rb)
            count += rb.num_rows
            while count >= size:
                t = pa.Table.from_batches(pending)
                yield _Chunk(size, arrow=t.slice(0, size))
                rest = t.slice(size)
                pending, count = rest.to_batches(), rest.num_rows
        if count:
            yield _Chunk(count, arrow=pa.Table.from_batches(pending))

    def column_chunks(self, column: str, size: int) -> Iterator[_Chunk]:
        import pyarrow as pa

        for rb in self._pf.iter_batches(batch_size=max(1, size), columns=[column], use_pandas_metadata=False):
            yield _Chunk(rb.num_rows, arrow=pa.Table.from_batches([rb]))

    def take(self, rows: Sequence[int]) -> _Chunk:
        import pyarrow as pa

        idx = np.asarray(rows, dtype=np.int64)
        if not idx.size:
            return _Chunk(0, records=[])
        groups = np.searchsorted(self._starts, idx, side="right") - 1
        parts = []
        for g in np.unique(groups):
            local = idx[groups == g] - self._starts[g]
            t = self._pf.read_row_group(int(g), columns=self.columns, use_pandas_metadata=False)
            parts.append(t.take(pa.array(local)))
        return _Chunk(int(idx.size), arrow=pa.concat_tables(parts))


class _LineTable(_Table):
    """JSONL or CSV, streamed line by line."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind
        self._delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        if not path.is_file():
            raise SourceNotFound("table not found", path)
        if kind == "jsonl":
            count, first = 0, None
            with open(path, "rb") as fh:
                for line in fh:
                    if line.strip():
                        count += 1
                        if first is None:
                            first = line
            self.num_rows = count
            self.columns = [] if first is None else list(self._parse(first.decode("utf-8"), 1).keys())
        else:
            with open(path, newline="", encoding="utf-8") as fh:
                reader = csv.reader(fh, delimiter=self._delimiter)
                self.columns = next(reader, [])
                self.num_rows = sum(1 for r in reader if r)

    def _parse(self, line: str, row: int) -> dict:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(f"invalid JSON ({e.msg.removesuffix(' at')} at column {e.colno})", self.path,
                              row) from None
        if not isinstance(obj, dict):
            raise SourceError(f"each line must be a JSON object, got {type(obj).__name__}", self.path, row)
        return obj

    def _records(self, start: int, rows: set[int] | None = None, last: int | None = None) -> Iterator[dict]:
        """The records of data rows ``start`` on (0-based; blank lines are no row), only ``rows`` when
        given, up to ``last``."""
        with open(self.path, newline="" if self.kind != "jsonl" else None, encoding="utf-8") as fh:
            if self.kind == "jsonl":
                header, raw = None, (line for line in fh if line.strip())
            else:
                reader = csv.reader(fh, delimiter=self._delimiter)
                header = next(reader, [])
                raw = (cells for cells in reader if cells)
            for row, item in enumerate(raw):
                if last is not None and row > last:
                    return
                if row < start or (rows is not None and row not in rows):
                    continue
                if header is None:
                    yield self._parse(item, row + 1)
                else:  # as csv.DictReader reads them: short rows padded, empty cells as None
                    cells = item + [None] * (len(header) - len(item))
                    yield {k: v or None for k, v in zip(header, cells)}

    def chunks(self, start: int, size: int) -> Iterator[_Chunk]:
        buf: list[dict] = []
        for rec in self._records(start):
            buf.append(rec)
            if len(buf) >= size:
                yield _Chunk(len(buf), records=buf)
                buf = []
        if buf:
            yield _Chunk(len(buf), records=buf)

    def take(self, rows: Sequence[int]) -> _Chunk:
        if not len(rows):
            return _Chunk(0, records=[])
        recs = list(self._records(0, set(int(r) for r in rows), int(max(rows))))
        return _Chunk(len(recs), records=recs)


def _open_table(path: str | Path) -> _Table:
    p = Path(path)
    suffix = p.suffix.lower()
    if not p.is_file():
        raise SourceNotFound("table not found", p)
    if suffix in (".parquet", ".pq"):
        return _ParquetTable(p)
    if suffix in (".jsonl", ".ndjson"):
        return _LineTable(p, "jsonl")
    if suffix in (".csv", ".tsv"):
        return _LineTable(p, "csv")
    raise SourceError(f"unknown table format {suffix or '(no suffix)'!r}: use .parquet, .jsonl or .csv", p)
