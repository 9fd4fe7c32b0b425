"""Readers of vectors embedded elsewhere (index/sources.py), the model check (index/model_check.py)
and our clip-retrieval layout writer (data/clip_retrieval.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _collection_helpers import HashEncoder, make_folder
from nobackfill.data.clip_retrieval import write_clip_retrieval
from nobackfill.collection.ingest import folder_items, image_id, text_id
from nobackfill.adopt.model_check import ModelCheck, check_model, sample_rows
from nobackfill.adopt.sources import ImportSource, SourceError, open_source
from nobackfill.gallery.atomic_files import file_sha256

DIM = 16


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _rand(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    return _unit(np.random.default_rng(seed).standard_normal((n, dim)))


def _all(src: ImportSource, start_row: int = 0):
    ids, mods, sources, metas, vecs, rows = [], [], [], [], [], []
    for b in src.batches(start_row):
        ids += b.ids
        mods += b.modality
        sources += b.sources
        metas += b.metadata
        rows += b.rows
        vecs.append(b.vectors)
    return ids, mods, sources, metas, (np.concatenate(vecs) if vecs else np.zeros((0, src.dim))), rows


@pytest.fixture(scope="module")
def enc() -> HashEncoder:
    return HashEncoder(DIM, "v1", name="hash-v1")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """4 images with 2 captions each (captions.jsonl) and 2 uncaptioned images."""
    return make_folder(tmp_path_factory.mktemp("data"), n_images=4, captions_per_image=2, extra_images=2)


def _pairs(folder: Path):
    lines = [json.loads(x) for x in (folder / "captions.jsonl").read_text().splitlines()]
    return [str(folder / x["image"]) for x in lines], [x["caption"] for x in lines]


@pytest.fixture(scope="module")
def cr_dir(tmp_path_factory, folder, enc) -> Path:
    """clip-retrieval output of the folder's (image, caption) pairs: 8 rows, float32."""
    paths, caps = _pairs(folder)
    out = tmp_path_factory.mktemp("cr") / "emb"
    write_clip_retrieval(out, image_paths=paths, image_vectors=enc.encode_images(paths), captions=caps,
                         text_vectors=enc.encode_texts(caps), dtype=np.float32)
    return out


# ---------------------------------------------------------------------------------- clip-retrieval

def test_clip_retrieval_round_trip_gives_the_ids_of_add(cr_dir, folder, enc):
    src = open_source(f"clip-retrieval:{cr_dir}")
    assert src.rows == 16 and src.dim == DIM and "clip-retrieval" in src.describe()
    ids, mods, sources, metas, vecs, rows = _all(src)
    # each image is 2 rows (one per caption): kept once, the repeats counted
    assert mods.count("image") == 4 and mods.count("text") == 8
    assert any("4 rows repeat" in w for w in src.warnings)
    added = {it.id: it for it in folder_items(folder, uncaptioned=False).items}
    assert set(ids) == set(added)  # the same ids `collection add` gives
    for iid, m, s, md, v, r in zip(ids, mods, sources, metas, vecs, rows):
        it = added[iid]
        want = enc.encode_images([it.payload]) if m == "image" else enc.encode_texts([it.payload])
        np.testing.assert_allclose(v, want[0], atol=1e-6)
        if m == "image":
            assert s["path"] == it.source["path"] and s["sha256"] == it.source["sha256"] and "url" not in s
            assert r % 2 == 0
        else:
            assert s == {"text": it.payload} and md["image_id"] == it.metadata["image_id"] and r % 2 == 1
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-6) and vecs.dtype == np.float32


