"""The Hugging Face CLIP dual encoder: ``transformers.CLIPModel`` + a fast tokenizer +
Pillow/NumPy preprocessing. Loads any local HF CLIP directory (e.g. a downloaded
``openai/clip-vit-base-patch32``) and the tiny world models the project trains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import CLIPModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

from ..progress import progress_bar
from .base import DualEncoder, ImageInput, TokenOutput, l2_normalise
from .hf import NOBACKFILL_META, HFEncoderMixin, load_tokenizer
from .preprocess import ImagePreprocessor


class CLIPDualEncoder(HFEncoderMixin, DualEncoder):
    """A ``CLIPModel`` behind the :class:`DualEncoder` interface."""

    kind = "hf-clip"
    default_name = "clip"

    def __init__(self, model: CLIPModel, tokenizer: PreTrainedTokenizerBase,
                 preprocessor: ImagePreprocessor | None = None, meta: dict | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        size = model.config.vision_config.image_size
        self.preprocessor = preprocessor or ImagePreprocessor(size=size, crop=size)
        self.meta = dict(meta or {})
        self._space_id: str | None = None
        self.max_length = min(int(getattr(tokenizer, "model_max_length", 77) or 77),
                              model.config.text_config.max_position_embeddings)

    # ----------------------------------------------------------------- identity
    @property
    def embed_dim(self) -> int:
        return int(self.model.config.projection_dim)

    def _fingerprint_extra(self) -> dict:
        return {"pre": vars(self.preprocessor)}

    # ----------------------------------------------------------------- differentiable features
    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Projected (not normalised) image embeddings; differentiable."""
        return self.model.get_image_features(pixel_values=pixel_values).pooler_output

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Projected (not normalised) text embeddings; differentiable."""
        return self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output

    # ----------------------------------------------------------------- inference
    @torch.inference_mode()
    def encode_images(self, images: Sequence[ImageInput] | np.ndarray, batch_size: int = 128,
                      progress: bool = False) -> np.ndarray:
        out = []
        n = len(images)
        with progress_bar(progress, "encode images", n) as advance:
            for s in range(0, n, batch_size):
                pv = self.preprocessor(images[s:s + batch_size])
                out.append(l2_normalise(self.image_features(pv)).float().numpy())
                advance(min(batch_size, n - s))
        return np.concatenate(out) if out else np.zeros((0, self.embed_dim), np.float32)

    def encode_texts(self, texts: Sequence[str], batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """Unit-norm float32 ``(N, embed_dim)``. Texts are batched longest-first (CLIP's causal
        mask and EOS pooling ignore padding, so less padding is pure savings); input order kept."""
        return self._encode_texts_sorted(texts, batch_size, progress)

    @torch.inference_mode()
    def image_tokens(self, images: Sequence[ImageInput] | np.ndarray) -> TokenOutput:
        """Patch tokens (CLS excluded) through post-LayerNorm and the visual projection (FILIP)."""
        vm = self.model.vision_model
        hs = vm(pixel_values=self.preprocessor(images)).last_hidden_state[:, 1:]
        tok = l2_normalise(self.model.visual_projection(vm.post_layernorm(hs)))
        return TokenOutput(tok.float(), torch.ones(tok.shape[:2], dtype=torch.bool))

    @torch.inference_mode()
    def text_tokens(self, texts: Sequence[str]) -> TokenOutput:
        """Word tokens through the final LayerNorm and text projection; BOS, EOS, padding masked."""
        enc = self.tokenize(texts)
        hs = self.model.text_model(**enc).last_hidden_state
        tok = l2_normalise(self.model.text_projection(hs))
        ids = enc["input_ids"]
        special = torch.zeros_like(ids, dtype=torch.bool)
        for t in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id):
            if t is not None:
                special |= ids == t
        return TokenOutput(tok.float(), enc["attention_mask"].bool() & ~special)

    # ----------------------------------------------------------------- persistence
    def save(self, directory: str | Path, weights_dtype: str = "float32") -> Path:
        """Write an HF-style directory (model, tokenizer, preprocessor config) atomically.

        ``weights_dtype="float16"`` halves the file: the in-memory weights are first rounded to
        float16 values, so the saved-and-reloaded (float32) model equals this one exactly."""
        if weights_dtype == "float16":
            self.round_weights_to_float16()
        meta = dict(self.meta, kind=self.kind, space_id=self.space_id, embed_dim=self.embed_dim)
        return self._save_dir(directory, meta, write_extra=self.preprocessor.save, weights_dtype=weights_dtype)

    @classmethod
    def load(cls, directory: str | Path) -> "CLIPDualEncoder":
        """Load a local HF CLIP directory (ours, or e.g. ``openai/clip-vit-base-patch32``)."""
        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory}: not a model directory (no config.json)")
        model = CLIPModel.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
        tokenizer = load_tokenizer(directory, model.config.text_config.vocab_size)
        pre = ImagePreprocessor.from_dir(directory, model.config.vision_config.image_size)
        meta_path = directory / NOBACKFILL_META
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"name": directory.name}
        meta.pop("space_id", None)
        meta.setdefault("name", directory.name)
        return cls(model, tokenizer, pre, meta)
