"""Importing vectors embedded elsewhere (``collection import``): the model check, the same hits as
``add``, resuming after a kill, items without a source (status, backfill, retire)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nobackfill.cli import app
from nobackfill.data.clip_retrieval import write_clip_retrieval
from nobackfill.collection.collection import Collection
from nobackfill.adopt.importing import ModelCheckRefused, import_source
from nobackfill.collection.ingest import add_items, folder_items
from nobackfill.adopt.sources import open_source
from nobackfill.lifecycle.backfill import BackfillError, backfill_status, retire_space, run_backfill
from nobackfill.lifecycle.plan_changes import upgrade_collection
from nobackfill.search.searcher import Searcher

from _collection_helpers import NEW_REF, OLD_REF, HashEncoder, make_folder, pool_with, related_pair, \
    write_procrustes_upgrade

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _pairs(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "captions.jsonl").read_text().splitlines()]


def _clip_folder(folder: Path, enc: HashEncoder, out: Path, *, shuffle: bool = False) -> Path:
    """``folder`` embedded by ``enc`` in clip-retrieval's layout (float32: bit for bit)."""
    pairs = _pairs(folder)
    paths = [folder / p["image"] for p in pairs]
    img = enc.encode_images(paths)
    txt = enc.encode_texts([p["caption"] for p in pairs])
    if shuffle:  # rows shuffled against the table
        img = img[np.random.default_rng(0).permutation(len(img))]
    return write_clip_retrieval(out, image_paths=paths, image_vectors=img, captions=[p["caption"] for p in pairs],
                                text_vectors=txt, dtype=np.float32)


def test_an_import_gives_the_hits_of_add_in_both_directions(tmp_path):
    enc = HashEncoder(16, "old")
    folder = make_folder(tmp_path / "d", n_images=8, captions_per_image=2)
    added = Collection.create(tmp_path / "added", space_id=enc.space_id, dim=16, model=OLD_REF)
    add_items(added, enc, folder_items(folder).items, progress=False)
    src = open_source(f"clip-retrieval:{_clip_folder(folder, enc, tmp_path / 'emb')}")
    rep = import_source(tmp_path / "imported", src, enc, model=OLD_REF, progress=False)
    assert rep.created and rep.added == rep.items == 24 and rep.model_check["accepted"]
    imported = Collection.open(tmp_path / "imported")
    assert set(imported.items()) == set(added.items())
    pool = pool_with((OLD_REF, enc))
    for kw in (dict(text="caption 1 of image 3 seed 0"), dict(image=folder / "images" / "005.png")):
        a = Searcher(added, pool=pool).search(k=10, **kw).hits
        b = Searcher(imported, pool=pool).search(k=10, **kw).hits
        assert [h.id for h in a] == [h.id for h in b]
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-6)
    plan = imported.plan.current_space
    assert plan.imports[0]["items"] == 24 and plan.imports[0]["model_check"]["accepted"]


@pytest.mark.parametrize("wrong", ["other model", "shuffled rows"])
def test_vectors_of_another_model_or_shuffled_rows_are_refused_and_nothing_is_created(tmp_path, wrong):
    enc = HashEncoder(16, "old")
    folder = make_folder(tmp_path / "d", n_images=10, captions_per_image=1)
    made_by = HashEncoder(16, "stranger") if wrong == "other model" else enc
    src = open_source(f"clip-retrieval:{_clip_folder(folder, made_by, tmp_path / 'emb', shuffle=wrong != 'other model')}")
    with pytest.raises(ModelCheckRefused, match="were not made by /fake/models/old: median cosine"):
        import_source(tmp_path / "c", src, enc, model=OLD_REF, progress=False)
    assert not (tmp_path / "c").exists()
    rep = import_source(tmp_path / "c", src, enc, model=OLD_REF, trust_model=True, progress=False)
    assert rep.added == 20 and Collection.open(tmp_path / "c").plan.current_space.imports[0]["model_check"] == \
        {"skipped": True, "model": OLD_REF, "message": f"skipped (trust_model): nothing checked that {OLD_REF} made "
                                                      "these vectors"}


