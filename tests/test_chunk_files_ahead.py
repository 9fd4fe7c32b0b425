"""A chunk's files packed and written ahead of its commit (index/npz_bytes, index/atomic_files,
index/chunks): the ``.npz`` as np.load reads it, files written ahead named or dropped, and the
leftovers of a killed writer swept."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobackfill.gallery.atomic_files import AHEAD, AheadFile, stale_ahead_files
from nobackfill.gallery.gallery import Gallery
from nobackfill.gallery.npz_bytes import npz_bytes

DIM = 8


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), dim=st.integers(1, 9), ids=st.lists(st.text(min_size=1, max_size=6), max_size=40))
def test_npz_bytes_are_read_by_np_load_as_savez_writes_them(n, dim, ids):
    vectors = np.random.default_rng(n).standard_normal((n, dim)).astype(np.float32)
    arrays = {"vectors": vectors, "ids": np.asarray(ids, dtype=str), "big": np.arange(n, dtype=np.int64)[::-1]}
    data = npz_bytes(arrays)
    assert zipfile.ZipFile(io.BytesIO(data)).testzip() is None  # every member's CRC holds
    with np.load(io.BytesIO(data), allow_pickle=False) as ours:
        ref = io.BytesIO()
        np.savez(ref, **arrays)
        with np.load(io.BytesIO(ref.getvalue()), allow_pickle=False) as theirs:
            assert sorted(ours.files) == sorted(theirs.files)
            for k in theirs.files:
                assert ours[k].dtype == theirs[k].dtype and ours[k].shape == theirs[k].shape
                assert np.array_equal(ours[k], theirs[k])


def test_a_file_written_ahead_is_named_durably_or_dropped(tmp_path):
    first = AheadFile.write(tmp_path, b"abc" * 1000)
    second = AheadFile.write(tmp_path, b"xyz")
    assert first.path.parent == tmp_path / AHEAD and str(os.getpid()) in first.path.name
    first.name(tmp_path / "chunk.npz")
    assert (tmp_path / "chunk.npz").read_bytes() == b"abc" * 1000
    with pytest.raises(ValueError, match="closed"):
        first.name(tmp_path / "again.npz")
    second.close()
    assert not list((tmp_path / AHEAD).iterdir()) and not (tmp_path / "again.npz").exists()
    third = AheadFile.write(tmp_path, b"dropped")
    path = third.path
    del third  # dropped unnamed: gone with it
    assert not path.exists()


def test_files_written_ahead_by_a_process_that_is_gone_are_swept_by_the_next_open(tmp_path):
    g = Gallery.create(tmp_path / "g", space_id="s", dim=DIM, model="m")
    g.add("image", ["a"], np.ones((1, DIM), np.float32), space_id="s")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "g" / AHEAD).mkdir(exist_ok=True)
    stale = tmp_path / "g" / AHEAD / f"{int(dead.stdout)}-0123456789ab"
    stale.write_bytes(b"half a chunk")
    live = AheadFile.write(tmp_path / "g", b"this process's")
    odd = tmp_path / "g" / AHEAD / "not-a-pid"
    odd.write_bytes(b"?")
    assert stale_ahead_files(tmp_path / "g") == sorted([stale, odd])
    Gallery.open(tmp_path / "g")
    assert not stale.exists() and not odd.exists() and live.path.exists()  # a live writer's file is left to it
    live.close()
    assert Gallery.open(tmp_path / "g").count("image") == 1


def test_a_prepared_chunk_is_stored_as_prepared_or_rebuilt_when_some_rows_are_held(tmp_path):
    g = Gallery.create(tmp_path / "g", space_id="s", dim=DIM, model="m")
    x = np.random.default_rng(0).standard_normal((6, DIM)).astype(np.float32)
    ready = g.prepare_rows("image", ["a", "b", "c"], x[:3])
    assert ready.npz_file is not None and ready.npz_file.path.exists()
    added, rows = g.add_rows("image", ["a", "b", "c"], x[:3], space_id="s", prepared=ready)
    assert added == 3 and rows.tolist() == [0, 1, 2]
    again = g.prepare_rows("image", ["c", "d"], x[2:4])  # "c" is held: its files are not the chunk's
    added, rows = g.add_rows("image", ["c", "d"], x[2:4], space_id="s", prepared=again)
    assert added == 1 and rows.tolist() == [2, 3]
    other = g.prepare_rows("image", ["e"], x[4:5])  # prepared for other ids than those added: not used
    added, rows = g.add_rows("image", ["f"], x[5:6], space_id="s", prepared=other)
    assert added == 1 and rows.tolist() == [4]
    stale = g.prepare_rows("image", ["g"], x[4:5])  # prepared for other vectors: not used either
    added, rows = g.add_rows("image", ["g"], x[5:6] * 2, space_id="s", prepared=stale)
    assert added == 1 and rows.tolist() == [5]
    assert not list((tmp_path / "g" / AHEAD).iterdir())  # every file written ahead was named or dropped
    g = Gallery.open(tmp_path / "g")
    assert np.allclose(g.get_vectors("image", ["a", "b", "c", "d", "f", "g"]), np.concatenate([x[[0, 1, 2, 3, 5]],
                                                                                          x[5:6] * 2]))
    assert g.verify().ok
    with pytest.raises(ValueError, match="NaN"):
        g.prepare_rows("image", ["z"], np.full((1, DIM), np.nan, np.float32))


def test_keys_checked_by_their_maker_make_the_chunk_plain_ids_make(tmp_path):
    """An import's keys come checked (``CheckedIds``): the add takes them without its own pass and
    makes the same chunk, held keys and rows as from a plain list; a plain list is still checked."""
    from nobackfill.gallery.chunks import CheckedIds

    x = np.random.default_rng(0).standard_normal((5, DIM)).astype(np.float32)
    keys = [f"k{i}#{i:016x}" for i in range(5)]
    made = {}
    for kind, given_ids in (("plain", list(keys)), ("checked", CheckedIds(keys))):
        g = Gallery.create(tmp_path / kind, space_id="s" * 16, dim=DIM, model="m")
        p = g.prepare_rows("image", given_ids, x)
        added, rows = g.add_rows("image", given_ids, x, space_id="s" * 16, prepared=p)
        made[kind] = (p.npz_sha256, added, rows.tolist(), g.positions("image", keys))
        assert g.add_rows("image", given_ids, x, space_id="s" * 16)[0] == 0  # held now: skipped
    assert made["plain"] == made["checked"]
    g = Gallery.create(tmp_path / "bad", space_id="s" * 16, dim=DIM, model="m")
    with pytest.raises(ValueError, match="without NUL"):
        g.prepare_rows("image", ["a", ""], x[:2])


def test_an_imports_keys_are_marked_checked_only_after_the_ids_were(tmp_path):
    from _collection_helpers import OLD_REF, HashEncoder

    from nobackfill.gallery.chunks import CheckedIds
    from nobackfill.collection.collection import Collection
    from nobackfill.adopt.importing import _checked_batch

    enc = HashEncoder(DIM, "ck")
    c = Collection.create(str(tmp_path / "c"), space_id=enc.space_id, dim=DIM, model=OLD_REF, modalities=["text"])
    x = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)
    staged, _ = _checked_batch(c, ["a", "b c", " d"], x, modality="text", sources=None, metadata=None,
                               space_id=None, where="t")
    assert type(staged.keys) is CheckedIds and [k.split("#")[0] for k in staged.keys] == ["a", "b c", " d"]
    for bad in (["a", "a", "b"], ["a", "", "b"], ["a", "x\0y", "b"]):
        with pytest.raises(ValueError):
            _checked_batch(c, bad, x, modality="text", sources=None, metadata=None, space_id=None, where="t")