def test_clip_retrieval_float16_default_is_upcast(tmp_path, folder, enc):
    paths, caps = _pairs(folder)
    out = write_clip_retrieval(tmp_path / "cr", image_paths=paths, image_vectors=enc.encode_images(paths))
    assert np.load(out / "img_emb" / "img_emb_0.npy").dtype == np.float16
    assert pq.read_table(out / "metadata" / "metadata_0.parquet").column_names == ["image_path"]
    src = open_source(f"clip-retrieval:{out}")
    assert "float16" in src.describe() and src.rows == 8  # images only: one item per row
    ids, mods, _, _, vecs, _ = _all(src)
    assert vecs.dtype == np.float32 and set(mods) == {"image"} and len(ids) == 4
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-6)
    want = enc.encode_images(sorted(set(paths)))
    assert np.abs(np.sort(vecs @ want.T, axis=1)[:, -1] - 1).max() < 2e-3


def test_clip_retrieval_shards_stream_and_resume(tmp_path, folder, enc):
    paths, caps = _pairs(folder)
    out = write_clip_retrieval(tmp_path / "cr", image_paths=paths, image_vectors=enc.encode_images(paths),
                               captions=caps, text_vectors=enc.encode_texts(caps), shard_rows=3, dtype=np.float32)
    assert sorted(p.name for p in (out / "metadata").iterdir()) == [f"metadata_{i}.parquet" for i in range(3)]
    full = open_source(f"clip-retrieval:{out}", batch_rows=4)
    sizes = [(b.row0, b.row_end, len(b)) for b in full.batches()]
    # shards of 3 rows: 6, 6, 4 items; rows 0-3 are image 0, caption, image 0 again (kept once), caption
    assert sizes[0] == (0, 4, 3) and sizes[-1][1] == 16
    assert all(e - s <= 4 for s, e, _ in sizes)
    ids, _, _, _, vecs, rows = _all(open_source(f"clip-retrieval:{out}"))
    # resume in the middle of a pair (row 7 = the caption of metadata row 3)
    tail = _all(open_source(f"clip-retrieval:{out}", batch_rows=4), start_row=7)
    first = rows.index(7)
    assert tail[5][0] == 7 and set(tail[0]) >= set(ids[first:]) and set(tail[0]) - set(ids) == set()
    np.testing.assert_array_equal(tail[4][tail[0].index(ids[-1])], vecs[-1])


def test_clip_retrieval_relative_paths_urls_and_missing_files(tmp_path, folder, enc):
    rel = "images/000.png"
    vecs = np.stack([enc.encode_images([folder / rel])[0], _rand(1)[0], _rand(1, seed=1)[0]])
    out = write_clip_retrieval(tmp_path / "cr", image_paths=[rel, "images/missing.png", None],
                               image_vectors=vecs, urls=[None, None, "http://x.org/a.jpg"], dtype=np.float32)
    ids, _, sources, _, _, _ = _all(open_source(f"clip-retrieval:{out}", images_root=folder))
    assert ids[0] == image_id(file_sha256(folder / rel)) and sources[0]["path"] == str(folder / rel)
    assert sources[1] == {"path": str(folder / "images/missing.png")}  # unreadable: no sha256
    assert ids[1] == "img-" + hashlib.sha256(b"images/missing.png").hexdigest()[:20]
    assert sources[2] == {"path": "", "url": "http://x.org/a.jpg"}
    assert ids[2] == "img-" + hashlib.sha256(b"http://x.org/a.jpg").hexdigest()[:20]


def test_clip_retrieval_errors_name_files(tmp_path, folder, enc):
    paths, caps = _pairs(folder)
    out = write_clip_retrieval(tmp_path / "cr", image_paths=paths, image_vectors=enc.encode_images(paths),
                               dtype=np.float32)
    np.save(out / "img_emb" / "img_emb_0.npy", enc.encode_images(paths[:5]))
    with pytest.raises(SourceError, match=r"metadata_0\.parquet has 8 rows but .*img_emb_0\.npy has 5 vectors"):
        open_source(f"clip-retrieval:{out}")
    with pytest.raises(SourceError, match="no metadata/metadata_"):
        open_source(f"clip-retrieval:{tmp_path}")
    with pytest.raises(SourceError, match=r"no column 'key' \(the id column\); its columns: image_path"):
        np.save(out / "img_emb" / "img_emb_0.npy", enc.encode_images(paths))
        open_source(f"clip-retrieval:{out}", id_column="key")