def test_an_import_killed_between_batches_finishes_when_run_again(tmp_path):
    enc = HashEncoder(16, "old")
    x = enc.encode_texts([f"text {i}" for i in range(50)])
    np.save(tmp_path / "e.npy", x)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": f"text {i}", "group": i % 3}) + "\n"
                                              for i in range(50)))
    spec = dict(table=tmp_path / "t.jsonl", id_column="id", source_column="text", modality="text", batch_rows=20)

    def die(n):
        if n == 2:
            raise KeyboardInterrupt  # killed after the second batch's commit

    with pytest.raises(KeyboardInterrupt):
        import_source(tmp_path / "c", open_source(f"npy:{tmp_path / 'e.npy'}", **spec), enc, model=OLD_REF,
                      progress=False, on_batch=die)
    assert len(Collection.open(tmp_path / "c")) == 40
    rep = import_source(tmp_path / "c", open_source(f"npy:{tmp_path / 'e.npy'}", **spec), enc, model=OLD_REF,
                        progress=False)
    c = Collection.open(tmp_path / "c")
    assert (rep.added, rep.unchanged) == (10, 40) and len(c) == 50 and c.gallery(enc.space_id).count("text") == 50
    assert c.get("t7").metadata == {"text": "text 7", "group": 1} and not c.verify()


@pytest.mark.parametrize("order", ["sequential", "uncertainty", "random"])
def test_items_without_a_source_are_searched_skipped_by_the_backfill_and_kept_by_retire(tmp_path, order):
    """... whichever the order (trial AL: the uncertainty order's rest held the url items, which the
    backfill then read as the path '.' and named as files to restore)."""
    old, new, w = related_pair(16, 16)
    folder = make_folder(tmp_path / "d", n_images=6, captions_per_image=1)
    pairs = _pairs(folder)
    paths = [folder / p["image"] for p in pairs] + [f"https://example.com/{i}.jpg" for i in range(4)]
    vecs = np.concatenate([old.encode_images(paths[:6]), old.encode_images([folder / p["image"] for p in pairs[:4]])])
    np.save(tmp_path / "e.npy", vecs)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"i{j}", "path": str(p)}) + "\n"
                                              for j, p in enumerate(paths)))
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", id_column="id", source_column="path",
                      modality="image")
    import_source(tmp_path / "c", src, old, model=OLD_REF, progress=False)
    c = Collection.open(tmp_path / "c")
    assert c.status()["unsourced"] == 4
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    hits = Searcher(c, pool=pool).search(image=folder / pairs[1]["image"], k=3, target="image").hits
    assert {h.id for h in hits[:2]} == {"i1", "i7"}  # a url item is searchable (same vector as i1's image here)
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(tmp_path / "up", w, new, old)], pool=pool)
    with pytest.raises(BackfillError, match=r"6 item\(s\) have no vector .*; 4 more have no source \(--drop-unsourced"):
        retire_space(c, old.space_id)  # (trial AM: the second blocker was named only once the first was gone)
    out = run_backfill(c, new, order=order, batch_size=4)
    st = backfill_status(c)
    assert out["done"] == out["total"] == 6 and st["no_source"] == 4 and st["done"] == st["total"]
    assert st["unreadable"] == 0 and not st["unreadable_items"] and "could not be read" not in (st.get("note") or ""), st
    with pytest.raises(BackfillError, match="4 item.* no source"):
        retire_space(c, old.space_id)
    assert len(c) == 10
    retire_space(c, old.space_id, drop_unsourced=True)
    assert len(c) == 6 and c.status()["unsourced"] == 0


def test_the_cli_imports_a_clip_retrieval_folder_with_a_real_model(tmp_path):
    from nobackfill.search.models import ModelPool, model_ref

    ref = model_ref(ROOT / "models" / "world-old")
    enc = ModelPool().get(ref)
    folder = make_folder(tmp_path / "d", n_images=5, captions_per_image=1)
    pairs = _pairs(folder)
    paths = [folder / p["image"] for p in pairs]
    emb = write_clip_retrieval(tmp_path / "emb", image_paths=paths, image_vectors=enc.encode_images(paths),
                               captions=[p["caption"] for p in pairs],
                               text_vectors=enc.encode_texts([p["caption"] for p in pairs]))
    r = runner.invoke(app, ["collection", "import", str(tmp_path / "c"), "--model", str(ROOT / "models" / "world-old"),
                            "--from", f"clip-retrieval:{emb}"])
    assert r.exit_code == 0, r.output
    assert "model check: these vectors match" in r.output and "added 10" in r.output
    r = runner.invoke(app, ["collection", "import", str(tmp_path / "c2"), "--model", str(ROOT / "models" / "world-new"),
                            "--from", f"clip-retrieval:{emb}"])
    assert r.exit_code == 2 and "64-d" in r.output and "128-d" in r.output and not (tmp_path / "c2").exists()
    r = runner.invoke(app, ["collection", "status", str(tmp_path / "c")])
    assert r.exit_code == 0 and "imported 10 item(s) from" in r.output and "median cosine" in r.output


