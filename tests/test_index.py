"""Tests for nobackfill.ann and nobackfill.gallery: backends, the versioned crash-safe gallery store, resumable builds."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from nobackfill.encoders.base import DualEncoder, l2_normalise
from nobackfill.gallery import (CorruptGalleryError, DuplicateIdError, Gallery, NotAGalleryError, SpaceMismatchError,
                                build_gallery)
from nobackfill.ann import make_index, parse_spec
from nobackfill.ann.backends import load_index

faiss.omp_set_num_threads(1)  # CPU is shared; the data here is tiny

DIM = 16
SPACE_A = "a" * 16
SPACE_B = "b" * 16
KILL_HELPER = Path(__file__).with_name("_index_kill_helper.py")


def _unit_from_bytes(data: bytes, dim: int, salt: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(salt.encode() + data).digest()[:8], "little")
    return l2_normalise(np.random.default_rng(seed).standard_normal(dim).astype(np.float32))


class FakeEncoder(DualEncoder):
    """Deterministic stand-in: a hash of the text / image pixels seeds a random unit vector."""

    kind = "fake"

    def __init__(self, dim: int = DIM, salt: str = "v1") -> None:
        self._dim, self._salt = dim, salt

    @property
    def embed_dim(self) -> int:
        return self._dim

    @property
    def space_id(self) -> str:
        return hashlib.sha256(f"fake/{self._dim}/{self._salt}".encode()).hexdigest()[:16]

    def encode_images(self, images: Sequence, batch_size: int = 128, progress: bool = False) -> np.ndarray:
        rows = [_unit_from_bytes(Image.open(p).convert("RGB").tobytes(), self._dim, self._salt + "/img")
                for p in images]
        return np.stack(rows) if rows else np.zeros((0, self._dim), np.float32)

    def encode_texts(self, texts: Sequence[str], batch_size: int = 256, progress: bool = False) -> np.ndarray:
        rows = [_unit_from_bytes(t.encode(), self._dim, self._salt + "/txt") for t in texts]
        return np.stack(rows) if rows else np.zeros((0, self._dim), np.float32)

    def save(self, directory):  # pragma: no cover - not needed here
        raise NotImplementedError


def make_inputs(root: Path, n_images: int = 7, n_texts: int = 9):
    """Small PNGs (distinct pixels) and captions for build_gallery."""
    root.mkdir(parents=True, exist_ok=True)
    images = []
    for i in range(n_images):
        p = root / f"img{i}.png"
        if not p.exists():
            Image.new("RGB", (4, 4), (i * 30 % 256, i * 7 % 256, 200)).save(p)
        images.append((f"img{i}", p))
    texts = [(f"txt{i}", f"a caption number {i}", {"lang": "en", "n": i}) for i in range(n_texts)]
    return images, texts


def unit_rows(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    return l2_normalise(np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32))


@pytest.fixture
def gallery(tmp_path: Path) -> Gallery:
    return Gallery.create(tmp_path / "g", space_id=SPACE_A, dim=DIM, model="models/fake-a")


# ------------------------------------------------------------------------------------- backends


def test_flat_and_hnsw_agree_on_top1():
    base = unit_rows(400, seed=1)
    queries = l2_normalise(base[:50] + 0.05 * unit_rows(50, seed=2))
    top1 = {}
    for spec in ("flat", "hnsw", "hnsw:M=16,ef=64"):
        index = make_index(spec, DIM)
        index.add(base)
        scores, pos = index.search(queries, 5)
        assert scores.dtype == np.float32 and pos.dtype == np.int64 and pos.shape == (50, 5)
        assert np.all(np.diff(scores, axis=1) <= 1e-6)
        top1[spec] = pos[:, 0]
    np.testing.assert_array_equal(top1["flat"], np.arange(50))
    np.testing.assert_array_equal(top1["hnsw"], top1["flat"])
    np.testing.assert_array_equal(top1["hnsw:M=16,ef=64"], top1["flat"])


@pytest.mark.parametrize("spec", ["flat", "hnsw"])
def test_k_clipped_and_no_missing_positions(spec):
    index = make_index(spec, DIM)
    assert index.search(unit_rows(2), 3)[1].shape == (2, 0)
    index.add(unit_rows(5))
    scores, pos = index.search(unit_rows(3, seed=9), 50)
    assert pos.shape == (3, 5) and (pos >= 0).all()
    assert sorted(pos[0].tolist()) == list(range(5))


def test_backend_spec_errors():
    with pytest.raises(ValueError, match="known: auto, flat, hnsw"):
        make_index("ivf", DIM)
    with pytest.raises(ValueError, match="options: M, ef, efc"):
        make_index("hnsw:Q=3", DIM)
    with pytest.raises(ValueError, match="int"):
        make_index("hnsw:M=big", DIM)
    assert parse_spec("HNSW:M=16, ef=64") == ("hnsw", {"M": 16, "ef": 64})


# ------------------------------------------------------------------------------------- store


def test_add_search_round_trip(gallery: Gallery):
    vecs = unit_rows(20)
    ids = [f"t{i}" for i in range(20)]
    assert gallery.add("text", ids[:12], vecs[:12], [{"i": i} for i in range(12)], space_id=SPACE_A) == 12
    assert gallery.add("text", ids[12:], vecs[12:], space_id=SPACE_A) == 8
    assert gallery.ids("text") == ids and gallery.count("text") == 20 and len(gallery) == 20
    np.testing.assert_array_equal(gallery.vectors("text"), vecs)
    assert gallery.metadata("text")[:2] == [{"i": 0}, {"i": 1}] and gallery.metadata("text")[-1] == {}
    res = gallery.search("text", vecs[[3, 15]], k=4, space_id=SPACE_A)
    assert [row[0] for row in res.ids] == ["t3", "t15"]
    assert res.scores.shape == (2, 4) and res.positions[0, 0] == 3
    assert np.isclose(res.scores[0, 0], 1.0, atol=1e-5)
    assert gallery.count("image") == 0
    assert gallery.search("image", vecs[:1], k=3, space_id=SPACE_A).ids == [[]]
    assert (gallery.path / "index-text.faiss").exists()
    assert gallery.verify().ok


def test_space_mismatch_on_add_and_search(gallery: Gallery):
    with pytest.raises(SpaceMismatchError) as e:
        gallery.add("image", ["x"], unit_rows(1), space_id=SPACE_B)
    assert SPACE_A in str(e.value) and SPACE_B in str(e.value)
    gallery.add("image", ["x"], unit_rows(1), space_id=SPACE_A)
    with pytest.raises(SpaceMismatchError) as e:
        gallery.search("image", unit_rows(1), space_id=SPACE_B)
    assert SPACE_A in str(e.value) and SPACE_B in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(SpaceMismatchError, match=SPACE_B):
        Gallery.create(gallery.path, space_id=SPACE_B, dim=DIM, model="other")


def test_bad_input_errors(gallery: Gallery):
    with pytest.raises(ValueError, match="shape"):
        gallery.add("text", ["a"], unit_rows(1, dim=DIM + 1), space_id=SPACE_A)
    nan = unit_rows(2)
    nan[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        gallery.add("text", ["a", "b"], nan, space_id=SPACE_A)
    with pytest.raises(DuplicateIdError, match="within one batch"):
        gallery.add("text", ["a", "a"], unit_rows(2), space_id=SPACE_A)
    gallery.add("text", ["a", "b"], unit_rows(2), space_id=SPACE_A)
    with pytest.raises(DuplicateIdError, match="already in gallery"):
        gallery.add("text", ["c", "b"], unit_rows(2, seed=3), space_id=SPACE_A)
    assert gallery.add("text", ["c", "b"], unit_rows(2, seed=3), space_id=SPACE_A, skip_existing=True) == 1
    assert gallery.ids("text") == ["a", "b", "c"]
    np.testing.assert_array_equal(gallery.vectors("text")[2], unit_rows(2, seed=3)[0])
    with pytest.raises(ValueError, match="modality"):
        gallery.add("audio", ["z"], unit_rows(1), space_id=SPACE_A)
    with pytest.raises(ValueError, match="shape"):
        gallery.search("text", unit_rows(1, dim=DIM - 1), space_id=SPACE_A)
    with pytest.raises(ValueError, match="dim"):
        Gallery.create(gallery.path, space_id=SPACE_A, dim=DIM * 2, model="x")


def test_reopen_after_close(gallery: Gallery):
    vecs = unit_rows(6)
    gallery.add("image", [f"i{i}" for i in range(6)], vecs, [{"path": f"p{i}"} for i in range(6)], space_id=SPACE_A)
    first = gallery.search("image", vecs, k=2, space_id=SPACE_A)
    path = gallery.path
    gallery.close()
    again = Gallery.open(path)
    assert (again.space_id, again.dim, again.model, again.backend) == (SPACE_A, DIM, "models/fake-a", "flat")
    assert again.ids("image") == [f"i{i}" for i in range(6)]
    assert again.metadata("image")[5] == {"path": "p5"}
    second = again.search("image", vecs, k=2, space_id=SPACE_A)  # served from the cached index file
    assert second.ids == first.ids
    np.testing.assert_allclose(second.scores, first.scores)
    resumed = Gallery.create(path, space_id=SPACE_A, dim=DIM, model="ignored", backend="hnsw:M=8")
    assert resumed.backend == "hnsw:M=8" and resumed.count("image") == 6
    assert resumed.search("image", vecs, k=2, space_id=SPACE_A).ids == first.ids  # rebuilt for hnsw


def test_index_rebuilt_after_add(gallery: Gallery):
    gallery.add("text", ["a"], unit_rows(1), space_id=SPACE_A)
    assert gallery.search("text", unit_rows(1), k=5, space_id=SPACE_A).ids == [["a"]]
    new = unit_rows(1, seed=5)
    gallery.add("text", ["b"], new, space_id=SPACE_A)
    assert Gallery.open(gallery.path).search("text", new, k=1, space_id=SPACE_A).ids == [["b"]]


class _Shift:
    """A toy bridge from SPACE_B to SPACE_A: negates the queries."""

    source, target = SPACE_B, SPACE_A

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        return -queries


def test_bridge_applied(gallery: Gallery):
    vecs = unit_rows(10)
    gallery.add("image", [str(i) for i in range(10)], vecs, space_id=SPACE_A)
    bridge = _Shift()
    res = gallery.search("image", bridge(-vecs[[4]]), k=1, space_id=bridge.target)
    assert res.ids == [["4"]] and np.isclose(res.scores[0, 0], 1.0, atol=1e-5)
    # queries of another space that were not mapped are refused, naming both spaces
    with pytest.raises(SpaceMismatchError, match=f"{SPACE_A}.*{SPACE_B}"):
        gallery.search("image", -vecs[[4]], k=1, space_id=bridge.source)
    assert gallery.search("image", vecs[[4]], k=1, space_id=SPACE_A).ids == [["4"]]


def test_orphan_chunk_ignored_and_collected(gallery: Gallery):
    gallery.add("text", ["a"], unit_rows(1), space_id=SPACE_A)
    chunks = gallery.path / "chunks"
    # simulate a kill between chunk write and manifest write: a complete chunk nobody lists
    np.savez(chunks / "text-00001.npz", vectors=unit_rows(2, seed=8), ids=np.array(["b", "c"]))
    (chunks / "text-00001.jsonl").write_text("{}\n{}\n")
    (chunks / ".tmp-text-00002.npz.abc").write_bytes(b"partial")
    assert sorted(gallery.verify().orphans) == ["chunks/.tmp-text-00002.npz.abc",
                                                "chunks/text-00001.jsonl", "chunks/text-00001.npz"]
    reopened = Gallery.open(gallery.path)
    assert reopened.ids("text") == ["a"]
    assert not (chunks / "text-00001.npz").exists() and not (chunks / ".tmp-text-00002.npz.abc").exists()
    reopened.add("text", ["b"], unit_rows(1, seed=4), space_id=SPACE_A)
    assert Gallery.open(gallery.path).ids("text") == ["a", "b"]


def test_open_errors_name_the_path(tmp_path: Path):
    with pytest.raises(NotAGalleryError, match=re.escape(str(tmp_path / "nothing"))):
        Gallery.open(tmp_path / "nothing")
    g = Gallery.create(tmp_path / "g", space_id=SPACE_A, dim=DIM, model="m")
    manifest = g.path / "manifest.json"
    manifest.write_text('{"format": "nobackfill-gallery", "format_ver')
    with pytest.raises(CorruptGalleryError, match=re.escape(str(manifest))):
        Gallery.open(g.path)
    manifest.write_text(json.dumps({"format": "nobackfill-gallery", "format_version": 1}))
    with pytest.raises(CorruptGalleryError, match="space_id"):
        Gallery.open(g.path)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="not a gallery"):
        Gallery.create(tmp_path / "junk", space_id=SPACE_A, dim=DIM, model="m")


def test_verify_detects_tampering(gallery: Gallery):
    gallery.add("text", ["a", "b"], unit_rows(2), space_id=SPACE_A)
    (gallery.path / "chunks" / "text-00000.jsonl").write_text('{"x": 1}\n{}\n')
    report = Gallery.open(gallery.path).verify()
    assert not report.ok and "text-00000.jsonl" in report.problems[0] and "sha256" in report.problems[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.integers(0, 10**6), min_size=0, max_size=6), min_size=1, max_size=5))
def test_property_ids_are_concatenation(batches):
    seen: set[int] = set()
    unique_batches = []
    for batch in batches:  # make ids globally unique while keeping the batch structure
        b = [x for x in dict.fromkeys(batch) if x not in seen]
        seen.update(b)
        unique_batches.append([f"id{x}" for x in b])
    with tempfile.TemporaryDirectory() as d:
        g = Gallery.create(Path(d) / "g", space_id=SPACE_A, dim=4, model="m")
        expected: list[str] = []
        for i, ids in enumerate(unique_batches):
            added = g.add("text", ids, unit_rows(len(ids), dim=4, seed=i), space_id=SPACE_A)
            assert added == len(ids)
            expected += ids
        assert g.ids("text") == expected
        assert Gallery.open(g.path).ids("text") == expected
        assert g.vectors("text").shape == (len(expected), 4)


# ------------------------------------------------------------------------------------- build


def test_build_gallery_contents(tmp_path: Path):
    images, texts = make_inputs(tmp_path / "in")
    enc = FakeEncoder()
    g = build_gallery(enc, tmp_path / "g", images=images, texts=texts, model_ref="models/fake", chunk_size=4,
                      progress=False)
    assert g.space_id == enc.space_id and g.model == "models/fake"
    assert g.ids("image") == [i for i, _ in images] and g.ids("text") == [t[0] for t in texts]
    assert g.metadata("image")[0] == {"path": str(images[0][1])}
    assert g.metadata("text")[2] == {"text": "a caption number 2", "lang": "en", "n": 2}
    q = enc.encode_texts(["a caption number 5"])
    assert g.search("text", q, k=1, space_id=enc.space_id).ids == [["txt5"]]
    with pytest.raises(SpaceMismatchError):
        build_gallery(FakeEncoder(salt="v2"), tmp_path / "g", images=images, model_ref="x", progress=False)


def test_build_killed_then_resumed(tmp_path: Path):
    inputs, out, clean = tmp_path / "in", tmp_path / "g", tmp_path / "clean"
    images, texts = make_inputs(inputs)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(KILL_HELPER), str(inputs), str(out), "2"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    partial = Gallery.open(out)
    assert partial.count("image") == 6 and partial.count("text") == 0  # two chunks of 3 committed

    resumed = build_gallery(FakeEncoder(), out, images=images, texts=texts, model_ref="fake", chunk_size=3,
                            progress=False)
    reference = build_gallery(FakeEncoder(), clean, images=images, texts=texts, model_ref="fake", chunk_size=3,
                              progress=False)
    for modality in ("image", "text"):
        ids = resumed.ids(modality)
        assert len(ids) == len(set(ids))
        assert ids == reference.ids(modality)
        np.testing.assert_array_equal(resumed.vectors(modality), reference.vectors(modality))
        assert resumed.metadata(modality) == reference.metadata(modality)
    assert resumed.verify().ok


def test_on_commit_is_called_after_each_committed_chunk(tmp_path: Path):
    images, texts = make_inputs(tmp_path / "in")
    seen: list[tuple[int, int]] = []
    out = tmp_path / "g"
    build_gallery(FakeEncoder(), out, images=images, texts=texts, model_ref="fake", chunk_size=3, progress=False,
                  on_commit=lambda n: seen.append((n, Gallery.open(out).count("image") + Gallery.open(out).count("text"))))
    n_chunks = -(-len(images) // 3) + -(-len(texts) // 3)
    assert [n for n, _ in seen] == list(range(1, n_chunks + 1))
    assert all(stored > 0 for _, stored in seen) and seen[-1][1] == len(images) + len(texts)


def test_read_tagged_json_names_the_file_for_every_kind_of_bad_manifest(tmp_path):
    """The one reader behind the gallery, token-store, memory, RECO and upgrade manifests."""
    from nobackfill.gallery.atomic_files import read_tagged_json

    class Bad(ValueError):
        pass

    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": "fmt-a", "version": 2, "x": 1}))
    assert read_tagged_json(path, "fmt-a", max_version=2)["x"] == 1
    assert read_tagged_json(path, "fmt-a")["x"] == 1  # version unchecked without max_version
    for text, match in ((json.dumps({"format": "fmt-a", "version": 3}), "unsupported version 3"),
                        (json.dumps({"format": "fmt-a"}), "unsupported version None"),
                        (json.dumps({"format": "fmt-b", "version": 1}), "not a fmt-a file"),
                        (json.dumps([1, 2]), "not a fmt-a file"),
                        ("{truncated", "unreadable")):
        path.write_text(text)
        with pytest.raises(Bad, match=match) as info:
            read_tagged_json(path, "fmt-a", error=Bad, max_version=2)
        assert str(path) in str(info.value)
    with pytest.raises(Bad, match="unreadable"):
        read_tagged_json(tmp_path / "absent.json", "fmt-a", error=Bad)


# ----------------------------------------------------------------------------- faiss factory strings
@pytest.mark.parametrize("spec", ["Flat", "HNSW16", "HNSW16:efSearch=64", "IVF16,Flat:nprobe=16", "IVF16,PQ4x4:nprobe=16",
                                  "PQ4x4"])  # 16 centroids a sub-quantizer: trains in a second (PQ4: 256, ~15 s here)
def test_factory_strings_search_masks_and_round_trip(spec, tmp_path):
    rng = np.random.default_rng(0)
    x = l2_normalise(rng.standard_normal((1200, DIM)).astype(np.float32))
    idx = make_index(spec, DIM)
    idx.add(x)
    mask = np.zeros(len(x), bool)
    mask[1::3] = True
    scores, pos = idx.search(x[:5], 4, mask=mask)
    assert pos.shape == (5, 4) and (pos % 3 == 1).all() and (pos >= 0).all()
    exact = (x[:5] @ x[mask].T).max(axis=1)
    tol = 0.1 if "PQ" in spec else 1e-4  # PQ scores are approximate (compressed codes)
    assert (scores[:, 0] <= exact + tol).all()  # never (much) better than the best allowed row
    g = Gallery.create(tmp_path / "g", space_id=SPACE_A, dim=DIM, model="m", backend=spec)
    g.add("image", [f"i{k}" for k in range(len(x))], x, space_id=SPACE_A)
    first = g.search("image", x[:3], k=3, space_id=SPACE_A)
    again = Gallery.open(tmp_path / "g").search("image", x[:3], k=3, space_id=SPACE_A)  # from the cached index
    assert first.ids == again.ids


def test_factory_spec_parsing_and_errors():
    assert parse_spec("IVF1024,PQ16:nprobe=32") == ("faiss", {"factory": "IVF1024,PQ16", "nprobe": 32})
    assert parse_spec("flat") == ("flat", {}) and parse_spec("Flat") == ("flat", {})
    assert parse_spec("hnsw:M=16,ef=64") == ("hnsw", {"M": 16, "ef": 64})  # the old spelling
    with pytest.raises(ValueError, match="options: factory, efSearch, nprobe"):
        parse_spec("HNSW32:ef=3")
    with pytest.raises(ValueError, match="cannot build 'IVF8,PQ5' for dim 16"):
        make_index("IVF8,PQ5", DIM)


def test_a_factory_index_too_small_to_train_searches_exactly_until_it_can_be_trained(caplog, capfd):
    """Trial AE: a collection created with ``IVF1024,PQ16`` and 60 vectors answered every search with
    faiss' training error. Its rows are searched exactly until a block brings enough to train it,
    across a save and load (the stand-in is what is cached)."""
    rng = np.random.default_rng(1)
    x = l2_normalise(rng.standard_normal((300, DIM)).astype(np.float32))
    idx = make_index("IVF64,Flat:nprobe=64", DIM)
    idx.add(x[:10])
    assert idx.waiting and "10 rows cannot train 'IVF64,Flat' yet" in idx.waiting and idx.ntotal == 10
    scores, pos = idx.search(x[:3], 2)
    assert pos[:, 0].tolist() == [0, 1, 2] and np.allclose(scores[:, 0], 1.0, atol=1e-5)
    idx.add(x[10:20])
    again = load_index("IVF64,Flat:nprobe=64", DIM, idx.to_bytes())
    assert again.waiting and again.ntotal == 20
    assert again.search(x[15:16], 1)[1][0, 0] == 15
    capfd.readouterr()
    with caplog.at_level("WARNING", logger="nobackfill.ann"):
        again.add(x[20:])  # 300 rows: trained now, every row kept in its order
    assert again.waiting is None and again.ntotal == 300
    # fewer than faiss advises (64 lists x 39): said once as our warning, not by faiss' C++ on stderr
    said = [r.getMessage() for r in caplog.records if r.name == "nobackfill.ann"]
    assert len(said) == 1 and "trained on 300 rows, fewer than faiss advises for its 64 IVF lists (2496)" in said[0]
    assert "WARNING clustering" not in capfd.readouterr().err
    assert again.search(x[[5, 150, 299]], 1)[1][:, 0].tolist() == [5, 150, 299]  # nprobe 64: every list
    mask = np.zeros(300, bool)
    mask[200:] = True
    assert set(again.search(x[:4], 3, mask=mask)[1].ravel().tolist()) <= set(range(200, 300))


def test_a_gallery_says_its_factory_index_is_searched_exactly_until_it_can_be_trained(tmp_path):
    """The status of a space whose IVF index cannot be trained yet names the exact search and why,
    in the process that searched and in another one (from its cache's stamp)."""
    x = l2_normalise(np.random.default_rng(2).standard_normal((40, DIM)).astype(np.float32))
    g = Gallery.create(tmp_path / "g", space_id=SPACE_A, dim=DIM, model="m", backend="IVF64,Flat")
    g.add("image", [f"i{k}" for k in range(len(x))], x, space_id=SPACE_A)
    # before a search builds it, an index to train is not named as if it existed (trial AF)
    assert Gallery.open(tmp_path / "g").index_info()["image"]["in_use"] is None
    assert g.search("image", x[:2], k=1, space_id=SPACE_A).ids == [["i0"], ["i1"]]
    for info in (g.index_info()["image"], Gallery.open(tmp_path / "g").index_info()["image"]):
        assert info["in_use"] == "Flat" and "40 rows cannot train 'IVF64,Flat' yet" in info["waiting"], info
        assert "failed" not in info["waiting"]  # (faiss' C++ assertion text is left out)


@pytest.mark.parametrize("spec", ["Flat", "flat", "HNSW16", "hnsw:M=16,ef=32", "IVF16,Flat:nprobe=16"])
def test_a_masks_search_parameters_are_made_once_and_follow_a_new_mask(spec):
    """A snapshot's searches pass one mask object: its faiss parameters (bitmap, selector) are made
    for the first search and reused; another mask (a later snapshot) gets its own, and every answer
    is the exact one over the allowed rows."""
    rng = np.random.default_rng(3)
    x = l2_normalise(rng.standard_normal((600, DIM)).astype(np.float32))
    idx = make_index(spec, DIM)
    idx.add(x)
    for keep in (2, 5):
        mask = np.zeros(len(x), bool)
        mask[::keep] = True
        for q in (x[1:2], x[7:8], x[:4]):
            scores, pos = idx.search(q, 5, mask=mask)
            assert (pos % keep == 0).all()
            best = np.sort(q @ x[mask].T, axis=1)[:, ::-1][:, :5]
            assert np.allclose(scores[:, 0], best[:, 0], atol=1e-5)
            if "IVF" not in spec:  # IVF makes its own parameters (nprobe) per search
                made = idx._last_params
                assert made is not None and made[0] is idx._last_mask[2]
                scores2, pos2 = idx.search(q, 5, mask=mask)
                assert idx._last_params is made and np.array_equal(pos, pos2)


_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), st.text(max_size=12))
_MANIFESTS = st.recursive(_JSON_LEAF, lambda kids: st.lists(kids, max_size=4) |
                          st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=25)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _MANIFESTS, max_size=5))
