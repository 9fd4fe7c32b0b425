"""The shared config path refuses at ``--show-config`` what the run refuses (``resolve_config``'s
``check``), a broken YAML config is one error line with its place, and ``lingual eval`` / ``learn``
/ ``bench lingual-lambda`` say what they did: the evaluated languages (by default those the model
learned that the data has), R@1 in percent, nothing to learn, the lambda table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import typer
from typer.testing import CliRunner

from _cli_helpers import error_line, tiny_en_de_world
from _compat_helpers import tiny_encoder
from _fake_multi30k import caption, fake_multi30k, write_gz
from test_lingual import tiny_bert

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _app():
    from nobackfill.cli import app

    return app


_error_line = error_line


# ----------------------------------------------------------------------------- --show-config checks
@dataclass
class _Cfg:
    name: str = "a"
    n: int = 1


def test_resolve_config_runs_the_check_before_showing(capsys):
    from nobackfill.cli._common import resolve_config

    def check(cfg: _Cfg) -> None:
        if cfg.name not in ("a", "b"):
            raise ValueError(f"name must be a or b, got {cfg.name!r}")

    assert resolve_config(_Cfg, None, None, ["name='b'"], check=check).name == "b"
    for show in (False, True):  # the run and --show-config refuse alike, with one line
        with pytest.raises(typer.Exit) as e:
            resolve_config(_Cfg, None, None, None, flags={"name": "bogus"}, show=show, check=check)
        assert e.value.exit_code == 2
        err = capsys.readouterr()
        assert err.out == "" and err.err.strip() == "error: name must be a or b, got 'bogus'"
    with pytest.raises(typer.Exit) as e:
        resolve_config(_Cfg, None, None, ["n=2"], show=True, check=check)
    assert e.value.exit_code == 0 and json.loads(capsys.readouterr().out) == {"name": "a", "n": 2}


@pytest.mark.parametrize("args, needle", [
    (["bench", "lingual-text", "--methods", "cll_clip,bogus"], "unknown lingual method 'bogus'"),
    (["bench", "lingual-world", "--set", "methods=['cll_clip', 'nope_teir']"], "unknown lingual method 'nope_teir'"),
    (["bench", "lingual-world", "--methods", "cll_clip", "--set", "eval_split='train'"], "eval split must be"),
    (["bench", "compat-steps", "--methods", "bogus"], "unknown method(s) ['bogus']"),
    (["bench", "encode", "--set", "repeats=0"], "must be >= 1"),
    (["lingual", "learn", "--model", "m", "--data", "d", "--out", "o", "--method", "bogus"], "method must be one of"),
    (["late", "train", "--out", "o", "--kind", "bogus"], "kind must be one of"),
    (["reco", "train", "--memory", "m", "--out", "o", "--search", "bogus"], "search must be in"),
    (["reco", "train", "--memory", "m", "--out", "o", "--set", "fusion='bogus'"], "fusion kind must be one of"),
    (["compat", "train", "--method", "bogus"], "unknown compatibility-learning method 'bogus'"),
    (["compat", "train", "--method", "bct", "--option", "bogus=1"], "unknown option(s) ['bogus']"),
])
def test_show_config_refuses_what_the_run_refuses(args, needle, monkeypatch):
    from nobackfill.bench import host

    monkeypatch.setattr(host, "pin_cpu_code_path", lambda: False)  # the test process's torch stays as it is
    shown = _error_line(runner.invoke(_app(), args + ["--show-config"]))
    assert needle in shown
    if args[:2] in (["bench", "lingual-text"], ["bench", "lingual-world"]):
        # the run refuses with the same line, before any data is read (there is none here)
        assert _error_line(runner.invoke(_app(), args + ["--data", "/nonexistent/data"])) == shown


def test_show_config_still_shows_a_good_bench_config(monkeypatch):
    from nobackfill.bench import host

    monkeypatch.setattr(host, "pin_cpu_code_path", lambda: False)
    r = runner.invoke(_app(), ["bench", "lingual-world", "--methods", "cll_clip_teir_used,dualprompt_teir",
                               "--show-config"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["methods"] == ["cll_clip_teir_used", "dualprompt_teir"]


@dataclass
class _Lit:
    mode: Literal["uni", "cross"] = "uni"


def test_a_literal_field_takes_only_its_values():
    from nobackfill.config import ConfigError, build_config

    assert build_config(_Lit, sets=["mode='cross'"]).mode == "cross"
    with pytest.raises(ConfigError, match=r"--set: field 'mode': expected one of \['uni', 'cross'\], got 'bogus'"):
        build_config(_Lit, sets=["mode='bogus'"])


# ----------------------------------------------------------------------------- a broken YAML file
@pytest.mark.parametrize("text, where", [
    ("n: 3\nlr: [1, 2\nfoo: bar: baz\n", "at line 3, column 4; while parsing a flow sequence from line 2, column 5"),
    ("a: b: c\n", "mapping values are not allowed here (at line 1, column 5)"),
    ('x: "unterminated\n', "found unexpected end of stream (at line 2, column 1;"),
])
def test_a_broken_yaml_config_is_one_line_naming_file_line_and_column(tmp_path, text, where):
    from nobackfill.config import ConfigError, read_mapping

    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_mapping(f)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{f}: cannot parse: ") and where in str(e.value)
    line = _error_line(runner.invoke(_app(), ["bench", "world", "--config", str(f), "--show-config"]))
    assert "bad.yaml: cannot parse: " in line and where in line


def test_a_broken_toml_config_stays_one_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[stage2\n")
    line = _error_line(runner.invoke(_app(), ["bench", "world", "--config", str(f), "--show-config"]))
    assert "bad.toml: cannot parse: " in line and "line 1" in line


# ----------------------------------------------------------------------------- lingual learn / eval
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny en+de world, a tiny CLIP (English only) and that CLIP after learning de."""
    from nobackfill.data.world import WorldSpec, generate_world

    d = tmp_path_factory.mktemp("world")
    data = tiny_en_de_world(d)
    fr = generate_world(d / "fr", WorldSpec(seed=4, n_train=0, n_val=0, n_test=6, langs=("en", "fr")),
                        workers=1, progress=False)
    model = tiny_encoder().save(d / "tiny-clip")
    learned = d / "tiny-de"
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,de", "--data", str(data),
                               "--out", str(learned), "--steps", "2", "--batch-size", "8", "--vocab-size", "400",
                               "--cache-dir", str(d / "cache")])
    assert r.exit_code == 0, r.output
    return data, fr, model, learned, d / "cache"