def test_verify_model_check_accepts_the_models_own_vectors_and_names_a_swapped_store(tmp_path, monkeypatch):
    import nobackfill.search.models as models
    from nobackfill.lifecycle.verify import check_models

    enc = HashEncoder(16, "old")
    folder = make_folder(tmp_path / "d", n_images=8, captions_per_image=1)
    src = open_source(f"clip-retrieval:{_clip_folder(folder, enc, tmp_path / 'emb')}")
    import_source(tmp_path / "c", src, enc, model=OLD_REF, progress=False)
    c = Collection.open(tmp_path / "c")
    monkeypatch.setattr(models.ModelPool, "get", lambda self, ref, *a, **k: enc)  # the space's model, loaded
    ok = check_models(c)[enc.space_id]
    monkeypatch.setattr(models.ModelPool, "get", lambda self, ref, *a, **k: HashEncoder(16, "stranger"))  # swapped
    bad = check_models(c)[enc.space_id]
    assert ok["accepted"] and ok["n"] == 16 and ok["median_cosine"] == pytest.approx(1.0)
    assert not bad["accepted"] and "were not made by /fake/models/old" in bad["message"]


def test_an_import_into_a_collection_that_exists_but_is_empty_fills_it(tmp_path):
    # (what an import killed before its first commit leaves: an empty collection is falsy, and was
    # taken for none, so the same command again tried to create it and failed)
    enc = HashEncoder(16, "old")
    np.save(tmp_path / "e.npy", enc.encode_texts([f"text {i}" for i in range(5)]))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": f"text {i}"}) + "\n" for i in range(5)))
    Collection.create(tmp_path / "c", space_id=enc.space_id, dim=16, model=OLD_REF)
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", id_column="id", source_column="text",
                      modality="text")
    rep = import_source(tmp_path / "c", src, enc, model=OLD_REF, progress=False)
    assert not rep.created and rep.added == 5 and len(Collection.open(tmp_path / "c")) == 5


