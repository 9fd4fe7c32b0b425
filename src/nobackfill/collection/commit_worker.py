"""The catalog commits of a large import in a process of their own (:class:`CommitWorker`).

On an embedded (SQLite) catalog the inserts of an import take about half of its time, and Python
threads share one core: a child process commits batch ``k`` on another core while the import reads
and stores batch ``k + 1`` (storing in a thread of its own, while the batch after is checked:
:func:`~nobackfill.adopt.importing.import_source`). Nothing of the import's guarantees changes:

- a batch's vectors are stored (their chunk committed) before its rows are handed over, and the
  worker commits batches in the order given, each in one catalog transaction
  (:meth:`~nobackfill.collection.collection.Collection.commit_placed_columns`: the rows of new ids
  as given, the others through ``commit_rows``, the call an import makes in process); batches that
  queued up while the worker was busy go in one transaction together (a group commit: fewer,
  larger transactions when the catalog is the slower side);
- a kill of either process leaves the catalog at the last committed transaction; the import, run
  again, finds what was committed (the worker ends when the import's end of the pipe closes, a
  killed import included, after at most the transaction under way);
- at most ``max_pending`` batches are in flight (16: with random ids, each transaction rewrites
  most of the id index's pages, so fewer, larger ones pay; about 300 MB for the worker at 1M rows
  of random ids), and a transaction takes at most :data:`GROUP_ROWS` rows.

The pipe carries length-prefixed JSON frames (orjson): to the worker ``{"space": space,
"columns": [ids, modalities, keys, sources JSON, metadata JSON, rows]}`` (columns: fewer, larger
JSON arrays to decode, laid out as the INSERTs' parameters by slice assignment); back
``{"upto": batches committed, "added": items}`` or ``{"error": ..., "type": ...}``, and last
``{"end": true, "peak_rss_mb": ...}`` (the worker's own peak memory, which an import reports).
"""

from __future__ import annotations

import queue
import struct
import subprocess
import sys
import threading
from itertools import chain
from pathlib import Path
from typing import IO, Any, Sequence

import orjson

from ..catalog.items import CollectionError

__all__ = ["CommitWorker", "CommitWorkerError"]

_LEN = struct.Struct("<Q")
#: a group commit takes at most this many rows in one transaction
GROUP_ROWS = 262144


class CommitWorkerError(CollectionError, RuntimeError):
    """The worker refused a batch or died (the message says which, with its last words): a
    collection error, which a command says in one line (trial AH: a killed worker gave two
    tracebacks)."""


def _write_frame(out: IO[bytes], obj: Any) -> None:
    data = orjson.dumps(obj)
    out.write(_LEN.pack(len(data)) + data)
    out.flush()


def _read_frame(inp: IO[bytes]) -> Any | None:
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        return None  # the other end closed
    (n,) = _LEN.unpack(head)
    data = inp.read(n)
    if len(data) < n:
        return None
    return orjson.loads(data)


