"""The upgrade commands end to end on tiny world models: upgrade xbt / procrustes, search and
eval with --bridge, eval compat, and the XBT benchmark (in-process, tiny budgets)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import tiny_preset
from nobackfill.cli import app
from nobackfill.config import updated

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat_cli")
    r = invoke("world", "--out", root / "world", "--n-train", 40, "--n-val", 10, "--n-test", 20, "--workers", 1,
               "--langs", "en")
    assert r.exit_code == 0, r.output
    for name, dim in (("world-old", 16), ("world-new", 32), ("world-newer", 24)):
        preset = root / f"{name}.toml"
        preset.write_text(tiny_preset(dim=dim, steps=2))
        r = invoke("train", "--preset", preset, "--data", root / "world", "--out", root / "models" / name)
        assert r.exit_code == 0, r.output
    r = invoke("index", "--model", root / "models" / "world-old", "--data", root / "world", "--out", root / "g")
    assert r.exit_code == 0, r.output
    r = invoke("upgrade", "xbt", "--old", root / "models" / "world-old", "--new", root / "models" / "world-new",
               "--text-corpus", root / "world", "--pairs", root / "world", "--out", root / "up", "--n-pairs", 32,
               "--corpus-size", 200, "--stage1-steps", 3, "--steps", 2, "--batch-size", 16)
    assert r.exit_code == 0, r.output
    return root


def test_upgrade_directory(setup):
    man = json.loads((setup / "up" / "upgrade.json").read_text())
    old = json.loads((setup / "models" / "world-old" / "nobackfill.json").read_text())
    assert man["kind"] == "xbt" and man["target"]["space_id"] == old["space_id"]
    assert man["recipe"]["command"].startswith("nobackfill upgrade xbt")
    assert json.loads((setup / "up" / "stage1" / "upgrade.json").read_text())["kind"] == "phi"


def test_upgrade_xbt_config_file_and_set(setup, tmp_path):
    """--config FILE.toml then --set (last wins); the recipe records both; --show-config prints the
    effective config; a bad key exits 2 naming it."""
    cfg = tmp_path / "my.toml"
    cfg.write_text("n_pairs = 24\n[stage1]\ncorpus_size = 150\nsteps = 2\n[stage2]\nsteps = 3\nbatch_size = 8\n"
                   "lr = 5e-4\n")
    base = ("upgrade", "xbt", "--old", setup / "models" / "world-old", "--new", setup / "models" / "world-new",
            "--text-corpus", setup / "world", "--pairs", setup / "world", "--config", cfg)
    r = invoke(*base, "--out", tmp_path / "x", "--set", "stage2.lr=1e-4", "--show-config")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert shown["n_pairs"] == 24 and shown["stage2"]["loop"]["lr"] == 1e-4 and shown["stage2"]["loop"]["steps"] == 3
    assert not (tmp_path / "x").exists()  # --show-config trains nothing
    r = invoke(*base, "--out", tmp_path / "up", "--set", "stage2.lr=1e-4", "--set", "stage2.loop.steps=2")
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "up" / "upgrade.json").read_text())
    rec = man["recipe"]
    assert rec["n_pairs"] == 24 and rec["config"]["loop"]["lr"] == 1e-4 and rec["config"]["loop"]["steps"] == 2
    assert rec["config"]["batch_size"] == 8 and "--config" in rec["command"] and "--set stage2.lr=1e-4" in rec["command"]
    r = invoke(*base, "--out", tmp_path / "bad", "--set", "stage2.learning_rate=1")
    assert r.exit_code == 2 and "learning_rate" in r.output and not (tmp_path / "bad").exists()


def test_a_run_killed_in_stage_2_reuses_its_finished_stage_1(setup, tmp_path):
    """A rerun into the folder of a run killed in stage 2 (only ``stage1/`` left) takes the finished phi
    as it is (byte for byte) when the models, captions and stage-1 settings are the same; with other
    stage-1 settings it trains stage 1 again."""
    import shutil

    out = tmp_path / "up"
    shutil.copytree(setup / "up" / "stage1", out / "stage1")  # what a run killed in stage 2 leaves
    phi = (out / "stage1" / "phi.safetensors").read_bytes()
    base = ("upgrade", "xbt", "--old", setup / "models" / "world-old", "--new", setup / "models" / "world-new",
            "--text-corpus", setup / "world", "--pairs", setup / "world", "--out", out, "--n-pairs", 32,
            "--corpus-size", 200, "--steps", 2, "--batch-size", 16)
    r = invoke(*base, "--stage1-steps", 3, "--threads", 1)  # threads change no result
    assert r.exit_code == 0, r.output
    assert "is reused" in r.output and "phi on" not in r.output
    assert (out / "stage1" / "phi.safetensors").read_bytes() == phi and (out / "upgrade.json").is_file()
    other = tmp_path / "other"
    shutil.copytree(setup / "up" / "stage1", other / "stage1")
    r = invoke(*[other if a == out else a for a in base], "--stage1-steps", 4)
    assert r.exit_code == 0, r.output
    assert "is reused" not in r.output and "phi on" in r.output
    assert json.loads((other / "stage1" / "upgrade.json").read_text())["recipe"]["config"]["loop"]["steps"] == 4


def test_search_through_the_upgrade(setup):
    args = ("search", "--gallery", setup / "g", "--model", setup / "models" / "world-new", "--text", "a red circle")
    r = invoke(*args)
    assert r.exit_code == 2 and "space" in r.output.lower()  # refused without a bridge
    r = invoke(*args, "--bridge", setup / "up", "--k", 3, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["hits"]) == 3
    img = setup / "world" / "test" / "images" / "000001.png"
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-new", "--image", img,
               "--bridge", setup / "up", "--json")
    assert r.exit_code == 0, r.output


def test_eval_compat_and_retrieval_with_bridge(setup):
    out = setup / "compat.json"
    r = invoke("eval", "compat", "--old", setup / "models" / "world-old", "--new", setup / "models" / "world-new",
               "--bridge", setup / "up", "--data", setup / "world", "--json", out, "--n-unpaired", 200)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["onoff_max_abs_diff"] == 0.0
    assert set(res["rows"]) == {"old_old", "new_new", "new_old_raw", "upgraded_new_old"}
    assert set(res["criterion"]) == {"w_new/v_old", "v_new/w_old"}
    assert set(res["flips"]) == {"new_new", "upgraded_new_old"}
    for d in ("t2i", "i2t"):
        f = res["flips"]["upgraded_new_old"][d]
        assert 0 <= f["NFR"] <= 1 - res["rows"]["upgraded_new_old"][d]["R@1"] + 1e-9  # a flip is a miss now
        assert f["PFR"] - f["NFR"] == pytest.approx(res["rows"]["upgraded_new_old"][d]["R@1"]
                                                    - res["rows"]["old_old"][d]["R@1"], abs=1e-9)
    r = invoke("eval", "retrieval", "--query-model", setup / "models" / "world-new", "--gallery-model",
               setup / "models" / "world-old", "--data", setup / "world", "--bridge", setup / "up")
    assert r.exit_code == 0, r.output
    assert "note" not in r.output  # same width after the bridge: no raw truncation


def test_procrustes_bridge_and_stage1_reuse(setup):
    r = invoke("upgrade", "procrustes", "--old", setup / "models" / "world-old", "--new",
               setup / "models" / "world-new", "--text-corpus", setup / "world", "--out", setup / "pro",
               "--corpus-size", 100)
    assert r.exit_code == 0, r.output
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-new", "--text", "a circle",
               "--bridge", setup / "pro", "--json")
    assert r.exit_code == 0, r.output
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-newer", "--text", "a circle",
               "--bridge", setup / "pro")
    assert r.exit_code == 2  # a bridge from another space is refused
    r = invoke("upgrade", "xbt", "--old", setup / "models" / "world-old", "--new", setup / "models" / "world-new",
               "--text-corpus", setup / "world", "--pairs", setup / "world", "--out", setup / "up2",
               "--stage1", setup / "up" / "stage1", "--n-pairs", 16, "--steps", 1, "--batch-size", 8)
    assert r.exit_code == 0, r.output


def test_bench_xbt_tiny(setup):
    from nobackfill.bench.xbt import XBTBenchConfig, run_xbt_bench
    from nobackfill.bench.xbt_report import format_xbt_tables
    from nobackfill.compat.xbt import Stage1Config, XBTConfig

    cfg = XBTBenchConfig(seeds=1, n_eval=12, n_pairs=24, sweep=(16, 24), corpus_size=120,
                         stage1=updated(Stage1Config(), steps=2, batch_size=32), stage2=updated(XBTConfig(), steps=1, batch_size=8),
                         threads=1, isolate=False, n_unpaired=100, work=setup / "bench" / "xbt-work")
    res = run_xbt_bench(setup / "models", setup / "world", setup / "bench" / "xbt.json", cfg, log=lambda m: None)
    saved = json.loads((setup / "bench" / "xbt.json").read_text())
    for row in ("old_old", "new_new", "new_old_raw", "phi_text_only", "xbt", "direct_full", "direct_lora",
                "direct_base", "procrustes", "slerp"):
        assert set(saved["rows"][row]) >= {"t2i", "i2t"} and "R@1" in saved["rows"][row]["t2i"]
    assert saved["onoff_max_abs_diff"] == 0.0
    assert saved["cost"]["xbt stage 2"]["old_model_loaded"] is False
    assert saved["cost"]["direct base"]["old_model_loaded"] is True
    assert {"xbt@16", "direct_base@16", "xbt@24", "direct_base@24"} <= set(saved["sweep"])
    m = saved["matrix"]["t2i"]["strict"]
    assert len(m["C"]) == 3 and m["C"][0][1] is None and 0 <= m["AC"] <= 1
    assert "XBT" in format_xbt_tables(res) and (setup / "bench" / "xbt.html").is_file()
