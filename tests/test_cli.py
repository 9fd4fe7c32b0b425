"""End-to-end through the public CLI: world -> train -> index -> search -> eval -> demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

from conftest import tiny_preset



runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    r = invoke("world", "--out", root / "world", "--n-train", 40, "--n-val", 20, "--n-test", 30, "--workers", 1)
    assert r.exit_code == 0, r.output
    for name, dim in (("world-old", 32), ("world-new", 48)):
        preset = root / f"{name}.toml"
        preset.write_text(tiny_preset(dim=dim, steps=6))
        r = invoke("train", "--preset", preset, "--data", root / "world", "--out", root / "models" / name)
        assert r.exit_code == 0, r.output
    r = invoke("index", "--model", root / "models" / "world-old", "--data", root / "world", "--out", root / "g")
    assert r.exit_code == 0, r.output
    return root


def test_world_layout(setup):
    world = setup / "world"
    assert (world / "world.json").is_file()
    for split, n in (("train", 40), ("val", 20), ("test", 30)):
        assert len(list((world / split / "images").glob("*.png"))) == n


def test_train_writes_recipe_and_model(setup):
    recipe = json.loads((setup / "models" / "world-old" / "recipe.json").read_text())
    assert recipe["command"].startswith("nobackfill train")
    assert recipe["loop"]["steps"] == 6
    assert (setup / "models" / "world-old" / "model.safetensors").is_file()


def test_train_takes_config_and_set_and_records_them(setup, tmp_path):
    preset = setup / "world-old.toml"
    extra = tmp_path / "more.toml"
    extra.write_text("[train]\nsteps = 3\n")
    out = tmp_path / "m"
    r = invoke("train", "--preset", preset, "--data", setup / "world", "--out", out, "--config", extra,
               "--set", "train.batch_size=8", "--set", "train.lr=2e-3")
    assert r.exit_code == 0, r.output
    recipe = json.loads((out / "recipe.json").read_text())
    assert (recipe["loop"]["steps"], recipe["train"]["batch_size"], recipe["loop"]["lr"]) == (3, 8, 2e-3)
    assert f"--config {extra}" in recipe["command"] and "--set train.batch_size=8" in recipe["command"]


def test_search_text_and_image_json(setup):
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-old",
               "--text", "a red circle", "--k", 3, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["modality"] == "image" and len(out["hits"]) == 3
    assert [h["rank"] for h in out["hits"]] == [1, 2, 3]
    img = setup / "world" / "test" / "images" / "000001.png"
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-old", "--image", img, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["modality"] == "text"


def test_search_from_other_space_is_refused(setup):
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-new", "--text", "a red circle")
    assert r.exit_code == 2
    assert "space" in r.output.lower()


def test_search_needs_exactly_one_query(setup):
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-old")
    assert r.exit_code == 2


def test_index_is_resumable_without_duplicates(setup):
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", setup / "world", "--out", setup / "g")
    assert r.exit_code == 0, r.output
    from nobackfill.index import Gallery

    g = Gallery.open(setup / "g")
    assert g.count("image") == 30
    assert len(set(g.ids("text"))) == g.count("text") == 30 * 2 * 7  # 2 captions per image and language


def test_eval_retrieval_json(setup, tmp_path):
    out = tmp_path / "e.json"
    r = invoke("eval", "retrieval", "--query-model", setup / "models" / "world-new", "--gallery-model",
               setup / "models" / "world-old", "--data", setup / "world", "--json", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert set(res["t2i"]) >= {"R@1", "R@5", "R@10", "median_rank", "mAP"}
    assert res["n_images"] == 30 and "note" in res  # different widths: the raw comparison


def test_bad_data_folder_error_names_the_file(setup, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "captions.jsonl").write_text('{"image": "images/x.png", "caption": "a", "lang": "en"}\n{oops\n')
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", bad, "--out", tmp_path / "g2")
    assert r.exit_code == 2
    assert "captions.jsonl" in r.output and "line" in r.output


def test_error_paths_stay_whole_and_literal_on_a_narrow_terminal(setup, tmp_path, monkeypatch):
    """Errors are never wrapped (CI's terminal is 80 columns) and "[...]" in a path is not rich markup."""
    from nobackfill.cli import _common

    monkeypatch.setattr(_common.console, "_width", 30)
    bad = tmp_path / "a_rather_long_folder_name_[v2]_that_will_not_fit_in_thirty_columns"
    bad.mkdir()
    (bad / "captions.jsonl").write_text('{oops\n')
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", bad, "--out", tmp_path / "g3")
    assert r.exit_code == 2
    assert str(bad / "captions.jsonl") in r.output


def test_demo_json_keys(setup, tmp_path):
    out = tmp_path / "demo.json"
    r = invoke("demo", "--world", setup / "world", "--models", setup / "models", "--out", tmp_path / "demo",
               "--json", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    for key in ("old_old", "new_new", "new_old_raw"):
        for d in ("t2i", "i2t"):
            assert set(res[key][d]) >= {"R@1", "R@5", "R@10"}
            assert 0.0 <= res[key][d]["R@1"] <= 1.0
    assert res["n_images"] == 30
    assert (tmp_path / "demo" / "report.html").read_text().count("<img") == 1


def test_importing_the_cli_and_compat_package_loads_no_heavy_library():
    """Every command starts fast: the CLI and ``nobackfill.compat`` (lazy exports) import no torch,
    transformers or peft until a command needs them; a lazy name still resolves on first use."""
    import subprocess
    import sys

    code = ("import sys, nobackfill.cli, nobackfill.compat as c\n"
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))\n"
            "print(c.Projection.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "nobackfill.compat.phi"
