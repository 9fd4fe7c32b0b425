"""Tests for nobackfill.lingual (CLL-CLIP + TEIR, Yang et al. 2024) and metrics.continual, on tiny models."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from _compat_helpers import tiny_encoder
from nobackfill.lingual.embeddings import (PLAIN_INIT_STD, embedding_stats, expand_token_embeddings,
                                           freeze_all_but_token_embeddings, token_embedding)
from nobackfill.lingual.learner import CLLConfig, ContinualLearner, LanguageTask, load_lingual_state
from nobackfill.lingual.losses import cll_clip_loss, cross_lingual_loss, cross_modal_loss
from nobackfill.lingual.methods import CLLCLIPMethod, LingualBatch
from nobackfill.lingual.teir import RowScaledEmbedding, teir_row_scales
from nobackfill.lingual.vocab import merge_vocab, model_type, task_token_set, token_counts, train_task_vocab
from nobackfill.metrics.continual import average_recall, continual_summary, forgetting
from nobackfill.train.loop import LoopConfig, train

ENGLISH = ["a red circle above a small blue square", "a large green star on a white background",
           "two black rings next to a yellow cross", "a small purple hexagon at the top"] * 3
GREEK = ["ένας κόκκινος κύκλος πάνω από ένα μικρό μπλε τετράγωνο", "ένα μεγάλο πράσινο αστέρι σε λευκό φόντο",
         "δύο μαύροι δακτύλιοι δίπλα σε έναν κίτρινο σταυρό", "ένα μικρό μωβ εξάγωνο στην κορυφή"] * 3
GERMAN = ["ein roter kreis über einem kleinen blauen quadrat", "ein großer grüner stern auf weißem hintergrund",
          "zwei schwarze ringe neben einem gelben kreuz", "ein kleines lila sechseck oben"] * 3


def tiny_bert():
    """A tiny BERT with a WordPiece vocabulary (the MiniLM family) behind MiniLMTextEncoder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from nobackfill.train.text_pairs import TextModelSpec, tiny_bert_encoder

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(ENGLISH, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                 sep_token="[SEP]", mask_token="[MASK]", model_max_length=32)
    return tiny_bert_encoder(hf, TextModelSpec(hidden=16, layers=1, heads=2, intermediate=32, max_length=32, dropout=0.0))


# ----------------------------------------------------------------------------- vocabulary growth
@pytest.mark.parametrize("make,kind", [(tiny_encoder, "BPE"), (tiny_bert, "WordPiece")])
def test_merged_vocab_keeps_old_ids_and_appends_new(make, kind):
    enc = make()
    base = enc.tokenizer
    assert model_type(base) == kind
    old = base.get_vocab()
    tv = train_task_vocab(base, GERMAN, 400)
    merged = merge_vocab(base, tv, n_rows=token_embedding(enc).weight.shape[0])
    new = merged.tokenizer.get_vocab()
    assert all(new[t] == i for t, i in old.items())  # old ids keep their meaning
    assert set(new) == set(old) | task_token_set(tv)  # V_t = V_{t-1} U V_hat_t
    assert merged.new_ids == list(range(merged.old_size, merged.size))
    assert sorted(new[t] for t in merged.new_tokens) == merged.new_ids
    assert merged.new_tokens and all(t not in old for t in merged.new_tokens)
    # special tokens unchanged; the merged tokenizer still frames every text the same way
    for t in base.all_special_tokens:
        assert new[t] == old[t]
    ids_old, ids_new = base(GERMAN[0])["input_ids"], merged.tokenizer(GERMAN[0])["input_ids"]
    assert ids_new[0] == ids_old[0] and ids_new[-1] == ids_old[-1]
    assert len(ids_new) < len(ids_old)  # the language's own tokens are used
    assert max(ids_new) >= merged.old_size


