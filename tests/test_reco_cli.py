"""RECO end to end on tiny inputs: the CLI (build-memory, train, search --reco, eval retrieval --reco),
the guarantee that the encoder's weights and a stored gallery are unchanged, and a tiny bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _compat_helpers import tiny_encoder
from nobackfill.bench.reco import RecoBenchConfig, run_reco_bench, tree_hashes
from nobackfill.cli import app
from nobackfill.data.world import WorldSpec, generate_world

runner = CliRunner()


def invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("reco-cli")
    world = root / "world"
    generate_world(world, WorldSpec(n_train=40, n_val=8, n_test=8, langs=("en",)), workers=1, progress=False)
    model = root / "model"
    tiny_encoder(dim=16).save(model)
    gallery = root / "gallery"
    invoke("index", "--model", model, "--data", world, "--split", "test", "--out", gallery)
    before = {"model": tree_hashes(model), "gallery": tree_hashes(gallery)}
    mem, reco = root / "mem", root / "reco"
    r = invoke("reco", "build-memory", "--model", model, "--data", world, "--out", mem,
               "--exclude", world / "test", "--exclude", world / "val")
    invoke("reco", "train", "--memory", mem, "--out", reco, "--k", 3, "--steps", 4, "--batch-size", 8,
           "--val", world, "--model", model)
    return {"root": root, "world": world, "model": model, "gallery": gallery, "mem": mem, "reco": reco,
            "before": before, "build_output": r.output}


def test_build_memory_reports_removals(setup):
    info = json.loads((setup["mem"] / "memory.json").read_text())
    rem = info["removal"]
    assert rem["source_images"] == 40 and rem["kept_images"] == 40 - rem["test_items"] - rem["near_duplicates"]
    assert "near-duplicate" in setup["build_output"].replace("\n", " ")
    r = runner.invoke(app, ["reco", "build-memory", "--model", str(setup["model"]), "--data", str(setup["world"]),
                            "--out", str(setup["mem"])])
    assert r.exit_code == 2 and "holds a finished memory already (memory.json)" in r.output.replace("\n", " ")


def test_build_memory_takes_a_new_folder_or_its_own_killed_build_only(setup, tmp_path):
    """trial Y: it wrote memory.json and gallery/ into a model's folder, or one holding the user's notes."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    args = ["reco", "build-memory", "--model", str(setup["model"]), "--data", str(setup["world"]), "--split", "val"]
    for out, said in ((notes, "holds files already (notes.txt)"), (setup["model"], "is the model this command starts")):
        before = tree_hashes(out)
        r = runner.invoke(app, [*args, "--out", str(out)])
        assert r.exit_code == 2 and said in r.output.replace("\n", " "), r.output
        assert tree_hashes(out) == before  # nothing written, not even a lock
    mem = tmp_path / "mem"
    invoke(*args, "--out", mem)
    (mem / "memory.json").unlink()  # as a build killed after its gallery was embedded
    r = runner.invoke(app, [*args, "--out", str(mem)])
    assert r.exit_code == 0 and (mem / "memory.json").is_file(), r.output


def test_reco_dir_and_search(setup):
    info = json.loads((setup["reco"] / "reco.json").read_text())
    assert info["k"] == 3 and info["search"] == "uni" and info["fuse"] == "cross"
    r = invoke("search", "--gallery", setup["gallery"], "--model", setup["model"], "--reco", setup["reco"],
               "--text", "a small red circle on the left", "--k", 3, "--json")
    hits = json.loads(r.stdout)["hits"]
    assert len(hits) == 3
    img = sorted((setup["world"] / "test" / "images").iterdir())[0]
    r = invoke("search", "--gallery", setup["gallery"], "--model", setup["model"], "--reco", setup["reco"],
               "--image", img, "--k", 2, "--json")
    assert json.loads(r.stdout)["modality"] == "text"


def test_train_on_other_pairs(setup, tmp_path):
    r = invoke("reco", "train", "--memory", setup["mem"], "--out", tmp_path / "r2", "--k", 2, "--steps", 2,
               "--batch-size", 8, "--pairs", setup["world"], "--model", setup["model"])
    assert (tmp_path / "r2" / "reco.json").is_file() and "2 steps" in r.output.replace("\n", " ")
    r = runner.invoke(app, ["reco", "train", "--memory", str(setup["mem"]), "--out", str(tmp_path / "r3"),
                            "--pairs", str(setup["world"])])
    assert r.exit_code == 2 and "--model" in r.output


