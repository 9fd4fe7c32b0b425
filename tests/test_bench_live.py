"""The live-upgrade benchmarks on a small world with the shipped models: ``bench routes`` (world part)
and ``bench backfill`` through the CLI, their JSON shapes and the invariants the numbers must keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    r = invoke("world", "--out", root / "world", "--n-train", 40, "--n-val", 30, "--n-test", 40, "--workers", 1,
               "--langs", "en")
    assert r.exit_code == 0, r.output
    return root


def test_bench_routes_world(world):
    out = world / "routes.json"
    r = invoke("bench", "routes", "--parts", "world", "--world", world / "world", "--models", ROOT / "models",
               "--work", world / "routes-work", "--json", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    for d in ("t2i", "i2t"):
        rows = res["world"][d]
        assert set(rows) == {"old_old", "bridge", "fused", "new_new"}
        assert all(0 <= rows[k]["R@1"] <= rows[k]["R@5"] <= rows[k]["R@10"] <= 1 for k in rows)
        assert set(res["merge"]["world"]["test_partly_backfilled"][d]) == {"raw", "calibrated", "rank"}
        assert set(res["nfr"]["world"][d]) == {"bridge", "fused", "new_new"}
    assert res["merge"]["world"]["default"] in ("raw", "calibrated", "rank")
    assert out.with_suffix(".md").read_text().startswith("| row |")


def test_bench_backfill_curves_end_at_new_new(world):
    out = world / "backfill.json"
    r = invoke("bench", "backfill", "--world", world / "world", "--models", ROOT / "models", "--orders",
               "random,uncertainty", "--cost-sizes", "100", "--work", world / "bf-work", "--json", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["default"] in res["curves"]
    for key, cur in res["curves"].items():
        for d in ("t2i", "i2t"):
            pts = cur[d]
            assert [p["fraction"] for p in pts][0] == 0.0 and pts[-1]["fraction"] == 1.0
            assert pts[-1]["R@1"] == res["new_new"][d]["R@1"]  # fully backfilled: the new model alone
            assert cur["no_regret"][d]["ends_at_new_new"] is True
            assert 0 <= cur["auc"][d] <= 1
    cost = res["cost"]
    assert cost[0]["n"] == 100 and not cost[0]["extrapolated"] and cost[-1]["extrapolated"]
    for ext in (".md", ".png", ".html"):
        assert out.with_suffix(ext).is_file()
