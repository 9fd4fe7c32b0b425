"""XBT on real text (``bench xbt-text``, ``upgrade xbt-text``): caption-pair training, the text-XBT
loss, adapters on a BERT, the ``xbt-text`` upgrade directory (save -> load -> apply, on / off, refusals),
the embedding cache, early stopping in the loop, and smoke runs of the bench and the CLI on a tiny
fake Multi30K with tiny BERTs (seconds)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from _fake_multi30k import fake_multi30k, write_task2
from _loop_helpers import ToyMethod
from nobackfill.bench import xbt_text
from nobackfill.bench.xbt_text import ROWS, caption_recall, load_val, run_xbt_text
from nobackfill.compat import text_upgrade
from nobackfill.compat.adapters import AdapterConfig, Adapters, detect_architecture, trainable_names
from nobackfill.compat.phi import Projection
from nobackfill.compat.text_upgrade import TextXBTConfig, TextXBTUpgradeConfig
from nobackfill.compat.upgrade import TextUpgradedEncoder, load_upgrade, new_upgraded_encoder
from nobackfill.search.searcher import query_side_for
from nobackfill.compat.xbt import LOG_LOGIT_SCALE, Stage1Config
from nobackfill.gallery.types import SpaceMismatchError
from nobackfill.encoders.minilm import MiniLMTextEncoder
from nobackfill.encoders.tokenizer import train_bpe_tokenizer
from nobackfill.evaluate import embed_texts_cached
from nobackfill.train.loop import LoopConfig, train
from nobackfill.train.text_pairs import (CaptionPairBatches, TextModelSpec, TextPairContrastive, TextTrainSpec,
                                         tiny_bert_encoder, train_text_model)
from nobackfill.config import updated

TINY_OLD = TextModelSpec(vocab_size=200, hidden=16, layers=1, heads=2, intermediate=32, max_length=24)
TINY_NEW = TextModelSpec(vocab_size=300, hidden=32, layers=1, heads=2, intermediate=64, max_length=24)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Fake Multi30K + a tiny old model (trained a few steps) + a tiny 'new' BERT."""
    tmp = tmp_path_factory.mktemp("xbt_text")
    root = fake_multi30k(tmp / "m30k", n_train=40, n_val=10)
    from nobackfill.data.multi30k import read_task2

    train_cs, val = read_task2(root, "train"), read_task2(root, "val", ks=(1, 2))
    old_dir = tmp / "old"
    r = train_text_model(train_cs.captions, val.column(1), val.column(2), old_dir, model=TINY_OLD,
                         train_spec=TextTrainSpec(steps=6, batch_size=8, eval_every=2, patience=2, warmup=1,
                                                  threads=1), progress=False, command="test")
    assert r.best_step is not None
    corpus = [c for col in train_cs.captions for c in col]
    new = tiny_bert_encoder(train_bpe_tokenizer(corpus, TINY_NEW.vocab_size, TINY_NEW.max_length), TINY_NEW, seed=1,
                            name="tiny-new")
    new_dir = new.save(tmp / "new")
    return {"root": root, "old": old_dir, "new": new_dir, "tmp": tmp}


def tiny_config(**kw) -> TextXBTUpgradeConfig:
    return TextXBTUpgradeConfig(stage1_images=40, stage1=updated(Stage1Config(), steps=6, batch_size=32, warmup=1, corpus_size=0),
                         xbt=updated(TextXBTConfig(), images=40, steps=4, batch_size=8, warmup=1, eval_every=2), threads=1, **kw)


# ----------------------------------------------------------------------------- pieces
def test_caption_pair_batches_deterministic_and_distinct():
    caps = [[f"img{i} cap{k}" for i in range(10)] for k in range(5)]
    b = CaptionPairBatches(caps, batch_size=4, seed=3)
    a1, b1 = b.batch(7)
    assert (a1, b1) == b.batch(7)
    assert len(a1) == 4
    for x, y in zip(a1, b1):
        assert x != y and x.split()[0] == y.split()[0]  # same image, different caption
    assert len({x.split()[0] for x in a1}) == 4  # distinct images in a batch
    assert CaptionPairBatches(caps, batch_size=64).batch_size == 10  # capped at the image count
    with pytest.raises(ValueError):
        CaptionPairBatches(caps[:1], 4)


