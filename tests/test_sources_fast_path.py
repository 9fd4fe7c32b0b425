"""The column-wise reading of tables whose ids are given (index/sources): the same batches, sources,
metadata and errors as the row-by-row loop, on tricky tables (parquet, JSONL, CSV)."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobackfill.catalog.items import JsonRows, rows_json
from nobackfill.adopt.sources import ImportBatch, ImportSource, SourceError, open_source
from nobackfill.adopt.sources.arrow_json import (image_sources_json, metadata_json, sourced_metadata_json,
                                                 text_sources_json)
from nobackfill.adopt.sources.import_source import _ODD_FIRST
from nobackfill.adopt.sources.items import _chunk_metas, _jsonable, _own_ids, _string_id, _text, _texts, with_sources
from nobackfill.adopt.sources.table_source import TableSource
from nobackfill.adopt.sources.tables import _Chunk, _open_table
from nobackfill.adopt.sources import vectors
from nobackfill.adopt.sources.vectors import _ArrayVectors, _load_npy, _scan, _unit

DIM = 8

PATHS = ["images/a.jpg", "/abs/b.jpg", "~/c.jpg", "images/../d.jpg", "./e.jpg", "images//f.jpg", "/abs/./g.jpg",
         "/abs//h.jpg", ".hidden/i.jpg", "images/", "https://x.org/j.jpg", "s3://bucket/k.jpg", "/abs/x://y.jpg", "",
         "   ", None, "\u3000", " lead.jpg", "trail.jpg  ", "日本/画像.jpg", "\xa0x.jpg", "~", "a", "images/z.png"]
N = len(PATHS)
URLS = [[None, f"http://u/{i}", "", " ", f"ftp://v/{i}"][i % 5] for i in range(N)]
CAPTIONS = [["a cat", "", "  ", None, "\u3000x", " a dog "][i % 6] for i in range(N)]


def _vectors(tmp_path: Path, n: int = N) -> Path:
    x = np.random.default_rng(0).standard_normal((n, DIM)).astype(np.float32)
    x[::3] /= np.linalg.norm(x[::3], axis=1, keepdims=True)  # some unit rows, some normalised on reading
    np.save(tmp_path / "emb.npy", x)
    return tmp_path / "emb.npy"


def _columns(ids: list) -> dict[str, list]:
    """The table's columns: ids, path / url / caption cells and metadata of every kind."""
    return {"pk": ids, "image_path": PATHS, "url": URLS, "caption": CAPTIONS,
            "n": [None if i % 7 == 3 else i for i in range(N)],
            "f": [[0.5, float("nan"), None, float("inf"), -float("inf"), 2.0][i % 6] for i in range(N)],
            "flag": [[True, False, None][i % 3] for i in range(N)],
            "s": [None if i % 4 == 0 else f"s{i}" for i in range(N)],
            "nested": [None if i % 5 == 0 else {"k": [i, float("nan")], "t": "x"} for i in range(N)]}


def _write(tmp_path: Path, fmt: str, cols: dict[str, list]) -> Path:
    rows = [dict(zip(cols, r)) for r in zip(*cols.values())]
    path = tmp_path / f"meta.{fmt}"
    if fmt == "parquet":
        extra = {"b": [b"\xff\x00" if i % 2 else "é".encode() for i in range(N)],
                 "ts": [dt.datetime(2024, 1, 1 + i % 28) for i in range(N)]}
        pq.write_table(pa.table({**cols, **extra}), path, row_group_size=4)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        names = [c for c in ("pk", "image_path", "url", "caption", "n", "s") if c in cols]
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(names)
            w.writerows([["" if r[c] is None else r[c] for c in names] for r in rows])
    return path


def _shown(b: ImportBatch) -> tuple:
    """A batch's fields, its sources and metadata as the catalog's JSON (value types included; a
    reader may hand them over as that JSON already)."""
    return b.row0, b.row_end, b.ids, b.modality, rows_json(b.sources), rows_json(b.metadata), b.rows


def _dump(src: ImportSource, start_row: int = 0) -> tuple[str, list[bytes]]:
    """Every batch as one string and its vectors' bytes."""
    batches = list(src.batches(start_row))
    text = repr([_shown(b) for b in batches])
    return text, [b.vectors.tobytes() for b in batches] + [repr(src.warnings).encode()]


