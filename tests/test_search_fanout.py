"""A search of several spaces asks stores that search on a server (Milvus) at once, and local stores
one after the other in the caller's thread; results come back in the spaces' order."""

from __future__ import annotations

import threading

import pytest

from nobackfill.milvus.space_store import MilvusSpaceStore
from nobackfill.search.fanout import search_spaces


class _Store:
    def __init__(self, name: str, remote: bool, barrier: threading.Barrier | None = None) -> None:
        self.name, self.remote_search, self.barrier, self.threads = name, remote, barrier, []

    def search(self, gmod, queries, depth, *, space_id, mask):
        self.threads.append(threading.current_thread().name)
        if self.barrier is not None:
            self.barrier.wait(timeout=5)  # both searches must be in flight at once to pass
        return (self.name, gmod, queries, depth, space_id, mask)


class _View:
    def __init__(self, gallery) -> None:
        self.gallery = gallery


def _asked(stores):
    return [(f"s{i}", None, _View(st), f"q{i}", None) for i, st in enumerate(stores)]


def test_remote_stores_are_searched_at_once_in_order():
    barrier = threading.Barrier(2)
    stores = [_Store("a", True, barrier), _Store("b", True, barrier)]
    got = search_spaces(_asked(stores), "image", 7)
    assert got == [("a", "image", "q0", 7, "s0", None), ("b", "image", "q1", 7, "s1", None)]
    assert all(st.threads[0].startswith("nobackfill-search") for st in stores)


def test_local_stores_and_a_single_space_search_in_the_callers_thread():
    me = threading.current_thread().name
    for stores in ([_Store("a", False), _Store("b", False)], [_Store("a", True), _Store("b", False)], [_Store("a", True)]):
        got = search_spaces(_asked(stores), "text", 3)
        assert [g[0] for g in got] == [st.name for st in stores]
        assert all(st.threads == [me] for st in stores)


def test_an_error_in_one_remote_search_reaches_the_caller():
    class Broken(_Store):
        def search(self, *a, **k):
            raise ConnectionError("server gone")

    with pytest.raises(ConnectionError, match="server gone"):
        search_spaces(_asked([_Store("a", True), Broken("b", True)]), "text", 3)


def test_milvus_stores_say_they_search_on_a_server():
    assert MilvusSpaceStore.remote_search is True