def test_a_manifest_is_written_as_json_dumps_wrote_it(manifest):
    """The manifest writer (orjson) writes what ``json.dumps(indent=2, sort_keys=True)`` wrote for
    ASCII text, and for any text the same document; its copy is deep and equal."""
    import json as std_json

    from nobackfill.gallery.manifest import _copy_manifest, _write_manifest

    with tempfile.TemporaryDirectory() as d:
        _write_manifest(Path(d), manifest)
        data = (Path(d) / "manifest.json").read_bytes()
    assert std_json.loads(data) == manifest
    if "\\u" not in std_json.dumps(manifest):  # nothing json escapes as \\uXXXX (non-ASCII, control characters)
        assert data == std_json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    copy = _copy_manifest(manifest)
    assert copy == manifest
    for key, value in manifest.items():
        if isinstance(value, (dict, list)):
            assert copy[key] is not value


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([np.float16, np.float32, np.float64]), st.sampled_from([(1, 8), (3, 5), (4,), (2, 3, 6)]),
       st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]), st.integers(0, 2**16))
def test_l2_normalise_is_numpys_norm_bit_for_bit(dtype, shape, scale, seed):
    """The query path's normalisation is ``x / max(norm(x), eps)`` as ``np.linalg.norm`` computes
    it, to the last bit, for every float width (including squares that overflow or underflow)."""
    with np.errstate(all="ignore"):
        x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)
        want = (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(np.float32)
        got = l2_normalise(x)
    assert got.dtype == np.float32 and np.array_equal(got, want, equal_nan=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=0, max_size=40),
       st.integers(1, 4))
