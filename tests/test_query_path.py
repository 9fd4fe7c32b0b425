"""The query path of a search: the text query embedding cache (LRU, per model pool, in /metrics) and
the search batcher (a lone query never waits; queued ones share a batch; one bad query fails alone)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _collection_helpers import HashEncoder

from nobackfill.search.query_cache import QueryCache
from nobackfill.serve.batching import SearchBatcher


class CountingEncoder(HashEncoder):
    def __init__(self) -> None:
        super().__init__(dim=8)
        self.embedded: list[str] = []

    def encode_texts(self, texts, batch_size: int = 256, progress: bool = False):
        self.embedded += list(texts)
        return super().encode_texts(texts)


def test_the_cache_embeds_a_repeated_text_once_and_returns_the_same_rows():
    enc, cache = CountingEncoder(), QueryCache(3)
    first = cache.embed_texts(enc, ["a red circle", "blue"])
    again = cache.embed_texts(enc, ["a red circle", "green", "blue"])
    assert enc.embedded == ["a red circle", "blue", "green"]
    np.testing.assert_array_equal(again[[0, 2]], first)
    np.testing.assert_array_equal(again, enc.encode_texts(["a red circle", "green", "blue"]))
    assert cache.stats() == {"size": 3, "entries": 3, "hits": 2, "misses": 3}
    again[0] = 0  # a caller's array is its own: the cache is unchanged
    np.testing.assert_array_equal(cache.embed_texts(enc, ["a red circle"])[0], first[0])


def test_the_cache_never_changes_a_result_whatever_was_asked_before():
    """Texts that differ only in whitespace are other queries to a tokenizer (a tab, a doubled or a
    trailing space is a token of its own), so each is its own entry: what a query returns does not
    depend on which variant reached the cache first."""
    variants = ["a red circle", "a\tred circle", "a  red circle", "a red circle ", " a red circle", "a red\ncircle",
                "a\u00a0red circle", "A red circle"]
    for order in (variants, variants[::-1]):
        enc, cache = CountingEncoder(), QueryCache(16)
        for text in order:
            np.testing.assert_array_equal(cache.embed_texts(enc, [text])[0], enc.encode_texts([text])[0])
        assert len(cache) == len(variants) and cache.stats()["hits"] == 0


def test_the_cache_keeps_the_most_recently_used_and_keys_by_encoder():
    enc, other, cache = CountingEncoder(), CountingEncoder(), QueryCache(2)
    cache.embed_texts(enc, ["a"])
    cache.embed_texts(enc, ["b"])
    cache.embed_texts(enc, ["a"])  # a is now the most recent
    cache.embed_texts(enc, ["c"])  # b goes
    enc.embedded.clear()
    cache.embed_texts(enc, ["a", "c", "b"])
    assert enc.embedded == ["b"]
    cache.embed_texts(other, ["a"])  # another encoder's "a" is another entry
    assert other.embedded == ["a"]


def test_a_cache_of_size_zero_keeps_nothing():
    enc, cache = CountingEncoder(), QueryCache(0)
    cache.embed_texts(enc, ["a"])
    cache.embed_texts(enc, ["a", "b"])
    assert enc.embedded == ["a", "a", "b"] and len(cache) == 0
    assert cache.stats() == {"size": 0, "entries": 0, "hits": 0, "misses": 3}  # every query embedded is a miss
    with pytest.raises(ValueError, match=">= 0"):
        QueryCache(-1)


class FakeSearcher:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def search_batch(self, texts=None, images=None, k=10, target=None, filter=None):
        self.gate.wait(30)
        if "bad" in texts:
            raise ValueError("a bad query")
        self.batches.append(list(texts))

        class R:
            def __init__(self, q):
                self.query, self.hits = q, list(range(k))

        return [R(t) for t in texts]


def test_a_lone_query_is_answered_without_waiting_for_company():
    searcher = FakeSearcher()
    batcher = SearchBatcher(lambda merge: searcher, wait_s=60.0)  # it would wait a minute for more
    assert batcher.submit(text="alone", k=2).result(timeout=20).query == "alone"
    assert searcher.batches == [["alone"]]


def test_queries_queued_behind_a_running_batch_share_the_next_one_and_a_bad_one_fails_alone():
    searcher = FakeSearcher()
    batcher = SearchBatcher(lambda merge: searcher)
    searcher.gate.clear()
    first = batcher.submit(text="first", k=1)
    while not batcher._queue.empty():  # the batcher took the first query and waits on the gate
        threading.Event().wait(0.01)
    queued = [batcher.submit(text=t, k=3) for t in ("q1", "bad", "q2")]
    searcher.gate.set()
    assert first.result(timeout=20).query == "first"
    assert [f.result(timeout=20).query for f in (queued[0], queued[2])] == ["q1", "q2"]
    with pytest.raises(ValueError, match="a bad query"):
        queued[1].result(timeout=20)
    assert searcher.batches[0] == ["first"] and ["q1"] in searcher.batches and ["q2"] in searcher.batches
    assert batcher.search(text="sync", k=1).query == "sync"


def test_the_batcher_embeds_with_its_own_torch_thread_count():
    import torch

    seen = []

    class ThreadsSearcher(FakeSearcher):
        def search_batch(self, texts=None, **kw):
            seen.append(torch.get_num_threads())
            return super().search_batch(texts=texts, **kw)

    before = torch.get_num_threads()
    searcher = ThreadsSearcher()
    SearchBatcher(lambda merge: searcher, threads=1).submit(text="q", k=1).result(timeout=20)
    assert seen == [1] and torch.get_num_threads() == before  # the caller's threads are its own
