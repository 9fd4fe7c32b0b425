"""Tests for nobackfill.bench.encode: structure and equivalence of the encoding benchmark
(timings are not asserted: the CPU is shared)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch
from PIL import Image

from nobackfill.bench.encode import run_encode_bench
from nobackfill.bench.encode_report import format_encode_table, write_report
from nobackfill.bench.encode import PlainCLIP, bench_images, bench_texts
from nobackfill.data.world import WorldSpec, world_corpus
from nobackfill.encoders import create_model, load_encoder
from nobackfill.encoders.tokenizer import train_bpe_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = train_bpe_tokenizer(world_corpus(WorldSpec(), 500), 300, 40)
    d = tmp_path_factory.mktemp("bench") / "tiny"
    create_model("world-old", tok).save(d)
    return d


@pytest.fixture(scope="module")
def result(tiny_dir):
    return run_encode_bench({"tiny": tiny_dir}, n_images=32, n_texts=64, batch_size=16, threads=1)


def test_inputs():
    ims = bench_images(3)
    assert all(isinstance(i, Image.Image) and i.size == (64, 64) and i.mode == "RGB" for i in ims)
    assert bench_texts(5) == world_corpus(WorldSpec(), 5)


def test_structure_and_equivalence(result, tiny_dir):
    assert result["device"] == "cpu" and result["threads"] == 1
    assert set(result["models"]) == {"tiny"}
    r = result["models"]["tiny"]
    for path in ("ours", "plain_transformers"):
        for key in ("images_per_s", "texts_per_s"):
            assert np.isfinite(r[path][key]) and r[path][key] > 0
        assert len(r[path]["images_runs_s"]) == 3 and len(r[path]["texts_runs_s"]) == 3
    assert r["max_abs_diff_images"] < 1e-4
    assert r["max_abs_diff_texts"] < 1e-4
    assert r["max_abs_diff_pixels"] < 1e-5  # our 64x64 preprocessing == CLIPImageProcessor's
    assert r["space_id"] == load_encoder(tiny_dir).space_id
    m = result["minilm"]
    assert m["name"] == "all-MiniLM-L6-v2" and m["embed_dim"] == 384
    for path in ("ours", "plain_transformers"):
        assert np.isfinite(m[path]["texts_per_s"]) and m[path]["texts_per_s"] > 0
    assert m["max_abs_diff_texts"] < 1e-4
    assert torch.get_num_threads() == 1  # restored


def test_plain_loop_matches_ours_directly(tiny_dir):
    ours, plain = load_encoder(tiny_dir), PlainCLIP(tiny_dir)
    ims, texts = bench_images(5, seed=1), bench_texts(7, seed=1)
    np.testing.assert_allclose(ours.encode_images(ims, batch_size=2), plain.encode_images(ims, 2), atol=1e-5)
    np.testing.assert_allclose(ours.encode_texts(texts, batch_size=3), plain.encode_texts(texts, 3), atol=1e-5)


def test_table_and_report(result, tmp_path):
    table = format_encode_table(result)
    assert "| tiny | images |" in table and "| tiny | texts |" in table
    assert "all-MiniLM-L6-v2" in table and "speed-up" in table
    paths = write_report(result, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["models"]["tiny"]["ours"]["images_per_s"] > 0
    assert paths["md"].read_text().endswith(table)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["encode.json", "encode.md"]


def test_skip_minilm_and_validation(tiny_dir):
    r = run_encode_bench({"tiny": tiny_dir}, n_images=2, n_texts=3, batch_size=2, threads=1,
                         minilm=None, repeats=1)
    assert r["minilm"] is None and "all-MiniLM" not in format_encode_table(r)
    with pytest.raises(ValueError):
        run_encode_bench({"tiny": tiny_dir}, n_images=0, minilm=None)


def test_bench_world_writes_json_and_a_table(tmp_path):
    from typer.testing import CliRunner

    from nobackfill.cli import app

    out = tmp_path / "world.json"
    r = CliRunner().invoke(app, ["bench", "world", "--n", "12", "--workers", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["n_items"] == 12 and res["n_captions"] == 12 * 2 * len(res["languages"])
    md = out.with_suffix(".md").read_text()
    assert "items/s" in md and f"| 12 | {res['n_captions']} |" in md
