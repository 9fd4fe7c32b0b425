"""Plumbing shared by every Hugging Face encoder: space-id caching, tokenisation, and the
atomic save of a model directory."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..progress import progress_bar

from .fingerprint import fingerprint

NOBACKFILL_META = "nobackfill.json"


class HFEncoderMixin:
    """Needs ``self.model`` (a ``PreTrainedModel``), ``self.tokenizer``, ``self.meta``,
    ``self.max_length`` and ``self._space_id``; subclasses add what else defines their space
    via :meth:`_fingerprint_extra`."""

    kind: str
    default_name: str = "model"

    def _fingerprint_extra(self) -> dict[str, Any]:
        return {}

    @property
    def space_id(self) -> str:
        if self._space_id is None:
            extra = {"vocab": sorted(self.tokenizer.get_vocab().items()), **self._fingerprint_extra()}
            self._space_id = fingerprint(self.kind, self.model.config.to_dict(), self.model.state_dict(), extra=extra)
        return self._space_id

    def invalidate_space_id(self) -> None:
        """Call after changing weights in place (training) so the id is recomputed."""
        self._space_id = None

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or self.model.config._name_or_path or self.default_name)

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        if isinstance(texts, str):
            raise TypeError("encode_texts expects a sequence of strings, not one string")
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def truncated(self, texts: Sequence[str]) -> list[int]:
        """Indexes of the ``texts`` longer than the model's ``max_length`` tokens (embedded truncated)."""
        # verbose=False: no "longer than the specified maximum" warning, measuring them is the point
        lengths = [len(ids) for ids in self.tokenizer(list(texts), truncation=False, verbose=False)["input_ids"]]
        return [i for i, n in enumerate(lengths) if n > self.max_length]

    def _pad(self, seqs: list[list[int]]) -> dict[str, torch.Tensor]:
        """Right-pad already tokenised sequences into one batch."""
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[i, :len(s)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    @torch.inference_mode()
    def _encode_texts_sorted(self, texts: Sequence[str], batch_size: int, progress: bool) -> np.ndarray:
        """``l2(text_features)`` of every text: tokenised once, batched longest-first (less
        padding), rows returned in the input order."""
        if isinstance(texts, str):
            raise TypeError("encode_texts expects a sequence of strings, not one string")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        texts = list(texts)
        n = len(texts)
        out = np.zeros((n, self.embed_dim), np.float32)
        if n == 0:
            return out
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        order = sorted(range(n), key=lambda i: -len(ids[i]))  # stable: ties keep input order
        with progress_bar(progress, "encode texts", n) as advance:
            for s in range(0, n, batch_size):
                idx = order[s:s + batch_size]
                feats = self.text_features(**self._pad([ids[i] for i in idx]))
                out[idx] = torch.nn.functional.normalize(feats, dim=-1).float().numpy()
                advance(len(idx))
        return out

    @torch.no_grad()
    def round_weights_to_float16(self) -> None:
        """Round every floating-point weight to the nearest float16 value (kept as float32)."""
        for t in self.model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.half().float())
        self.invalidate_space_id()

    def _save_dir(self, directory: str | Path, meta: dict[str, Any],
                  write_extra: Callable[[Path], None] | None = None, weights_dtype: str = "float32") -> Path:
        """Write model, tokenizer, ``nobackfill.json`` (+ ``write_extra``) atomically; weights are
        stored as ``weights_dtype`` ("float32" or "float16"; loading always gives float32)."""
        if weights_dtype not in ("float32", "float16"):
            raise ValueError(f"weights_dtype must be 'float32' or 'float16', got {weights_dtype!r}")

        def write(tmp: Path) -> None:
            if weights_dtype == "float16":
                self.model.to(torch.float16).save_pretrained(tmp, safe_serialization=True)
                self.model.to(torch.float32)
            else:
                self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            if write_extra is not None:
                write_extra(tmp)
            (tmp / NOBACKFILL_META).write_text(json.dumps(meta, indent=2))

        return atomic_model_dir(directory, write)


def atomic_model_dir(directory: str | Path, write: Callable[[Path], None], commit_last: str = NOBACKFILL_META) -> Path:
    """Run ``write(tmp)`` into a temporary sibling folder, then move it into place.

    A new directory appears whole (one rename). An existing one keeps its other files (training
    logs); ours are replaced one by one with ``os.replace``, ``commit_last`` (the manifest:
    ``nobackfill.json`` for models, ``upgrade.json`` for upgrades) last, so a reader never sees a
    half-written file."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    os.chmod(tmp, 0o755)
    try:
        write(tmp)
        for f in tmp.rglob("*"):
            os.chmod(f, 0o755 if f.is_dir() else 0o644)
        if directory.exists():
            for f in sorted(tmp.rglob("*"), key=lambda f: (f.name == commit_last, len(f.parts))):
                if f.is_dir():
                    continue
                dest = directory / f.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


class TokenizerMissing(ValueError):
    """A model directory whose tokenizer files are missing or incomplete: the message names them."""


#: the files a Hugging Face tokenizer is read from (a fast tokenizer's one file, or its slow parts)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer_config.json")


def load_tokenizer(directory: str | Path, vocab_size: int) -> Any:
    """The tokenizer of the model directory ``directory`` (whose text tower has ``vocab_size``
    tokens). Refused (:class:`TokenizerMissing`) when it cannot be read, or when it holds under a
    tenth of the model's tokens: transformers builds a 2-token tokenizer from a folder holding only
    ``config.json`` and the weights, and every text then embeds to one vector (trial W). A model's
    embedding table may be larger than its tokenizer (padded, or sized for a benchmark: ``bench
    serve``'s B/32-sized tower holds 1,000 rows for the world's 391 tokens, and a half was refused)."""
    from transformers import AutoTokenizer

    directory = Path(directory)
    present = [f for f in TOKENIZER_FILES if (directory / f).is_file()]
    need = "tokenizer.json, or vocab.json + merges.txt (CLIP) or vocab.txt (BERT)"
    held = f"it holds {', '.join(present)}" if present else "it holds no tokenizer file"
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise TokenizerMissing(f"{directory}: its tokenizer cannot be read ({held}; {type(e).__name__}: "
                               f"{str(e).splitlines()[0][:200]}): a model directory needs {need}") from None
    if len(tokenizer) < max(3, int(vocab_size) // 10):
        raise TokenizerMissing(f"{directory}: its tokenizer holds {len(tokenizer)} tokens for a text tower of "
                               f"{vocab_size} ({held}): copy the tokenizer files with the weights: {need}")
    return tokenizer