def test_learn_refuses_when_there_is_nothing_to_learn(world, tmp_path):
    data, _, model, learned, cache = world
    for start, tasks, says in ((learned, "en,de", "nothing to learn: the model already has en, de"),
                               (learned, "de", "nothing to learn: the model already has de (it has en, de)"),
                               (model, "en", "nothing to learn: the model already has en")):
        out = tmp_path / f"again-{start.name}-{tasks}"
        r = runner.invoke(_app(), ["lingual", "learn", "--model", str(start), "--tasks", tasks, "--data", str(data),
                                   "--out", str(out), "--steps", "1", "--cache-dir", str(cache)])
        assert _error_line(r) == f"error: {says}"
        assert not out.exists()  # nothing written


def test_eval_defaults_to_the_learned_languages_the_data_has(world, tmp_path):
    data, fr, model, learned, cache = world
    j = tmp_path / "eval.json"
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(learned), "--data", str(data), "--limit", "4",
                               "--cache-dir", str(cache), "--out", str(j)])
    assert r.exit_code == 0, r.output
    assert "languages: en, de (learned by the model, with captions in the data" in r.output
    res = json.loads(j.read_text())
    assert res["langs"] == ["en", "de"] and set(res["t2i"]) == {"en", "de"} and res["limit"] == 4
    for d in ("t2i", "i2t"):  # the JSON keeps fractions; the table shows percent, as eval retrieval
        for lang, v in res[d].items():
            assert 0.0 <= v <= 1.0
            assert f"{100 * v:.1f}" in r.stdout
    assert "R@1" in r.stdout and '"t2i"' not in r.stdout
    # a data set without the model's German: every language of the data, and the missing one named
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(learned), "--data", str(fr), "--cache-dir",
                               str(cache), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["langs"] == ["en", "fr"] and json.loads(r.stdout)["limit"] is None
    assert "the model's de not in the data" in r.output
    # an English-only model: every language of the data
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(model), "--data", str(data), "--cache-dir",
                               str(cache), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["langs"] == ["en", "de"] and "learned none besides English" in r.output


