"""Trial Y's small rough edges: ``search`` says what refined or re-ranked its hits (RECO, CMLI); an adapter
config whose lora_targets the model lacks is refused before anything trains, naming the field; a run whose
steps all fall in the warm-up is warned about at its start; a path given as --preset that is no file, a data
folder that does not exist, and the compat-steps report without a flip-reduction method are said plainly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _compat_helpers import tiny_encoder
from conftest import tiny_preset
from nobackfill.cli import app
from nobackfill.data.world import WorldSpec, generate_world

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r


def flat(text: str) -> str:
    """``text`` with rich's table borders and line breaks gone (words wrapped in a help box joined)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("trialY")
    generate_world(root / "world", WorldSpec(n_train=40, n_val=8, n_test=8, langs=("en",)), workers=1,
                   progress=False)
    tiny_encoder(dim=16).save(root / "model")
    return root


# ----------------------------------------------------------------------------- A: search says what was applied
@pytest.fixture(scope="module")
def searchable(world):
    root = world
    ok("index", "--model", root / "model", "--data", root / "world", "--split", "test", "--out", root / "g",
       "--tokens", "float16")
    ok("reco", "build-memory", "--model", root / "model", "--data", root / "world", "--out", root / "mem",
       "--exclude", root / "world" / "test", "--exclude", root / "world" / "val")
    ok("reco", "train", "--memory", root / "mem", "--out", root / "reco", "--k", 3, "--steps", 2, "--batch-size", 8,
       "--model", root / "model")
    return root


def _search(root, *extra):
    return ("search", "--gallery", root / "g", "--model", root / "model", "--text", "a red circle", "--k", 2, *extra)


def test_search_json_names_reco_and_rerank_and_route_stays_the_route(searchable):
    root = searchable
    plain = json.loads(ok(*_search(root, "--json")).stdout)
    assert plain["applied"] == [] and {h["route"] for h in plain["hits"]} == {"native"}
    res = json.loads(ok(*_search(root, "--reco", root / "reco", "--rerank", "cmli", "--rerank-k", 5,
                                 "--json")).stdout)
    space = res["hits"][0]["space"]
    assert [a["step"] for a in res["applied"]] == ["reco", "rerank"]
    reco, rerank = res["applied"]
    assert reco["label"] == "reco(reco)" and reco["spaces"] == [space]
    assert rerank["label"] == "rerank(cmli, top 5, weight 1)" and rerank["rerank_k"] == 5 and rerank["spaces"] == [space]
    assert {h["route"] for h in res["hits"]} == {"native"}  # the route keeps meaning how the query reached the space
    inf = json.loads(ok(*_search(root, "--rerank", "cmli-sym", "--rerank-weight", "inf", "--json")).stdout)
    assert inf["applied"][0]["label"] == "rerank(cmli-sym, top 100, weight inf)" and inf["applied"][0]["weight"] == "inf"


def test_search_table_says_what_was_applied(searchable):
    root = searchable
    assert "applied" not in ok(*_search(root)).stdout
    out = flat(ok(*_search(root, "--reco", root / "reco")).stdout)
    assert "applied: +reco(reco)" in out and "rerank" not in out
    out = flat(ok(*_search(root, "--rerank", "cmli")).stdout)
    assert "applied: +rerank(cmli, top 100, weight 1)" in out and "reco(" not in out


def test_applied_names_only_the_spaces_a_step_served():
    """A refiner of another space refines nothing of this search: not said; a step serving some of the
    shown hits' spaces names them."""
    from types import SimpleNamespace

    from nobackfill.cli.gallery import applied_line
    from nobackfill.search.routes import QuerySide

    enc = SimpleNamespace(space_id="s1")

    def refine(v, m, s):
        return v

    refine.space_id = "s1"
    assert QuerySide("s1", "native", direct=enc, refine=refine).refined()
    refine.space_id = "s2"
    assert not QuerySide("s1", "native", direct=enc, refine=refine).refined()
    assert not QuerySide("s1", "native", direct=enc).refined()
    hits = [SimpleNamespace(space="s1"), SimpleNamespace(space="s2")]
    r = SimpleNamespace(hits=hits, applied=[{"step": "rerank", "label": "rerank(cmli, top 9, weight 1)",
                                             "spaces": ["s1"]}])
    assert applied_line(r, {"s1": "new"}) == "\napplied: +rerank(cmli, top 9, weight 1) in space new"
    assert applied_line(SimpleNamespace(hits=hits)) == ""  # a response without the field (another client's)