# ------------------------------------------------------------------------------- npy / npz / tables

def _parquet(path: Path, **cols) -> Path:
    pq.write_table(pa.table(cols), path, row_group_size=3)
    return path


def test_npy_parquet_round_trip_with_ids_sources_metadata(tmp_path, folder):
    vecs = _rand(7)
    np.save(tmp_path / "emb.npy", vecs)
    names = [f"images/{i:03d}.png" for i in range(6)] + ["images/nope.png"]
    _parquet(tmp_path / "meta.parquet", pk=[f"p{i}" for i in range(7)], image_path=names,
             shop=["a", "b", "c", "d", "e", "f", "g"], score=[0.5, 1, 2, 3, 4, 5, float("nan")])
    src = open_source(f"npy:{tmp_path / 'emb.npy'}", table=tmp_path / "meta.parquet", id_column="pk",
                      modality="image", images_root=folder, batch_rows=3)
    assert src.rows == 7 and "ids from 'pk'" in src.describe()
    ids, mods, sources, metas, got, rows = _all(src)
    assert ids == [f"p{i}" for i in range(7)] and mods == ["image"] * 7 and rows == list(range(7))
    np.testing.assert_array_equal(got, vecs)
    assert sources[0] == {"path": str(folder / names[0])}  # ids from the table: no image file is read
    assert sources[6] == {"path": str(folder / "images/nope.png")}
    assert metas[0] == {"path": str(folder / names[0]), "shop": "a", "score": 0.5} and metas[6]["score"] is None
    json.dumps(metas)
    # start_row resumes (parquet row groups of 3: start inside one)
    assert _all(src, start_row=4)[0] == ids[4:]


def test_ids_derived_like_add_without_id_column(tmp_path, folder):
    np.save(tmp_path / "t.npy", _rand(3))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"caption": c, "lang": "en"}) + "\n"
                                              for c in ["a cat", "a dog", "a cow"]) + "\n")
    ids, mods, sources, metas, _, _ = _all(open_source(f"npy:{tmp_path / 't.npy'}", table=tmp_path / "t.jsonl",
                                                       modality="text"))
    assert ids == [text_id(c) for c in ["a cat", "a dog", "a cow"]] and sources[1] == {"text": "a dog"}
    assert metas[0] == {"text": "a cat", "lang": "en"}
    np.save(tmp_path / "i.npy", _rand(2))
    (tmp_path / "i.csv").write_text("path,note\nimages/001.png,x\n/elsewhere/z.png,\n")
    ids, _, sources, metas, _, _ = _all(open_source(f"npy:{tmp_path / 'i.npy'}", table=tmp_path / "i.csv",
                                                    modality="image", images_root=folder))
    assert ids[0] == image_id(file_sha256(folder / "images/001.png"))
    assert ids[1] == "img-" + hashlib.sha256(b"/elsewhere/z.png").hexdigest()[:20]
    assert metas == [{"path": str(folder / "images/001.png"), "note": "x"}, {"path": "/elsewhere/z.png", "note": None}]


def test_npz_key_or_only_array_and_modality_column(tmp_path):
    a, b = _rand(3), _rand(3, seed=1)
    np.savez(tmp_path / "two.npz", a=a, b=b)
    np.savez(tmp_path / "one.npz", emb=b)
    (tmp_path / "t.jsonl").write_text(
        '{"id": 1, "modality": "image", "src": "http://x/1.jpg"}\n{"id": 2, "modality": "text", "src": "hello"}\n'
        '{"id": 3, "src": "world"}\n')
    src = open_source(f"npz:{tmp_path / 'two.npz'}:b", table=tmp_path / "t.jsonl", source_column="src",
                      modality="text", id_column="id")
    ids, mods, sources, _, got, _ = _all(src)
    assert ids == ["1", "2", "3"] and mods == ["image", "text", "text"]  # empty modality cell: the default
    assert sources == [{"path": "", "url": "http://x/1.jpg"}, {"text": "hello"}, {"text": "world"}]
    np.testing.assert_array_equal(got, b)
    np.testing.assert_array_equal(_all(open_source(f"npz:{tmp_path / 'one.npz'}", table=tmp_path / "t.jsonl",
                                                   modality="text", id_column="id"))[4], b)
    with pytest.raises(SourceError, match=r"two\.npz: holds 2 arrays \(a, b\)"):
        open_source(f"npz:{tmp_path / 'two.npz'}", table=tmp_path / "t.jsonl", modality="text")