def test_wordpiece_task_vocab_is_reproducible():
    """The raw WordPiece trainer numbers continuation symbols in hash-map order and breaks merge
    ties by id, so repeated training on a tie-rich corpus gives different vocabularies; ours
    registers them in sorted order first and must give the same vocabulary every time."""
    import random

    from tokenizers import Tokenizer, models, trainers

    from nobackfill.lingual.vocab import continuation_symbols, tokenizer_json

    rng = random.Random(0)
    texts = [" ".join("".join(rng.choice("abcdefghijkłmnóp") for _ in range(rng.randint(2, 7))) for _ in range(8))
             for _ in range(60)]
    base = tiny_bert().tokenizer
    assert len({train_task_vocab(base, texts, 150).to_str() for _ in range(5)}) == 1
    ref = Tokenizer.from_str(json.dumps(tokenizer_json(base)))

    def raw() -> str:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = ref.normalizer, ref.pre_tokenizer
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=150, special_tokens=["[PAD]", "[UNK]"],
                                                                 show_progress=False))
        return json.dumps(sorted(tok.get_vocab()))

    assert len({raw() for _ in range(5)}) > 1  # the trainer alone is not reproducible on this corpus
    syms = continuation_symbols(ref, ["Abc dé"], "##", exclude=["##c"])
    assert syms == ["##b", "##e"]  # BERT normaliser: lowercase, accents stripped; first chars excluded


def test_clip_eos_stays_one_and_english_features_unchanged_after_growth():
    enc = tiny_encoder()
    assert enc.tokenizer.eos_token_id == 1
    before_img = enc.encode_images(np.zeros((2, 64, 64, 3), np.uint8))
    before = enc.encode_texts(ENGLISH[:4])
    table = token_embedding(enc).weight.detach().clone()
    merged = merge_vocab(enc.tokenizer, train_task_vocab(enc.tokenizer, GREEK, 400), n_rows=table.shape[0])
    expand_token_embeddings(enc, merged, mean=0.0, std=0.02, generator=torch.Generator().manual_seed(0))
    w = token_embedding(enc).weight
    assert w.shape[0] == merged.size == len(enc.tokenizer.get_vocab())
    assert enc.model.config.text_config.vocab_size == merged.size
    assert torch.equal(w[:table.shape[0]], table)  # old rows bit-identical
    assert enc.tokenizer.eos_token_id == 1
    ids = enc.tokenizer(GREEK[0])["input_ids"]
    assert ids[-1] == 1 and 1 not in ids[:-1]  # pooling finds the EOS
    assert np.array_equal(enc.encode_texts(ENGLISH[:4]), before)  # Greek merges never touch English
    assert np.array_equal(enc.encode_images(np.zeros((2, 64, 64, 3), np.uint8)), before_img)


# ----------------------------------------------------------------------------- initialisation
def test_teir_init_matches_previous_statistics_and_plain_uses_002():
    enc = tiny_bert()
    with torch.no_grad():
        token_embedding(enc).weight.normal_(0.3, 0.7, generator=torch.Generator().manual_seed(1))
    mean, std = embedding_stats(token_embedding(enc).weight)
    assert mean == pytest.approx(0.3, abs=0.05) and std == pytest.approx(0.7, abs=0.05)
    tv = train_task_vocab(enc.tokenizer, GERMAN * 5 + GREEK * 5, 400)
    merged = merge_vocab(enc.tokenizer, tv, n_rows=token_embedding(enc).weight.shape[0])
    assert len(merged.new_tokens) > 100
    rows = expand_token_embeddings(enc, merged, mean=mean, std=std, generator=torch.Generator().manual_seed(0))
    assert float(rows.mean()) == pytest.approx(mean, abs=0.03)
    assert float(rows.std()) == pytest.approx(std, rel=0.05)
    enc2 = tiny_bert()
    merged2 = merge_vocab(enc2.tokenizer, tv, n_rows=token_embedding(enc2).weight.shape[0])
    rows2 = expand_token_embeddings(enc2, merged2, mean=0.0, std=PLAIN_INIT_STD, generator=torch.Generator().manual_seed(0))
    assert float(rows2.std()) == pytest.approx(0.02, rel=0.05) and abs(float(rows2.mean())) < 0.002


