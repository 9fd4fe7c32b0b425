"""The ``make bench`` steps that were scripts, as ``nobackfill bench`` commands: ``tables`` (the README's
and docs' result blocks), ``lingual-lambda`` (TEIR's lambda per language) and ``merged`` (merged vs
switchable upgrades), on tiny inputs, with the JSON shapes the committed results have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from nobackfill.cli import bench as bench_cli

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(command, *args):
    app = typer.Typer()
    app.command()(command)
    return runner.invoke(app, [str(a) for a in args])


def test_tables_check_refresh_check(tmp_path, monkeypatch):
    import nobackfill.bench.tables as tables

    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.md").write_text("# X bench\n\n## rows\n| a |\n|---|\n| 1 |\n")
    page = "intro\n<!-- results:x -->\nold\n<!-- /results:x -->\nend\n"
    (tmp_path / "README.md").write_text(page)
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    r = invoke(bench_cli.bench_tables, "--check", "--results", tmp_path / "results")
    assert r.exit_code == 1 and "README.md" in r.output
    assert (tmp_path / "README.md").read_text() == page  # --check writes nothing
    r = invoke(bench_cli.bench_tables, "--results", tmp_path / "results")
    assert r.exit_code == 0 and "refreshed 1 table(s)" in r.output
    assert (tmp_path / "README.md").read_text() == \
        "intro\n<!-- results:x -->\n**rows**\n| a |\n|---|\n| 1 |\n<!-- /results:x -->\nend\n"
    assert invoke(bench_cli.bench_tables, "--check", "--results", tmp_path / "results").exit_code == 0
    r = invoke(bench_cli.bench_tables, "--results", tmp_path / "none")
    assert r.exit_code == 2 and "x.md: missing" in r.output


def test_the_committed_tables_are_current():
    assert invoke(bench_cli.bench_tables, "--check").exit_code == 0


def test_lingual_lambda_rows(tmp_path):
    from nobackfill.data.world import WorldSpec, generate_world

    generate_world(tmp_path / "world", WorldSpec(n_train=40, n_val=0, n_test=0, langs=("en", "de", "fr")), workers=1,
                   progress=False)
    out = tmp_path / "lambda.json"
    r = invoke(bench_cli.bench_lingual_lambda, "--data", tmp_path / "world", "--model", ROOT / "models" / "world-new",
               "--langs", "de,fr", "--train-images", 40, "--vocab-size", 300, "--out", out)
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    assert [row["lang"] for row in rows] == ["de", "fr"] and out.read_text().endswith("]\n")
    for row in rows:
        assert row["new_rows"] > 0
        for key in ("vocab", "vocab+used"):
            s = row[key]
            assert set(s) == {"share_lambda_0", "share_overlap", "share_lambda_1", "mean_lambda",
                              "overlap_weighted_mean_lambda"}
            assert s["share_lambda_0"] + s["share_overlap"] + s["share_lambda_1"] == pytest.approx(1, abs=0.002)
    committed = json.loads((ROOT / "benchmarks" / "results" / "lingual_lambda_world.json").read_text())
    assert set(committed[0]) == set(rows[0])


def test_merged_rows(tmp_path):
    from nobackfill.data.world import WorldSpec, generate_world

    if not (ROOT / "upgrades" / "m30k-old-text-to-minilm" / "upgrade.json").is_file():
        pytest.skip("the text upgrade is not shipped")
    generate_world(tmp_path / "world", WorldSpec(n_train=0, n_val=6, n_test=0, langs=("en",)), workers=1,
                   progress=False)
    out = tmp_path / "merged.json"
    r = invoke(bench_cli.bench_merged, "--world", tmp_path / "world", "--models", ROOT / "models", "--upgrades",
               ROOT / "upgrades", "--repeats", 2, "--out", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    committed = json.loads((ROOT / "benchmarks" / "results" / "merged.json").read_text())
    assert set(res) - {"host"} == set(committed) - {"host"} and set(res["rows"]) == set(committed["rows"])
    assert "host" in res  # (a result committed before results named their host has none)
    for row in res["rows"].values():
        assert set(row) == {"unmerged_ms", "merged_ms", "speedup", "max_abs_diff"} and row["max_abs_diff"] < 1e-4
    assert out.with_suffix(".md").read_text().startswith("| upgrade |")


def test_every_benchmark_result_names_its_host(tmp_path):
    """trial Y: an encode speed-up did not reproduce, and its result named the CPU only "x86_64"."""
    from nobackfill.bench.runner import markdown_report, run_bench

    out = tmp_path / "r.json"
    result = run_bench(None, lambda c, log: {"x": 1}, markdown_report(lambda r: "| x |\n"), out=out,
                       log=lambda m: None, echo=lambda m: None)
    host = json.loads(out.read_text())["host"]
    assert result["host"] == host and {"cpu", "torch_cpu_capability", "versions"} <= set(host)
    assert "torch" in host["versions"]
