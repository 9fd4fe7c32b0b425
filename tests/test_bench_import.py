"""``nobackfill bench import`` on a tiny world, a fake Multi30K and 2,000 rows through the CLI: the JSON
shape the issue asks for, hits identical to ``add``, no false refusal and no false accept, a milvus-lite
collection adopted in place and left untouched (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from nobackfill.bench.importing import same_hits
from nobackfill.cli import app

from _fake_multi30k import fake_multi30k

ROOT = Path(__file__).resolve().parents[1]


def _hits(*pairs: tuple[str, float]) -> list[SimpleNamespace]:
    return [SimpleNamespace(id=i, score=s) for i, s in pairs]


def test_same_hits_allows_only_equal_scores_to_trade_places():
    a = _hits(("a", 0.9), ("b", 0.5), ("c", 0.5))
    assert same_hits(a, _hits(("a", 0.9), ("b", 0.5), ("c", 0.5)), k=3) == (True, False, 0.0)
    assert same_hits(a, _hits(("a", 0.9), ("c", 0.5), ("b", 0.5)), k=3)[:2] == (True, True)
    assert same_hits(a, _hits(("a", 0.9), ("b", 0.5), ("d", 0.5)), k=3)[:2] == (True, True)  # a cut tie at k
    assert not same_hits(a, _hits(("a", 0.9), ("b", 0.5), ("d", 0.5)), k=5)[0]  # not cut: another item
    assert not same_hits(a, _hits(("b", 0.9), ("a", 0.5), ("c", 0.5)), k=3)[0]
    assert not same_hits(a, _hits(("a", 0.9), ("b", 0.5), ("c", 0.49)), k=3)[0]  # score off by 0.01


def test_bench_import_writes_the_issue_json(tmp_path):
    out = tmp_path / "import.json"
    m30k = fake_multi30k(tmp_path / "m30k", n_train=4, n_val=12)
    r = CliRunner().invoke(app, ["bench", "import", "--sizes", "2000", "--models", str(ROOT / "models"),
                                 "--data", str(m30k), "--work", str(tmp_path / "work"), "--out", str(out),
                                 "--set", "world_test=12", "--set", "trials=20", "--set", "samples=8",
                                 "--set", "minilm_captions=60", "--set", "milvus_queries=5"])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert out.with_suffix(".md").is_file()
    ident = res["identical"]
    assert ident["t2i"] is True and ident["i2t"] is True and ident["t2t"] is True
    assert 0 <= ident["max_score_diff"] <= 1e-6
    assert ident["details"]["world"]["items_imported"] == 12 + 24  # 12 images, 2 English captions each
    assert ident["details"]["t2t"]["queries"] == 60
    (row,) = res["throughput"]
    assert row["n"] == 2000
    for key in ("rows_per_s", "peak_rss_mb", "vector_mb", "rss_over_vectors_mb"):
        assert isinstance(row[key], (int, float)), key
    assert row["rows_per_s"] > 0 and row["peak_rss_mb"] > row["vector_mb"] > 0 and row["python_loop_s"] > 0
    assert row["cpu_s"] > 0 and row["worker_cpu_s"] >= 0  # 2000 rows: no worker
    assert "| Python loop s |" in out.with_suffix(".md").read_text()
    # the commands end to end (world-new is 128-d: the rows' width), the graph index apart
    assert row["model"] == "world-new" and row["command_import_s"] > 0 and row["index_build_s"] > 0
    assert row["command_import_peak_rss_mb"] > 0 and row["index_build_peak_rss_mb"] > 0
    assert row["graph_missing_after_import"] is False and row["graph_in_use_after_index"] is True  # 2000 < 50k
    assert "| `collection import` s |" in out.with_suffix(".md").read_text()
    mc = res["model_check"]
    assert mc["right"]["trials"] >= 20 and mc["right"]["refused"] == 0
    assert mc["wrong"]["trials"] >= 100 and mc["wrong"]["accepted"] == 0
    cases = mc["wrong"]["by_case"]
    assert cases["world-new as world-old"]["refused_by_width"] == 20
    assert cases["MiniLM as m30k-old-text"]["refused_by_width"] == 20
    for name in mc["equal_width_wrong_cases"]:  # refused on the cosines, not on the width
        assert cases[name]["trials"] == 20 and cases[name]["refused_by_width"] == 0
        assert cases[name]["median_cosine"]["max"] < 0.99
    assert all(c["trials"] == 20 and c["refused"] == 0 for c in mc["right"]["by_case"].values())
    mil = res["milvus_in_place"]  # the user's collection: adopted, upgraded, backfilled, retired, untouched
    assert mil["adopted"] is True and mil["storage"] == "milvus-lite", mil
    assert mil["rows_before"] == mil["rows_after"] == 12
    assert mil["checksum_equal"] is True and all(mil["checksum_equal_after"].values())
    assert mil["backfilled"] is True and mil["searches_ok"] is True and mil["user_collection_kept"] is True
    assert set(mil["search_upgraded"]["routes"]) == {"bridge"} and set(mil["search_retired"]["routes"]) == {"native"}
    assert "Milvus in place (milvus-lite)" in out.with_suffix(".md").read_text()
    assert not list((tmp_path / "work").glob("rows-*"))  # the throughput rows are removed
