"""The ``auto`` index (the default of a new collection): exact below its threshold, a graph index past
it built in the background without blocking or degrading searches, cached on disk and extended
with rows added later instead of rebuilt; ``status`` says which index answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nobackfill.cli import app
from nobackfill.ann import backends
from nobackfill.gallery import search_index as gallery_index
from nobackfill.ann.backends import AutoIndex, FactoryIndex, make_index, validate_spec
from nobackfill.collection.collection import Collection
from nobackfill.gallery.gallery import Gallery

ROOT = Path(__file__).resolve().parents[1]


def unit(n: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_top(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


def test_spec_and_its_errors():
    assert validate_spec("auto") == "auto"
    assert validate_spec("auto:at=1000,efSearch=64") == "auto:at=1000,efSearch=64"
    with pytest.raises(ValueError, match="at=0"):
        make_index("auto:at=0", 8)
    with pytest.raises(ValueError, match="approximate"):
        make_index("auto:graph=Flat", 8)
    with pytest.raises(ValueError, match="bad option"):
        validate_spec("auto:M=3")


def test_exact_below_the_threshold_and_no_build():
    x = unit(300)
    idx = make_index("auto:at=301", 16)
    idx.add(x)
    assert isinstance(idx, AutoIndex) and idx.in_use == "Flat" and not idx.needs_graph
    assert idx.start_build() is False and not idx.building
    _, pos = idx.search(x[:20], 5)
    assert np.array_equal(pos, exact_top(x, x[:20], 5))


def test_past_the_threshold_searches_stay_exact_until_the_graph_swaps_in():
    x, q = unit(4000, seed=1), unit(50, seed=2)
    idx = make_index("auto:at=1000", 16)
    idx.add(x)
    assert idx.needs_graph
    built = []
    idx.on_built = built.append
    assert idx.start_build()
    truth = exact_top(x, q, 10)
    while idx.building:  # every search during the build is the exact answer
        _, pos = idx.search(q, 10)
        if idx.in_use == "Flat":
            assert np.array_equal(pos, truth) or idx.in_use != "Flat"
    assert idx.build() and idx.in_use == "HNSW32" and built == [idx] and idx.error is None
    _, pos = idx.search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(pos, truth)])
    assert recall >= 0.9


def test_rows_added_during_a_build_are_in_the_graph(monkeypatch):
    x, extra = unit(900, seed=3), unit(50, seed=4)
    idx = make_index("auto:at=500", 16)
    idx.add(x)
    monkeypatch.setattr(AutoIndex, "block", 100)
    original = FactoryIndex._add
    calls = []

    def add_and_interleave(self, vectors):
        original(self, vectors)
        if not calls:  # between two blocks of the build, a writer appends rows
            calls.append(1)
            idx.add(extra)

    monkeypatch.setattr(FactoryIndex, "_add", add_and_interleave)
    assert idx.build()
    assert calls and idx.ntotal == 950 and idx.in_use == "HNSW32"
    _, pos = idx.search(extra, 1)
    assert np.array_equal(pos[:, 0], np.arange(900, 950))


def test_serialised_in_both_states():
    x = unit(700, seed=5)
    idx = make_index("auto:at=600", 16)
    idx.add(x)
    flat = backends.load_index("auto:at=600", 16, idx.to_bytes())
    assert flat.in_use == "Flat" and flat.ntotal == 700 and flat.needs_graph
    idx.build()
    graph = backends.load_index("auto:at=600", 16, idx.to_bytes())
    assert graph.in_use == "HNSW32" and graph.ntotal == 700
    assert np.array_equal(graph.search(x[:5], 3)[1], idx.search(x[:5], 3)[1])


def test_gallery_caches_the_graph_and_extends_it_instead_of_rebuilding(tmp_path, monkeypatch):
    x = unit(3000, seed=6)
    g = Gallery.create(tmp_path / "g", space_id="s", dim=16, model="m", backend="auto:at=1000")
    g.add("text", [f"i{i}" for i in range(2000)], x[:2000], space_id="s")
    info = g.build_index()
    assert info["text"] == {"backend": "auto:at=1000", "in_use": "HNSW32", "building": False, "count": 2000}
    stamp = json.loads((tmp_path / "g" / "index-text.json").read_text())
    assert stamp["in_use"] == "HNSW32" and stamp["chunks"] == 1
    g.close()
    g = Gallery.create(tmp_path / "g", space_id="s", dim=16, model="m", backend="auto:at=1000")
    g.add("text", [f"i{i}" for i in range(2000, 3000)], x[2000:], space_id="s")
    g.close()
    # a new reader loads the cached graph and appends the new chunk: nothing is built from scratch
    monkeypatch.setattr(gallery_index, "make_index", lambda *a, **k: pytest.fail("the cached graph was rebuilt"))
    g = Gallery.open(tmp_path / "g")
    assert g.index_info()["text"]["in_use"] == "HNSW32"  # from the cache's stamp, nothing loaded
    r = g.search("text", x[2500:2501], 1, space_id="s")
    assert r.ids[0] == ["i2500"]
    assert g.index_info()["text"] == {"backend": "auto:at=1000", "in_use": "HNSW32", "building": False,
                                      "count": 3000}
    # the extended graph was 1.5x the cached one: it was written back
    assert json.loads((tmp_path / "g" / "index-text.json").read_text())["chunks"] == 2


def test_a_cache_of_other_rows_is_not_extended(tmp_path):
    x = unit(1200, seed=7)
    g = Gallery.create(tmp_path / "g", space_id="s", dim=16, model="m", backend="auto:at=1000")
    g.add("text", [f"i{i}" for i in range(1200)], x, space_id="s")
    g.build_index()
    stamp_path = tmp_path / "g" / "index-text.json"
    stamp = json.loads(stamp_path.read_text())
    stamp["key"] = "0" * 64  # as if the chunks it was built from were replaced
    stamp_path.write_text(json.dumps(stamp))
    g.close()
    g = Gallery.open(tmp_path / "g")
    g.build_in_background = False
    r = g.search("text", x[:1], 1, space_id="s")
    assert r.ids[0] == ["i0"] and g.index_info()["text"]["in_use"] == "Flat"  # rebuilt exact, graph pending


def test_collection_default_is_auto_and_status_names_the_index(tmp_path):
    c = Collection.create(tmp_path / "c", space_id="s", dim=16, model="m", modalities=["text"])
    assert c.backend == "auto"
    g = c.gallery("s")
    g.add("text", ["k1", "k2"], unit(2, seed=8), space_id="s")
    assert c.status()["spaces"]["s"]["index"]["text"]["backend"] == "auto"


def test_milvus_maps_auto_to_hnsw():
    from nobackfill.milvus import milvus_index_params

    index, search = milvus_index_params("auto:efSearch=64")
    assert index["index_type"] == "HNSW" and index["params"]["M"] == 32 and search == {"ef": 64}


def test_cli_add_builds_the_graph_and_status_says_so(tmp_path):
    runner = CliRunner()
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"a caption number {i}\n" for i in range(12)))
    coll = tmp_path / "c"
    r = runner.invoke(app, ["collection", "create", str(coll), "--model", str(ROOT / "models" / "world-old"),
                            "--backend", "auto:at=8"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["collection", "add", str(coll), "--texts", str(texts)])
    assert r.exit_code == 0, r.output
    assert "building the HNSW32 index of 12 text vectors" in r.output
    r = runner.invoke(app, ["collection", "status", str(coll)])
    assert r.exit_code == 0, r.output
    assert "index: auto:at=8: HNSW32 over 12 stored text vectors" in r.output
    r = runner.invoke(app, ["collection", "delete", str(coll), "--id", json.loads(runner.invoke(
        app, ["collection", "search", str(coll), "--text", "a caption number 3", "--k", "1", "--json"]).stdout)["hits"][0]["id"]])
    assert r.exit_code == 0, r.output
    out = " ".join(runner.invoke(app, ["collection", "status", str(coll)]).output.split())
    # trial J read "49 images" beside "Flat for 50 images": the line says what the difference is
    assert "HNSW32 over 12 stored text vectors (1 of them of items deleted, replaced or served by another space" in out
    st = json.loads(runner.invoke(app, ["collection", "status", str(coll), "--json"]).stdout)
    (space,) = st["spaces"].values()
    assert space["index"]["text"]["in_use"] == "HNSW32"
    r = runner.invoke(app, ["collection", "search", str(coll), "--text", "a caption number 3", "--k", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert Gallery.build_in_background  # the one-shot search restored the process-wide default


def test_a_graph_reserved_for_its_rows_never_moves_its_arrays_and_is_the_same_graph():
    """``FactoryIndex.reserve``: a graph built block by block reallocates (and copies) its vector and
    neighbour arrays as they grow, holding both copies at once; reserved for its rows it never does,
    and the graph is the one built without it, byte for byte."""
    import faiss

    x = unit(3000, seed=5)
    plain, reserved = FactoryIndex(16, "HNSW32"), FactoryIndex(16, "HNSW32")
    reserved.reserve(len(x))

    def arrays(g: FactoryIndex) -> tuple[int, int]:
        inner = g._inner()
        return int(faiss.downcast_index(inner.storage).codes.data()), int(inner.hnsw.neighbors.data())

    moved: dict[str, set] = {"plain": set(), "reserved": set()}
    for s in range(0, len(x), 250):
        for name, g in (("plain", plain), ("reserved", reserved)):
            g._add(x[s:s + 250])
            moved[name].add(arrays(g))
    assert len(moved["reserved"]) == 1
    assert len(moved["plain"]) > 1  # the check can fail: without the reserve the arrays move
    assert bytes(faiss.serialize_index(plain._index)) == bytes(faiss.serialize_index(reserved._index))


def test_reserving_an_index_that_is_not_a_graph_changes_nothing():
    import faiss

    for factory in ("Flat", "IVF4,Flat"):
        idx = FactoryIndex(16, factory)
        before = bytes(faiss.serialize_index(idx._index))
        idx.reserve(10_000)
        assert bytes(faiss.serialize_index(idx._index)) == before


def test_the_background_build_reserves_the_graph_for_the_rows_it_found(monkeypatch):
    x = unit(1200, seed=6)
    idx = make_index("auto:at=500", 16)
    idx.add(x)
    asked = []
    original = FactoryIndex.reserve
    monkeypatch.setattr(FactoryIndex, "reserve", lambda self, n: (asked.append(n), original(self, n))[1])
    assert idx.build() and idx.in_use == "HNSW32"
    assert asked == [1200]


def test_status_before_any_search_names_the_exact_index_of_a_small_space(tmp_path):
    """A fresh process's status knows an auto index below its threshold searches exactly (it read
    'not loaded yet over 12 stored text vectors' before); past it, no cache: loaded at the first search."""
    runner = CliRunner()
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"a caption number {i}\n" for i in range(12)))
    for backend, says in (("auto", "auto: Flat over 12 stored text vectors"),
                          ("auto:at=8", "auto:at=8: HNSW32 over 12 stored text vectors")):
        coll = tmp_path / backend.replace(":", "_").replace("=", "")
        assert runner.invoke(app, ["collection", "create", str(coll), "--model", str(ROOT / "models" / "world-old"),
                                   "--backend", backend]).exit_code == 0
        assert runner.invoke(app, ["collection", "add", str(coll), "--texts", str(texts)]).exit_code == 0
        out = " ".join(runner.invoke(app, ["collection", "status", str(coll)]).output.split())
        assert says in out and "not loaded" not in out, out
        for p in coll.rglob("index-text.*"):  # a graph index not cached: built or loaded by the first search
            p.unlink()
        out = " ".join(runner.invoke(app, ["collection", "status", str(coll)]).output.split())
        assert says.split(": ", 1)[0] + ": " + (
            "Flat over 12" if backend == "auto" else "12 stored text vectors (their index is loaded at the first "
                                                     "search)") in out, out
