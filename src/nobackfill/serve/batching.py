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
    """One thread takes the queued searches, waits up to ``wait_s`` for more (at most ``max_batch``),
    groups them by what must be equal within a batch (query modality, target, filter, merge) and
    answers each group with :meth:`~nobackfill.search.Searcher.search_batch` at the largest ``k``.
    A group that fails is answered query by query, so one bad query fails alone."""

    def __init__(self, searcher_for: Callable[[str | None], Any], *, max_batch: int = 32, wait_s: float = 0.002) -> None:
        self.searcher_for, self.max_batch, self.wait_s = searcher_for, int(max_batch), float(wait_s)
        self._queue: queue.Queue[_Request] = queue.Queue()
        self.batches = 0
        self.queries = 0
        threading.Thread(target=self._loop, name="search-batcher", daemon=True).start()

    def search(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: dict | None = None, merge: str | None = None):
        """The :class:`~nobackfill.search.SearchResponse` of one query (blocks until answered)."""
        kind = "text" if text is not None else "image"
        key = (kind, target, json.dumps(filter, sort_keys=True, default=str) if filter else None, merge)
        req = _Request(key, text if text is not None else image, int(k))
        self._queue.put(req)
        return req.future.result()

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            deadline = time.monotonic() + self.wait_s
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
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
