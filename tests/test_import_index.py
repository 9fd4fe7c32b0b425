"""An import returns when its rows are in (issue 40): the collection is searchable at once (exact
search while a space's graph index is missing), the graph index is built later by ``collection
index``, the service or :meth:`~nobackfill.collection.collection.Collection.build_graph_indexes`,
and a build killed at any of its writes is never served half-built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nobackfill.adopt.importing import import_source
from nobackfill.adopt.sources import open_source
from nobackfill.cli import app
from nobackfill.collection.collection import Collection
from nobackfill.search.searcher import Searcher

from _collection_helpers import OLD_REF, HashEncoder, pool_with

HERE = Path(__file__).parent
ROOT = HERE.parent
runner = CliRunner()
AUTO = "auto:at=300"  # the graph index from 300 vectors on


def _data(folder: Path, n: int, enc: HashEncoder) -> Path:
    """``n`` captions embedded by ``enc`` as an npy with a JSONL table."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = [f"caption number {i}" for i in range(n)]
    np.save(folder / "e.npy", enc.encode_texts(texts))
    (folder / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i:05d}", "text": t}) + "\n"
                                            for i, t in enumerate(texts)))
    return folder


def _import(tmp_path: Path, n: int = 500) -> tuple[Collection, HashEncoder, np.ndarray]:
    enc = HashEncoder(16, "old")
    data = _data(tmp_path / "d", n, enc)
    src = open_source(f"npy:{data / 'e.npy'}", table=data / "t.jsonl", id_column="id", source_column="text",
                      modality="text")
    import_source(tmp_path / "c", src, enc, model=OLD_REF, trust_model=True, progress=False, backend=AUTO)
    return Collection.open(tmp_path / "c"), enc, np.load(data / "e.npy")


def _brute_force(vectors: np.ndarray, q: np.ndarray, k: int) -> list[str]:
    scores = vectors @ q
    return [f"t{i:05d}" for i in np.argsort(-scores, kind="stable")[:k]]


def _in_use(c: Collection) -> str | None:
    return c.status()["spaces"][c.current_space]["index"]["text"]["in_use"]


def test_an_import_is_searched_exactly_at_once_and_the_graph_index_is_built_later(tmp_path, monkeypatch):
    from nobackfill.gallery.gallery import Gallery

    monkeypatch.setattr(Gallery, "build_in_background", False)  # (a search would start the graph meanwhile)
    c, enc, vectors = _import(tmp_path)
    assert [m["count"] for m in c.missing_graph_indexes()] == [500]  # the import built no graph
    assert _in_use(c) != "HNSW32"
    s = Searcher(c, pool=pool_with((OLD_REF, enc)))
    queries = [f"a query {i}" for i in range(20)]
    for text, q in zip(queries, enc.encode_texts(queries)):  # exact: brute force, hit for hit
        assert [h.id for h in s.search(text=text, k=10, target="text").hits] == _brute_force(vectors, q, 10)
    assert _in_use(c) == "Flat"
    built = c.build_graph_indexes()
    assert built[c.current_space]["text"]["in_use"] == "HNSW32" and not c.missing_graph_indexes()
    again = Collection.open(tmp_path / "c")  # the next process loads the graph from disk
    s = Searcher(again, pool=pool_with((OLD_REF, enc)))
    hits = s.search(text="caption number 123", k=5, target="text").hits
    assert hits[0].id == "t00123" and _in_use(again) == "HNSW32"


def test_collection_index_builds_what_is_missing_and_says_so(tmp_path):
    c, _, _ = _import(tmp_path, 400)
    r = runner.invoke(app, ["collection", "index", str(c.path), "--json"])
    assert r.exit_code == 0, r.output
    (ix,) = json.loads(r.stdout)["indexes"]
    assert (ix["count"], ix["graph"], ix["in_use"], ix["modality"]) == (400, "HNSW32", "HNSW32", "text")
    assert _in_use(Collection.open(c.path)) == "HNSW32"
    r = runner.invoke(app, ["collection", "index", str(c.path)])
    assert r.exit_code == 0 and "every space that needs a graph index has it" in r.output


def test_the_cli_import_returns_before_the_graph_index_and_names_the_command_that_builds_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.random.default_rng(3).standard_normal((350, 64)).astype(np.float32)
    np.save(tmp_path / "e.npy", x / np.linalg.norm(x, axis=1, keepdims=True))
    pq.write_table(pa.table({"key": [f"i{i}" for i in range(350)]}), tmp_path / "t.parquet")
    r = runner.invoke(app, ["collection", "import", str(tmp_path / "c"), "--model", str(ROOT / "models" / "world-old"),
                            "--from", f"npy:{tmp_path / 'e.npy'}", "--table", str(tmp_path / "t.parquet"),
                            "--id-column", "key", "--modality", "image", "--trust-model", "--backend", AUTO])
    assert r.exit_code == 0, r.output
    assert "exact search of the 350 image vectors" in r.output and "collection index" in r.output
    c = Collection.open(tmp_path / "c")
    assert c.status()["spaces"][c.current_space]["index"]["image"]["in_use"] != "HNSW32"
    assert not list((tmp_path / "c").rglob("index-image.json"))  # nothing built, not even the exact cache