def test_unit_length_normalised_with_a_warning(tmp_path):
    v = _rand(10)
    v[[1, 4, 7]] *= 3.0
    np.save(tmp_path / "e.npy", v)
    (tmp_path / "t.csv").write_text("id\n" + "".join(f"x{i}\n" for i in range(10)))
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.csv", modality="image", id_column="id")
    assert any(w.startswith("3 of 10 vectors were not unit length: normalised") for w in src.warnings)
    assert any("no source column" in w for w in src.warnings)  # ids only: cannot be re-embedded
    got = _all(src)[4]
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(got, _unit(v), atol=1e-6)


# ------------------------------------------------------------------------------------- validation

def _ids_table(tmp_path: Path, n: int, ids=None) -> Path:
    return _parquet(tmp_path / "ids.parquet", id=ids or [f"i{k}" for k in range(n)],
                    text=[f"text {k}" for k in range(n)])


def test_duplicate_ids_name_both_rows(tmp_path):
    np.save(tmp_path / "e.npy", _rand(7))
    table = _ids_table(tmp_path, 7, ids=["a", "b", "c", "d", "b", "e", "f"])
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=table, modality="text", batch_rows=2, id_column="id")
    with pytest.raises(SourceError, match=r"ids\.parquet row 5: id 'b' repeats the id of row 2"):
        _all(src)
    with pytest.raises(SourceError, match=r"row 5: id 'b' repeats the id of row 2"):  # also when resumed after row 2
        _all(src, start_row=3)


def test_count_mismatch_names_both_files_and_counts(tmp_path):
    np.save(tmp_path / "e.npy", _rand(5))
    with pytest.raises(SourceError, match=r"ids\.parquet has 6 rows but .*e\.npy has 5 vectors"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=_ids_table(tmp_path, 6), modality="text")


@pytest.mark.parametrize("bad, what", [(np.nan, "NaN or infinite"), (np.inf, "NaN or infinite"),
                                       (0.0, "all zeros")])
def test_nan_inf_zero_name_file_and_row(tmp_path, bad, what):
    v = _rand(5)
    v[3] = bad if bad == 0.0 else v[3]
    if bad != 0.0:
        v[3, 2] = bad
    np.save(tmp_path / "e.npy", v)
    with pytest.raises(SourceError, match=rf"e\.npy row 4: the vector .*{what}"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=_ids_table(tmp_path, 5), modality="text")


def test_width_missing_column_no_modality_and_bad_json(tmp_path):
    np.save(tmp_path / "e.npy", _rand(3))
    table = _ids_table(tmp_path, 3)
    with pytest.raises(SourceError, match=r"e\.npy: vectors are 16-d .* the model embeds 32-d"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=table, modality="text", expect_dim=32)
    with pytest.raises(SourceError, match=r"ids\.parquet: no column 'path' \(the source column\); its columns: id, "
                                          "text"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=table, modality="image", source_column="path")
    with pytest.raises(SourceError, match="no 'modality' column and no modality given"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=table)
    (tmp_path / "t.jsonl").write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": \n{"id": "c", "text": "z"}\n')
    with pytest.raises(SourceError, match=r"t\.jsonl row 2: invalid JSON"):
        _all(open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", modality="text", id_column="id"))
    (tmp_path / "u.jsonl").write_text('{"id": "a", "text": "x"}\n{"text": "y"}\n{"id": "c", "text": "z"}\n')
    with pytest.raises(SourceError, match=r"u\.jsonl row 2: column 'id' is empty"):
        _all(open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "u.jsonl", modality="text", id_column="id"))
    with pytest.raises(SourceError, match="vectors alone have no ids"):
        open_source(f"npy:{tmp_path / 'e.npy'}", modality="text")


