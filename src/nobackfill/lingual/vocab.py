"""Per-task vocabularies and their union (CLL-CLIP's expandable vocabulary, Sec. "CLL-CLIP" and
Fig. 2a of the CLL-CLIP paper, Yang et al. 2024).

For task ``t`` a vocabulary ``V_hat_t`` is trained on the task's texts with Hugging Face
``tokenizers`` the way the base tokenizer was trained (byte-level BPE for our CLIP models, see
:mod:`nobackfill.encoders.tokenizer`; WordPiece for BERT/MiniLM). The model's vocabulary becomes
``V_t = V_{t-1} U V_hat_t``: every old token keeps its id (so old embedding rows keep their
meaning), tokens new to the model get the next free ids, and the special tokens (CLIP's EOS id 1,
which CLIP pooling looks for; BERT's [CLS]/[SEP]) are untouched.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, models, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..encoders.tokenizer import bpe_trainer, new_bpe_model

#: the paper's per-task vocabulary size (Implementation Details)
PAPER_TASK_VOCAB = 10_000


def tokenizer_json(tokenizer: PreTrainedTokenizerBase) -> dict:
    """The ``tokenizers`` JSON of a fast HF tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__}: a fast (tokenizers-backed) tokenizer is needed")
    return json.loads(backend.to_str())


def model_type(tokenizer: PreTrainedTokenizerBase) -> str:
    """``"BPE"`` or ``"WordPiece"`` (the only vocabularies CLL-CLIP expands here)."""
    kind = tokenizer_json(tokenizer)["model"]["type"]
    if kind not in ("BPE", "WordPiece"):
        raise ValueError(f"cannot expand a {kind} vocabulary (BPE and WordPiece are supported)")
    return kind


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def train_task_vocab(base: PreTrainedTokenizerBase, texts: Iterable[str], vocab_size: int,
                     min_frequency: int = 2) -> Tokenizer:
    """``V_hat_t``: a tokenizer of the base's kind trained on ``texts`` (same normaliser and
    pre-tokeniser as the base, same special tokens)."""
    kind = model_type(base)
    specials = [str(t) for t in base.all_special_tokens]
    if kind == "BPE":
        tok = new_bpe_model()
        trainer = bpe_trainer(vocab_size, min_frequency=min_frequency, special_tokens=_ordered_specials(base))
    else:
        j = tokenizer_json(base)
        tok = Tokenizer(models.WordPiece(unk_token=str(base.unk_token),
                                         continuing_subword_prefix=j["model"].get("continuing_subword_prefix", "##")))
        prefix = j["model"].get("continuing_subword_prefix", "##")
        ref = Tokenizer.from_str(json.dumps(j))
        tok.normalizer = ref.normalizer
        tok.pre_tokenizer = ref.pre_tokenizer
        texts = list(texts)
        symbols = continuation_symbols(tok, texts, prefix, specials)
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials + symbols, show_progress=False,
                                            continuing_subword_prefix=prefix)
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def continuation_symbols(tok: Tokenizer, texts: Sequence[str], prefix: str, exclude: Sequence[str] = ()) -> list[str]:
    """Every ``prefix + char`` the WordPiece trainer will create (a character after the first of
    a pre-tokenised word), sorted. The trainer numbers these symbols in the order it meets them
    while iterating a randomly seeded hash map of words, and breaks ties between equally frequent
    merges by symbol id, so its vocabulary changed between runs (+-2 tokens). Registering them up
    front, in sorted order, as the trainer's special tokens fixes their ids: training becomes
    reproducible (they would be in the vocabulary anyway)."""
    chars: set[str] = set()
    for text in texts:
        norm = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
        words = tok.pre_tokenizer.pre_tokenize_str(norm) if tok.pre_tokenizer is not None else [(norm, None)]
        for word, _ in words:
            chars.update(word[1:])
    skip = set(exclude)
    return [s for s in (prefix + c for c in sorted(chars)) if s not in skip]


def _ordered_specials(base: PreTrainedTokenizerBase) -> list[str]:
    """Special tokens in the base's id order (keeps CLIP's PAD 0, EOS 1, BOS 2)."""
    vocab = base.get_vocab()
    return sorted({str(t) for t in base.all_special_tokens}, key=lambda t: vocab.get(t, 1 << 30))