def test_eval_retrieval_with_reco(setup, tmp_path):
    out = tmp_path / "e.json"
    invoke("eval", "retrieval", "--query-model", setup["model"], "--gallery-model", setup["model"],
           "--data", setup["world"], "--reco", setup["reco"], "--json", out)
    res = json.loads(out.read_text())
    assert res["reco"] == str(setup["reco"]) and 0 <= res["t2i"]["R@1"] <= 1


def test_reco_refuses_other_space(setup, tmp_path):
    other = tmp_path / "other"
    tiny_encoder(dim=16, seed=1).save(other)
    r = runner.invoke(app, ["search", "--gallery", str(setup["gallery"]), "--model", str(other), "--reco",
                            str(setup["reco"]), "--text", "a red circle"])
    assert r.exit_code == 2


def test_encoder_and_gallery_unchanged_by_reco(setup):
    # every RECO command above ran after the hashes were taken (build-memory, train, search, eval)
    test_reco_dir_and_search(setup)
    assert tree_hashes(setup["model"]) == setup["before"]["model"]
    after = tree_hashes(setup["gallery"])
    # the gallery may gain a cached search index (derived data); every committed file is identical
    assert {k: v for k, v in after.items() if k in setup["before"]["gallery"]} == setup["before"]["gallery"]
    assert set(after) - set(setup["before"]["gallery"]) <= {"index-image.faiss", "index-image.json",
                                                             "index-text.faiss", "index-text.json"}
    assert tree_hashes(setup["gallery"], stored_only=True) == {
        k: v for k, v in setup["before"]["gallery"].items() if not k.startswith("index-") and k != ".lock"}


def test_bench_reco_tiny(setup, tmp_path):
    cfg = RecoBenchConfig(model=str(setup["model"]), world=str(setup["world"]), memory_size=40, k=None,
                          k_sweep=(1, 2), steps=3, batch_size=8, eval_every=3, cache=str(tmp_path / "cache"),
                          latency_queries=3, calibration_scenes=4)
    res = run_reco_bench(tmp_path / "reco.json", cfg, log=lambda m: None)
    assert set(res["zero_shot"]) == {"base", "reco", "cross_modal_search", "unimodal_fusion", "mean_fusion"}
    assert set(res["k_sweep"]) == {"1", "2"} and "reco_queries_only" in res["retrieval"]
    assert isinstance(res["memory_removed_near_duplicates"], int)
    assert res["unchanged"] == {"encoder_weights": True, "memory_gallery": True}
    sel = res["k_selected_on_val"]
    assert sel["k"] in (1, 2) and sel["val_score"] == max(r["val"]["score"] for r in res["k_sweep"].values())
    # k=None: the main row IS the sweep's val-chosen k, and the ablations are trained at that k
    assert res["label_set"]["k"] == sel["k"] and res["label_set"]["k_chosen_on_val"]
    assert res["zero_shot"]["reco"] == res["k_sweep"][str(sel["k"])]["zero_shot"]
    assert res["rows"]["mean_fusion"]["train"]["config"]["k"] == sel["k"]
    # the main (done-when) label set is size x colour x texture; the others are reported beside it
    assert res["label_set"]["name"] == "size_colour_texture" and res["label_set"]["classes"] == 64
    assert res["label_set"]["prompts_per_class"] == 8 and res["classes"] == 64
    assert set(res["zero_shot_by_label_set"]) == {"size_colour_texture", "size_colour_shape", "colour_shape"}
    assert res["zero_shot_by_label_set"]["size_colour_texture"]["reco"]["all"] == res["zero_shot"]["reco"]
    assert set(res["summary"]["zero_shot_gain_points_by_label_set"]) == set(res["zero_shot_by_label_set"])
    pr = res["premise"]
    attrs = {"size", "colour", "shape", "texture", "background"}
    assert set(pr["image_neighbours"]) == attrs | {"fine"} and set(pr["prompt_neighbours"]) == {"size", "colour",
                                                                                               "texture", "fine"}
    assert 0 <= pr["knn_vote"]["fine"]["all"] <= 1 and pr["chance"]["fine"] == 1 / 64 and pr["chance"]["shape"] == 1 / 8
    assert all(0 <= pr["linear_probe"][a]["all"] <= 1 for a in attrs | {"fine"})
    assert pr["base_zero_shot"]["background"] is None and pr["base_zero_shot"]["fine"] == res["rows"]["base"]["val"]["zero_shot"]
    for ls, za in res["zero_shot_attributes"].items():
        # an exact hit has every attribute right: no attribute can be rarer than the class accuracy
        assert min(za["base"]["all"].values()) >= res["zero_shot_by_label_set"][ls]["base"]["all"] - 1e-9
    assert (tmp_path / "reco.md").read_text().startswith("# RECO benchmark")