def test_eval_refuses_a_language_the_data_lacks(world):
    data, _, _, learned, cache = world
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(learned), "--data", str(data), "--langs", "de,cs",
                               "--cache-dir", str(cache)])
    assert "the data has no cs captions in split test (it has en, de)" in _error_line(r)


def test_eval_on_multi30k_defaults_to_the_foreign_languages(tmp_path):
    root = fake_multi30k(tmp_path / "m30k", n_train=8, n_val=4)
    ev = root / "evaldir"
    for lang in ("en", "de", "fr"):
        write_gz(ev / f"test_2016_flickr.{lang}.gz", [f"{lang} {caption(i, 2)}" for i in range(6)])
    write_gz(ev / "test_2016_flickr.1.en.gz", ["not a task-1 language file"] * 6)
    model = tiny_bert().save(tmp_path / "tiny-bert")
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(model), "--data", str(root), "--eval-dir", str(ev),
                               "--limit", "5", "--cache-dir", str(tmp_path / "cache"), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["langs"] == ["de", "fr"] and set(res["R@1"]) == {"de", "fr"} and res["limit"] == 5
    for langs in ("en", "en,de"):  # English is the gallery here: refused, not an empty table (trial O)
        r = runner.invoke(_app(), ["lingual", "eval", "--model", str(model), "--data", str(root), "--eval-dir",
                                   str(ev), "--limit", "5", "--cache-dir", str(tmp_path / "cache"), "--langs", langs])
        assert r.exit_code == 2 and "English is not evaluated here" in _error_line(r), r.output


# ----------------------------------------------------------------------------- bench lingual-lambda
def test_bench_lingual_lambda_prints_its_table(tmp_path, monkeypatch):
    """The rows' table on stdout (and beside the JSON), the JSON itself unchanged; ``--json``
    prints the rows instead. The benchmark itself is replaced by the committed rows."""
    from nobackfill.bench import lingual_lambda

    committed = ROOT / "benchmarks" / "results" / "lingual_lambda_world.json"
    rows = json.loads(committed.read_text())
    seen = []
    monkeypatch.setattr(lingual_lambda, "lambda_usage", lambda cfg: seen.append(cfg) or rows)
    out = tmp_path / "ll.json"
    r = runner.invoke(_app(), ["bench", "lingual-lambda", "--langs", "de,fr", "--train-images", "500",
                               "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert seen[0].langs == ("de", "fr") and seen[0].train_images == 500
    de, v = rows[0], rows[0]["vocab"]  # the committed first row, as the table prints it
    assert de["lang"] == "de" and (f"| de | {de['new_rows']} | {100 * v['share_lambda_0']:.1f} / "
                                   f"{100 * v['share_overlap']:.1f} / {100 * v['share_lambda_1']:.1f} | "
                                   f"{v['mean_lambda']:.3f} |") in r.stdout and "| zh | 741 |" in r.stdout
    assert out.read_text() == committed.read_text()  # the JSON format is the committed one
    assert out.with_suffix(".md").read_text().strip() == lingual_lambda.format_markdown(rows).strip()
    r = runner.invoke(_app(), ["bench", "lingual-lambda", "--out", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == rows