# -------------------------------------------------------------------------------------------- faiss

def _faiss(tmp_path: Path, factory: str, x: np.ndarray, ids=None) -> Path:
    index = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x) if ids is None else index.add_with_ids(x, np.asarray(ids, dtype=np.int64))
    path = tmp_path / f"{factory.replace(',', '_')}.faiss"
    faiss.write_index(index, str(path))
    return path


@pytest.mark.parametrize("factory", ["Flat", "HNSW8", "IVF4,Flat"])
def test_faiss_exact_indexes_give_back_their_vectors(tmp_path, factory):
    x = _rand(40, seed=3)
    path = _faiss(tmp_path, factory, x)
    table = _ids_table(tmp_path, 40)
    src = open_source(f"faiss:{path}", table=table, modality="text", batch_rows=16, id_column="id")
    assert "(exact)" in src.describe() and not src.warnings
    ids, _, sources, _, got, _ = _all(src)
    assert ids == [f"i{k}" for k in range(40)] and sources[5] == {"text": "text 5"}
    np.testing.assert_array_equal(got, x)  # IVF-Flat: read by position through its direct map


def test_faiss_idmap_ids_map_to_table_rows_or_become_the_ids(tmp_path):
    x = _rand(6, seed=4)
    perm = [3, 0, 5, 1, 4, 2]  # index entry j holds table row perm[j]
    path = _faiss(tmp_path, "IDMap2,Flat", x, ids=perm)
    ids, _, sources, _, got, _ = _all(open_source(f"faiss:{path}", table=_ids_table(tmp_path, 6), modality="text",
                                                  id_column="id"))
    assert ids == [f"i{k}" for k in range(6)] and sources[3] == {"text": "text 3"}  # table order
    np.testing.assert_array_equal(got[perm], x)
    bare = open_source(f"faiss:{path}", modality="image")
    ids, mods, sources, _, got, _ = _all(bare)
    assert ids == [str(k) for k in perm] and sources == [{}] * 6 and mods == ["image"] * 6
    assert any("without a table" in w for w in bare.warnings)
    np.testing.assert_array_equal(got, x)
    with pytest.raises(SourceError, match=r"Flat\.faiss: this IndexFlatIP index holds no ids"):
        open_source(f"faiss:{_faiss(tmp_path, 'Flat', x)}", modality="text")
    with pytest.raises(SourceError, match=r"vector 2: faiss id 9 is not a row of .*ids\.parquet"):
        open_source(f"faiss:{_faiss(tmp_path, 'IDMap,Flat', x, ids=[0, 9, 1, 2, 3, 4])}",
                    table=_ids_table(tmp_path, 6), modality="text")
    with pytest.raises(SourceError, match=r"vector 3: faiss id 1 repeats the id of vector 2"):
        open_source(f"faiss:{_faiss(tmp_path, 'IDMap,Flat', x, ids=[0, 1, 1, 2, 3, 4])}", modality="text")


@pytest.mark.parametrize("factory, name", [("SQ4", "IndexScalarQuantizer"), ("IVF2,SQ4", "IndexIVFScalarQuantizer")])
def test_faiss_lossy_refused_then_accepted_with_a_warning(tmp_path, factory, name):
    x = _rand(64, seed=5)
    path = _faiss(tmp_path, factory, x)
    table = _ids_table(tmp_path, 64)
    with pytest.raises(SourceError, match=rf"\.faiss: this {name} index stores its vectors lossily.*lossy=True"):
        open_source(f"faiss:{path}", table=table, modality="text")
    src = open_source(f"faiss:{path}", table=table, modality="text", lossy=True)
    assert "(lossy)" in src.describe()
    assert any(f"lossy {name}" in w and "approximations" in w and "drift" in w for w in src.warnings)
    got = _all(src)[4]
    cos = np.einsum("ij,ij->i", got, x)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5) and not np.array_equal(got, x)
    assert 0.5 < np.median(cos) < 1.0 - 1e-6
    with pytest.raises(ValueError, match="faiss indexes only"):
        open_source(f"npy:{path}", lossy=True)