def _both(monkeypatch, open_it, check=None):
    """``check(src)`` (default: every batch, a resume and scattered rows) column by column and row by
    row; asserts the column-wise reading ran and both give the same."""
    calls = []
    real = TableSource._listed_sources
    monkeypatch.setattr(TableSource, "_listed_sources", lambda self, *a: calls.append(1) or real(self, *a))
    check = check or (lambda s: (_dump(s), _dump(s, 5), repr(_shown(rows := s.read_rows([9, 2, 17, 3]))),
                                 rows.vectors.tobytes()))
    fast = check(open_it())
    assert calls, "the column-wise path did not run"
    monkeypatch.setattr(TableSource, "_columnwise", False)
    calls.clear()
    slow = check(open_it())
    assert not calls
    assert fast == slow
    return fast


def _ids(kind: str) -> list:
    if kind == "str":
        return [f"p{i}" if i % 5 else f" p{i}" for i in range(N)]  # a leading space is kept
    if kind == "int":
        return [i * 7 for i in range(N)]
    return [i + (0.5 if i % 2 else 0.0) for i in range(N)]  # 2.0 -> "2", 3.5 -> "3.5"


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
@pytest.mark.parametrize("root", ["plain", ".dot", "//double"])
@pytest.mark.parametrize("url", [True, False])
def test_image_tables_read_the_same_column_by_column(tmp_path, monkeypatch, fmt, root, url):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cols = _columns(_ids("str"))
    if not url:
        del cols["url"]
    table, emb = _write(tmp_path, fmt, cols), _vectors(tmp_path)
    images = {"plain": tmp_path / "root", ".dot": tmp_path / ".cache" / "root", "//double": f"/{tmp_path}/root"}[root]
    got = _both(monkeypatch, lambda: open_source(f"npy:{emb}", table=table, id_column="pk",
                                                 source_column="image_path", modality="image", images_root=images,
                                                 batch_rows=4))
    text = got[0][0]
    assert '"path":"","url":"https://x.org/j.jpg"' in text  # a url in the path column
    assert ('"path":"","url":"http://u/11"' in text) == url  # a url column's cell wins over it


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("kind", ["int", "float"])
def test_number_ids_and_text_tables_read_the_same(tmp_path, monkeypatch, fmt, kind):
    table, emb = _write(tmp_path, fmt, _columns(_ids(kind))), _vectors(tmp_path)
    for modality, column in (("image", None), ("image", "url"), ("text", "caption")):
        got = _both(monkeypatch, lambda: open_source(f"npy:{emb}", table=table, id_column="pk", modality=modality,
                                                     source_column=column, batch_rows=5))
        monkeypatch.undo()
        assert ("'3.5'" in got[0][0]) == (kind == "float") and "'2.0'" not in got[0][0] and "'7'" in got[0][0] \
            or kind == "float"


def test_cheap_reads_for_duplicates_and_resumes_are_the_same(tmp_path, monkeypatch):
    ids = _ids("str")
    ids[11] = ids[6]
    table, emb = _write(tmp_path, "parquet", _columns(ids)), _vectors(tmp_path)
    src = lambda: open_source(f"npy:{emb}", table=table, id_column="pk", modality="image", batch_rows=4)  # noqa: E731

    def dup(s):
        with pytest.raises(SourceError) as e:
            _dump(s)
        return str(e.value), _dump(s, 12), [(x[0], x[2], x[3]) for x in s._id_rows(9)]

    msg = _both(monkeypatch, src, dup)[0]
    assert msg.endswith("meta.parquet row 12: id 'p6' repeats the id of row 7 (ids must be unique)")


@pytest.mark.parametrize("fmt, cell, row", [("parquet", None, 7), ("jsonl", None, 6), ("csv", "  ", 6),
                                            ("jsonl", "\u3000", 10), ("jsonl", float("nan"), 9)])
def test_an_empty_id_names_its_file_and_row(tmp_path, monkeypatch, fmt, cell, row):
    ids = _ids("str")
    ids[row - 1] = cell
    cols = _columns(ids)
    if fmt == "jsonl" and cell is None:  # no id at all in that line
        table = _write(tmp_path, fmt, cols)
        lines = table.read_text(encoding="utf-8").splitlines()
        lines[row - 1] = json.dumps({k: v for k, v in json.loads(lines[row - 1]).items() if k != "pk"})
        table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        table = _write(tmp_path, fmt, cols)
    emb = _vectors(tmp_path)

    def err(s):
        with pytest.raises(SourceError) as e:
            _dump(s)
        return str(e.value)

    msg = _both(monkeypatch, lambda: open_source(f"npy:{emb}", table=table, id_column="pk", modality="image",
                                                 batch_rows=4), err)
    assert msg == f"{table} row {row}: column 'pk' is empty (every row needs an id)"