class _TableEncoder:
    """A stand-in encoder: each text maps to a fixed feature row (for a hand-computed loss)."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table
        self.model = torch.nn.Linear(1, 1)

    def tokenize(self, texts):
        return {"texts": list(texts)}

    def text_features(self, texts):
        return torch.tensor([self.table[t] for t in texts])

    def invalidate_space_id(self):
        pass


def test_text_xbt_loss_hand_case():
    # rows: image 1 = (a, a2), image 2 = (b, b2); features need not be unit (they are normalised)
    enc = _TableEncoder({"a": [3.0, 0.0], "b": [0.0, 2.0], "a2": [1.0, 0.0], "b2": [0.0, 5.0]})
    phi = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        phi.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))  # swap coordinates
    m = TextPairContrastive(enc, head=phi, learn_temperature=False, log_scale=math.log(2.0))
    loss, logs = m.loss((["a", "b"], ["a2", "b2"]), 0)
    s = 2.0
    # phi(unit w): a -> (0,1), b -> (1,0); a2 -> (0,1), b2 -> (1,0): logits = s * I (2x2)
    expected = math.log(1 + math.exp(-s))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert logs["temperature"] == pytest.approx(1 / s)
    # mismatched pairs: logits s * (1 - I) -> loss log(1 + e^s)
    loss2, _ = m.loss((["a", "b"], ["b2", "a2"]), 0)
    assert loss2.item() == pytest.approx(math.log(1 + math.exp(s)), rel=1e-5)
    assert not m.log_scale.requires_grad
    # the paper's fixed temperature (log logit scale 2.6592) by default in the bench
    m2 = TextPairContrastive(enc, head=phi, learn_temperature=False, log_scale=LOG_LOGIT_SCALE)
    assert m2.loss((["a", "b"], ["b2", "a2"]), 0)[0].item() == pytest.approx(math.log(1 + math.exp(math.exp(2.6592))), rel=1e-4)
    # only the head is trainable here (the stand-in encoder's weights are frozen)
    enc.model.requires_grad_(False)
    names = set(m.state_dict())
    assert names == {"head.weight"}


BERT_LORA_RE = re.compile(r"^encoder\.layer\.\d+\.attention\.(self\.(query|key|value)|output\.dense)"
                         r"\.lora_[AB]\.default\.weight$")


def _tiny_bert(seed: int = 0) -> MiniLMTextEncoder:
    tok = train_bpe_tokenizer(["a dog runs", "a cat sits", "two men walk"] * 5, 80, 16)
    return tiny_bert_encoder(tok, TINY_NEW, seed=seed)


def _perturb(adapters: Adapters, seed: int = 7) -> None:
    """Move every added tensor off its initial value (LoRA B starts at zero: a no-op)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in adapters.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_adapters_on_a_bert_trainable_set_and_on_off_exact(tmp_path):
    enc, ref = _tiny_bert(), _tiny_bert()
    enc.model.eval(), ref.model.eval()
    texts = ["a dog runs", "two men walk on a long road", "hi"]
    want = ref.encode_texts(texts)
    before = {n: p.detach().clone() for n, p in enc.model.named_parameters()}
    assert detect_architecture(enc.model) == "bert"
    ad = Adapters(enc.model)  # the architecture picks the config: LoRA on attention + LayerNorms, no prompts
    assert ad.cfg.architecture == "bert" and ad.cfg.n_prompts == 0 and ad.cfg.lora_towers == ("text",)
    names = trainable_names(enc.model)
    lora = {n for n in names if BERT_LORA_RE.match(n)}
    n_ln = sum(isinstance(m, torch.nn.LayerNorm) for m in ref.model.modules())
    assert len(lora) == TINY_NEW.layers * 4 * 2  # query, key, value, output.dense; A and B
    assert names - lora == {n for n in names if n.endswith((".tuned_weight", ".tuned_bias"))}
    assert len(names - lora) == 2 * n_ln
    assert (ad.lora_config.r, ad.lora_config.lora_alpha, ad.lora_config.lora_dropout) == (16, 16, 0.1)
    base = ad.base_state_dict()
    assert base.keys() == before.keys() and all(torch.equal(base[n], before[n]) for n in before)
    _perturb(ad)
    enc.invalidate_space_id()
    on = enc.encode_texts(texts)
    assert not np.allclose(on, want)
    with ad.switched(False):
        assert np.array_equal(enc.encode_texts(texts), want)  # the original model, bit for bit
    assert ad.enabled and np.array_equal(enc.encode_texts(texts), on)
    # saved like CLIP adapters: adapter_model.safetensors + adapter_config.json (peft + ours)
    ad.save(tmp_path / "ad")
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["r"] == 16 and cfg["nobackfill"]["architecture"] == "bert"
    assert "attention" in cfg["target_modules"]
    other = _tiny_bert()
    ad2 = Adapters(other.model, Adapters.read_config(tmp_path / "ad"))
    ad2.load(tmp_path / "ad")
    other.model.eval()
    assert np.array_equal(other.encode_texts(texts), on)
    # refusals: a CLIP config on a BERT, prompts without a vision tower, a non-transformer
    with pytest.raises(ValueError, match="'clip'"):
        Adapters(_tiny_bert().model, AdapterConfig())
    with pytest.raises(ValueError, match="no vision tower"):
        AdapterConfig.text(n_prompts=10)
    with pytest.raises(ValueError, match="Linear"):
        Adapters(torch.nn.Linear(2, 2))