# ----------------------------------------------------------------------------- lambda scales
def test_teir_row_scales_hand_computed():
    counts = np.array([1.0, 3.0, 9.0, 1.0])
    lam = teir_row_scales(6, 4, [1, 2, 4, 5], counts)
    assert lam.tolist() == [0.0, 0.25, 0.1, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        teir_row_scales(6, 4, [7], counts)


def test_row_scales_apply_to_gradient_and_weight_decay():
    w = torch.nn.Parameter(torch.ones(3, 2))
    rows = RowScaledEmbedding(w, np.array([0.0, 0.5, 1.0]), weight_decay=0.1)
    (w * torch.tensor([[2.0, 4.0]])).sum().backward()
    assert w.grad.tolist() == [[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]]
    rows.decay(lr=0.5)
    assert w.detach()[:, 0].tolist() == pytest.approx([1.0, 1 - 0.5 * 0.1 * 0.5, 1 - 0.5 * 0.1])
    rows.remove()
    w.grad = None
    w.sum().backward()
    assert w.grad.tolist() == [[1.0, 1.0]] * 3


def test_update_mode_scales_the_optimiser_step_per_row():
    w = torch.nn.Parameter(torch.zeros(3, 2))
    rows = RowScaledEmbedding(w, np.array([0.0, 0.25, 1.0]), weight_decay=0.0, mode="update")
    opt = torch.optim.Adam([w], lr=0.1)
    rows.before_step()
    w.sum().backward()
    assert w.grad.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]  # only lambda = 0 is cut in the gradient
    opt.step()
    rows.after_step(lr=0.1)
    # Adam's first step is -lr * sign(g): row 1 moves a quarter of it, row 2 all of it, row 0 not at all
    assert w.detach()[:, 0].tolist() == pytest.approx([0.0, -0.025, -0.1], abs=1e-6)
    with pytest.raises(ValueError):
        RowScaledEmbedding(w, np.ones(3), 0.0, mode="nope")


def test_grad_scaling_is_cancelled_by_adam_normalisation():
    """Why ``mode="update"`` exists: with Adam a constant 1/(c+1) on a row's gradient barely matters."""
    w = torch.nn.Parameter(torch.zeros(2, 2))
    rows = RowScaledEmbedding(w, np.array([0.01, 1.0]), weight_decay=0.0, mode="grad")
    opt = torch.optim.Adam([w], lr=0.1)
    for _ in range(3):
        rows.before_step()
        opt.zero_grad()
        w.sum().backward()
        opt.step()
        rows.after_step(0.1)
    assert float(w.detach()[0, 0]) == pytest.approx(float(w.detach()[1, 0]), rel=1e-4)
    rows.remove()