class CommitWorker:
    """A child process committing :func:`~nobackfill.adopt.importing.add_vectors`' rows into the
    collection at ``path`` (a local directory), batch after batch (see the module doc)."""

    def __init__(self, path: str | Path, *, max_pending: int = 16) -> None:
        root = str(Path(__file__).resolve().parents[2])  # where this package lies, however it was found
        self.path = str(path)
        self.max_pending = int(max_pending)
        # the package's folder goes last on the worker's path: found when nothing else provides it,
        # never ahead of the standard library (as PYTHONPATH would put it)
        launch = ("import sys; sys.path.append(sys.argv[1]); "
                  "from nobackfill.collection.commit_worker import main; main(sys.argv[2])")
        isolated = ["-P"] if sys.version_info >= (3, 11) else []  # nor the working directory ahead of it
        self._proc = subprocess.Popen([sys.executable, *isolated, "-c", launch, root, self.path],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._acks: queue.Queue = queue.Queue()
        self._stderr: list[bytes] = []
        self._sent = 0
        self.committed = 0  # batches committed so far
        self.added = 0  # items the committed batches added
        self.peak_rss_mb = 0.0  # the worker's peak resident memory, known once it ended
        threading.Thread(target=self._read_acks, name="commit-worker-acks", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="commit-worker-stderr", daemon=True).start()

    def _read_acks(self) -> None:
        assert self._proc.stdout is not None
        while True:
            try:
                msg = _read_frame(self._proc.stdout)
            except (OSError, ValueError) as e:
                msg = {"error": f"unreadable answer ({e})", "type": "OSError"}
            self._acks.put(msg)
            if msg is None or "error" in msg or "end" in msg:
                return

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-20]

    def submit(self, space: str, columns: Sequence[Sequence[Any]]) -> list[int]:
        """Hand over one batch of items whose vectors are stored already in ``space``, column by
        column: ids, modalities, keys, sources JSON, metadata JSON and each vector's row in the
        store (the columns of :meth:`~nobackfill.collection.collection.Collection.commit_placed_columns`;
        columns cost the pipe and the worker less than rows). Returns the numbers (from 1) of the
        batches whose commits completed meanwhile; waits while ``max_pending`` batches are in
        flight."""
        assert self._proc.stdin is not None
        if len(columns) != 6 or len({len(c) for c in columns}) > 1:
            raise ValueError("a batch is six columns of one length: ids, modalities, keys, sources, metadata, rows")
        try:
            _write_frame(self._proc.stdin, {"space": space, "columns": columns})
            gone = False
        except (BrokenPipeError, OSError):
            gone = True
        if gone:  # (outside the except: its error is the worker's, not the pipe's)
            self._take(block=True)  # its last answer says why, if it gave one
            raise self._died()
        self._sent += 1
        done = self._take(block=False)
        while self._sent - self.committed >= self.max_pending:
            done += self._take(block=True)
        return done

    def close(self) -> list[int]:
        """Wait for every batch handed over to be committed, and for the worker to end; returns the
        numbers of the batches committed meanwhile."""
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        done: list[int] = []
        while self._proc.returncode is None or self.committed < self._sent:
            done += self._take(block=True)
        if self._proc.returncode != 0 or self.committed < self._sent:
            raise self._died()
        return done

    def abort(self) -> None:
        """Stop now (the transaction under way is rolled back; what was committed stays)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def _take(self, *, block: bool) -> list[int]:
        done: list[int] = []
        while True:
            try:
                msg = self._acks.get(block=block and not done)
            except queue.Empty:
                return done
            if msg is None:
                raise self._died()
            if "end" in msg:
                self.peak_rss_mb = float(msg["peak_rss_mb"])
                self._proc.wait()
                return done
            if "error" in msg:
                raise CommitWorkerError(f"committing the import into {self.path}: {msg['type']}: {msg['error']}")
            done += list(range(self.committed + 1, int(msg["upto"]) + 1))
            self.committed = int(msg["upto"])
            self.added += int(msg["added"])

    def _died(self) -> CommitWorkerError:
        code = self._proc.wait()
        said = b"".join(self._stderr).decode("utf-8", "replace").strip()
        return CommitWorkerError(f"the catalog worker of {self.path} ended (exit status {code}) after "
                                 f"{self.committed} of {self._sent} batches" + (f": {said[-2000:]}" if said else ""))


def _serve(path: str, inp: IO[bytes], out: IO[bytes]) -> None:
    """The worker: commit the batches read from ``inp`` in order, grouping those already waiting."""
    from ..memory import cyclic_gc_paused, peak_rss_mb
    from .collection import Collection

    collection = Collection.open(path)
    inbox: queue.Queue = queue.Queue(maxsize=64)

    def read() -> None:
        while True:
            msg = _read_frame(inp)
            inbox.put(msg)
            if msg is None:
                return

    threading.Thread(target=read, name="commit-worker-inbox", daemon=True).start()
    # the log's checkpoints overlap the next inserts; the rows made and freed batch by batch hold no cycle
    with collection.catalog.checkpoints_apart(), cyclic_gc_paused():
        if not _commit_batches(collection, inbox, out):
            return  # an error, told to the import
    _write_frame(out, {"end": True, "peak_rss_mb": round(peak_rss_mb(), 1)})


def _commit_batches(collection: Any, inbox: queue.Queue, out: IO[bytes]) -> bool:
    """Commit the batches of ``inbox`` in order (a group of those waiting at most
    :data:`GROUP_ROWS` rows to a transaction), saying on ``out`` how far it got; False when a
    commit failed (its error was said instead)."""
    upto, carried, ended = 0, None, False
    while not ended:
        msg = carried if carried is not None else inbox.get()
        carried = None
        if msg is None:
            break
        group, n = [msg], len(msg["columns"][0])
        while n < GROUP_ROWS:
            try:
                nxt = inbox.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                ended = True
                break
            if nxt["space"] != msg["space"]:
                carried = nxt  # another space: its own transaction, next time round
                break
            group.append(nxt)
            n += len(nxt["columns"][0])
        columns = [list(chain.from_iterable(m["columns"][j] for m in group)) for j in range(6)]
        try:
            added = collection.commit_placed_columns(msg["space"], columns)
        except Exception as e:  # told to the import, which raises it
            _write_frame(out, {"error": str(e), "type": type(e).__name__})
            return False
        upto += len(group)
        _write_frame(out, {"upto": upto, "added": added})
    return True


def main(path: str) -> None:
    """The worker process's entry point (:class:`CommitWorker` starts it): serve stdin / stdout."""
    _serve(path, sys.stdin.buffer, sys.stdout.buffer)