# ------------------------------------------------------------------- the column functions, cell by cell

CELLS = st.one_of(st.none(), st.text(alphabet="/.~: a\u3000\xa0é\t", max_size=8), st.integers(-3, 3),
                  st.floats(allow_nan=True, allow_infinity=True), st.booleans())


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[ImportSource]:
    base = tmp_path_factory.mktemp("roots")
    return [ImportSource([], batch_rows=1, description="", ids_from_column=True, images_root=Path(r))
            for r in (base / "r", base / ".d" / "r", f"/{base}/r", "/")]


@settings(max_examples=300, deadline=None)
@given(paths=st.lists(CELLS, max_size=12), urls=st.lists(CELLS, max_size=12), with_urls=st.booleans())
def test_image_sources_are_image_of_each_row(sources, paths, urls, with_urls):
    urls = (urls + [None] * len(paths))[:len(paths)] if with_urls else None
    for src in sources:
        want = []
        for j, p in enumerate(paths):
            raw, url = _text(p), _text(urls[j]) if urls is not None else ""
            want.append(src._image(raw, url, False, need_id=False)[1] if raw or url else {})
        assert repr(src._image_sources(paths, urls)) == repr(want)


@settings(max_examples=300, deadline=None)
@given(cells=st.lists(CELLS, max_size=10))
def test_texts_and_ids_are_those_of_each_cell(cells):
    assert _texts(cells) == [_text(v) for v in cells]
    chunk = _Chunk(len(cells), records=[{"id": v} for v in cells])
    want = [_string_id(v) for v in cells]
    if all(want):
        assert _own_ids(chunk, "id", "t", 0) == want
    else:
        with pytest.raises(SourceError, match=rf"^t row {want.index('') + 1}: column 'id' is empty"):
            _own_ids(chunk, "id", "t", 0)


TYPED = {pa.int64(): st.integers(-2 ** 63, 2 ** 63 - 1), pa.float64(): st.floats(), pa.string(): st.text(max_size=3),
         pa.bool_(): st.booleans(), pa.list_(pa.float64()): st.lists(st.floats(), max_size=2),
         pa.struct({"a": pa.float64()}): st.fixed_dictionaries({"a": st.floats()}), pa.binary(): st.binary(max_size=3)}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_metadata_columns_are_those_of_each_row(data):
    n = data.draw(st.integers(0, 8))
    types = data.draw(st.lists(st.sampled_from(list(TYPED)), min_size=1, max_size=4))
    table = pa.table({f"c{i}": pa.array(data.draw(st.lists(st.one_of(st.none(), TYPED[t]), min_size=n, max_size=n)),
                                        type=t) for i, t in enumerate(types)})
    records = table.to_pylist()
    got = repr(_chunk_metas(_Chunk(n, arrow=table), {"c1"}))
    assert got == repr(_chunk_metas(_Chunk(n, records=records), {"c1"}))  # row by row
    assert got == repr([{k: _jsonable(v) for k, v in r.items() if k != "c1"} for r in records])


def test_records_keep_their_own_key_order():
    recs = [{"a": 1, "b": float("nan"), "c": "x"}, {"b": 3, "a": 4, "c": None}, {"a": 5}]
    assert repr(_chunk_metas(_Chunk(3, records=recs), {"c"})) == "[{'a': 1, 'b': None}, {'b': 3, 'a': 4}, {'a': 5}]"
    assert repr(_chunk_metas(_Chunk(2, records=recs[:2][::-1]), {"a", "b"})) == "[{'c': None}, {'c': 'x'}]"


@pytest.mark.parametrize("text", ["id,path,x,x\n1,a,,\n\n2,\"\",\"q,r\",s,extra,more\n3\n,,,\n", "id\n", "",
                                  "\n1,2\n3\n", "a\tb\n1\t\n"])
def test_csv_rows_are_those_of_dict_reader(tmp_path, text):
    path = tmp_path / ("t.tsv" if "\t" in text else "t.csv")
    path.write_text(text, encoding="utf-8")
    with open(path, newline="", encoding="utf-8") as fh:
        want = [{k: (v if v != "" else None) for k, v in rec.items() if k is not None}
                for rec in csv.DictReader(fh, delimiter="\t" if "\t" in text else ",")]
    table = _open_table(path)
    assert table.num_rows == len(want)
    assert repr([r for c in table.chunks(0, 2) for r in c.records]) == repr(want)
    assert repr(table.take([1, 2]).records) == repr(want[1:3])