# -------------------------------------------------------------------------------------- model check

def test_check_model_accepts_the_right_model_and_refuses_others(cr_dir, enc):
    src = open_source(f"clip-retrieval:{cr_dir}")
    samples = sample_rows(src, n=10, seed=0)
    assert len(samples) == 10 and samples == sorted(samples, key=lambda s: s.row)
    assert [s.row for s in sample_rows(src, n=10, seed=0)] == [s.row for s in samples]  # fixed seed
    ok = check_model(enc, samples, model="models/hash-v1")
    assert ok.accepted and ok.n == 10 and ok.median_cosine > 0.9999 and "match models/hash-v1" in ok.message
    assert json.loads(json.dumps(ok.to_json()))["accepted"] is True
    bad = check_model(HashEncoder(DIM, "v2"), samples, model="models/other")
    assert not bad.accepted and bad.median_cosine < 0.9
    assert bad.message.startswith("these vectors were not made by models/other: median cosine") and "over 10 items" \
        in bad.message
    wide = check_model(HashEncoder(32, "v1"), samples, model="M")
    assert not wide.accepted and "16-d and M embeds 32-d" in wide.message and wide.median_cosine is None
    text_only = check_model(HashEncoder(DIM, "v1", modalities=("text",)), samples, model="T")
    assert not text_only.accepted and "does not embed images" in text_only.message
    none = check_model(enc, [])
    assert isinstance(none, ModelCheck) and not none.accepted and none.n == 0


def test_check_model_refuses_rows_shuffled_against_the_table(tmp_path, folder, enc):
    paths = [folder / f"images/{i:03d}.png" for i in range(6)]
    vecs = enc.encode_images(paths)
    _parquet(tmp_path / "t.parquet", image_path=[str(p) for p in paths])
    np.save(tmp_path / "right.npy", vecs)
    np.save(tmp_path / "shuffled.npy", vecs[[1, 2, 3, 4, 5, 0]])
    right = open_source(f"npy:{tmp_path / 'right.npy'}", table=tmp_path / "t.parquet", modality="image")
    shuffled = open_source(f"npy:{tmp_path / 'shuffled.npy'}", table=tmp_path / "t.parquet", modality="image")
    assert check_model(enc, sample_rows(right)).accepted
    res = check_model(enc, sample_rows(shuffled), model="M")
    assert not res.accepted and res.n == 6 and "not made by M" in res.message


def test_sample_rows_only_readable_sources(tmp_path, folder, enc):
    names = [str(folder / f"images/{i:03d}.png") for i in range(3)] + [f"/missing/{i}.png" for i in range(9)]
    _parquet(tmp_path / "t.parquet", image_path=names)
    np.save(tmp_path / "e.npy", _rand(12))
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.parquet", modality="image")
    got = sample_rows(src, n=5, seed=1)
    assert [s.row for s in got] == [0, 1, 2] and all(Path(s.payload).is_file() for s in got)
    np.testing.assert_array_equal(got[1].vector, src.read_rows([1]).vectors[0])
    assert len(sample_rows(src, n=2, seed=1)) == 2


# ------------------------------------------------------------------------------ reading rows back