def test_all_finite_agrees_with_isfinite(values, rows):
    """The sum-of-squares shortcut says what ``isfinite(x).all()`` says, for NaN, inf and finite
    values whose squares overflow alike."""
    from nobackfill.gallery.chunks import all_finite

    x = np.array(values * rows, np.float32).reshape(rows, -1) if values else np.zeros((rows, 0), np.float32)
    assert all_finite(x) == bool(np.isfinite(x).all())
    assert all_finite(np.full((2, 3), 3e38, np.float32))  # squares overflow: settled entry by entry


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_search_refuses_queries_that_are_not_finite(gallery: Gallery, bad):
    gallery.add("text", ["a", "b"], unit_rows(2), space_id=SPACE_A)
    q = unit_rows(3, seed=1)
    q[1, 2] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        gallery.search("text", q, k=1, space_id=SPACE_A)
    with pytest.raises(ValueError, match="NaN or infinite"):
        gallery.search("text", q[1:2], k=1, space_id=SPACE_A)


@pytest.mark.parametrize("queries", [1, 3])
def test_scores_past_one_by_rounding_are_clipped_at_both_ends(gallery: Gallery, queries):
    """Scores of unit vectors lie in [-1, 1]: a query a hair longer than unit length scores its own
    row above 1 and its opposite below -1; both are clipped, for one query and for several."""
    v = unit_rows(1)[0]
    gallery.add("text", ["same", "opposite"], np.stack([v, -v]), space_id=SPACE_A)
    q = np.repeat((v * np.float32(1.0001))[None], queries, axis=0)
    res = gallery.search("text", q, k=2, space_id=SPACE_A)
    assert res.ids == [["same", "opposite"]] * queries
    assert (res.scores[:, 0] == 1.0).all() and (res.scores[:, 1] == -1.0).all()
    inside = gallery.search("text", unit_rows(1, seed=5), k=2, space_id=SPACE_A).scores
    assert (np.abs(inside) < 1.0).all()  # nothing to clip: left as computed
    # only the last score past -1: the top one is well inside
    other = Gallery.create(gallery.path.parent / "g2", space_id=SPACE_A, dim=DIM, model="models/fake-a")
    w = l2_normalise(v + unit_rows(1, seed=9)[0])
    other.add("text", ["near", "opposite"], np.stack([w, -v]), space_id=SPACE_A)
    res = other.search("text", q, k=2, space_id=SPACE_A)
    assert res.ids == [["near", "opposite"]] * queries
    assert (res.scores[:, 0] < 1.0).all() and (res.scores[:, 1] == -1.0).all()