def _text_upgrade(new: MiniLMTextEncoder, out: Path) -> TextUpgradedEncoder:
    """A trained-looking xbt-text upgrade of ``new`` (perturbed adapters, random phi), saved to ``out``."""
    torch.manual_seed(3)
    up = new_upgraded_encoder(new, Projection(new.embed_dim, 16), {"space_id": "old-text-space", "name": "old",
                                                                   "embed_dim": 16},
                              TextXBTConfig(lora_rank=4, lora_alpha=4).adapters(), kind="xbt-text")
    _perturb(up.adapters)
    up.train(False)
    up.save(out, recipe={"command": "test"})
    return up


def test_xbt_text_upgrade_round_trip_on_off_and_refusals(world, tmp_path):
    texts = ["a dog runs on the grass", "two men", "a woman in a red dress sings"]
    ref = MiniLMTextEncoder.load(world["new"])
    want = ref.encode_texts(texts)
    up = _text_upgrade(MiniLMTextEncoder.load(world["new"]), tmp_path / "up")
    assert isinstance(up, TextUpgradedEncoder) and up.space_id == "old-text-space"
    on = up.encode_texts(texts)
    assert on.shape == (3, 16)
    man = json.loads((tmp_path / "up" / "upgrade.json").read_text())
    assert man["kind"] == "xbt-text" and man["source"]["space_id"] == ref.space_id
    assert man["target"]["space_id"] == "old-text-space" and man["adapters"]["architecture"] == "bert"
    for f in ("adapter_model.safetensors", "adapter_config.json", "phi.safetensors", "phi_config.json"):
        assert (tmp_path / "up" / f).is_file()
    u = load_upgrade(tmp_path / "up")
    fresh = MiniLMTextEncoder.load(world["new"])
    up2 = u.apply(fresh)
    assert isinstance(up2, TextUpgradedEncoder) and up2.space_id == "old-text-space"
    assert np.array_equal(up2.encode_texts(texts), on)  # the saved upgrade is the in-memory one
    with up2.switched(False):
        assert up2.space_id == ref.space_id and up2.embed_dim == TINY_NEW.hidden
        assert np.array_equal(up2.encode_texts(texts), want)  # switched off: the new model bit for bit
    assert np.array_equal(up2.encode_texts(texts), on)
    with pytest.raises(NotImplementedError, match="no image tower"):
        up2.encode_images([np.zeros((8, 8, 3), np.uint8)])
    # another model: refused, naming the upgrade directory
    with pytest.raises(SpaceMismatchError, match=re.escape(str(tmp_path / "up"))):
        u.apply(MiniLMTextEncoder.load(world["old"]))
    # the query pipeline resolves it like the CLIP upgrades
    side = query_side_for(MiniLMTextEncoder.load(world["new"]), "old-text-space", bridges=[tmp_path / "up"],
                          direction="t2t")
    assert side.bridge is None and side.bridged.space_id == "old-text-space"
    assert np.allclose(side.embed("text", texts), on, atol=1e-5)


