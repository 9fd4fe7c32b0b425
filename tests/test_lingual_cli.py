"""CLI and bench tests for continual language learning (``nobackfill lingual``, ``bench lingual-*``)
on a tiny fake Multi30K, a tiny world, a tiny BERT and a tiny CLIP."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from _cli_helpers import tiny_en_de_world
from _compat_helpers import tiny_encoder
from _fake_multi30k import caption, fake_multi30k, write_gz
from test_lingual import tiny_bert

runner = CliRunner()


def _app():
    from nobackfill.cli import app

    return app


@pytest.fixture(scope="module")
def m30k(tmp_path_factory):
    root = fake_multi30k(tmp_path_factory.mktemp("m30k"), n_train=32, n_val=12)
    ev = root / "evaldir"
    for lang in ("en", "de"):
        write_gz(ev / f"test_2016_flickr.{lang}.gz", [f"{lang} {caption(i, 2)}" for i in range(10)])
    model = tiny_bert().save(root / "tiny-bert")
    return root, ev, model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    data = tiny_en_de_world(d)
    model = tiny_encoder().save(d / "tiny-clip")
    return data, model


def test_cli_learn_then_eval_on_multi30k(m30k, tmp_path):
    root, ev, model = m30k
    out = tmp_path / "learned"
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,de", "--data", str(root),
                               "--out", str(out), "--steps", "2", "--batch-size", "8", "--vocab-size", "150",
                               "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    state = json.loads((out / "lingual.json").read_text())
    assert state["learned"] == ["en", "de"] and state["config"]["teir"] is True
    from nobackfill.lingual.learner import CLLConfig

    assert state["config"]["lr"] == CLLConfig().lr == 1e-2  # the val-chosen TEIR rate, CLI and library alike
    assert state["history"][0]["new_tokens"] > 0
    j = tmp_path / "eval.json"
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(out), "--data", str(root), "--langs", "de",
                               "--eval-dir", str(ev), "--cache-dir", str(tmp_path / "cache"), "--out", str(j)])
    assert r.exit_code == 0, r.output
    assert "foreign -> English R@1" in r.stdout and '"R@1"' not in r.stdout, r.stdout  # a table; JSON in the file
    res = json.loads(j.read_text())
    assert set(res["R@1"]) == {"de"} and 0.0 <= res["R@1"]["de"] <= 1.0
    # a second call continues from the saved state: nothing left to learn for en,de, so it writes nothing
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(out), "--tasks", "en,de", "--data", str(root),
                               "--out", str(tmp_path / "again"), "--steps", "1", "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 2 and "nothing to learn: the model already has en, de" in r.output, r.output
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("method", ["lora", "prompt", "dualprompt"])
def test_cli_learn_saves_and_reloads_per_language_methods(m30k, tmp_path, method):
    """``lingual learn --method lora`` (and prompt, dualprompt) saves a model that ``lingual eval``
    and :func:`open_learned` reload with the same embeddings."""
    from nobackfill.lingual.adapters import use_language
    from nobackfill.lingual.learner import open_learned

    root, ev, model = m30k
    out = tmp_path / method
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,de", "--data", str(root),
                               "--out", str(out), "--steps", "2", "--batch-size", "8", "--vocab-size", "150",
                               "--method", method, "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    state = json.loads((out / "lingual.json").read_text())
    assert state["method"]["name"] == method and state["learned"] == ["en", "de"]
    j = tmp_path / "eval.json"
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(out), "--data", str(root), "--langs", "de",
                               "--eval-dir", str(ev), "--cache-dir", str(tmp_path / "cache"), "--out", str(j)])
    assert r.exit_code == 0, r.output
    a, _ = open_learned(out)
    b, _ = open_learned(out)
    use_language(a, "de")
    use_language(b, "de")
    np.testing.assert_allclose(a.encode_texts(["ein hund"]), b.encode_texts(["ein hund"]), atol=1e-6)


def test_cli_errors_are_clear(m30k, tmp_path):
    root, _, model = m30k
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,xx", "--data", str(root),
                               "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "train.xx" in r.output
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,de", "--data", str(root),
                               "--out", str(tmp_path / "o"), "--method", "nope"])
    assert r.exit_code == 2 and "method" in r.output


def test_cli_learn_never_writes_over_its_model_or_a_folder_with_files(m30k, tmp_path):
    """--out equal to --model would have replaced the starting model's weights (its recipe left
    describing another model); a folder of models would have got loose model files. Both refused
    before anything is read, the files unchanged."""
    root, _, model = m30k
    before = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    full = tmp_path / "full"
    full.mkdir()
    (full / "other-model").mkdir()
    (tmp_path / "afile").write_text("x")
    for out, says in ((model, "is the model this command starts from"), (full, "holds files already (other-model)"),
                      (tmp_path / "afile", "is a file")):
        r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,de", "--data", str(root),
                                   "--out", str(out), "--steps", "2"])
        assert r.exit_code == 2 and says in " ".join(r.output.split()), r.output
    assert {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()} == before
    assert [p.name for p in full.iterdir()] == ["other-model"]


def test_cli_learn_and_eval_on_world_keeps_images(world, tmp_path):
    from nobackfill.encoders import load_encoder
    from nobackfill.evaluate import load_eval_data

    data, model = world
    out = tmp_path / "w-learned"
    r = runner.invoke(_app(), ["lingual", "learn", "--model", str(model), "--tasks", "en,de", "--data", str(data),
                               "--out", str(out), "--steps", "2", "--batch-size", "8", "--vocab-size", "400",
                               "--teir-tokens", "used", "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "lingual.json").read_text())["config"]["teir_task_tokens"] == "used"
    test = load_eval_data(data, "test", langs=["en"])
    before = load_encoder(model).encode_images(test.image_paths())
    assert np.array_equal(load_encoder(out).encode_images(test.image_paths()), before)
    r = runner.invoke(_app(), ["lingual", "eval", "--model", str(out), "--data", str(data), "--langs", "en,de",
                               "--eta", "0.5", "--cache-dir", str(tmp_path / "cache"), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert set(res["t2i"]) == {"en", "de"} and res["eta"] == 0.5


def test_bench_lingual_text_on_fake_multi30k(m30k, tmp_path):
    from nobackfill.bench.lingual import LingualTextConfig, run_lingual_text, write_outputs
    from nobackfill.lingual.learner import CLLConfig

    root, ev, model = m30k
    cfg = LingualTextConfig(langs=("de",), methods=("cll_clip", "cll_clip_teir", "prompt_teir"), train_lines=16,
                            cll=CLLConfig(steps=2, batch_size=8, task_vocab_size=150, prompt_length=2), teir_lr=5e-3)
    assert (cfg.method_cll("cll_clip").lr, cfg.method_cll("prompt_teir").lr) == (cfg.cll.lr, 5e-3)
    assert cfg.method_cll("prompt_teir").method == "prompt"
    res = run_lingual_text(root, eval_dir=ev, config=cfg, model=model, cache_dir=tmp_path / "c", work_dir=tmp_path / "w")
    assert set(res["methods"]) == {"cll_clip", "cll_clip_teir", "prompt_teir"}
    assert res["config"]["teir_lr"] == 5e-3
    sizes = {name: m["tasks"][0]["vocab_after"] for name, m in res["methods"].items()}
    assert sizes["prompt_teir"] == sizes["cll_clip_teir"] + 2  # two soft-prompt rows
    m = res["methods"]["cll_clip_teir"]
    assert len(m["matrix"]) == 1 and 0.0 <= m["AR"] <= 1.0 and m["F"] == 0.0
    assert len(m["english_R@1"]) == 1 and "english_R@1_before" in res and res["n_eval"] == 10
    assert set(res["teir_gains"]) == {"cll_clip_teir"}  # prompt_teir has no plain twin in this run
    assert res["teir_gains"]["cll_clip_teir"]["AR_gain"] == pytest.approx(m["AR"] - res["methods"]["cll_clip"]["AR"])
    md = write_outputs(res, tmp_path / "out.json")
    assert "cll_clip_teir" in md and json.loads((tmp_path / "out.json").read_text())["methods"]


def test_bench_lingual_world_on_tiny_world(world, tmp_path):
    from nobackfill.bench.lingual import LingualWorldConfig, format_markdown, run_lingual_world
    from nobackfill.lingual.learner import CLLConfig
    from nobackfill.lingual.sequence import method_config

    data, model = world
    cfg = LingualWorldConfig(langs=("de",), methods=("cll_clip_teir", "er"), train_images=12, eval_split="val",
                             translate_test_etas=(0.3, 1.0), teir_lr=5e-3,
                             cll=CLLConfig(steps=2, batch_size=8, task_vocab_size=400, memory_size=4))
    assert (cfg.method_cll("er").lr, cfg.method_cll("cll_clip_teir").lr) == (cfg.cll.lr, 5e-3)
    res = run_lingual_world(data, model=model, config=cfg, cache_dir=tmp_path / "c", work_dir=tmp_path / "w")
    assert res["eval_split"] == "val" and res["n_eval_images"] == 6
    for m in res["methods"].values():
        assert m["image_embeddings_bit_identical"] and m["image_tower_bit_identical"]
        assert len(m["t2i"]["matrix"]) == 1 and len(m["english_t2i"]) == 2
        assert set(m["translate_test"]) == {"0.3", "1"}
        assert len(m["translate_test"]["1"]["i2t"]["matrix"]) == 1
    md = format_markdown(res)
    assert "t2i AR" in md and "translate-test (eta 0.3)" in md and "6 val images" in md
    with pytest.raises(ValueError, match="split"):
        LingualWorldConfig(eval_split="train")
    with pytest.raises(ValueError, match="eta"):
        LingualWorldConfig(translate_test_etas=(0.0,))
    assert method_config("der_teir_oracle", CLLConfig()).oracle_vocab
    grad, upd = method_config("cll_clip_teir_grad", CLLConfig()), method_config("cll_clip_teir_update", CLLConfig())
    assert (grad.teir_scale, upd.teir_scale) == ("grad", "update") and grad.label != upd.label
    reg = method_config("cll_clip_teir_update_reg", CLLConfig())
    assert reg.teir and not reg.teir_init and reg.teir_scale == "update" and reg.label != upd.label
    with pytest.raises(ValueError):
        method_config("bogus_teir", CLLConfig())


def _capture_bench_config(monkeypatch, runner_name: str) -> dict:
    """Replace ``nobackfill.bench.lingual.<runner_name>`` by a stub that records the config the CLI
    built and then fails with a message naming the split (so no training runs)."""
    import nobackfill.bench.lingual as bench

    seen: dict = {}

    def fake_run(data, *, config, **kw):
        seen["cfg"] = config
        raise FileNotFoundError(f"no split {config.eval_split}")

    monkeypatch.setattr(bench, runner_name, fake_run)
    return seen


def test_cli_bench_lingual_text_passes_split_and_lr(m30k, tmp_path, monkeypatch):
    seen = _capture_bench_config(monkeypatch, "run_lingual_text")
    root, _, _ = m30k
    r = runner.invoke(_app(), ["bench", "lingual-text", "--data", str(root), "--quick", "--split", "val", "--limit",
                               "7", "--lr", "0.003", "--teir-lr", "0.02", "--methods", "cll_clip,prompt_teir",
                               "--json", str(tmp_path / "o.json")])
    assert r.exit_code != 0 and "no split val" in r.output
    cfg = seen["cfg"]
    assert (cfg.eval_split, cfg.eval_limit, cfg.cll.lr, cfg.teir_lr) == ("val", 7, 0.003, 0.02)
    assert cfg.methods == ("cll_clip", "prompt_teir") and cfg.method_cll("prompt_teir").lr == 0.02
    r = runner.invoke(_app(), ["bench", "lingual-text", "--data", str(root), "--quick", "--split", "val",
                               "--json", str(tmp_path / "o.json")])
    from nobackfill.bench.lingual import DEFAULT_METHODS

    assert seen["cfg"].methods == DEFAULT_METHODS and "coda_prompt_teir" in DEFAULT_METHODS


def test_world_retrieval_fusion_weights_match_single_eta(world, tmp_path):
    """Each weight of ``etas`` scores exactly like a separate call with that ``eta``; eta 1 is the
    English translation alone."""
    from nobackfill.encoders import load_encoder
    from nobackfill.evaluate import load_eval_data
    from nobackfill.lingual.data import world_parallel, world_retrieval
    from nobackfill.metrics.retrieval import retrieval_metrics

    data, model = world
    enc = load_encoder(model)
    d = load_eval_data(data, "test", langs=["en", "de"])
    imgs = enc.encode_images(d.image_paths())
    out = world_retrieval(enc, d, imgs, ["en", "de"], tmp_path / "c", etas=(0.4, 1.0))
    single = world_retrieval(enc, d, imgs, ["de"], tmp_path / "c", eta=0.4)
    assert out["translate_test"]["0.4"] == single
    _, english, img = world_parallel(d, "de")
    m = retrieval_metrics(imgs, enc.encode_texts(english), img, ks=(1,), directions=("t2i", "i2t"))
    assert out["translate_test"]["1"]["t2i"]["de"] == pytest.approx(m["t2i"]["R@1"])
    assert "en" not in out["translate_test"]["1"]["t2i"]


def test_cli_bench_lingual_world_passes_split_lr_langs_and_etas(world, tmp_path, monkeypatch):
    import nobackfill.bench.lingual as bench

    seen = _capture_bench_config(monkeypatch, "run_lingual_world")
    data, model = world
    r = runner.invoke(_app(), ["bench", "lingual-world", "--data", str(data), "--model", str(model), "--quick",
                               "--split", "val", "--limit", "9", "--lr", "0.003", "--teir-lr", "0.02", "--langs",
                               "de,fr", "--etas", "0.5,1", "--json", str(tmp_path / "o.json")])
    assert r.exit_code != 0 and "no split val" in r.output
    cfg = seen["cfg"]
    assert (cfg.eval_split, cfg.eval_limit, cfg.cll.lr, cfg.teir_lr) == ("val", 9, 0.003, 0.02)
    assert cfg.langs == ("de", "fr") and cfg.translate_test_etas == (0.5, 1.0)
    assert cfg.methods == bench.WORLD_METHODS and "cll_clip_teir_used" in cfg.methods
    r = runner.invoke(_app(), ["bench", "lingual-world", "--data", str(data), "--split", "train",
                               "--json", str(tmp_path / "o.json")])
    assert r.exit_code == 2 and "split" in r.output


def test_teir_gains_reports_every_teir_variant_per_direction():
    from nobackfill.bench.lingual import teir_gains

    def m(t2i, i2t):
        return {"t2i": {"AR": t2i[0], "F": t2i[1]}, "i2t": {"AR": i2t[0], "F": i2t[1]}}

    res = {"methods": {"cll_clip": m((0.70, 0.08), (0.75, 0.07)), "cll_clip_teir": m((0.67, 0.01), (0.71, 0.01)),
                       "cll_clip_teir_used": m((0.73, 0.01), (0.76, 0.01)), "dualprompt_teir": m((0.5, 0), (0.5, 0))}}
    out = teir_gains(res, ("t2i", "i2t"))
    assert set(out) == {"cll_clip_teir", "cll_clip_teir_used"}  # dualprompt_teir has no plain twin here
    assert out["cll_clip_teir"]["t2i_AR_gain"] == pytest.approx(-0.03)
    assert out["cll_clip_teir"]["t2i_F_drop"] == pytest.approx(0.07)
    assert out["cll_clip_teir_used"]["i2t_AR_gain"] == pytest.approx(0.01)
    flat = teir_gains({"methods": {"er": {"AR": 0.5, "F": 0.1}, "er_teir": {"AR": 0.6, "F": 0.0}}})
    assert flat["er_teir"] == pytest.approx({"AR_gain": 0.1, "F_drop": 0.1})
