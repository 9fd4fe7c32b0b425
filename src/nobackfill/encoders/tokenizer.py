"""BPE tokenizers trained with Hugging Face ``tokenizers`` (byte-level, lower-cased, CLIP-style
start/end tokens), wrapped as ``PreTrainedTokenizerFast`` so they save and load like any HF
tokenizer. Byte-level BPE covers every script (Cyrillic, Greek, Han) without unknown tokens.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|startoftext|>", "<|endoftext|>", "<|pad|>"
#: ids 0, 1, 2 in this order. EOS must not get id 2: ``transformers``' CLIP text model treats
#: ``eos_token_id == 2`` as a legacy config and pools the token with the *largest id* instead of the
#: EOS token (so with EOS = 2 the text embedding ignored every word after the max-id token).
SPECIAL_TOKENS = (PAD, EOS, BOS)


def bpe_trainer(vocab_size: int, min_frequency: int = 2, special_tokens: Iterable[str] = SPECIAL_TOKENS):
    """The trainer used for every nobackfill BPE vocabulary (base and per-language, Yang et al. 2024)."""
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )


def new_bpe_model() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with our normaliser and pre-tokeniser."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024, max_length: int = 64) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer on ``texts``; every encoding is ``BOS ... EOS``, padded with PAD."""
    tok = new_bpe_model()
    tok.train_from_iterator(texts, trainer=bpe_trainer(vocab_size))
    return wrap_tokenizer(tok, max_length)


def wrap_tokenizer(tok: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, bos), (EOS, eos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        model_max_length=max_length, padding_side="right", truncation_side="right",
    )