# ------------------------------------------------------------------------ a failed import: what stays
def _table(tmp_path: Path, ids: list[str], fmt: str, *, modality: list[str] | None = None) -> tuple[Path, Path]:
    """n random 8-d vectors and a table of ids and texts (and a modality column) in ``fmt``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(ids)
    x = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)
    np.save(tmp_path / "e.npy", x / np.linalg.norm(x, axis=1, keepdims=True))
    cols = {"key": ids, "text": [f"text {i}" for i in range(n)], **({"modality": modality} if modality else {})}
    path = tmp_path / f"t.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table(cols), path, row_group_size=5000)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(dict(zip(cols, r))) + "\n" for r in zip(*cols.values())))
    else:
        path.write_text(",".join(cols) + "\n" + "".join(",".join(r) + "\n" for r in zip(*cols.values())))
    return tmp_path / "e.npy", path


@pytest.mark.parametrize("n, batch_rows, dup, first, fmt", [
    (40_000, None, 30_001, 6, "parquet"),  # the report's table: the default batches of 16,384 rows
    (5_000, 1_000, 2_501, 1, "jsonl"),
    (3_000, 1_000, 3_000, 2_999, "csv"),  # the last row repeats the one before it
])
def test_a_repeated_id_after_the_first_batch_is_refused_before_anything_is_committed(tmp_path, n, batch_rows, dup,
                                                                                     first, fmt):
    enc = HashEncoder(8, "old")
    ids = [f"k{i}" for i in range(n)]
    ids[dup - 1] = ids[first - 1]
    emb, table = _table(tmp_path, ids, fmt)
    kw = {} if batch_rows is None else {"batch_rows": batch_rows}
    src = open_source(f"npy:{emb}", table=table, id_column="key", source_column="text", modality="text", **kw)
    with pytest.raises(ValueError, match=rf"t\.{fmt} row {dup}: id 'k{first - 1}' repeats the id of row {first}") as e:
        import_source(tmp_path / "c", src, enc, model=OLD_REF, trust_model=True, progress=False)
    assert "nothing of" in str(e.value) and "was committed" in str(e.value)
    assert not (tmp_path / "c").exists()  # not even created
    # into a collection that holds items: it keeps them, and only them
    c = Collection.create(tmp_path / "held", space_id=enc.space_id, dim=8, model=OLD_REF)
    import_source(c, _small(tmp_path, enc), enc, model=OLD_REF, trust_model=True, progress=False)
    gen = c.generation
    with pytest.raises(ValueError, match="repeats the id of"):
        import_source(c, src, enc, model=OLD_REF, trust_model=True, progress=False)
    assert len(Collection.open(tmp_path / "held")) == 3 and Collection.open(tmp_path / "held").generation == gen


def _small(tmp_path: Path, enc: HashEncoder):
    d = tmp_path / "small"
    d.mkdir()
    np.save(d / "e.npy", enc.encode_texts(["one", "two", "three"]))
    (d / "t.jsonl").write_text("".join(json.dumps({"key": f"s{i}", "text": t}) + "\n"
                                       for i, t in enumerate(["one", "two", "three"])))
    return open_source(f"npy:{d / 'e.npy'}", table=d / "t.jsonl", id_column="key", source_column="text",
                       modality="text")


@pytest.mark.parametrize("n, batch_rows, bad", [(40_000, None, 30_001), (2_500, 1_000, 2_100)])
def test_an_error_after_the_first_batches_says_what_was_committed_and_the_same_command_finishes(tmp_path, n,
                                                                                                 batch_rows, bad):
    """An error only reading a row finds (a modality cell that is neither image nor text) after
    batches were committed: the message says which rows stayed and how to finish; run again once
    the table is fixed, the import finishes with the rows committed found unchanged."""
    enc = HashEncoder(8, "old")
    mods = ["text"] * n
    mods[bad - 1] = "video"
    kw = {} if batch_rows is None else {"batch_rows": batch_rows}
    emb, table = _table(tmp_path, [f"k{i}" for i in range(n)], "parquet", modality=mods)
    spec = dict(table=table, id_column="key", source_column="text", modality="text", **kw)
    size = batch_rows or 16_384
    stayed = (bad - 1) // size * size
    with pytest.raises(ValueError) as e:
        import_source(tmp_path / "c", open_source(f"npy:{emb}", **spec), enc, model=OLD_REF, trust_model=True,
                      progress=False)
    msg = str(e.value)
    assert f"t.parquet row {bad}: column 'modality' must be 'image' or 'text'" in msg
    assert f"rows 1-{stayed} of npy" in msg and f"({stayed} items) were committed to {tmp_path / 'c'}" in msg
    assert "run the same command again to finish the import" in msg
    assert len(Collection.open(tmp_path / "c")) == stayed
    _table(tmp_path, [f"k{i}" for i in range(n)], "parquet", modality=["text"] * n)  # the table fixed
    rep = import_source(tmp_path / "c", open_source(f"npy:{emb}", **spec), enc, model=OLD_REF, trust_model=True,
                        progress=False)
    assert (rep.added, rep.unchanged) == (n - stayed, stayed) and len(Collection.open(tmp_path / "c")) == n


# ------------------------------------------------------------------ the items' metadata, their ids
def test_imported_items_keep_their_source_and_the_columns_asked_for_in_hits_get_and_after_a_backfill(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    old, new, w = related_pair(16, 16)
    folder = make_folder(tmp_path / "d", n_images=6, captions_per_image=1)
    paths = [f"images/{i:03d}.png" for i in range(6)]
    np.save(tmp_path / "e.npy", old.encode_images([folder / p for p in paths]))
    pq.write_table(pa.table({"key": [f"i{i}" for i in range(6)], "image_path": paths, "shop": list("abcdef"),
                             "price": list(range(6)), "secret": ["x"] * 6}), tmp_path / "t.parquet")
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.parquet", id_column="key",
                      modality="image", images_root=folder, metadata_columns=["shop", "price"])
    import_source(tmp_path / "c", src, old, model=OLD_REF, progress=False)
    c = Collection.open(tmp_path / "c")
    want = {"path": str(folder / paths[2]), "shop": "c", "price": 2}
    assert c.get("i2").metadata == want
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    hit = Searcher(c, pool=pool).search(image=folder / paths[2], k=1, target="image").hits[0]
    assert hit.id == "i2" and hit.metadata == want
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(tmp_path / "up", w, new, old)], pool=pool)
    run_backfill(c, new, order="sequential", batch_size=4)
    hit = Searcher(Collection.open(tmp_path / "c"), pool=pool).search(image=folder / paths[2], k=1, target="image").hits[0]
    assert (hit.id, hit.route, hit.metadata) == ("i2", "native", want)
    with pytest.raises(ValueError, match=r"no column 'nope' \(a metadata column\); its columns: key, image_path"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.parquet", id_column="key", modality="image",
                     metadata_columns=["nope"])


def test_clip_retrieval_items_keep_their_path_and_caption(tmp_path):
    enc = HashEncoder(16, "old")
    folder = make_folder(tmp_path / "d", n_images=3, captions_per_image=1)
    import_source(tmp_path / "c", open_source(f"clip-retrieval:{_clip_folder(folder, enc, tmp_path / 'emb')}"), enc,
                  model=OLD_REF, progress=False)
    added = Collection.create(tmp_path / "added", space_id=enc.space_id, dim=16, model=OLD_REF)
    add_items(added, enc, folder_items(folder).items, progress=False)
    c = Collection.open(tmp_path / "c")
    for iid in added.items():  # what add keeps of each source, the import keeps too
        mine, theirs = c.get(iid).metadata, added.get(iid).metadata
        key = "path" if c.get(iid).modality == "image" else "text"
        assert mine[key] == theirs[key], iid


def test_a_column_named_id_is_not_taken_for_ids_unless_named(tmp_path):
    """The table's 'id' held row numbers: without --id-column the ids come from content (as the
    help and docs say), a warning names the column, and its values stay in the metadata, whole in
    every hit."""
    enc = HashEncoder(16, "old")
    texts = ["a red cube", "a blue ball", "a green cone"]
    np.save(tmp_path / "e.npy", enc.encode_texts(texts))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": i * 7, "caption": t}) + "\n"
                                              for i, t in enumerate(texts)))
    src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", modality="text")
    assert "ids from content" in src.describe()
    rep = import_source(tmp_path / "c", src, enc, model=OLD_REF, progress=False)
    assert any("column 'id' was not taken for the ids" in w and "--id-column id" in w for w in rep.warnings)
    c = Collection.open(tmp_path / "c")
    from nobackfill.collection.ingest import text_id

    assert sorted(c.items()) == sorted(text_id(t) for t in texts) and "7" not in c.items()
    hit = Searcher(c, pool=pool_with((OLD_REF, enc))).search(text="a blue ball", k=1).hits[0]
    assert hit.id == text_id("a blue ball") and hit.metadata == {"text": "a blue ball", "id": 7}
    named = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", modality="text", id_column="id")
    assert [b.ids for b in named.batches()] == [["0", "7", "14"]] and not named.warnings
    (tmp_path / "u.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match="no id column given .* its column 'id' is taken for ids only when named"):
        open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "u.jsonl", modality="text")


def test_an_import_run_again_that_changes_nothing_records_nothing(tmp_path):
    enc = HashEncoder(16, "old")
    np.save(tmp_path / "e.npy", enc.encode_texts([f"text {i}" for i in range(5)]))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": f"text {i}"}) + "\n" for i in range(5)))

    def run():
        src = open_source(f"npy:{tmp_path / 'e.npy'}", table=tmp_path / "t.jsonl", id_column="id", modality="text")
        return import_source(tmp_path / "c", src, enc, model=OLD_REF, trust_model=True, progress=False)

    assert run().added == 5
    c = Collection.open(tmp_path / "c")
    gen, imports = c.generation, c.plan.current_space.imports
    assert len(imports) == 1 and imports[0]["model_check"]["message"].startswith("skipped (trust_model)")
    rep = run()
    c = Collection.open(tmp_path / "c")
    assert (rep.added, rep.unchanged) == (0, 5) and c.generation == gen and c.plan.current_space.imports == imports
    r = runner.invoke(app, ["collection", "status", str(tmp_path / "c")])
    assert r.exit_code == 0 and r.output.count("imported 5 item(s) from") == 1


@pytest.mark.parametrize("factory, name", [("PQ8x4", "IndexPQ"), ("IVF4,PQ8x4", "IndexIVFPQ"),
                                           ("HNSW8_PQ8x4", "IndexHNSWPQ")])
def test_the_model_check_of_a_lossy_index_fits_its_threshold_to_the_compression(tmp_path, factory, name):
    """--lossy alone: the reconstructions of the declared model's vectors are accepted (their cosines
    fall well below 0.99), with a threshold measured on the index's own codec that the message
    names; another model's vectors are still refused."""
    import faiss

    enc = HashEncoder(16, "old")
    texts = [f"caption {i}" for i in range(800)]
    x = enc.encode_texts(texts)
    index = faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    faiss.write_index(index, str(tmp_path / "i.faiss"))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)))

    def source():
        return open_source(f"faiss:{tmp_path / 'i.faiss'}", table=tmp_path / "t.jsonl", id_column="id",
                           modality="text", lossy=True)

    rep = import_source(tmp_path / "c", source(), enc, model=OLD_REF, progress=False)
    mc = rep.model_check
    assert mc["accepted"] and mc["median_cosine"] < 0.99 and mc["threshold"] < 0.99 and rep.added == 800
    assert f"rather than 0.99 since the vectors are the reconstructions of a lossy {name} index" in mc["message"]
    assert mc["lossy"]["index"] == name and mc["threshold"] == pytest.approx(mc["lossy"]["min_cosine"] - 0.02)
    with pytest.raises(ModelCheckRefused, match=rf"not made by /other: median cosine .* threshold .* lossy {name}"):
        import_source(tmp_path / "w", source(), HashEncoder(16, "stranger"), model="/other", progress=False)
    from nobackfill.lifecycle.verify import check_models  # verify --model-check, later: the same threshold

    again = check_models(Collection.open(tmp_path / "c"), pool=pool_with((OLD_REF, enc)))[enc.space_id]
    assert again["accepted"] and again["threshold"] == mc["threshold"] and f"lossy {name} index" in again["message"]