class _CountingEncoder:
    def __init__(self, sid: str) -> None:
        self.space_id, self.embed_dim, self.calls = sid, 3, 0

    def encode_texts(self, texts, batch_size=256, progress=False):
        self.calls += 1
        return np.array([[len(t), 1.0, 0.0] for t in texts], np.float32)


def test_embedding_cache_hit_and_miss_by_space_id(tmp_path):
    texts = [f"caption {i}" for i in range(7)]
    enc = _CountingEncoder("space-a")
    st: dict = {}
    a = embed_texts_cached(enc, texts, tmp_path, block=3, stats=st)
    assert enc.calls == 3 and st == {"misses": 3}  # blocks of 3, 3, 1
    b = embed_texts_cached(enc, texts, tmp_path, block=3, stats=st)
    np.testing.assert_array_equal(a, b)
    assert enc.calls == 3 and st == {"misses": 3, "hits": 3}
    embed_texts_cached(enc, texts[:3], tmp_path, block=3)  # a prefix reuses the first block
    assert enc.calls == 3
    other = _CountingEncoder("space-b")  # another model: every block misses
    embed_texts_cached(other, texts, tmp_path, block=3)
    assert other.calls == 3
    texts[4] = "changed"  # changed content: only its block misses
    embed_texts_cached(enc, texts, tmp_path, block=3)
    assert enc.calls == 4
    assert embed_texts_cached(enc, [], tmp_path).shape == (0, 3)
    assert embed_texts_cached(enc, texts, None).shape == (7, 3)


