"""A user's own Milvus collection adopted in place (:func:`nobackfill.adopt.in_place.adopt_milvus`):
their schema and their index, searched as it is, upgraded, backfilled, retired, while their row
count and a checksum of their vectors never change; and what is refused (a width, a field, a model,
a metric that does not fit, another Milvus). milvus-lite here; one flow on a real Milvus server with
a PostgreSQL catalog (``milvus_server``)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import numpy as np
import pytest

from _collection_helpers import NEW_REF, OLD_REF, HashEncoder, make_folder, pool_with, related_pair, \
    write_procrustes_upgrade
from nobackfill.adopt.in_place import adopt_milvus
from nobackfill.collection.collection import Collection, is_collection
from nobackfill.adopt.importing import ModelCheckRefused
from nobackfill.collection.uri import parse_uri
from nobackfill.search import Searcher
from nobackfill.lifecycle.backfill import backfill_status, retire_space, run_backfill
from nobackfill.lifecycle.plan_changes import upgrade_collection

N_IMAGES = 12


def _client(uri: str):
    from nobackfill.milvus import _client

    return _client(*parse_uri(uri))


def _user_collection(client, name: str, vectors: np.ndarray, paths: list[str], *, pk: str = "int",
                     dim: int | None = None, index: str = "HNSW", metric: str = "COSINE",
                     params: dict | None = None) -> list:
    """The user's own collection: primary key ``pk`` (INT64 or VARCHAR), ``embedding``,
    ``image_path``, indexed as they chose; its primary keys."""
    from pymilvus import DataType

    s = client.create_schema(auto_id=False, enable_dynamic_field=False)
    if pk == "int":
        s.add_field("pk", DataType.INT64, is_primary=True)
        pks = [1000 + 7 * i for i in range(len(vectors))]
    else:
        s.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=64)
        pks = [f"sku-{i:04d}" for i in range(len(vectors))]
    s.add_field("embedding", DataType.FLOAT_VECTOR, dim=int(dim or vectors.shape[1]))
    s.add_field("image_path", DataType.VARCHAR, max_length=1024)
    idx = client.prepare_index_params()
    idx.add_index(field_name="embedding", index_type=index, metric_type=metric, params=params or {})
    client.create_collection(name, schema=s, index_params=idx, consistency_level="Strong")
    client.insert(name, [{"pk": p, "embedding": v.tolist(), "image_path": path}
                         for p, v, path in zip(pks, vectors, paths)])
    return pks


def _fingerprint(client, name: str) -> tuple[int, str]:
    """The user's row count and the sha256 of their vectors (float32) sorted by primary key."""
    rows = []
    it = client.query_iterator(name, batch_size=1000, filter="", output_fields=["pk", "embedding"],
                               consistency_level="Strong")
    while True:
        batch = it.next()
        if not batch:
            break
        rows.extend(batch)
    it.close()
    rows.sort(key=lambda r: r["pk"])
    h = hashlib.sha256()
    for r in rows:
        h.update(str(r["pk"]).encode())
        h.update(np.asarray(r["embedding"], np.float32).tobytes())
    return len(rows), h.hexdigest()


def _brute(query: np.ndarray, pks: list, vectors: np.ndarray, k: int) -> tuple[list[str], np.ndarray]:
    v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    s = v @ query
    top = np.argsort(-s, kind="stable")[:k]
    return [str(pks[i]) for i in top], s[top]


