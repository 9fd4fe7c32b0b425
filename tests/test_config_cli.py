"""Every train / upgrade / bench command builds its config one way: defaults or preset, then
``--config FILE``, then its own flags, then ``--set key=value`` (``cli._common.resolve_config``)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from nobackfill.cli import app

runner = CliRunner()

#: commands with no config dataclass behind them, each with the reason (none today)
NO_CONFIG: dict[str, str] = {}


def _commands() -> dict[str, object]:
    root = get_command(app)
    out = {}
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            for sub, c in cmd.commands.items():
                out[f"{name} {sub}"] = c
        else:
            out[name] = cmd
    return out


def test_every_train_upgrade_bench_command_takes_config_and_set():
    cmds = _commands()
    wanted = [n for n in cmds if n.split()[0] in ("bench", "upgrade") or n.split()[-1] in ("train", "learn")
              or n.startswith("train")]
    missing = []
    for name in wanted:
        opts = {o for p in cmds[name].params for o in getattr(p, "opts", [])}
        if not {"--config", "--set", "--show-config"} <= opts and name not in NO_CONFIG:
            missing.append(name)
    assert not missing, f"commands without --config/--set/--show-config: {missing}"
    assert set(NO_CONFIG) <= set(cmds), "NO_CONFIG names a command that does not exist"


@pytest.mark.parametrize("args, key, value", [
    (["bench", "xbt", "--quick", "--set", "stage2.lr=3e-4"], ("stage2", "loop", "lr"), 3e-4),
    (["bench", "backfill", "--quick", "--set", "orders=['random']"], ("orders",), ["random"]),
    (["bench", "serve", "--set", "concurrency=3"], ("concurrency",), 3),
    (["bench", "reco", "--set", "steps=5"], ("steps",), 5),
    (["train-text", "--steps", "9", "--set", "model.hidden=48"], ("model", "hidden"), 48),
    (["reco", "train", "--memory", "m", "--out", "o", "--steps", "8", "--set", "lr=2e-3"], ("loop", "lr"), 2e-3),
    (["compat", "train", "--method", "bct", "--lr", "0.01", "--set", "options.influence_weight=0.5"],
     ("options", "influence_weight"), 0.5),
    (["compat", "train", "--method", "bct", "--backbone", "pixels"], ("data", "backbone"), "pixels"),
    (["late", "train", "--out", "o", "--kind", "kd", "--set", "kd.reg_weight=0.3"], ("kd", "reg_weight"), 0.3),
    (["late", "train", "--out", "o", "--no-swap-twins"], ("swap_twins",), False),
    (["lingual", "learn", "--model", "m", "--data", "d", "--out", "o", "--set", "lora_rank=4"], ("lora_rank",), 4),
    (["train", "--preset", "world-old", "--data", "d", "--out", "o", "--steps", "9"], ("train", "steps"), 9),
    (["train", "--preset", "world-old", "--data", "d", "--out", "o", "--set", "model.text_layers=1"],
     ("model", "text_layers"), 1),
    (["bench", "encode", "--n-texts", "64", "--set", "repeats=1"], ("repeats",), 1),
    (["bench", "encode", "--no-minilm"], ("minilm",), False),
    (["bench", "world", "--n", "30", "--set", "workers=1"], ("workers",), 1),
    (["upgrade", "procrustes", "--old", "a", "--new", "b", "--text-corpus", "c", "--out", "o", "--set",
      "corpus_size=500"], ("corpus_size",), 500),
    (["lingual", "learn", "--model", "m", "--data", "d", "--out", "o", "--no-teir"], ("teir",), False),
    (["lingual", "learn", "--model", "m", "--data", "d", "--out", "o"], ("teir",), True),
    (["lingual", "learn", "--model", "m", "--data", "d", "--out", "o", "--steps", "7", "--set", "lr=0.5"],
     ("steps",), 7),
])
def test_show_config_applies_set_last(args, key, value):
    r = runner.invoke(app, args + ["--show-config"])
    assert r.exit_code == 0, r.output
    node = json.loads(r.stdout)
    for k in key:
        node = node[k]
    assert node == value


def test_config_file_then_flag_then_set(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("[train]\nsteps = 50\nlr = 1e-3\n[model]\nlayers = 2\n")
    r = runner.invoke(app, ["train-text", "--config", str(f), "--lr", "5e-3", "--set", "train.steps=60", "--show-config"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout)
    assert (cfg["train"]["steps"], cfg["train"]["lr"], cfg["model"]["layers"]) == (60, 5e-3, 2)


@pytest.mark.parametrize("args, needle", [
    (["bench", "routes", "--set", "nope=1"], "nope"),
    (["bench", "store", "--set", "n=lots"], "'n'"),
    (["upgrade", "xbt-text", "--out", "x", "--set", "xbt.steps=0"], "steps must be positive"),
])
def test_bad_set_exits_2_naming_the_field(args, needle, tmp_path):
    r = runner.invoke(app, args + ["--show-config"])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_bad_config_file_names_the_file(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text("[stage2\n")
    r = runner.invoke(app, ["bench", "xbt", "--config", str(f), "--show-config"])
    assert r.exit_code == 2 and "broken.toml" in r.output