def test_bench_reco_rejects_unknown_label_set(tmp_path):
    r = runner.invoke(app, ["bench", "reco", "--label-set", "size_shape", "--json", str(tmp_path / "r.json")])
    assert r.exit_code != 0 and "size_colour_texture" in r.output and not (tmp_path / "r.json").exists()


def _shown_config(args: list[str]) -> dict:
    return json.loads(invoke(*args, "--show-config").stdout)


def test_train_prints_effective_values_and_records_a_rerunnable_command(setup, tmp_path):
    """The summary line has no None and ``recipe.command`` reruns to the same config (trial F #4)."""
    import shlex

    out = tmp_path / "r4"
    args = ["reco", "train", "--memory", str(setup["mem"]), "--out", str(out), "--steps", "3", "--batch-size", "8",
            "--val", str(setup["world"]), "--model", str(setup["model"]), "--set", "loop.weight_decay=0.1",
            "--set", "loop.eval_every=2"]
    r = invoke(*args)
    line = r.output.replace("\n", " ")
    assert "None" not in line and "k=10, uni search, cross fusion, transformer" in line
    command = json.loads((out / "reco.json").read_text())["recipe"]["command"]
    assert "None" not in command
    rerun = shlex.split(command)
    assert rerun[:3] == ["nobackfill", "reco", "train"]
    for opt in ("--val", "--model", "--batch-size", "--steps", "--k"):
        assert opt in rerun
    assert _shown_config(rerun[1:]) == _shown_config(args)
    r = runner.invoke(app, rerun[1:] + ["--out", str(tmp_path / "r5")])  # it really runs (the last --out wins)
    assert r.exit_code == 0, r.output


def test_a_reco_model_finds_its_memory_from_anywhere_and_is_not_overwritten(setup, tmp_path, monkeypatch):
    """trial R: a RECO model trained with a relative --memory failed from any other working
    directory, and a second `reco train` into its folder replaced it silently."""
    import shutil

    from nobackfill.reco.model import RecoModel

    monkeypatch.chdir(setup["root"])
    invoke("reco", "train", "--memory", "mem", "--out", tmp_path / "rel", "--k", 2, "--steps", 2, "--batch-size", 8)
    info = json.loads((tmp_path / "rel" / "reco.json").read_text())
    assert Path(info["memory"]).is_absolute() and Path(info["memory"]) == setup["mem"].resolve()
    monkeypatch.chdir(tmp_path)
    assert RecoModel.load(tmp_path / "rel").spec.memory == str(setup["mem"].resolve())
    moved = tmp_path / "moved"  # the memory and the model moved together: found beside it
    moved.mkdir()
    shutil.copytree(setup["mem"], moved / "mem")
    shutil.copytree(tmp_path / "rel", moved / "models" / "rel")
    info["memory"], info["memory_from_here"] = str(tmp_path / "nowhere"), "../../mem"
    (moved / "models" / "rel" / "reco.json").write_text(json.dumps(info))
    assert RecoModel.load(moved / "models" / "rel").spec.memory == str((moved / "mem").resolve())
    before = (tmp_path / "rel" / "reco.json").read_bytes()
    r = runner.invoke(app, ["reco", "train", "--memory", str(setup["mem"]), "--out", str(tmp_path / "rel"),
                            "--steps", "1", "--batch-size", "8"])
    assert r.exit_code == 2 and "holds a finished RECO model already" in " ".join(r.output.split())
    assert (tmp_path / "rel" / "reco.json").read_bytes() == before