def test_no_space_to_strip_lies_past_the_odd_first_characters():
    assert not any(chr(c).isspace() for c in range(0x3001, 0x110000))
    assert all(c in _ODD_FIRST for c in map(chr, range(0x3001)) if c.isspace())


# ------------------------------------------------------------------------------------------ vectors

@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("scan_rows", [64, None])
def test_unit_rows_skip_measuring_rows_the_scan_found_unit(tmp_path, monkeypatch, dtype, scan_rows):
    if scan_rows:  # the scan in blocks (of a multiple of 8 rows)
        monkeypatch.setattr(vectors, "_SCAN_ROWS", scan_rows)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 7))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    near = rng.random(300) < 0.5
    x[near] *= 1 + rng.uniform(-1.3e-6, 1.3e-6, (int(near.sum()), 1))  # about the 1e-6 line
    x[[5, 140]] *= 3.0
    np.save(tmp_path / "e.npy", x.astype(dtype))
    vec = _load_npy(tmp_path / "e.npy")
    normalised = _scan(vec, 7)
    assert vec._moved is not None and len(vec._moved) == -(-300 // 8)
    if dtype != "float16":
        assert normalised == 2 and 2 < np.unpackbits(vec._moved).sum() < 200
    for size in (1, 3, 8, 13, 64, 300):
        for s in range(0, 300, size):
            e = min(300, s + size)
            assert vec.unit(s, e).tobytes() == _unit(vec.read(s, e)).tobytes()
    mem = _ArrayVectors(np.load(tmp_path / "e.npy"), tmp_path / "e.npy")  # in memory (npz): no map to release
    _scan(mem, None)
    assert mem.unit(0, 300).tobytes() == _unit(mem.read(0, 300)).tobytes()


def test_the_scan_reads_no_vector_twice_and_still_finds_bad_rows(tmp_path):
    x = np.ones((10, 4), np.float32) / 2
    x[6, 1] = -np.inf
    np.save(tmp_path / "e.npy", x)
    with pytest.raises(SourceError, match=r"e\.npy row 7: the vector has NaN or infinite values"):
        _scan(_load_npy(tmp_path / "e.npy"), None)
    big = np.full((3, 4), 3e38, np.float32)  # squares overflow float32 but not the float64 sum
    np.save(tmp_path / "big.npy", big)
    assert _scan(_load_npy(tmp_path / "big.npy"), None) == 3


# ------------------------------------------------------------------- JSON written column by column in Arrow

#: path cells of every kind the Arrow rules take or leave: plain, absolute, urls, and those to normalise or escape
PATH_CELLS = st.one_of(st.sampled_from(["images/a.jpg", "b.jpg", "_x/c.png", "Z", "/abs/d.jpg", "https://x.org/e.jpg",
                                        "s3://b/f", "9/g.jpg", "images/./h.jpg", "a//i.jpg", ".j.jpg", "~/k.jpg",
                                        "/", "ö/l.jpg", 'q"m.jpg', "n\\o.jpg", "tab\t.jpg", "日本/画像.jpg"]),
                       st.text(alphabet='/.~:a"\\\t é', max_size=6))
ARROW_TYPED = {pa.int64(): st.integers(-2 ** 63, 2 ** 63 - 1), pa.uint64(): st.integers(0, 2 ** 64 - 1),
               pa.int8(): st.integers(-128, 127), pa.bool_(): st.booleans(), pa.null(): st.none(),
               pa.string(): st.text(alphabet='ab "\\\n\x01é😀', max_size=4), pa.large_string(): st.text(max_size=3),
               pa.float64(): st.floats()}


@settings(max_examples=300, deadline=None)
@given(paths=st.lists(PATH_CELLS, max_size=10))
def test_image_sources_written_in_arrow_are_those_of_each_row(sources, paths):
    for src in sources:
        made = image_sources_json(pa.chunked_array([pa.array(paths, pa.string())]), src._root_str)
        if made is not None:  # (None: the dicts are made row by row)
            assert made[0].texts == rows_json(src._image_sources(paths, None))
            table = pa.table({"k": pa.array(range(len(paths)), pa.int64())})
            assert sourced_metadata_json(table, ["k"], made[1]).texts == \
                rows_json(with_sources([{"k": i} for i in range(len(paths))], src._image_sources(paths, None)))
    plain = [p for p in paths if (p[:1].isascii() and p[:1].isalnum() or p[:1] == "/") and "//" not in p
             and "/." not in p and not any(c in p for c in '"\\\t')]
    assert image_sources_json(pa.chunked_array([pa.array(plain, pa.string())]), sources[0]._root_str) is not None


@settings(max_examples=300, deadline=None)
@given(cells=st.lists(st.text(alphabet='ab "\\\n\x01 \u3000é', max_size=5), max_size=8))
def test_text_sources_written_in_arrow_are_those_of_each_row(cells):
    made = text_sources_json(pa.chunked_array([pa.array(cells, pa.string())]))
    if made is not None:
        assert made[0].texts == rows_json([{"text": t} if t else {} for t in _texts(cells)])
        assert sourced_metadata_json(pa.table({"x": pa.nulls(len(cells))}), [], made[1]).texts == made[0].texts
    else:
        assert any(not any(c.isalpha() and c.isascii() for c in t) or set(t) & set('"\\\n\x01') for t in cells)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_metadata_written_in_arrow_is_that_of_each_row(data):
    n = data.draw(st.integers(0, 6))
    names = data.draw(st.lists(st.sampled_from(["b", "a", "z9", "é", 'q"', "a b", "_"]), min_size=1, max_size=4,
                               unique=True))
    types = [data.draw(st.sampled_from(list(ARROW_TYPED))) for _ in names]
    table = pa.table({k: pa.array(data.draw(st.lists(st.one_of(st.none(), ARROW_TYPED[t]), min_size=n, max_size=n)),
                                  type=t) for k, t in zip(names, types)})
    keys = [k for k in names if k != "a"]
    made = metadata_json(table, keys)
    want = rows_json(_chunk_metas(_Chunk(n, arrow=table), {"a"}))
    if made is not None:
        assert made.texts == want
    escaped = (lambda cells: any(c in '"\\' or c < " " for s in cells if s for c in s))
    plain = all(k.isascii() and k.isalnum() or k == "_" for k in keys) and not any(
        pa.types.is_floating(t) or (not pa.types.is_integer(t) and escaped(table.column(k).to_pylist()))
        for k, t in zip(names, types) if k in keys and not pa.types.is_boolean(t) and not pa.types.is_null(t))
    if plain:  # (plain columns are written in Arrow)
        assert made is not None


def test_a_plain_parquet_table_is_read_as_json_columns_equal_to_the_rows(tmp_path, monkeypatch):
    """Plain paths, urls and int / bool / string / null metadata: the batches carry the JSON written in
    Arrow (no dict per row), equal to the row-by-row reading's."""
    n = 23
    cols = {"pk": [f"id{i}" for i in range(n)],
            "image_path": [f"images/{i}.jpg" if i % 3 else f"https://x.org/{i}.jpg" for i in range(n)],
            "group": [None if i % 5 == 0 else i % 4 for i in range(n)], "ok": [i % 2 == 0 for i in range(n)],
            "tag": [f"t{i}" if i % 7 else None for i in range(n)], "empty": pa.nulls(n)}
    table, emb = tmp_path / "plain.parquet", _vectors(tmp_path, n)
    pq.write_table(pa.table(cols), table, row_group_size=5)
    src = open_source(f"npy:{emb}", table=table, id_column="pk", source_column="image_path", modality="image",
                      images_root=tmp_path / "root", batch_rows=8)
    first = next(iter(src.batches()))
    assert isinstance(first.sources, JsonRows) and isinstance(first.metadata, JsonRows)
    assert first.metadata.texts[1] == \
        f'{{"empty":null,"group":1,"ok":false,"path":"{tmp_path / "root" / "images" / "1.jpg"}","tag":"t1"}}'
    assert first.metadata[0] == {"empty": None, "group": None, "ok": True, "tag": None, "url": "https://x.org/0.jpg"}
    assert first.sources[0] == {"path": "", "url": "https://x.org/0.jpg"}
    assert first.sources[1] == {"path": str(tmp_path / "root" / "images" / "1.jpg")}
    _both(monkeypatch, lambda: open_source(f"npy:{emb}", table=table, id_column="pk", source_column="image_path",
                                           modality="image", images_root=tmp_path / "root", batch_rows=8))


def test_json_rows_read_as_a_list_of_dicts():
    rows = JsonRows(['{"a":1}', "{}", '{"b":[1,null]}'])
    assert len(rows) == 3 and rows[0] == {"a": 1} and rows[-1] == {"b": [1, None]} and list(rows)[1] == {}
    assert rows == [{"a": 1}, {}, {"b": [1, None]}] and rows != [{"a": 1}] and rows != "x"
    assert rows[1:].texts == ["{}", '{"b":[1,null]}'] and rows.where([True, False, True]).texts == ['{"a":1}',
                                                                                                  '{"b":[1,null]}']
    assert rows_json(rows) == rows.texts and rows_json(rows) is not rows.texts