@pytest.mark.skipif(not hasattr(os, "fork"), reason="SIGKILLs a child at its writes")
def test_a_build_killed_at_any_write_is_never_served_half_built_and_the_next_one_finishes(tmp_path, monkeypatch):
    from nobackfill.gallery.gallery import Gallery

    monkeypatch.setattr(Gallery, "build_in_background", False)  # this process' searches build no graph
    c, enc, vectors = _import(tmp_path, 400)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(HERE / "_import_kill_helper.py"), "index", str(c.path)]
    queries = enc.encode_texts([f"a query {i}" for i in range(10)])
    want = [_brute_force(vectors, q, 10) for q in queries]
    before = []
    # killed before / after a process' first atomic rename, then before its second: with no cache,
    # the exact index's file and stamp; with the exact index cached (a search writes it), the graph's
    for at in ("1", "1+", "2"):
        before.append(Collection.open(c.path).gallery(c.current_space).index_info()["text"]["in_use"])
        done = subprocess.run(cmd, env={**env, "NOBACKFILL_TEST_KILL_AT_WRITE": at}, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == -9, (at, done.stdout, done.stderr)
        again = Collection.open(c.path)
        g = again.gallery(again.current_space)
        in_use = g.index_info()["text"]["in_use"]  # what the stamp on disk says
        assert in_use in (None, "Flat"), (at, in_use)  # a graph not stamped whole is never recorded
        res = g.search("text", queries, 10, space_id=again.current_space)  # (writes the exact index's cache)
        assert [[k.split("#")[0] for k in row] for row in res.ids] == want, at  # exact answers
        assert g.index_info()["text"]["in_use"] == "Flat"
    assert before == [None, "Flat", "Flat"]  # the last two were killed writing the graph
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    again = Collection.open(c.path)
    assert _in_use(again) == "HNSW32" and not again.missing_graph_indexes()
    res = again.gallery(again.current_space).search("text", vectors[:5], 1, space_id=again.current_space)
    assert [row[0].split("#")[0] for row in res.ids] == [f"t{i:05d}" for i in range(5)]


def _service(c: Collection, enc: HashEncoder) -> tuple:
    from fastapi.testclient import TestClient

    from nobackfill.serve import KeyRing, ServeSettings, create_app

    keys = KeyRing({"read": ["read-key-0123456789"], "admin": [ADMIN]})
    api = create_app(ServeSettings(collection=str(c.path), keys=keys), pool=pool_with((OLD_REF, enc)))
    return api.state.service, TestClient(api)


ADMIN = "admin-key-0123456789"


def test_the_service_builds_a_missing_graph_index_when_it_starts(tmp_path):
    pytest.importorskip("fastapi")
    c, enc, _ = _import(tmp_path, 350)
    svc, http = _service(c, enc)
    started = svc._indexer
    assert started is not None  # started with the service
    started.join(60)
    assert svc.collection.status()["spaces"][c.current_space]["index"]["text"]["in_use"] == "HNSW32"
    r = http.post("/v1/search", json={"text": "caption number 7", "k": 3, "target": "text"},
                  headers={"Authorization": "Bearer read-key-0123456789"})
    assert r.status_code == 200 and r.json()["hits"][0]["id"] == "t00007"


def test_post_index_starts_the_build_of_an_index_missing_since_another_process_imported(tmp_path):
    pytest.importorskip("fastapi")
    c, enc, _ = _import(tmp_path, 200)  # under the threshold: no graph yet
    svc, http = _service(c, enc)
    assert http.post("/v1/index", headers={"Authorization": "Bearer read-key-0123456789"}).status_code == 403
    r = http.post("/v1/index", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and r.json() == {"indexes": []}  # none missing
    more = _data(tmp_path / "d2", 700, enc)  # (its first 200 rows are the same items: unchanged)
    src = open_source(f"npy:{more / 'e.npy'}", table=more / "t.jsonl", id_column="id", source_column="text",
                      modality="text")
    import_source(c.path, src, enc, model=OLD_REF, trust_model=True, progress=False)
    r = http.post("/v1/index", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    (ix,) = r.json()["indexes"]
    assert ix["count"] == 700 and ix["building"] is True and ix["graph"] == "HNSW32"
    svc._indexer is None or svc._indexer.join(60)
    assert not svc.collection.missing_graph_indexes()
    from nobackfill.client.remote import RemoteClient

    remote = RemoteClient("http://testserver", api_key=ADMIN, http=http)  # the Python client over HTTP
    assert remote.index() == {"indexes": []}


def test_a_graph_build_tells_its_progress_block_by_block():
    from nobackfill.ann.backends import make_index

    idx = make_index("auto:at=100", 8)
    idx.block = 64
    x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    idx.add(x / np.linalg.norm(x, axis=1, keepdims=True))
    told: list[int] = []
    assert idx.build(progress=told.append) and idx.in_use == "HNSW32"
    assert told == [64, 64, 64, 64, 44]  # every row once: the last block appended at the swap