def _flow(tmp_path: Path, uri: str, source_uri: str, *, pk: str, index: str, metric: str, params: dict,
          scale: bool) -> None:
    """Adopt, search, resume, upgrade, backfill, search, retire; the user's collection untouched."""
    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=N_IMAGES, captions_per_image=1)
    paths = [str(data / "images" / f"{i:03d}.png") for i in range(N_IMAGES)]
    vecs = old.encode_images([Path(p) for p in paths])
    if scale:  # their vectors as they stored them: not unit length (their COSINE index does not mind)
        vecs = vecs * np.linspace(0.5, 3.0, len(vecs), dtype=np.float32)[:, None]
    vecs = np.vstack([vecs, old.encode_texts(["a row without an image"])])  # a row whose source is gone
    paths.append("")
    client = _client(source_uri)
    user = parse_uri(source_uri)[1]["name"]
    pks = _user_collection(client, user, vecs, paths, pk=pk, index=index, metric=metric, params=params)
    before = _fingerprint(client, user)
    assert before[0] == N_IMAGES + 1

    rep = adopt_milvus(uri, source_uri, old, model=OLD_REF, vector_field="embedding", id_field="pk",
                       source_field="image_path", modality="image", samples=8, batch_rows=5)
    assert rep["created"] and rep["items"] == N_IMAGES + 1 and rep["added"] == N_IMAGES + 1
    assert rep["unsourced"] == 1 and rep["model_check"]["accepted"] and rep["model_check"]["n"] == 8
    assert _fingerprint(client, user) == before
    c = Collection.open(uri)
    assert c.count("image") == N_IMAGES + 1
    assert c.get(str(pks[3])).source == {"path": paths[3]} == c.get(str(pks[3])).metadata  # kept as add keeps it
    (imported,) = c.space(old.space_id).imports
    assert imported["in_place"] and imported["items"] == N_IMAGES + 1 and imported["from"] == source_uri
    store = c.gallery(old.space_id)
    assert store.metric == metric and store.index_info()["image"]["adopted"] == user
    with pytest.raises(PermissionError, match="never writes"):
        store.add("image", ["x"], np.ones((1, old.embed_dim), np.float32), space_id=old.space_id)

    again = adopt_milvus(uri, source_uri, old, model=OLD_REF, vector_field="embedding", id_field="pk",
                         source_field="image_path", modality="image", samples=8, batch_rows=5)
    assert not again["created"] and again["added"] == 0 and again["unchanged"] == N_IMAGES + 1
    assert len(Collection.open(uri).space(old.space_id).imports) == 1  # a run that changed nothing: no record

    s = Searcher(Collection.open(uri), pool=pool)
    for q in ("caption 0 of image 3 seed 0", "anything at all"):
        hits = s.search(text=q, k=5, target="image").hits
        ids, scores = _brute(old.encode_texts([q])[0], pks, vecs, 5)
        assert [h.id for h in hits] == ids
        np.testing.assert_allclose([h.score for h in hits], scores, atol=1e-5)
        assert {h.space for h in hits} == {old.space_id}
    assert not Collection.open(uri).verify()
    status = Collection.open(uri).status()
    assert status["unsourced"] == 1 and status["spaces"][old.space_id]["index"]["image"]["adopted"] == user

    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    assert _fingerprint(client, user) == before
    q = "caption 0 of image 3 seed 0"
    hits = Searcher(Collection.open(uri), pool=pool).search(text=q, k=5, target="image").hits
    assert [h.id for h in hits] == _brute(old.encode_texts([q])[0], pks, vecs, 5)[0]  # the bridge is exact
    assert {h.route for h in hits} == {"bridge"}

    out = run_backfill(c, new, order="random", batch_size=4, pool=pool)
    assert backfill_status(c)["fraction"] == 1.0 and out["committed"] == N_IMAGES
    assert _fingerprint(client, user) == before
    hits = Searcher(Collection.open(uri), pool=pool).search(text=q, k=N_IMAGES + 1, target="image").hits
    assert len(hits) == len({h.id for h in hits}) == N_IMAGES + 1  # the unsourced row still from the old space
    assert [h.id for h in hits if h.route == "bridge"] == [str(pks[-1])]
    native = new.encode_images([Path(p) for p in paths[:-1]])
    assert [h.id for h in hits if h.route == "native"] == _brute(new.encode_texts([q])[0], pks[:-1], native,
                                                                   N_IMAGES)[0]

    entry = c.space(old.space_id)
    retire_space(c, old.space_id, drop_unsourced=True)
    assert client.has_collection(user) and _fingerprint(client, user) == before
    assert not c.storage.has_space(entry.dir) and c.storage.read_doc(f"spaces/{entry.dir}.json") is None
    c = Collection.open(uri)
    hits = Searcher(c, pool=pool).search(text=q, k=20, target="image").hits
    assert {h.route for h in hits} == {"native"} and len(hits) == N_IMAGES
    assert [h.id for h in hits] == _brute(new.encode_texts([q])[0], pks[:-1], native, N_IMAGES)[0]
    assert not c.verify()
    c.storage.drop()  # nobackfill's own collections only
    assert client.has_collection(user) and _fingerprint(client, user) == before


@pytest.fixture
def lite(tmp_path):
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    from nobackfill import milvus

    yield f"{tmp_path}/milvus.db"
    milvus.close_clients()


def test_adopt_in_place_upgrade_backfill_retire_milvus_lite(tmp_path, lite):
    _flow(tmp_path, f"milvus-lite:{lite}#photos", f"milvus-lite:{lite}#products", pk="int", index="HNSW",
          metric="COSINE", params={"M": 8, "efConstruction": 64}, scale=True)