# ----------------------------------------------------------------------------- B: lora_targets checked first
def test_check_adapter_config_names_field_bad_names_and_what_exists():
    from nobackfill.compat.adapters import AdapterConfig, check_adapter_config, lora_target_names

    model = tiny_encoder(dim=16).model
    assert sorted(lora_target_names(model, AdapterConfig())) == ["k_proj", "out_proj", "q_proj", "v_proj"]
    check_adapter_config(model, AdapterConfig())
    with pytest.raises(ValueError) as e:  # one bad name among good ones is refused too (peft skipped it)
        check_adapter_config(model, AdapterConfig(lora_targets=("q_proj", "q_prj", "fc9")), "stage2.adapters")
    msg = str(e.value)
    assert msg.startswith("stage2.adapters.lora_targets: 'q_prj', 'fc9' are not a module") and "\n" not in msg
    assert "it has: " in msg and all(n in msg.split("it has: ")[1] for n in ("q_proj", "k_proj", "v_proj", "out_proj"))
    with pytest.raises(ValueError, match=r"^adapters\.architecture: 'bert', but CLIPModel is a 'clip' model"):
        check_adapter_config(model, AdapterConfig(architecture="bert"))
    check_adapter_config(model, AdapterConfig(lora_towers=(), lora_targets=("nothing",)))  # no LoRA: no targets


def test_upgrade_xbt_refuses_bad_lora_targets_before_stage1(world, tmp_path):
    tiny_encoder(dim=32, seed=1).save(tmp_path / "new")
    cfg = tmp_path / "x.yaml"
    cfg.write_text("stage2:\n  adapters:\n    lora_targets: [q_prj]\n")
    r = invoke("upgrade", "xbt", "--old", world / "model", "--new", tmp_path / "new", "--text-corpus", world / "world",
               "--pairs", world / "world", "--out", tmp_path / "up", "--config", cfg, "--n-pairs", 8)
    assert r.exit_code == 2, r.output
    line = flat(r.output)
    assert "stage2.adapters.lora_targets: 'q_prj' is not a module" in line and "q_proj" in line
    assert "stage 1" not in r.output and not (tmp_path / "up" / "stage1").exists()


# ----------------------------------------------------------------------------- C: all steps in the warm-up
def test_warmup_warnings_name_the_key_and_the_lengths():
    from nobackfill.compat.text_upgrade import TextXBTUpgradeConfig
    from nobackfill.compat.xbt import XBTUpgradeConfig
    from nobackfill.config import updated, warmup_warnings
    from nobackfill.encoders.zoo import Preset, RecipeSpec
    from nobackfill.train.loop import LoopConfig

    (line,) = warmup_warnings(Preset(name="p", train=RecipeSpec(steps=40, warmup=100, lr=2e-3)))
    assert line.startswith("train.warmup is 100 steps and the run is 40: every step is in the warm-up")
    assert "never reaches its peak 0.002 and never decays" in line and "--set train.warmup=N" in line
    (line,) = warmup_warnings(Preset(name="p", train=RecipeSpec(steps=100, warmup=100)))
    assert "reaches its peak 0.001 at the last step only" in line
    assert warmup_warnings(Preset(name="p", train=RecipeSpec(steps=101, warmup=100))) == []
    assert warmup_warnings(LoopConfig(steps=5, warmup=0)) == []
    cfg = updated(XBTUpgradeConfig(), stage1={"loop": {"steps": 10}}, stage2={"loop": {"steps": 20}})
    assert [w.split(" is ")[0] for w in warmup_warnings(cfg)] == ["stage1.loop.warmup", "stage2.loop.warmup"]
    text = updated(TextXBTUpgradeConfig(), xbt={"loop": {"steps": 3}})  # a constant schedule: no decay to miss
    (line,) = warmup_warnings(text)
    assert line.startswith("xbt.loop.warmup is 5 steps") and "decays" not in line
    seq = LoopConfig(steps=10, warmup=20)  # compat train: its sequence's loop, named by its own key
    assert warmup_warnings(seq, "sequence")[0].startswith("sequence.warmup is 20 steps and the run is 10")