def test_the_cli_imports_the_metadata_columns_asked_for_and_get_and_search_show_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    np.save(tmp_path / "e.npy", x / np.linalg.norm(x, axis=1, keepdims=True))
    pq.write_table(pa.table({"key": [f"i{i}" for i in range(4)], "image_path": [f"img/{i}.png" for i in range(4)],
                             "shop": list("abcd"), "secret": list("wxyz"), "rank": [9, 8, 7, 6]}),
                   tmp_path / "t.parquet")
    r = runner.invoke(app, ["collection", "import", str(tmp_path / "c"), "--model", str(ROOT / "models" / "world-old"),
                            "--from", f"npy:{tmp_path / 'e.npy'}", "--table", str(tmp_path / "t.parquet"),
                            "--id-column", "key", "--modality", "image", "--trust-model",
                            "--metadata-columns", "shop,rank"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["collection", "get", str(tmp_path / "c"), "--id", "i2", "--json"])
    want = {"path": str(tmp_path / "img" / "2.png"), "shop": "c", "rank": 7}
    assert r.exit_code == 0 and json.loads(r.stdout)["metadata"] == want
    r = runner.invoke(app, ["collection", "search", str(tmp_path / "c"), "--text", "a red circle", "--k", "4", "--json"])
    hits = {h["id"]: h for h in json.loads(r.stdout)["hits"]}
    assert r.exit_code == 0 and hits["i2"]["metadata"] == want and hits["i2"]["shop"] == "c"
    assert {h["rank"] for h in hits.values()} == {1, 2, 3, 4}  # the hit's own rank; the item's is in metadata


def test_the_cli_imports_into_an_existing_collection_without_model_and_names_model_for_a_new_one(tmp_path):
    """``--model`` may be left out where the collection exists (its current model made the vectors,
    as import.md says); for a collection this import would create, the error names ``--model`` and
    nothing is created."""
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    np.save(tmp_path / "e.npy", x / np.linalg.norm(x, axis=1, keepdims=True))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"i{i}", "path": f"img/{i}.png"}) + "\n"
                                              for i in range(3)))
    args = ["--from", f"npy:{tmp_path / 'e.npy'}", "--table", str(tmp_path / "t.jsonl"), "--id-column", "id",
            "--source-column", "path", "--modality", "image", "--trust-model"]
    r = runner.invoke(app, ["collection", "import", str(tmp_path / "new"), *args])
    assert r.exit_code == 2 and "--model" in r.output and "create it" in r.output, r.output
    assert not (tmp_path / "new").exists()
    r = runner.invoke(app, ["collection", "create", str(tmp_path / "c"), "--model", str(ROOT / "models" / "world-old")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["collection", "import", str(tmp_path / "c"), *args])
    assert r.exit_code == 0 and "added 3" in r.output, r.output
    r = runner.invoke(app, ["collection", "import", "milvus-lite:" + str(tmp_path / "m.db") + "#x", "--from",
                            "milvus-lite:" + str(tmp_path / "m.db") + "#x", "--vector-field", "v", "--id-field", "id",
                            "--modality", "image"])
    assert r.exit_code == 2 and "needs --model" in r.output, r.output


def test_a_reimport_says_what_changed_and_what_it_found_stored(tmp_path):
    """A re-import with two rows' vectors changed: status records 2 of the 6 read as new or changed;
    an import of items deleted since (their vectors still stored) says it did not store them again."""
    from nobackfill.search.models import ModelPool, model_ref

    model = ROOT / "models" / "world-old"
    enc = ModelPool().get(model_ref(model))
    texts = [f"a small caption number {i}" for i in range(6)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    vectors = enc.encode_texts(texts)
    np.save(tmp_path / "e.npy", vectors)
    changed = vectors.copy()
    changed[[1, 4]] = enc.encode_texts(["another text", "yet another text"])
    np.save(tmp_path / "f.npy", changed)
    coll = str(tmp_path / "c")

    def run(npy: str) -> str:
        r = runner.invoke(app, ["collection", "import", coll, "--model", str(model), "--from", f"npy:{tmp_path / npy}",
                                "--table", str(tmp_path / "t.jsonl"), "--id-column", "id", "--source-column", "text",
                                "--modality", "text", "--trust-model"])
        assert r.exit_code == 0, r.output
        return r.output

    assert "added 6, already there 0" in run("e.npy")
    out = run("f.npy")
    assert "added 2 (of them 2 replacing other content under their ids), already there 4" in out, out
    assert "stored already" not in out
    # an id holding a text given an image: refused as add refuses it, nothing changed (trial AH: replaced, unsaid)
    folder = make_folder(tmp_path / "d", n_images=2, captions_per_image=1)
    imgs = sorted((folder / "images").iterdir())
    (tmp_path / "i.jsonl").write_text("".join(json.dumps({"id": i, "path": str(p)}) + "\n"
                                              for i, p in zip(["fresh", "t3"], imgs)))
    np.save(tmp_path / "i.npy", enc.encode_images(imgs))
    before = Collection.open(coll).items()
    r = runner.invoke(app, ["collection", "import", coll, "--from", f"npy:{tmp_path / 'i.npy'}", "--table",
                            str(tmp_path / "i.jsonl"), "--id-column", "id", "--source-column", "path",
                            "--modality", "image", "--trust-model"])
    assert r.exit_code == 2 and "row 2: id 't3' already holds a stored text item, not an image one" in r.output, r.output
    assert Collection.open(coll).items() == before
    r = runner.invoke(app, ["collection", "status", coll])
    assert "imported 6 item(s) from" in r.output and "imported 6 item(s) read, 2 of them new or changed" in r.output
    r = runner.invoke(app, ["collection", "delete", coll, "--id", "t0", "--id", "t2"])
    assert r.exit_code == 0, r.output
    out = run("f.npy")
    assert "added 2, already there 4" in out and "2 of the added with their vectors stored already" in out


def test_the_index_hint_after_an_import_names_the_collection_as_given(tmp_path, monkeypatch):
    """Trial AH: after an import past the exact-search size into ``DIR?catalog=postgresql://...``,
    the hint said ``nobackfill collection index DIR``, which is not the collection. The hint names
    what the command was given (here a relative path, as typed)."""
    from nobackfill.ann.backends import AUTO_GRAPH_AT

    monkeypatch.chdir(tmp_path)
    n = AUTO_GRAPH_AT + 10
    v = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    np.save("e.npy", v / np.linalg.norm(v, axis=1, keepdims=True))
    Path("t.jsonl").write_text("".join(f'{{"id": "t{i}"}}\n' for i in range(n)))
    r = runner.invoke(app, ["collection", "import", "rel/coll", "--model", str(ROOT / "models" / "world-old"),
                            "--from", "npy:e.npy", "--table", "t.jsonl", "--id-column", "id", "--modality", "text",
                            "--trust-model"], terminal_width=400)
    assert r.exit_code == 0, r.output
    assert "index is built by `nobackfill collection index rel/coll`" in " ".join(r.output.split()), r.output