def test_adopt_refusals(tmp_path, lite):
    old, _, _ = related_pair()
    data = make_folder(tmp_path / "data", n_images=6, captions_per_image=1)
    paths = [str(data / "images" / f"{i:03d}.png") for i in range(6)]
    vecs = old.encode_images([Path(p) for p in paths])
    uri = f"milvus-lite:{lite}#photos"
    client = _client(uri)
    src = lambda name: f"milvus-lite:{lite}#{name}"  # noqa: E731

    def adopt(name: str, **kw):
        args = dict(model=OLD_REF, vector_field="embedding", id_field="pk", source_field="image_path",
                    modality="image", samples=4)
        return adopt_milvus(uri, src(name), old, **{**args, **kw})

    good_pks = _user_collection(client, "good", vecs, paths, pk="str", index="IVF_FLAT", metric="IP",
                                params={"nlist": 2})
    wide = HashEncoder(16, "wide").encode_images([Path(p) for p in paths])
    _user_collection(client, "wide", wide, paths)
    other = HashEncoder(old.embed_dim, "other").encode_images([Path(p) for p in paths])
    _user_collection(client, "other_model", other, paths)
    _user_collection(client, "l2", vecs, paths, index="FLAT", metric="L2")
    _user_collection(client, "not_unit", vecs * 2.0, paths, index="FLAT", metric="IP")
    before = {n: _fingerprint(client, n) for n in ("good", "wide", "other_model", "l2", "not_unit")}

    with pytest.raises(ValueError, match=r"'wide' holds 16-d vectors in 'embedding' but /fake/models/old embeds 12-d"):
        adopt("wide")
    with pytest.raises(ValueError, match=r"has no field 'caption' to read the sources .* \(its fields: pk, embedding, "
                                         r"image_path\)"):
        adopt("good", source_field="caption")
    with pytest.raises(ValueError, match=r"field 'image_path' of Milvus collection 'good' is not its primary key"):
        adopt("good", id_field="image_path")
    with pytest.raises(ModelCheckRefused, match=r"these vectors were not made by /fake/models/old: median cosine "
                                                r"-?0\.\d\d over 4 items"):
        adopt("other_model")
    with pytest.raises(ValueError, match=r"indexed with metric L2 on 'embedding' \(FLAT index\).* COSINE or IP only"):
        adopt("l2")
    with pytest.raises(ValueError, match=r"metric IP but 6 of 6 sampled vectors are not unit length"):
        adopt("not_unit", trust_model=True)
    with pytest.raises(ModelCheckRefused, match="no source field to re-embed a sample from"):
        adopt("good", source_field=None)
    with pytest.raises(FileNotFoundError, match="no Milvus collection 'missing' to adopt"):
        adopt("missing")
    with pytest.raises(ValueError, match=r"'nb_photos_mine' is named like nobackfill's own collections"):
        adopt("nb_photos_mine")  # refused before anything is read: a collection's drop() drops nb_photos_*
    with pytest.raises(ValueError, match=r"is not in the Milvus that holds collection .* in place, never copied"):
        adopt_milvus(uri, f"milvus-lite:{tmp_path}/elsewhere.db#good", old, model=OLD_REF, vector_field="embedding",
                     id_field="pk", modality="image")
    with pytest.raises(ValueError, match="a Milvus collection is adopted in place"):
        adopt_milvus(str(tmp_path / "local"), src("good"), old, model=OLD_REF, vector_field="embedding",
                     id_field="pk", modality="image")
    assert not is_collection(uri)
    assert {n: _fingerprint(client, n) for n in before} == before

    # trust_model skips the check (and the plan says so); an IVF_FLAT / IP index is searched as it is
    rep = adopt("other_model", trust_model=True)
    assert rep["model_check"]["skipped"] and rep["model_check"]["model"] == OLD_REF and rep["model_check"]["message"]
    c = Collection.open(uri)
    assert c.space(old.space_id).imports[0]["model_check"]["skipped"]
    assert _fingerprint(client, "other_model") == before["other_model"]
    with pytest.raises(FileExistsError, match="already holds a collection"):  # a collection holds one adoption
        Collection.create(uri, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, adopt={"collection": "good"})
    with pytest.raises(ValueError, match=r"is not the adopted Milvus collection 'good': nothing to resume"):
        adopt("good")

    other_uri = f"milvus-lite:{lite}#shop"
    rep = adopt_milvus(other_uri, src("good"), old, model=OLD_REF, vector_field="embedding", id_field="pk",
                       source_field="image_path", modality="image", samples=4)
    assert rep["items"] == 6 and rep["model_check"]["accepted"]
    s = Searcher(Collection.open(other_uri), pool=pool_with((OLD_REF, old)))
    q = "a query"
    hits = s.search(text=q, k=4, target="image").hits
    ids, scores = _brute(old.encode_texts([q])[0], good_pks, vecs, 4)
    assert [h.id for h in hits] == ids
    np.testing.assert_allclose([h.score for h in hits], scores, atol=1e-5)
    assert {n: _fingerprint(client, n) for n in before} == before


