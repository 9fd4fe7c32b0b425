"""The continual-language-learning plug-ins (nobackfill.lingual.registry): every registered method
learns on a tiny setup, saves (safetensors + JSON), reloads with the same embeddings and state; the
DualPrompt- and CODA-Prompt-style baselines; TEIR through the loop's before_backward hook."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from _compat_helpers import tiny_encoder
from test_lingual import ENGLISH, GERMAN, GREEK, tiny_bert
from nobackfill.lingual.adapters import use_language
from nobackfill.lingual.embeddings import token_embedding
from nobackfill.lingual.learner import CLLConfig, ContinualLearner, LanguageTask, open_learned
from nobackfill.lingual.registry import create_lingual_method, lingual_method_names
from nobackfill.lingual.sequence import method_config, method_variants

METHODS = ["cll_clip", "oewc", "er", "der", "lora", "prompt", "dualprompt", "coda_prompt"]


def test_registry_lists_every_method_and_the_grammar_reaches_them():
    assert lingual_method_names() == METHODS
    for name in method_variants():
        cfg = method_config(name, CLLConfig())
        assert create_lingual_method(cfg).NAME == cfg.method
    assert method_config("coda_prompt_teir", CLLConfig()).method == "coda_prompt"
    assert method_config("dualprompt", CLLConfig()).teir is False
    with pytest.raises(ValueError, match="method"):
        method_config("l2p_teir", CLLConfig())


def _learn_two(method: str, tmp_path, teir: bool = True):
    enc = tiny_bert()
    cfg = CLLConfig(method=method, teir=teir, steps=2, batch_size=4, task_vocab_size=150, lr=5e-2, memory_size=6,
                    ewc_batches=2, prompt_length=2, coda_components=2)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path / "w")
    learner.learn(LanguageTask("el", GREEK, ENGLISH), tmp_path / "w")
    return enc, learner


def _embed_all(enc) -> dict[str, np.ndarray]:
    out = {}
    for lang, texts in (("en", ENGLISH[:4]), ("de", GERMAN[:4]), ("el", GREEK[:4])):
        use_language(enc, lang)
        out[lang] = enc.encode_texts(texts)
    return out


@pytest.mark.parametrize("method", METHODS)
def test_every_method_saves_and_reloads_the_same_embeddings(method, tmp_path):
    enc, learner = _learn_two(method, tmp_path)
    parent = enc.name
    before = _embed_all(enc)
    out = learner.save(tmp_path / "model")
    meta = json.loads((out / "nobackfill.json").read_text())  # not the parent's name: a status tells them apart
    assert meta["name"] == f"{parent}+de+el" and meta["lingual"]["base_name"] == parent
    learner.save(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "nobackfill.json").read_text())["name"] == f"{parent}+de+el"
    assert not list(out.glob("*.pkl")) and (out / "lingual.safetensors").is_file()
    state = json.loads((out / "lingual.json").read_text())
    assert state["method"]["name"] == method and state["learned"] == ["en", "de", "el"]
    loaded, saved = open_learned(out)
    after = _embed_all(loaded)
    for lang in before:
        np.testing.assert_allclose(after[lang], before[lang], atol=1e-6, err_msg=f"{method} {lang}")
    assert saved.learned == ["en", "de", "el"] and np.array_equal(saved.counts, learner.counts)
    m, r = learner.method, saved.method
    if method == "oewc":
        assert torch.equal(m.fisher, r.fisher) and torch.equal(m.anchor, r.anchor)
    if method in ("er", "der"):
        assert r.buffer.foreign == m.buffer.foreign and r.buffer.seen == m.buffer.seen
        for a, b in zip(m.buffer.english + m.buffer.stored, r.buffer.english + r.buffer.stored):
            assert (a is None and b is None) or np.array_equal(a, b)
        assert r.rng.integers(1 << 30) == m.rng.integers(1 << 30)  # reservoir sampling continues
    # a resumed learner continues the sequence with the restored state
    cont = ContinualLearner(loaded, learner.cfg, ENGLISH, resume=saved)
    assert cont.method is saved.method and cont.learned == ["en", "de", "el"]
    cont.learn(LanguageTask("fr", GERMAN[::-1], ENGLISH[::-1]), tmp_path / "w2")
    assert cont.learned[-1] == "fr"


def test_resume_refuses_another_method(tmp_path):
    _, learner = _learn_two("er", tmp_path)
    _, saved = open_learned(learner.save(tmp_path / "m"))
    with pytest.raises(ValueError, match="learned with method 'er'"):
        ContinualLearner(tiny_bert(), CLLConfig(method="der"), ENGLISH, resume=saved)


def test_lora_model_directory_is_a_plain_model_and_adapters_come_back(tmp_path):
    from nobackfill.encoders import load_encoder

    enc, learner = _learn_two("lora", tmp_path)
    use_language(enc, "en")
    base_en = enc.encode_texts(ENGLISH[:3])
    out = learner.save(tmp_path / "m")
    plain = load_encoder(out)  # no adapters: the base text tower
    assert not [n for n, _ in plain.model.named_parameters() if "lora_" in n]
    np.testing.assert_allclose(plain.encode_texts(ENGLISH[:3]), base_en, atol=1e-6)
    assert [n for n, _ in enc.model.named_parameters() if "lora_" in n]  # the learner's model kept them


@pytest.mark.parametrize("method", ["dualprompt", "coda_prompt"])
def test_key_query_prompts_need_no_language_id_and_leave_english_alone(method, tmp_path):
    from nobackfill.lingual.prompts import soft_prompt

    enc, learner = _learn_two(method, tmp_path)
    pool = learner.method.pool
    use_language(enc, "en")
    en_before = enc.encode_texts(ENGLISH[:4])
    assert not soft_prompt(enc).enabled  # English: the plain tower
    use_language(enc, "de")
    de_as_de = enc.encode_texts(GERMAN[:4])
    use_language(enc, "el")  # any non-English language: the same prompts, chosen from the text
    assert np.array_equal(enc.encode_texts(GERMAN[:4]), de_as_de)
    assert not np.allclose(de_as_de, en_before, atol=1e-4)
    assert pool.n_tasks == 2 and not any(p.requires_grad for p in pool.parameters())
    if method == "dualprompt":
        ids = enc.tokenize(GERMAN[:4])
        picks = pool.pick(pool.query(ids["input_ids"], ids["attention_mask"]))
        assert picks.shape == (4,) and set(picks.tolist()) <= {0, 1}
    else:
        from nobackfill.lingual.coda_prompt import orthogonal_rows

        k = torch.cat(list(pool.K))
        assert k.shape == (4, 16)
        gram = orthogonal_rows(None, 3, 8, torch.Generator().manual_seed(0))
        torch.testing.assert_close(gram @ gram.T, torch.eye(3), atol=1e-5, rtol=0)
        new = orthogonal_rows(gram, 2, 8, torch.Generator().manual_seed(1))
        torch.testing.assert_close(new @ gram.T, torch.zeros(2, 3), atol=1e-5, rtol=0)


def test_dualprompt_trains_only_the_current_e_prompt_and_the_shared_g_prompt(tmp_path):
    enc = tiny_bert()
    cfg = CLLConfig(method="dualprompt", teir=True, steps=25, batch_size=4, task_vocab_size=150, lr=5e-2,
                    prompt_length=2)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path)
    pool = learner.method.pool
    g1, e_de, k_de = pool.g.detach().clone(), pool.e[0].detach().clone(), pool.keys[0].detach().clone()
    learner.learn(LanguageTask("el", GREEK, ENGLISH), tmp_path)
    assert torch.equal(pool.e[0], e_de) and torch.equal(pool.keys[0], k_de)  # old task: frozen
    assert not torch.equal(pool.g, g1)  # the G-prompt keeps learning
    ids = enc.tokenize(GREEK[:4])
    q = pool.query(ids["input_ids"], ids["attention_mask"])
    assert (pool.pick(q) == 1).all()  # the match loss pulled el's key to el's queries
    ids = enc.tokenize(GERMAN[:4])
    assert (pool.pick(pool.query(ids["input_ids"], ids["attention_mask"])) == 0).all()  # and de's to de's


def test_coda_prompt_freezes_earlier_components(tmp_path):
    enc = tiny_encoder()  # a CLIP text tower (EOS pooling inside the tower)
    cfg = CLLConfig(method="coda_prompt", teir=False, steps=2, batch_size=4, task_vocab_size=300, lr=5e-2,
                    prompt_length=2, coda_components=2)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path)
    pool = learner.method.pool
    first = [t.detach().clone() for t in (pool.P[0], pool.K[0], pool.A[0])]
    learner.learn(LanguageTask("el", GREEK, ENGLISH), tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(first, (pool.P[0], pool.K[0], pool.A[0])))
    ids = enc.tokenize(GREEK[:2])
    alpha = pool.weights(pool.query(ids["input_ids"], ids["attention_mask"]))
    assert alpha.shape == (2, 4) and alpha.abs().max() <= 1.0 + 1e-6


def test_teir_snapshot_runs_in_before_backward_not_in_loss(tmp_path):
    from nobackfill.lingual.methods import CLLCLIPMethod, LingualBatch
    from nobackfill.train.loop import LoopConfig

    enc = tiny_bert()
    n = token_embedding(enc).weight.shape[0]
    m = CLLCLIPMethod(enc, np.full(n, 0.5), LoopConfig(steps=1, warmup=1), teir=True, gamma_cm=0.0, gamma_cl=1.0,
                      temperature=0.07, scale_mode="update")
    eng = torch.nn.functional.normalize(torch.randn(2, 16), dim=-1)
    m.loss(LingualBatch(GERMAN[:2], eng), 0)
    assert m.rows._snapshot is None
    m.before_backward(0)
    assert m.rows._snapshot is not None
    m.close()