def task_token_set(task_vocab: Tokenizer) -> set[str]:
    return set(task_vocab.get_vocab().keys())


@dataclass
class MergedVocab:
    """``V_t`` as a tokenizer plus what changed: ``new_tokens`` got ids ``new_ids``."""

    tokenizer: PreTrainedTokenizerBase
    new_tokens: list[str]
    new_ids: list[int]
    old_size: int

    @property
    def size(self) -> int:
        return self.old_size + len(self.new_tokens)


def merge_vocab(base: PreTrainedTokenizerBase, task_vocab: Tokenizer, n_rows: int | None = None) -> MergedVocab:
    """``V_t = V_{t-1} U V_hat_t``: old ids unchanged, new tokens appended (ids from ``n_rows``,
    the embedding table's current height, so ids always index a row). BPE merges: the old
    merges keep their ranks; the task's merges not yet known follow in the task's order."""
    j = tokenizer_json(base)
    vocab: dict[str, int] = j["model"]["vocab"]
    start = max(max(vocab.values()) + 1, n_rows or 0)
    task = json.loads(task_vocab.to_str())["model"]
    task_tokens = sorted(task["vocab"].items(), key=lambda kv: kv[1])
    new_tokens = [t for t, _ in task_tokens if t not in vocab]
    new_ids = list(range(start, start + len(new_tokens)))
    for t, i in zip(new_tokens, new_ids):
        vocab[t] = i
    if j["model"]["type"] == "BPE":
        old = _merge_pairs(j["model"]["merges"])
        known = set(old)
        extra = [m for m in _merge_pairs(task["merges"]) if m not in known]
        j["model"]["merges"] = [list(m) for m in old + extra]
    merged = rebuild_tokenizer(base, j)
    return MergedVocab(merged, new_tokens, new_ids, old_size=start)


def rebuild_tokenizer(base: PreTrainedTokenizerBase, tokenizer_json_obj: dict) -> PreTrainedTokenizerBase:
    """An HF tokenizer of ``base``'s class and settings whose backend is ``tokenizer_json_obj``
    (saved and re-opened, so it round-trips exactly like a shipped model's tokenizer)."""
    Tokenizer.from_str(json.dumps(tokenizer_json_obj))  # validate early with a tokenizers error
    with tempfile.TemporaryDirectory(prefix="nobackfill-vocab-") as d:
        base.save_pretrained(d)
        for f in ("vocab.txt", "vocab.json", "merges.txt"):
            (Path(d) / f).unlink(missing_ok=True)
        (Path(d) / "tokenizer.json").write_text(json.dumps(tokenizer_json_obj))
        tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    tok.model_max_length = base.model_max_length
    return tok


def oracle_vocab(base: PreTrainedTokenizerBase, corpora: Sequence[Sequence[str]], vocab_size: int,
                 n_rows: int | None = None) -> MergedVocab:
    """The oracle vocabulary (Table 3, setting 7): one vocabulary trained on the corpora of all
    languages at once, merged into the base before the first task."""
    texts = [t for corpus in corpora for t in corpus]
    return merge_vocab(base, train_task_vocab(base, texts, vocab_size), n_rows=n_rows)


def token_counts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], size: int,
                 batch: int = 4096) -> np.ndarray:
    """How many times each id occurs in ``texts`` tokenised by ``tokenizer`` (special tokens
    included), as a float64 vector of length ``size``."""
    counts = np.zeros(size, np.float64)
    texts = list(texts)
    for s in range(0, len(texts), batch):
        for ids in tokenizer(texts[s:s + batch], truncation=False, verbose=False)["input_ids"]:
            np.add.at(counts, np.asarray(ids, dtype=np.int64), 1.0)
    return counts


def ids_of(tokenizer: PreTrainedTokenizerBase, tokens: Iterable[str]) -> np.ndarray:
    vocab = tokenizer.get_vocab()
    return np.array(sorted(vocab[t] for t in tokens if t in vocab), dtype=np.int64)


__all__ = ["train_task_vocab", "merge_vocab", "MergedVocab", "oracle_vocab", "token_counts", "model_type",
           "tokenizer_json", "rebuild_tokenizer", "task_token_set", "ids_of", "continuation_symbols",
           "PAPER_TASK_VOCAB"]
