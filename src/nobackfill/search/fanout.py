"""A search of several spaces (an upgraded collection during its backfill): each space's store asked for
its nearest rows. Stores that search on a server (``remote_search``: Milvus) are asked at once, so the
search waits for the slowest of them, not for their sum."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

__all__ = ["search_spaces"]

_REMOTE_SEARCHES: ThreadPoolExecutor | None = None
_REMOTE_LOCK = threading.Lock()


def search_spaces(asked: Sequence[tuple], gmod: str, depth: int) -> list[Any]:
    """Each space's search of ``asked`` (``(space, side, view, query vectors, mask)``), in order. Spaces
    whose stores search on a server (``remote_search``: Milvus) are sent at once, so a search of
    several spaces (during a backfill) waits for the slowest, not for the sum; local stores search
    here, one after the other (microseconds each)."""
    def one(a: tuple) -> Any:
        sid, _, view, queries, mask = a
        return view.gallery.search(gmod, queries, depth, space_id=sid, mask=mask)

    if len(asked) < 2 or not all(getattr(a[2].gallery, "remote_search", False) for a in asked):
        return [one(a) for a in asked]
    global _REMOTE_SEARCHES
    with _REMOTE_LOCK:
        if _REMOTE_SEARCHES is None:
            _REMOTE_SEARCHES = ThreadPoolExecutor(max_workers=8, thread_name_prefix="nobackfill-search")
    return [f.result() for f in [_REMOTE_SEARCHES.submit(one, a) for a in asked]]
