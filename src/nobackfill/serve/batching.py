"""Dynamic batching of searches: queries that arrive together are answered by one batched search
(one encoder pass per model for the whole batch instead of one per query), the usual way model
servers trade a millisecond of waiting for throughput."""

from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["SearchBatcher"]


@dataclass
class _Request:
    key: tuple
    payload: Any  # a text or a PIL image
    k: int
    future: Future = field(default_factory=Future)


class SearchBatcher:
    """One thread takes the queued searches: the first, and every other one already queued (at most
    ``max_batch``; it never waits when nothing else is queued, so a lone query goes at once; with
    ``wait_s`` > 0 and others queued, it waits that long for more), groups them by what must be equal
    within a batch (query modality, target, filter, merge) and answers each group with
    :meth:`~nobackfill.search.Searcher.search_batch` at the largest ``k``. Queries arriving while a
    batch runs form the next batch. A group that fails is answered query by query, so one bad query
    fails alone. :meth:`submit` returns a future (an async caller awaits it without a thread of its
    own: one thread hop a query); :meth:`search` blocks."""

    def __init__(self, searcher_for: Callable[[str | None], Any], *, max_batch: int = 32, wait_s: float = 0.0,
                 threads: int | None = 1) -> None:
        self.searcher_for, self.max_batch, self.wait_s = searcher_for, int(max_batch), float(wait_s)
        self.threads = threads  # torch's intra-op threads in the batcher's thread (None: torch's default)
        self._queue: queue.Queue[_Request] = queue.Queue()
        self.batches = 0
        self.queries = 0
        threading.Thread(target=self._loop, name="search-batcher", daemon=True).start()

    def submit(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: dict | None = None, merge: str | None = None) -> Future:
        """A future of the :class:`~nobackfill.search.SearchResponse` of one query."""
        kind = "text" if text is not None else "image"
        key = (kind, target, json.dumps(filter, sort_keys=True, default=str) if filter else None, merge)
        req = _Request(key, text if text is not None else image, int(k))
        self._queue.put(req)
        return req.future

    def search(self, **query: Any) -> Any:
        """The :class:`~nobackfill.search.SearchResponse` of one query (blocks until answered)."""
        return self.submit(**query).result()

    def _take(self) -> list[_Request]:
        """The next batch: the first queued query and those queued behind it."""
        batch = [self._queue.get()]
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if self.wait_s > 0 and len(batch) > 1:  # traffic: a little longer for more
            deadline = time.monotonic() + self.wait_s
            while len(batch) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
        return batch

    def _loop(self) -> None:
        if self.threads is not None:
            # a query's encoder pass is small: one thread answers it without waking (and waiting on) a
            # pool of them, and leaves the other cores to the requests and the backfill. torch's thread
            # count is per calling thread: the backfill's own threads keep theirs.
            import torch

            torch.set_num_threads(max(1, int(self.threads)))
        while True:
            batch = self._take()
            groups: dict[tuple, list[_Request]] = {}
            for r in batch:
                groups.setdefault(r.key, []).append(r)
            for key, reqs in groups.items():
                self._answer(key, reqs)

    def _answer(self, key: tuple, reqs: list[_Request]) -> None:
        kind, target, flt, merge = key
        searcher = self.searcher_for(merge)
        kw = {"k": max(r.k for r in reqs), "target": target, "filter": json.loads(flt) if flt else None}
        try:
            payloads = [r.payload for r in reqs]
            out = searcher.search_batch(**({"texts": payloads} if kind == "text" else {"images": payloads}), **kw)
        except Exception:
            if len(reqs) == 1:
                reqs[0].future.set_exception(_current_exception())
                return
            for r in reqs:  # isolate the failing query
                self._answer(key, [r])
            return
        self.batches += 1
        self.queries += len(reqs)
        for r, resp in zip(reqs, out):
            resp.hits = resp.hits[: r.k]
            r.future.set_result(resp)


def _current_exception() -> BaseException:
    import sys

    return sys.exc_info()[1]