def test_train_warns_at_the_start_when_every_step_is_warm_up(world, tmp_path):
    preset = tmp_path / "tiny.toml"
    preset.write_text(tiny_preset(dim=16, steps=3).replace("warmup = 2", "warmup = 50"))
    r = ok("train", "--preset", preset, "--data", world / "world", "--out", tmp_path / "m", "--no-stream")
    lines = [ln for ln in r.output.splitlines() if "warm-up" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: train.warmup is 50 steps and the run is 3")
    assert r.output.index("warning: train.warmup") < r.output.index("trained ")


# ----------------------------------------------------------------------------- D: wording
def test_preset_path_that_is_no_file_is_said_so(tmp_path):
    from nobackfill.config import ConfigError
    from nobackfill.encoders import list_presets
    from nobackfill.encoders.zoo import get_preset

    zoo = ", ".join(list_presets())
    for name in ("/nope.toml", "nope.yaml", "presets/x"):
        with pytest.raises(ConfigError, match=rf"^preset {re.escape(name)}: no such file .*zoo presets: {zoo}\)$"):
            get_preset(name)
    with pytest.raises(ConfigError, match="is a folder, not a preset file"):
        get_preset(str(tmp_path) + "/")
    with pytest.raises(ConfigError, match=rf"^unknown preset 'nope'; zoo presets: {zoo}$"):
        get_preset("nope")
    r = invoke("train", "--preset", "/nope.toml", "--data", tmp_path, "--out", tmp_path / "m")
    assert r.exit_code == 2 and "preset /nope.toml: no such file" in flat(r.output)


def test_train_help_lists_the_zoo():
    from nobackfill.encoders import list_presets

    out = flat(ok("train", "--help").stdout)
    assert "world-tiny" in list_presets()
    assert f"Zoo preset name ({', '.join(list_presets())}) or TOML path." in out


def test_missing_data_folder_is_no_such_folder(world, tmp_path):
    gone = tmp_path / "gone"
    for args in (("train", "--preset", "world-tiny", "--data", gone, "--out", tmp_path / "m"),
                 ("index", "--model", world / "model", "--data", gone, "--out", tmp_path / "g"),
                 ("eval", "retrieval", "--query-model", world / "model", "--gallery-model", world / "model",
                  "--data", gone)):
        r = invoke(*args)
        assert r.exit_code == 2 and f"{gone}: no such folder" in flat(r.output), (args, r.output)
    (tmp_path / "afile").write_text("x")
    r = invoke("train", "--preset", "world-tiny", "--data", tmp_path / "afile", "--out", tmp_path / "m")
    assert r.exit_code == 2 and "afile: a file, not a data folder" in flat(r.output)
    from nobackfill.compat.data import read_text_corpus

    with pytest.raises(FileNotFoundError, match="gone: no such file or folder"):
        read_text_corpus(gone)


def _compat_result(methods):
    flips = {"classification": {"NFR": 0.1, "rel_NFR": 0.5}, "retrieval": {"NFR": 0.2}}
    row = {"AC": 0.5, "AA": 0.6, "ACA": 0.55, "C": [[0.6, None], [0.5, 0.6]]}
    result = {"config": {"steps": [2], "methods": methods, "sequence": {"metric": "search"}},
              "T2": {m: row for m in methods}, "nfr": {"T2": {m: flips for m in methods}}}
    from nobackfill.bench.compat_steps import nfr_reductions

    result["nfr_reduction"] = nfr_reductions(result)
    return result


def test_compat_steps_report_omits_an_empty_reduction_section(tmp_path):
    from nobackfill.bench.compat_steps import format_compat_steps, write_compat_steps_outputs

    res = _compat_result(["baseline", "bct", "cores"])
    md = format_compat_steps(res)
    assert "Relative NFR reduction" not in md and "## Negative flips" in md
    paths = write_compat_steps_outputs(res, tmp_path / "r.json")
    assert "Relative NFR reduction" not in paths["html"].read_text()
    md = format_compat_steps(_compat_result(["baseline", "fd-kl"]))
    assert "## Relative NFR reduction against the baseline (mean over T)\n\n- fd-kl: 0.0%" in md
    md = format_compat_steps(_compat_result(["fd-kl"]))
    assert "- fd-kl: -%\n- (the baseline is not among the methods" in md