@pytest.mark.parametrize("mode", ["grad", "update"])
def test_adamw_through_the_loop_leaves_lambda_zero_rows_untouched(tmp_path, mode):
    enc = tiny_bert()
    n = token_embedding(enc).weight.shape[0]
    table = token_embedding(enc).weight.detach().clone()
    scales = np.zeros(n)
    used = sorted({i for ids in enc.tokenizer(GERMAN)["input_ids"] for i in ids})
    scales[used[: len(used) // 2]] = 0.5
    scales[used[len(used) // 2:]] = 1.0
    loop = LoopConfig(steps=3, lr=1e-2, warmup=1, weight_decay=0.5, schedule="constant", checkpoint_every=100)
    body = {k: v.clone() for k, v in enc.model.state_dict().items() if "word_embeddings" not in k}
    eng = torch.nn.functional.normalize(torch.randn(4, 16, generator=torch.Generator().manual_seed(0)), dim=-1)

    class Batches:
        def batch(self, i):
            return LingualBatch(GERMAN[:4], eng)

    m = CLLCLIPMethod(enc, scales, loop, teir=True, gamma_cm=0.01, gamma_cl=1.0, temperature=0.07, scale_mode=mode)
    train(m, Batches(), loop, tmp_path / "run", progress=False, export=False)
    m.close()
    after = token_embedding(enc).weight.detach()
    zero = scales == 0
    assert torch.equal(after[zero], table[zero])  # no gradient, no decay
    assert not torch.equal(after[~zero], table[~zero])
    assert all(torch.equal(v, enc.model.state_dict()[k]) for k, v in body.items())  # tower frozen


def test_plain_decay_equals_adamw_decoupled_decay():
    """lambda = 1 everywhere reproduces AdamW's decoupled weight decay on a row with no gradient."""
    w = torch.nn.Parameter(torch.full((2, 2), 2.0))
    loop = LoopConfig(steps=10, lr=0.1, warmup=1, weight_decay=0.05, schedule="constant")
    rows = RowScaledEmbedding(w, np.ones(2), loop.weight_decay)
    ref = torch.nn.Parameter(torch.full((2, 2), 2.0))
    opt = torch.optim.AdamW([ref], lr=0.1, weight_decay=0.05)
    ref.grad = torch.zeros_like(ref)
    opt.step()
    rows.decay(0.1)
    assert torch.allclose(w, ref)


# ----------------------------------------------------------------------------- losses
def test_cross_lingual_loss_hand_computed():
    e = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    f = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    assert float(cross_lingual_loss(e, f)) == pytest.approx(0.5 * (2.0 + 0.0) / 2)
    with pytest.raises(ValueError):
        cross_lingual_loss(e, f[:1])


def test_cross_modal_loss_hand_computed():
    a = torch.eye(2)
    expected = math.log(1 + math.exp(-1.0))  # logits I / tau with tau = 1
    assert float(cross_modal_loss(a, a, temperature=1.0)) == pytest.approx(expected, rel=1e-5)
    loss, logs = cll_clip_loss(a, a, None, gamma_cm=0.01, gamma_cl=1.0)
    assert float(loss) == 0.0 and "L_cm" not in logs
    loss, logs = cll_clip_loss(a, torch.tensor([[0.0, 1.0], [0.0, 1.0]]), a, gamma_cm=0.5, gamma_cl=2.0, temperature=1.0)
    assert float(loss) == pytest.approx(2.0 * logs["L_cl"] + 0.5 * logs["L_cm"], rel=1e-6)


# ----------------------------------------------------------------------------- metrics
def test_continual_metrics_hand_computed():
    a = [[0.5, 0.1, 0.0], [0.4, 0.6, 0.1], [0.3, 0.5, 0.7]]
    assert average_recall(a, 1) == pytest.approx(0.5)
    assert average_recall(a) == pytest.approx((0.3 + 0.5 + 0.7) / 3)
    assert forgetting(a, 1) == 0.0
    assert forgetting(a, 2) == pytest.approx(0.1)
    assert forgetting(a) == pytest.approx(((0.5 - 0.3) + (0.6 - 0.5)) / 2)
    s = continual_summary(a)
    assert s["AR_j"][1] == pytest.approx(0.5) and s["F"] == pytest.approx(0.15)
    with pytest.raises(ValueError):
        average_recall([[1.0, 2.0]])


# ----------------------------------------------------------------------------- learner
def test_learner_grows_trains_and_keeps_images_bit_identical(tmp_path):
    from nobackfill.encoders import load_encoder

    enc = tiny_encoder()
    pixels = np.random.default_rng(0).integers(0, 255, (4, 64, 64, 3), dtype=np.uint8)
    imgs_before = enc.encode_images(pixels)
    vision = {k: v.clone() for k, v in enc.model.vision_model.state_dict().items()}
    cfg = CLLConfig(teir=True, steps=2, batch_size=4, task_vocab_size=300, lr=1e-2)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    n0 = token_embedding(enc).weight.shape[0]
    old_rows = token_embedding(enc).weight.detach().clone()
    task_tokens = task_token_set(train_task_vocab(enc.tokenizer, GREEK, 300))
    untouched = torch.tensor([t not in task_tokens for t, _ in sorted(enc.tokenizer.get_vocab().items(), key=lambda kv: kv[1])])
    assert untouched.any() and not untouched.all()
    info = learner.learn(LanguageTask("el", GREEK, ENGLISH, images=imgs_before[np.arange(12) % 4]), tmp_path / "w")
    assert info["vocab_after"] > n0 and info["lambda"]["one"] == info["vocab_after"] - n0
    w = token_embedding(enc).weight.detach()
    assert info["lambda"]["zero"] == int(untouched.sum())
    assert torch.equal(w[:n0][untouched], old_rows[untouched])  # V_{t,old}: lambda = 0
    assert not torch.equal(w[:n0][~untouched], old_rows[~untouched])
    assert np.array_equal(enc.encode_images(pixels), imgs_before)
    assert all(torch.equal(v, enc.model.vision_model.state_dict()[k]) for k, v in vision.items())
    assert learner.counts.shape == (w.shape[0],) and learner.counts.min() >= 1
    out = learner.save(tmp_path / "model")
    loaded = load_encoder(out)
    assert token_embedding(loaded).weight.shape == w.shape
    assert np.array_equal(loaded.encode_images(pixels), imgs_before)
    state, counts = load_lingual_state(out)
    assert state["learned"] == ["en", "el"] and np.array_equal(counts, learner.counts)
    with pytest.raises(ValueError, match="already learned"):
        learner.learn(LanguageTask("el", GREEK, ENGLISH), tmp_path / "w")


@pytest.mark.parametrize("method", ["oewc", "er", "der"])
def test_baselines_run_two_tasks(tmp_path, method):
    enc = tiny_bert()
    cfg = CLLConfig(method=method, teir=True, steps=2, batch_size=4, task_vocab_size=150, memory_size=6, ewc_batches=2)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path)
    learner.learn(LanguageTask("el", GREEK, ENGLISH), tmp_path)
    if method == "oewc":
        assert learner.method.fisher is not None and learner.method.fisher.shape == token_embedding(enc).weight.shape
    else:
        assert len(learner.method.buffer) == 6
        if method == "der":
            assert all(s is not None for s in learner.method.buffer.stored)


def test_token_counts_and_task_validation():
    enc = tiny_bert()
    n = len(enc.tokenizer.get_vocab())
    c = token_counts(enc.tokenizer, ENGLISH[:2], n)
    assert c.sum() == sum(len(x) for x in enc.tokenizer(ENGLISH[:2])["input_ids"])
    with pytest.raises(ValueError):
        LanguageTask("de", GERMAN, ENGLISH[:2])
    with pytest.raises(ValueError):
        CLLConfig(method="nope")
    assert freeze_all_but_token_embeddings(enc).requires_grad
    assert sum(p.requires_grad for p in enc.model.parameters()) == 1


# ----------------------------------------------------------------------------- LoRA baseline
@pytest.mark.parametrize("make", [tiny_encoder, tiny_bert])
def test_task_lora_adapters_switch_by_language(make, tmp_path):
    from nobackfill.lingual.adapters import add_task_lora, use_language

    enc = make()
    before = enc.encode_texts(ENGLISH[:3])
    vision = None if not hasattr(enc.model, "vision_model") else {k: v.clone() for k, v in enc.model.vision_model.state_dict().items()}
    cfg = CLLConfig(method="lora", teir=True, steps=3, batch_size=4, task_vocab_size=400, lr=5e-2)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path)
    names = [n for n, _ in enc.model.named_parameters() if "lora_" in n]
    assert names and all("vision" not in n for n in names)
    use_language(enc, "en")  # no English adapter: the base text tower
    sid_en = enc.space_id
    base_en = enc.encode_texts(ENGLISH[:3])
    use_language(enc, "de")
    assert enc.space_id != sid_en
    assert not np.allclose(enc.encode_texts(ENGLISH[:3]), base_en, atol=1e-4)  # the trained adapter acts
    use_language(enc, "xx")  # unknown language: adapters off again
    assert np.array_equal(enc.encode_texts(ENGLISH[:3]), base_en)
    assert before.shape == base_en.shape
    if vision is not None:
        assert all(torch.equal(v, enc.model.vision_model.state_dict()[k]) for k, v in vision.items())
    assert add_task_lora(enc, "fr")  # a second adapter


# ----------------------------------------------------------------------------- prompt-tuning baseline
@pytest.mark.parametrize("make", [tiny_encoder, tiny_bert])
def test_soft_prompt_is_inserted_after_the_first_token_and_dropped_before_pooling(make):
    import copy

    from nobackfill.lingual.adapters import use_language
    from nobackfill.lingual.prompts import add_task_prompt, text_tower

    enc = make()
    en_before = enc.encode_texts(ENGLISH[:3])
    n0 = token_embedding(enc).weight.shape[0]
    ids = add_task_prompt(enc, "de", 3, mean=0.0, std=0.5, generator=torch.Generator().manual_seed(0))
    assert ids.tolist() == [n0, n0 + 1, n0 + 2] and token_embedding(enc).weight.shape[0] == n0 + 3
    batch = enc.tokenize(ENGLISH[:2])  # (short enough for the tiny towers' positions)
    with torch.no_grad():
        prompted = enc.text_features(**batch)  # "de" is active
        # by hand: the ids with the prompt after position 0, through the tower with the prompt off
        use_language(enc, "en")
        x, m = batch["input_ids"], batch["attention_mask"]
        x_p = torch.cat([x[:, :1], ids.expand(2, -1), x[:, 1:]], 1)
        m_p = torch.cat([m[:, :1], torch.ones(2, 3, dtype=m.dtype), m[:, 1:]], 1)
        if hasattr(enc.model, "text_model"):  # CLIP: EOS pooling inside the tower, then the projection
            want = enc.model.text_projection(text_tower(enc)(input_ids=x_p, attention_mask=m_p).pooler_output)
        else:  # MiniLM: mean over the text's own positions
            hs = text_tower(enc)(input_ids=x_p, attention_mask=m_p).last_hidden_state
            hs = torch.cat([hs[:, :1], hs[:, 4:]], 1)
            want = (hs * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True)
        plain = enc.text_features(**batch)
    torch.testing.assert_close(prompted, want)
    assert not torch.allclose(prompted, plain, atol=1e-4)
    assert np.array_equal(enc.encode_texts(ENGLISH[:3]), en_before)  # English: the plain tower
    sid_en = enc.space_id
    use_language(enc, "de")
    assert enc.space_id != sid_en
    twin = copy.deepcopy(enc)  # the hooks travel with a copy
    np.testing.assert_allclose(twin.encode_texts(GERMAN[:2]), enc.encode_texts(GERMAN[:2]), atol=1e-6)
    with pytest.raises(ValueError, match="already has a prompt"):
        add_task_prompt(enc, "de", 3, mean=0.0, std=0.02)
    assert enc.encode_texts(["wort " * 200]).shape == (1, en_before.shape[1])  # over-long text: cut to fit


def test_soft_prompt_fit_keeps_the_final_token():
    from nobackfill.lingual.prompts import _fit

    ids = torch.tensor([[2, 5, 6, 7, 8, 1], [2, 5, 1, 0, 0, 0]])
    mask = (ids > 0).long()
    out, m = _fit(ids, mask, 4)
    assert out.tolist() == [[2, 5, 6, 1], [2, 5, 1, 0]] and m.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_prompt_baseline_learns_its_prompt_and_teir_freezes_earlier_prompts(tmp_path):
    from nobackfill.lingual.prompts import soft_prompt

    enc = tiny_bert()
    cfg = CLLConfig(method="prompt", teir=True, steps=3, batch_size=4, task_vocab_size=150, lr=5e-2, prompt_length=4)
    learner = ContinualLearner(enc, cfg, ENGLISH)
    mu, sigma = embedding_stats(token_embedding(enc).weight)
    learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path)
    de = soft_prompt(enc).ids["de"]
    assert de.tolist() == list(range(token_embedding(enc).weight.shape[0] - 4, token_embedding(enc).weight.shape[0]))
    de_rows = token_embedding(enc).weight.detach()[de].clone()
    w = freeze_all_but_token_embeddings(enc)
    enc.text_features(**enc.tokenize(GERMAN[:2])).sum().backward()  # "de" active: its prompt gets gradient
    assert w.grad[de].abs().sum(1).min() > 0
    w.grad = None
    info = learner.learn(LanguageTask("el", GREEK, ENGLISH), tmp_path)
    w = token_embedding(enc).weight.detach()
    el = soft_prompt(enc).ids["el"]
    assert info["vocab_after"] == w.shape[0] == int(el[-1]) + 1 and info["lambda"]["one"] >= 4
    assert torch.equal(w[de], de_rows)  # TEIR: lambda = 0 for the earlier language's prompt
    assert de_rows.std() > 0.5 * sigma  # TEIR initialisation of the prompt rows, not N(0, 0.02^2)


def test_teir_used_task_tokens_give_every_used_row_a_nonzero_lambda(tmp_path):
    """``teir_task_tokens="used"``: no row that the task's tokenised text uses is frozen (lambda 0);
    the default ("vocab", the paper's sets) freezes exactly the old rows outside V_hat_t."""
    from nobackfill.lingual.sequence import method_config
    from nobackfill.lingual.vocab import token_counts

    seen = {}
    for mode in ("vocab", "used"):
        enc = tiny_encoder()
        learner = ContinualLearner(enc, CLLConfig(teir=True, teir_task_tokens=mode, steps=1, batch_size=4,
                                                  task_vocab_size=300), ENGLISH)
        n0 = token_embedding(enc).weight.shape[0]
        before = token_embedding(enc).weight.detach().clone()
        info = learner.learn(LanguageTask("de", GERMAN, ENGLISH), tmp_path / mode)
        used = np.flatnonzero(token_counts(enc.tokenizer, GERMAN, info["vocab_after"])[:n0])
        moved = (token_embedding(enc).weight.detach()[:n0] != before).any(dim=1).numpy()
        seen[mode] = (info["lambda"]["zero"], used, moved)
    zero_vocab, used, moved = seen["vocab"]
    assert not moved[used].all()  # the paper's sets: some rows the text uses stay frozen
    zero_used, used_u, moved_u = seen["used"]
    assert np.array_equal(used, used_u) and zero_used < zero_vocab
    assert moved_u[used_u].all()  # every used old row trains (scaled by 1/(c+1))
    assert method_config("cll_clip_teir_used", CLLConfig()).teir_task_tokens == "used"
    assert method_config("cll_clip_teir_used", CLLConfig()).label == "cll_clip_teir_update_used"
    with pytest.raises(ValueError, match="teir_task_tokens"):
        CLLConfig(teir_task_tokens="all")
