"""The store's compact key index (nobackfill.ann.key_index) and what rests on it: a gallery's
key lookups, ids and duplicate checks, one thread adding while another looks keys up, and import
sources that release the pages of a memory-mapped .npy once read."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobackfill.gallery import DuplicateIdError, Gallery
from nobackfill.ann import key_index as K
from nobackfill.ann.key_index import KeyIndex, key_hashes
from nobackfill.adopt.sources import open_source

SPACE = "s" * 16


def _unit(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.text(min_size=1, max_size=12), max_size=30), max_size=14), st.lists(st.text(max_size=12)))
def test_rows_are_those_added_and_absent_keys_are_minus_one(batches, probes):
    ki, held, row = KeyIndex(), {}, 0
    for batch in batches:
        new = [k for k in dict.fromkeys(batch) if k not in held]
        ki.add(new, row)
        held.update((k, row + i) for i, k in enumerate(new))
        row += len(new)
    keys = list(held) + probes
    assert ki.rows(keys).tolist() == [held.get(k, -1) for k in keys]
    assert len(ki) == len(held)
    assert len(ki._runs) <= K.MAX_RUNS  # (more batches than that: the runs were merged)


def test_many_batches_merge_into_the_large_array_and_stay_found():
    ki = KeyIndex()
    keys = [f"item-{i}#{i * 7919:x}" for i in range(300_000)]
    for s in range(0, len(keys), 16384):
        ki.add(keys[s:s + 16384], s)
    assert len(ki._big) > sum(map(len, ki._runs))  # merged at least once
    probe = keys[::997] + ["item-5#nope", "missing"]
    assert ki.rows(probe).tolist() == list(range(0, len(keys), 997)) + [-1, -1]


def test_keys_sharing_the_first_hash_are_told_apart_by_the_second():
    s = K._Sorted(np.array([5, 5, 5, 7], np.uint64), np.array([3, 1, 2, 0], np.uint64), np.arange(4))
    got = s.find(np.array([5, 5, 5, 5, 7, 6, 9], np.uint64), np.array([1, 2, 3, 9, 0, 0, 0], np.uint64))
    assert got.tolist() == [1, 2, 0, -1, 3, -1, -1]


def test_hashes_differ_for_keys_that_differ_in_one_character_or_their_end():
    keys = ["a", "b", "ab", "ba", "a#0", "a#1", "é", "e", "x" * 200, "x" * 201]
    hi, lo = key_hashes(keys)
    assert len(set(zip(hi.tolist(), lo.tolist()))) == len(keys)
    assert key_hashes(np.asarray(keys))[0].tolist() == hi.tolist()  # numpy strings hash as Python's


def test_a_gallery_finds_its_keys_after_reopening_and_loads_ids_only_when_asked(tmp_path):
    g = Gallery.create(tmp_path / "g", space_id=SPACE, dim=8, model="m")
    g.add("text", ["a", "b"], _unit(2), space_id=SPACE)
    g.add("text", ["c"], _unit(1, seed=1), space_id=SPACE)
    g2 = Gallery.open(tmp_path / "g")
    assert g2.positions("text", ["c", "a", "zz"]) == {"c": 2, "a": 0}
    assert ("text", "b") in g2 and ("text", "zz") not in g2 and ("image", "a") not in g2
    assert g2._cols["text"].ids is None  # lookups never load the ids
    assert g2.ids("text") == ["a", "b", "c"]
    g2.add("text", ["d"], _unit(1, seed=2), space_id=SPACE)
    assert g2.ids("text") == ["a", "b", "c", "d"] and g2.positions("text", ["d"]) == {"d": 3}
    np.testing.assert_array_equal(g2.get_vectors("text", ["d", "a"]), np.concatenate([_unit(1, seed=2), _unit(2)[:1]]))
    with pytest.raises(KeyError, match="'zz'"):
        g2.get_vectors("text", ["a", "zz"])
    with pytest.raises(DuplicateIdError, match="already in gallery"):
        g2.add("text", ["e", "a"], _unit(2), space_id=SPACE)
    for bad in (["ok", ""], ["ok", 3], ["a\0b"], [["unhashable"]]):
        with pytest.raises(ValueError, match="non-empty strings"):
            g2.add("text", bad, _unit(len(bad)), space_id=SPACE)
    assert g2.count("text") == 4


def test_one_thread_adds_while_another_looks_keys_up(tmp_path):
    """Each lookup sees every key committed before it started: a commit grows the manifest and the
    key cache together, under the gallery's lock."""
    g = Gallery.create(tmp_path / "g", space_id=SPACE, dim=8, model="m")
    committed: list[int] = []
    errors: list[str] = []

    def add() -> None:
        for b in range(40):
            g.add("text", [f"k{b}-{i}" for i in range(50)], _unit(50, seed=b), space_id=SPACE)
            committed.append(b)

    def look() -> None:
        while len(committed) < 40:
            done = list(committed)
            keys = [f"k{b}-{i}" for b in done for i in (0, 49)]
            got = g.positions("text", keys)
            if len(got) != len(keys) or any(got[f"k{b}-0"] != 50 * b for b in done):
                errors.append(f"after {len(done)} batches: {len(got)} of {len(keys)} keys found")

    threads = [threading.Thread(target=add), threading.Thread(target=look)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert len(g.positions("text", [f"k{b}-{i}" for b in range(40) for i in range(50)])) == 2000


def test_a_memory_mapped_npy_reads_the_same_rows_after_its_pages_are_released(tmp_path):
    vecs = _unit(5000, dim=32, seed=4)
    np.save(tmp_path / "e.npy", vecs)
    (tmp_path / "t.jsonl").write_text("".join(f'{{"id": "r{i}", "text": "t{i}"}}\n' for i in range(5000)))
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", id_column="id",
                      source_column="text", modality="text", batch_rows=700)
    layer = src._segments[0].layers[0].vectors
    assert layer._map is not None  # the .npy is memory-mapped, its pages released as read
    first = np.concatenate([b.vectors for b in src.batches()])
    again = np.concatenate([b.vectors for b in src.batches()])
    np.testing.assert_array_equal(first, vecs)
    np.testing.assert_array_equal(again, vecs)
    np.testing.assert_array_equal(layer.raw(1234, 1300), vecs[1234:1300])


def test_keys_not_held_mostly_skip_the_binary_searches(monkeypatch):
    """The filter of held keys: across its growths every held key is still found, and of keys not
    held only about one in 16 (at most one in 8 here) reaches the sorted arrays."""
    ki = KeyIndex()
    held = [f"held-{i}" for i in range(100_000)]
    for s in range(0, len(held), 7000):  # the filter grows several times
        ki.add(held[s:s + 7000], s)
    searched = []
    real = K._Sorted.find
    monkeypatch.setattr(K._Sorted, "find", lambda self, hi, lo: searched.append(len(hi)) or real(self, hi, lo))
    absent = [f"absent-{i}" for i in range(20_000)]
    assert (ki.rows(absent) == -1).all()
    # the large array is asked for the keys the filter let through, each run for those still missing
    assert searched[0] < len(absent) // 8 and all(n <= searched[0] for n in searched)
    assert ki.rows(held[::101]).tolist() == list(range(0, len(held), 101))
