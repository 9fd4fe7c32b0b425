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
        {"skipped": True, "model": OLD_REF}


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
    assert c.get("t7").metadata == {"group": 1} and not c.verify()


def test_items_without_a_source_are_searched_skipped_by_the_backfill_and_kept_by_retire(tmp_path):
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
    out = run_backfill(c, new, order="sequential", batch_size=4)
    st = backfill_status(c)
    assert out["done"] == out["total"] == 6 and st["no_source"] == 4 and st["done"] == st["total"]
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
