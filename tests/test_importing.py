"""Adding precomputed vectors in bulk (``index/importing.py``): the same guarantees as ``add``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from _collection_helpers import OLD_REF, HashEncoder, pool_with

from nobackfill.collection.collection import Collection
from nobackfill.adopt.importing import add_vectors, vector_rev
from nobackfill.catalog.items import row_json, rows_json
from nobackfill.gallery.types import DuplicateIdError, SpaceMismatchError
from nobackfill.search.searcher import Searcher


def _unit(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _collection(tmp_path, modalities=("image", "text")) -> Collection:
    return Collection.create(tmp_path / "c", space_id="s", dim=8, model="/m/s", modalities=list(modalities))


def _ids(n: int, start: int = 0) -> list[str]:
    return [f"id{i}" for i in range(start, start + n)]


def test_vectors_are_served_under_their_ids_and_a_second_run_changes_nothing(tmp_path):
    c = _collection(tmp_path)
    x = _unit(20)
    r = add_vectors(c, _ids(20), x, modality="image", sources=[{"path": f"/p/{i}.jpg"} for i in range(20)],
                    metadata=[{"group": i % 3} for i in range(20)])
    assert (r.added, r.unchanged, r.stored) == (20, 0, 20)
    gen = c.generation
    again = add_vectors(c, _ids(20), x, modality="image", sources=[{"path": f"/p/{i}.jpg"} for i in range(20)],
                        metadata=[{"group": i % 3} for i in range(20)])
    assert (again.added, again.unchanged, again.stored) == (0, 20, 0) and c.generation == gen
    snap = c.snapshot()
    view = snap.views("image")["s"]
    assert view.count == 20 and snap.item_count("image") == 20
    assert c.get("id7").key == f"id7#{vector_rev(x[7:8])[0]}" and c.get("id7").metadata == {"group": 1}
    hit = view.gallery.search("image", x[7:8], k=1, mask=view.mask, space_id="s")
    assert view.item_ids[int(hit.positions[0][0])] == "id7"


def test_a_new_vector_or_new_metadata_under_an_id_replaces_it(tmp_path):
    c = _collection(tmp_path)
    x = _unit(6)
    add_vectors(c, _ids(6), x, modality="text", sources=[{"text": f"t{i}"} for i in range(6)])
    y = x.copy()
    y[2] = _unit(1, seed=9)[0]
    r = add_vectors(c, _ids(6), y, modality="text", sources=[{"text": f"t{i}"} for i in range(6)],
                    metadata=[{"v": 2} if i == 4 else {} for i in range(6)])
    assert (r.added, r.unchanged, r.stored) == (2, 4, 1)
    assert c.get("id2").key.endswith(vector_rev(y[2:3])[0]) and c.get("id4").metadata == {"v": 2}
    assert len(c) == 6 and c.snapshot().views("text")["s"].count == 6


def test_vectors_stored_by_a_killed_run_are_served_by_the_next_without_being_stored_twice(tmp_path):
    c = _collection(tmp_path)
    x = _unit(10)
    keys = [f"{i}#{r}" for i, r in zip(_ids(10), vector_rev(x))]
    c.gallery("s").add("text", keys, x, None, space_id="s")  # what a run killed before its commit left
    r = add_vectors(c, _ids(10), x, modality="text", sources=[{"text": f"t{i}"} for i in range(10)])
    assert (r.added, r.stored) == (10, 0) and c.gallery("s").count("text") == 10
    assert c.snapshot().views("text")["s"].count == 10 and not c.verify()


def test_a_local_store_says_where_each_key_of_a_batch_is_as_it_stores_it(tmp_path):
    g = _collection(tmp_path).gallery("s")
    x = _unit(12)
    g.add("text", _ids(5), x[:5], None, space_id="s")
    added, rows = g.add_rows("text", _ids(8, 3), x[3:11], space_id="s")  # ids 3, 4 held; 5..10 new
    assert added == 6 and rows.tolist() == [3, 4, 5, 6, 7, 8, 9, 10]
    assert g.positions("text", _ids(8, 3)) == dict(zip(_ids(8, 3), rows.tolist()))
    added, rows = g.add_rows("text", ["id11", "id0"], x[[11, 0]], space_id="s")
    assert added == 1 and rows.tolist() == [11, 0] and g.count("text") == 12
    assert np.allclose(g.get_vectors("text", ["id9", "id11"]), x[[9, 11]])


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(ids=["a", "b", "a"]), DuplicateIdError, "id 'a' is given twice (rows 1 and 3)"),
    (dict(ids=["a", "", "c"]), ValueError, "row 2: id must be a non-empty string"),
    (dict(nan_row=1), ValueError, "row 2 holds NaN or inf"),
    (dict(dim=5), ValueError, "5-d but the current model"),
    (dict(modality="audio"), ValueError, "modality must be one of"),
    (dict(metadata=[{"x": object()}] * 3), ValueError, "JSON"),
    (dict(sources=[{}]), ValueError, "1 sources rows for 3 ids"),
])
def test_a_bad_batch_is_refused_and_writes_nothing(tmp_path, kwargs, error, words):
    c = _collection(tmp_path)
    x = _unit(3, dim=kwargs.pop("dim", 8))
    if "nan_row" in kwargs:
        x[kwargs.pop("nan_row"), 0] = np.nan
    ids = kwargs.pop("ids", ["a", "b", "c"])
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        add_vectors(c, ids, x, **{"modality": "text", "where": "batch.npy", **kwargs})
    assert len(c) == 0 and c.gallery("s").count("text") == 0


def test_vectors_of_another_space_or_modality_the_model_lacks_are_refused(tmp_path):
    c = _collection(tmp_path, modalities=("text",))
    with pytest.raises(SpaceMismatchError):
        add_vectors(c, ["a"], _unit(1), modality="text", space_id="other")
    with pytest.raises(ValueError, match="embeds only text"):
        add_vectors(c, ["a"], _unit(1), modality="image")


def test_imported_items_are_searched_like_added_ones(tmp_path):
    enc = HashEncoder(8, "s")
    c = Collection.create(tmp_path / "c", space_id=enc.space_id, dim=8, model=OLD_REF)
    texts = [f"caption {i}" for i in range(12)]
    add_vectors(c, _ids(12), enc.encode_texts(texts), modality="text", sources=[{"text": t} for t in texts])
    pool = pool_with((OLD_REF, enc))
    hits = Searcher(c, pool=pool).search(text="caption 5", k=3, target="text").hits
    assert hits[0].id == "id5" and hits[0].score == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("where", ["sqlite", "postgresql", "milvus-lite"])
def test_the_bulk_path_on_each_catalog_and_store(tmp_path, request, where):
    """New ids inserted at once, a repeat unchanged, a changed vector replacing its item, and
    unsourced items counted: the same on SQLite, PostgreSQL and a Milvus store."""
    if where == "sqlite":
        location = str(tmp_path / "c")
    elif where == "postgresql":
        location = f"{tmp_path / 'c'}?catalog={request.getfixturevalue('postgres_db')}#c"
    else:
        pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
        location = f"milvus-lite:{tmp_path}/m.db#c"
    c = Collection.create(location, space_id="s", dim=8, model="/m/s")
    x = _unit(30)
    srcs = [{"text": f"t{i}"} if i % 5 else {} for i in range(30)]
    r = add_vectors(c, _ids(30), x, modality="text", sources=srcs)
    assert (r.added, r.stored) == (30, 30)
    assert (add_vectors(c, _ids(30), x, modality="text", sources=srcs).unchanged, c.generation) == (30, 1)
    y = x.copy()
    y[3] = _unit(1, seed=7)[0]
    assert add_vectors(c, _ids(30), y, modality="text", sources=srcs).added == 1
    c = Collection.open(location)
    assert len(c) == 30 and c.snapshot().views("text")["s"].count == 30 and c.count_unsourced() == {"text": 6}
    view = c.snapshot().views("text")["s"]
    hit = view.gallery.search("text", y[3:4], k=1, mask=view.mask, space_id="s")
    assert c.snapshot().hits([int(view.rids[hit.positions[0][0]])]).popitem()[1][0] == "id3"


def test_catalog_json_is_one_canonical_form_and_takes_every_json_value():
    """Items added one by one, bulk rows and imported rows share one JSON writer: keys sorted,
    compact, NaN as null, an integer beyond 64 bits kept (orjson cannot write it: the standard
    library does, in the same form); a value JSON has no form for is refused, naming its type."""
    from nobackfill.catalog.items import Item, _item_json, row_json, rows_json

    assert row_json({"b": 1, "a": [1.5, None]}) == '{"a":[1.5,null],"b":1}'
    assert row_json({"x": float("nan")}) == '{"x":null}'
    assert row_json({"big": 2**70, "a": 1}) == '{"a":1,"big":1180591620717411303424}'
    assert rows_json([{"a": 1}, {"big": -2**80}]) == ['{"a":1}', '{"big":-1208925819614629174706176}']
    it = Item(id="i", modality="text", key="i#0", source={"text": "t"}, metadata={"n": 2**65, "a": "é"})
    assert _item_json(it)[3:] == ('{"text":"t"}', '{"a":"é","n":36893488147419103232}')
    with pytest.raises(ValueError, match="not a JSON object of JSON values.*object"):
        row_json({"x": object()})


_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
                       | st.text(alphabet='{},:"\\ab\n\u00e9\x00', max_size=8),
                       lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='{},"ab', max_size=3),
                                                                                 kids, max_size=3), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(objs=st.lists(st.dictionaries(st.text(alphabet='{},:"ab\x00', max_size=4), _values, max_size=4), max_size=6))
def test_the_json_of_a_batch_is_each_objects_own_json(objs):
    # written as one array and cut between objects: a string holding '},{' must not cut it wrongly
    try:
        want = [row_json(o) for o in objs]
    except ValueError:  # (inf beside an integer orjson cannot write: no JSON takes it)
        with pytest.raises(ValueError, match="not a JSON object"):
            rows_json(objs)
        return
    assert rows_json(objs) == want


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=6), st.text(alphabet=" \t\u00a0\u3000ab\x01", max_size=4),
                          st.text(min_size=510, max_size=515), st.integers()), min_size=1, max_size=6))
def test_the_joined_id_test_passes_only_ids_each_test_passes(ids):
    """``_plain_ids`` (one test on the ids joined) says yes only where ``id_problem`` finds nothing
    in any id, and yes for every list of good ids without spaces at their ends."""
    from nobackfill.catalog.items import plain_ids as _plain_ids
    from nobackfill.catalog.items import id_problem

    good = all(id_problem(i) is None for i in ids)
    if _plain_ids(ids):
        assert good
    elif good:  # a good list it sends to the one-by-one test: spaces at an id's end, or a character
        # that is allowed but not printable
        assert any(i[:1] == " " or i[-1:] == " " or not i.isprintable() for i in ids)


def test_a_table_line_that_is_not_json_is_named_with_its_column(tmp_path):
    """One line naming the file, the line and the column (trial AH read "... character at at column 26")."""
    from nobackfill.adopt.sources import open_source

    np.save(tmp_path / "e.npy", np.eye(2, 8, dtype=np.float32))
    (tmp_path / "t.jsonl").write_text('{"id": "a"}\n{"id": "b\u0001"}\n')
    with pytest.raises(ValueError) as e:
        src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", id_column="id", modality="text")
        list(src.batches())
    msg = str(e.value)
    assert "t.jsonl row 2: invalid JSON (Invalid control character at column 10)" in msg and "at at" not in msg