def test_read_rows_scattered_jsonl_and_clip_pairs(tmp_path, cr_dir):
    np.save(tmp_path / "e.npy", _rand(6))
    rows = [{"id": f"x{i}", "text": f"t{i}", **({"k": i} if i % 2 else {})} for i in range(6)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", modality="text", id_column="id")
    b = src.read_rows([4, 1, 5])
    assert b.rows == [1, 4, 5] and b.ids == ["x1", "x4", "x5"]
    assert b.metadata == [{"text": "t1", "k": 1}, {"text": "t4"}, {"text": "t5", "k": 5}]
    np.testing.assert_array_equal(b.vectors, np.load(tmp_path / "e.npy")[[1, 4, 5]])
    cr = open_source(f"clip-retrieval:{cr_dir}")
    full = {r: (i, m) for b in cr.batches() for r, i, m in zip(b.rows, b.ids, b.modality)}
    got = cr.read_rows([6, 1, 3])
    assert got.rows == [1, 3, 6] and got.modality == ["text", "text", "image"]
    assert [got.ids[k] for k in (0, 1)] == [full[1][0], full[3][0]]


def test_a_hash_collision_is_not_a_duplicate(tmp_path, monkeypatch):
    from nobackfill.adopt import sources

    np.save(tmp_path / "e.npy", _rand(4))
    table = _ids_table(tmp_path, 4)
    monkeypatch.setattr(sources._SeenIds, "add", lambda self, ids: np.ones(len(ids), bool))  # every id "seen"
    ids = _all(open_source(f"npy:{tmp_path / 'e.npy'}", table=table, modality="text", id_column="id"))[0]
    assert ids == ["i0", "i1", "i2", "i3"]  # confirmed against the table: no earlier row has them


def test_clip_retrieval_id_column_names_images_and_repeats_across_shards(tmp_path, folder, enc):
    paths, caps = _pairs(folder)
    out = write_clip_retrieval(tmp_path / "cr", image_paths=paths, image_vectors=enc.encode_images(paths),
                               captions=caps, text_vectors=enc.encode_texts(caps), shard_rows=4, dtype=np.float32)
    for s, keys in enumerate([["k0", "k1", "k2", "k3"], ["k4", "k5", "k6", "k7"]]):
        f = out / "metadata" / f"metadata_{s}.parquet"
        pq.write_table(pq.read_table(f).append_column("key", pa.array(keys)), f)
    ids, mods, _, metas, _, _ = _all(open_source(f"clip-retrieval:{out}", id_column="key"))
    assert ids[0::2] == [f"k{i}" for i in range(8)] and set(mods[0::2]) == {"image"}
    assert ids[1::2] == [text_id(c, f"k{i}") for i, c in enumerate(caps)]
    assert metas[1]["image_id"] == "k0" and "key" not in metas[0]
    f = out / "metadata" / "metadata_1.parquet"
    t = pq.read_table(f)
    pq.write_table(t.set_column(t.column_names.index("key"), "key", pa.array(["k4", "k2", "k6", "k7"])), f)
    with pytest.raises(SourceError, match=r"metadata_1\.parquet row 2: id 'k2' repeats the id of .*metadata_0\.parquet "
                                          r"row 3"):
        _all(open_source(f"clip-retrieval:{out}", id_column="key"))


def test_with_ids_from_the_table_no_image_file_is_touched(tmp_path, folder, monkeypatch):
    """A million images with their ids are not each stat-ed and hashed: the reader records their
    paths; the backfill reads each file when it embeds it."""
    import os

    import nobackfill.adopt.sources.import_source as import_source

    np.save(tmp_path / "emb.npy", _rand(3))
    _parquet(tmp_path / "m.parquet", pk=["a", "b", "c"], image_path=["images/000.png", "images/001.png", "x/y.png"])
    src = open_source(f"npy:{tmp_path / 'emb.npy'}", table=tmp_path / "m.parquet", id_column="pk",
                      modality="image", images_root=folder)

    def touched(*a, **k):
        raise AssertionError(f"an image file was touched: {a}")

    monkeypatch.setattr(import_source, "file_sha256", touched)
    monkeypatch.setattr(os.path, "isfile", touched)
    ids, _, sources, _, _, _ = _all(src)
    assert ids == ["a", "b", "c"] and sources[2] == {"path": str(folder / "x/y.png")}