@pytest.mark.milvus_server
def test_adopt_in_place_on_a_milvus_server(tmp_path, milvus_server, postgres_db):
    name = f"c{uuid.uuid4().hex[:8]}"
    uri = f"milvus://{milvus_server}#{name}?catalog={postgres_db}#{name}"
    try:
        _flow(tmp_path, uri, f"milvus://{milvus_server}#products_{name}", pk="str", index="IVF_FLAT", metric="IP",
              params={"nlist": 4}, scale=False)
    finally:
        from nobackfill import milvus

        client = _client(f"milvus://{milvus_server}#x")
        if client.has_collection(f"products_{name}"):  # the test's own "user" collection
            client.drop_collection(f"products_{name}")
        milvus.close_clients()


def test_the_cli_adopts_a_milvus_collection_with_a_real_model(tmp_path):
    """``collection import NAME --from milvus-lite:PATH#THEIRS``: adopted in place (their vectors
    untouched), the model check on the shipped model; a missing option is named."""
    from typer.testing import CliRunner

    from nobackfill.cli import app
    from nobackfill.search.models import ModelPool, model_ref

    model = Path(__file__).resolve().parents[1] / "models" / "world-old"
    enc = ModelPool().get(model_ref(model))
    folder = make_folder(tmp_path / "d", n_images=6, captions_per_image=1)
    paths = sorted(str(p) for p in (folder / "images").iterdir())
    lite = tmp_path / "m.db"
    client = _client(f"milvus-lite:{lite}#x")
    theirs = f"products{uuid.uuid4().hex[:6]}"
    _user_collection(client, theirs, enc.encode_images([Path(p) for p in paths]), paths)
    before = _fingerprint(client, theirs)
    run = CliRunner().invoke
    args = ["collection", "import", f"milvus-lite:{lite}#ours", "--model", str(model), "--from",
            f"milvus-lite:{lite}#{theirs}"]
    r = run(app, args + ["--vector-field", "embedding"])
    assert r.exit_code == 2 and "--id-field" in r.output and "--modality" in r.output
    gone = f"gone{uuid.uuid4().hex[:6]}"  # rows whose images are gone: the model check has nothing to read
    _user_collection(client, gone, enc.encode_images([Path(p) for p in paths]), [p + ".gone" for p in paths])
    r = run(app, args[:-1] + [f"milvus-lite:{lite}#{gone}", "--vector-field", "embedding", "--id-field", "pk",
                              "--source-field", "image_path", "--modality", "image"])
    assert r.exit_code == 2 and "has a readable source" in r.output, r.output
    # a refusal makes nothing in their Milvus (trial AH: the check whether ours existed made a meta collection)
    assert sorted(client.list_collections()) == sorted([theirs, gone])
    client.release_collection(theirs)  # as in a new milvus-lite process: the model check loads it (trial AH: traceback)
    r = run(app, args + ["--vector-field", "embedding", "--id-field", "pk", "--source-field", "image_path",
                         "--modality", "image"])
    assert r.exit_code == 0, r.output
    assert "model check: these vectors match" in r.output and "adopted" in r.output and "6 item(s)" in r.output
    assert _fingerprint(client, theirs) == before
    r = run(app, ["collection", "status", f"milvus-lite:{lite}#ours"])  # (trial AL: KeyError 'count')
    assert r.exit_code == 0 and f"the Milvus collection {theirs!r} adopted in place" in r.output, r.output


def test_retiring_an_adopted_space_says_the_users_collection_is_kept():
    """Trial AH: retiring the space of a Milvus collection adopted in place said "its vectors were
    removed" / "dropped", while only its registration goes (import.md); said as it is."""
    from nobackfill.cli._collection_print import retired_words

    assert retired_words({"imports": [{"from": "milvus-lite:x#products", "in_place": True}]}) == \
        "its registration was forgotten; the adopted Milvus collection is kept as it was"
    assert retired_words({"imports": [{"from": "npy:e.npy"}]}) == retired_words({}) == "its vectors were dropped"