class _StepMethod(ToyMethod):
    """A one-parameter method whose eval score peaks at a chosen step (for early stopping)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def loss(self, batch, step):
        return (self.w - 10.0) ** 2, {}

    def export(self, out):
        (Path(out) / "w.txt").write_text(str(float(self.w.detach())))


def test_loop_early_stopping_restores_best(tmp_path):
    m = _StepMethod()
    scores = iter([0.1, 0.5, 0.4, 0.3, 0.9, 0.9])
    values = []

    def evaluate():
        values.append(float(m.w.detach()))
        return {"R@1": next(scores)}

    class B:
        def batch(self, i):
            return None

    cfg = LoopConfig(steps=100, lr=0.1, warmup=1, eval_every=2, checkpoint_every=2, log_every=2, weight_decay=0.0,
                     early_stop="R@1", patience=2)
    r = train(m, B(), cfg, tmp_path, evaluate=evaluate, progress=False)
    assert r.stopped_early and r.best_step == 4 and r.best_value == 0.5 and r.steps == 8
    assert float(m.w.detach()) == values[1]  # restored to the state evaluated at step 4
    assert float((tmp_path / "w.txt").read_text()) == values[1]
    with pytest.raises(ValueError):
        LoopConfig(early_stop="R@1", patience=0)


# ----------------------------------------------------------------------------- the bench
def test_old_model_is_a_minilm_encoder_with_recipe(world):
    enc = MiniLMTextEncoder.load(world["old"])
    assert enc.embed_dim == TINY_OLD.hidden and enc.model.config.model_type == "bert"
    recipe = json.loads((world["old"] / "recipe.json").read_text())
    assert recipe["command"] == "test" and recipe["val_curve"] and recipe["best_step"] is not None
    assert enc.encode_texts(["a red dog"]).shape == (1, TINY_OLD.hidden)


def test_bench_smoke_and_old_model_never_loaded_in_xbt(world, monkeypatch, tmp_path):
    events: list[str] = []
    real_load, real_xbt = text_upgrade.load_old_model, text_upgrade.train_text_xbt

    def watched_load(path):
        events.append("load_old")
        return real_load(path)

    def watched_xbt(*args, **kw):
        events.append("xbt_start")
        # nothing may open the old model from here on: make that an error
        monkeypatch.setattr(text_upgrade, "load_old_model", _sentinel)
        out = real_xbt(*args, **kw)
        events.append("xbt_end")
        return out

    def _sentinel(path):
        raise AssertionError("the old model was loaded during the XBT stage")

    monkeypatch.setattr(text_upgrade, "load_old_model", watched_load)
    monkeypatch.setattr(text_upgrade, "train_text_xbt", watched_xbt)
    res = run_xbt_text(world["root"], old_model=world["old"], new_model=world["new"], cache_dir=tmp_path / "cache",
                       work_dir=tmp_path / "work", config=tiny_config(), save_upgrade=tmp_path / "up")
    assert events == ["load_old", "xbt_start", "xbt_end"]
    assert res["xbt_old_model_alive"] is False
    assert set(res["rows"]) == set(ROWS)
    for row in res["rows"].values():
        assert set(row) == {"R@1", "R@5", "R@10"} and all(0.0 <= v <= 1.0 for v in row.values())
    assert res["n_val"] == 10 and res["xbt"]["val_curve"] and res["xbt"]["trainable"]["lora"] > 0
    md = xbt_text.write_outputs(res, tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text())["rows"].keys() == res["rows"].keys()
    assert "xbt_new_old" in md and (tmp_path / "out.md").read_text() == md
    # the reported XBT row is what the saved upgrade gives, reloaded from disk and applied to the new model
    monkeypatch.setattr(text_upgrade, "load_old_model", real_load)
    monkeypatch.setattr(text_upgrade, "train_text_xbt", real_xbt)
    u = load_upgrade(tmp_path / "up")
    assert u.kind == "xbt-text" and res["upgrade"] == str(tmp_path / "up")
    q, g = load_val(world["root"])
    o_g = MiniLMTextEncoder.load(world["old"]).encode_texts(g)
    assert u.target_id == res["old"]["space_id"] and u.source_id == res["new"]["space_id"]
    up = u.apply(MiniLMTextEncoder.load(world["new"]))
    assert caption_recall(up.encode_texts(q), o_g) == res["rows_detail"]["xbt_new_old"]
    # a second run only trains: every frozen-model embedding comes from the cache
    res2 = run_xbt_text(world["root"], old_model=world["old"], new_model=world["new"], cache_dir=tmp_path / "cache",
                        work_dir=tmp_path / "work2", config=tiny_config())
    assert all("misses" not in st for st in res2["cache"]["blocks"].values())
    assert res2["rows"]["old_old"] == res["rows"]["old_old"]


def test_cli_train_text_and_bench_with_eval_dir(world, tmp_path):
    from nobackfill.cli import app

    runner = CliRunner()
    old = tmp_path / "old-cli"
    r = runner.invoke(app, ["train-text", "--data", str(world["root"]), "--out", str(old), "--steps", "4",
                            "--batch-size", "8", "--hidden", "16", "--layers", "1", "--eval-every", "2"])
    assert r.exit_code == 0, r.output
    recipe = json.loads((old / "recipe.json").read_text())
    assert recipe["command"].startswith("nobackfill train-text --data ") and "--steps 4" in recipe["command"]
    ev = tmp_path / "eval"
    write_task2(ev, "val", 6, offset=777)
    out = tmp_path / "bench.json"
    r = runner.invoke(app, ["bench", "xbt-text", "--data", str(world["root"]), "--eval-dir", str(ev), "--quick",
                            "--stage1-steps", "5", "--xbt-steps", "3", "--old-model", str(old), "--new-model", str(world["new"]), "--cache-dir",
                            str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"), "--json", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["n_val"] == 6 and res["eval_dir"] == str(ev) and set(res["rows"]) == set(ROWS)
    assert res["quick"] and res["stage1"]["steps"] == 5 and res["xbt"]["steps"] == 3
    assert "| xbt_new_old |" in r.output
    r = runner.invoke(app, ["bench", "xbt-text", "--data", str(world["root"]), "--eval-dir", str(tmp_path / "nope"),
                            "--old-model", str(old), "--json", str(out)])
    assert r.exit_code == 2 and "nope" in r.output


def test_cli_upgrade_xbt_text(world, tmp_path):
    from nobackfill.cli import app

    out = tmp_path / "up"
    r = CliRunner().invoke(app, ["upgrade", "xbt-text", "--old", str(world["old"]), "--new", str(world["new"]),
                                 "--data", str(world["root"]), "--out", str(out), "--quick", "--stage1-steps", "4",
                                 "--xbt-steps", "3", "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    man = json.loads((out / "upgrade.json").read_text())
    old, new = MiniLMTextEncoder.load(world["old"]), MiniLMTextEncoder.load(world["new"])
    assert man["kind"] == "xbt-text"
    assert (man["source"]["space_id"], man["target"]["space_id"]) == (new.space_id, old.space_id)
    cmd = man["recipe"]["command"]
    assert cmd.startswith(f"nobackfill upgrade xbt-text --old {world['old']} --new {world['new']} ") and "--quick" in cmd
    assert "--stage1-steps 4 --xbt-steps 3" in cmd and man["recipe"]["xbt"]["steps"] == 3
    assert json.loads((out / "stage1" / "upgrade.json").read_text())["kind"] == "phi"  # stage 1 is a phi bridge
    assert not (out / "checkpoint.safetensors").exists()
    texts = ["a dog runs", "a man sits"]
    up = load_upgrade(out).apply(MiniLMTextEncoder.load(world["new"]))
    assert up.encode_texts(texts).shape == (2, TINY_OLD.hidden)
    with up.switched(False):
        assert np.array_equal(up.encode_texts(texts), new.encode_texts(texts))
    r = CliRunner().invoke(app, ["upgrade", "xbt-text", "--old", str(tmp_path / "missing"), "--new", str(world["new"]),
                                 "--data", str(world["root"]), "--out", str(tmp_path / "up2")])
    assert r.exit_code == 2 and "missing" in r.output


def test_a_text_xbt_resume_on_other_captions_is_refused_naming_both_folders(world, tmp_path, monkeypatch):
    """trial AC: ``upgrade xbt-text --data OTHER`` resumed stage 2 on other captions without a word."""
    from nobackfill.compat.text_upgrade import train_text_xbt
    from nobackfill.train.loop import ResumeMismatch, TrainingInterrupted

    cfg = updated(TextXBTConfig(), images=40, steps=6, batch_size=8, warmup=1, eval_every=0, checkpoint_every=2)
    target = {"space_id": "old-text-space", "name": "old", "embed_dim": 16}
    from nobackfill.data.multi30k import read_task2

    caps = read_task2(world["root"], "train").captions
    other = [list(reversed(col)) for col in caps]  # the same captions, paired otherwise
    loss = TextPairContrastive.loss

    def stop_at_3(self, batch, step):
        if step == 3:
            raise KeyboardInterrupt
        return loss(self, batch, step)

    def run(captions, data):
        return train_text_xbt(MiniLMTextEncoder.load(world["new"]), Projection(TINY_NEW.hidden, 16), captions, cfg,
                              tmp_path / "work", target=target, threads=1, data=data)

    with monkeypatch.context() as m:
        m.setattr(TextPairContrastive, "loss", stop_at_3)
        with pytest.raises(TrainingInterrupted):
            run(caps, tmp_path / "m30k_a")
    with pytest.raises(ResumeMismatch, match=r"data '.*m30k_a' \(now '.*m30k_b'\), data contents '[0-9a-f]{16}'"):
        run(other, tmp_path / "m30k_b")
    _, res, _ = run(caps, tmp_path / "m30k_moved")  # the same captions from elsewhere resume
    assert res.steps == 6 and res.history[-1]["step"] == 6
