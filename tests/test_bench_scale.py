"""``nobackfill bench scale`` at a tiny N through the CLI: the JSON shape the issue asks for, and the
invariants its numbers must keep (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from nobackfill.bench.scale import make_vectors
from nobackfill.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_make_vectors_are_unit_clustered_and_reproducible():
    a = make_vectors(500, 16, 8, 0.05, seed=3)
    assert a.shape == (500, 16) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    assert np.array_equal(a, make_vectors(500, 16, 8, 0.05, seed=3))
    assert not np.array_equal(a, make_vectors(500, 16, 8, 0.05, seed=4))
    # clustered: a row's nearest other row is far closer than a random pair
    sims = a @ a.T
    np.fill_diagonal(sims, -1)
    assert np.median(sims.max(axis=1)) > 0.9 > np.median(sims)


def test_bench_scale_writes_the_rows(tmp_path):
    out = tmp_path / "scale.json"
    r = CliRunner().invoke(app, ["bench", "scale", "--sizes", "3000", "--indexes", "Flat", "--model",
                                 str(ROOT / "models" / "world-new"), "--work", str(tmp_path / "work"),
                                 "--set", "cli=false", "--set", "backfill_seconds=2", "--set", "n_queries=30",
                                 "--set", "backfill_rate=500", "--set", "peers=[]", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert out.with_suffix(".md").is_file()
    (row,) = res["rows"]
    assert row["n"] == 3000 and row["vectors"] == "faiss:Flat" and row["catalog"] == "sqlite"
    for key in ("add_per_s", "open_s", "open_first_search_s", "disk_ratio", "p50_ms", "p99_ms", "raw_p50_ms",
                "filtered_p50_ms", "p50_upgraded_idle_ms", "p50_during_backfill_ms", "p50_backfilled_idle_ms"):
        assert isinstance(row[key], (int, float)) and row[key] > 0, key
    assert row["open_s"] <= row["open_first_search_s"]
    assert row["p50_ms"] <= row["p99_ms"]
    assert row["disk_ratio"] >= 1.0  # the vectors are stored
    assert row["searches_during_backfill"] > 0
    assert res["peers"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scale.json", "scale.md", "work"]  # nothing elsewhere
    assert not list((tmp_path / "work").glob("bridge-*"))  # the row's upgrade is removed with it


def test_the_model_only_floor_loads_the_model_and_names_a_model_it_cannot_load(tmp_path):
    """``model_only_s``: a cold process that loads the collection's model and embeds the query; a model
    it cannot load fails the row, named, instead of timing a crash."""
    import pytest

    from nobackfill.bench.scale import _model_only_seconds
    from nobackfill.search.models import model_ref

    assert _model_only_seconds(model_ref(ROOT / "models" / "world-new")) > 0
    with pytest.raises(RuntimeError, match="loading .*nowhere"):
        _model_only_seconds(str(tmp_path / "nowhere"))
