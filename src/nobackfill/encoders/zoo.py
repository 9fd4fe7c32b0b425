"""The model zoo: architectures as small TOML files (``zoo/<preset>.toml``) and one factory.

``create_model("world-new", tokenizer)`` builds a freshly initialised :class:`CLIPDualEncoder`;
the ``[train]`` table of the same file holds the recipe that produced the shipped checkpoint.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
from transformers import CLIPConfig, CLIPModel, PreTrainedTokenizerBase

from ..config import ConfigError, from_dict, read_mapping
from . import list_presets
from .clip import CLIPDualEncoder
from .preprocess import ImagePreprocessor


@dataclass
class ModelSpec:
    """Architecture of a tiny CLIP (fields map onto ``CLIPTextConfig`` / ``CLIPVisionConfig``)."""

    embed_dim: int = 128
    image_size: int = 64
    patch_size: int = 8
    vision_width: int = 128
    vision_layers: int = 4
    vision_heads: int = 4
    text_width: int = 128
    text_layers: int = 3
    text_heads: int = 4
    max_length: int = 40
    vocab_size: int = 768
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        small = [f"{k}={v!r}" for k, v in vars(self).items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if small:  # (a width of -3 failed deep in torch, after --show-config had printed it)
            raise ValueError(f"every model field is a whole number >= 1, got {', '.join(small)}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        for w, h, n in ((self.vision_width, self.vision_heads, "vision"), (self.text_width, self.text_heads, "text")):
            if w % h:
                raise ValueError(f"{n}_width {w} is not divisible by {n}_heads {h}")


@dataclass
class RecipeSpec:
    """How a preset is trained (``nobackfill train`` defaults)."""

    steps: int = 3000
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 200
    weight_decay: float = 0.05
    save_dtype: str = "float32"  # "float16" halves the shipped file (weights rounded before saving)
    shapes: list[str] | None = None
    colours: list[str] | None = None

    def __post_init__(self) -> None:
        """What a run would refuse (or fail on) later, refused as the recipe is built (``--show-config`` too)."""
        if self.steps < 1 or self.batch_size < 2 or self.warmup < 0:  # a contrastive batch needs negatives
            raise ValueError(f"steps must be >= 1, batch_size >= 2 and warmup >= 0, got {self.steps}, "
                             f"{self.batch_size}, {self.warmup}")
        if not (math.isfinite(self.lr) and self.lr > 0) or not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"lr must be finite and > 0 and weight_decay finite and >= 0, got {self.lr}, "
                             f"{self.weight_decay}")
        if self.save_dtype not in ("float32", "float16"):
            raise ValueError(f"save_dtype must be 'float32' or 'float16', got {self.save_dtype!r}")


@dataclass
class Preset:
    name: str
    model: ModelSpec = field(default_factory=ModelSpec)
    train: RecipeSpec = field(default_factory=RecipeSpec)


def shipped(path: str | Path) -> Path:
    """``path`` as given where it exists; else, for a relative path, the same path in the project's
    folder when that holds it (a default such as ``models/world-new`` names the shipped model, whatever
    the working directory: trial R saw such defaults fail outside the repository); else as given
    (its own error names it)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    project = Path(__file__).resolve().parents[3] / p  # src/nobackfill/encoders/zoo.py -> the project
    return project if project.exists() else p


def _no_preset(name: str) -> str:
    """Why ``name`` is no preset: a path (a '/' or a config suffix, trial Y: ``/nope.toml`` was called an
    unknown preset name) that is no file, or a name the zoo does not hold."""
    zoo = f"zoo presets: {', '.join(list_presets())}"
    if "/" in name or "\\" in name or name.endswith((".toml", ".yaml", ".yml")):
        p = Path(name)
        why = "is a folder, not a preset file" if p.is_dir() else "no such file"
        return f"preset {name}: {why} (a preset is a zoo name or a TOML file of the same layout; {zoo})"
    return f"unknown preset {name!r}; {zoo}"


def get_preset(name_or_path: str | Path) -> Preset:
    """A preset by zoo name (``world-new``) or path to a TOML file of the same layout."""
    p = Path(name_or_path)
    if not p.is_file():
        if str(name_or_path) not in list_presets():
            raise ConfigError(_no_preset(str(name_or_path)))
        p = Path(str(resources.files(__package__).joinpath("zoo", f"{name_or_path}.toml")))
    data = read_mapping(p)
    unknown = set(data) - {"model", "train"}
    if unknown:
        raise ConfigError(f"{p}: unknown section(s) {sorted(unknown)}; expected [model] and [train]")
    return Preset(name=p.stem, model=from_dict(ModelSpec, data.get("model", {}), f"{p} [model]"),
                  train=from_dict(RecipeSpec, data.get("train", {}), f"{p} [train]"))


def clip_config(spec: ModelSpec, tokenizer: PreTrainedTokenizerBase) -> CLIPConfig:
    if tokenizer.eos_token_id == 2:
        # transformers' CLIPTextTransformer pools argmax(input_ids) (not the EOS position) when
        # eos_token_id == 2 (legacy openai configs, where EOS is the largest id)
        raise ValueError("tokenizer EOS id 2 triggers CLIP's legacy argmax pooling; "
                         "build tokenizers with nobackfill.encoders.tokenizer (EOS id 1)")
    text = dict(vocab_size=len(tokenizer), hidden_size=spec.text_width, intermediate_size=spec.mlp_ratio * spec.text_width,
                num_hidden_layers=spec.text_layers, num_attention_heads=spec.text_heads,
                max_position_embeddings=spec.max_length, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                projection_dim=spec.embed_dim)
    vision = dict(hidden_size=spec.vision_width, intermediate_size=spec.mlp_ratio * spec.vision_width,
                  num_hidden_layers=spec.vision_layers, num_attention_heads=spec.vision_heads,
                  image_size=spec.image_size, patch_size=spec.patch_size, projection_dim=spec.embed_dim)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=spec.embed_dim)


def create_model(preset: str | Preset, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> CLIPDualEncoder:
    """A freshly initialised world CLIP of ``preset`` with ``tokenizer`` (seeded init)."""
    preset = preset if isinstance(preset, Preset) else get_preset(preset)
    torch.manual_seed(seed)
    model = CLIPModel(clip_config(preset.model, tokenizer))
    world_mean, world_std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    pre = ImagePreprocessor(size=preset.model.image_size, crop=preset.model.image_size, mean=world_mean, std=world_std)
    return CLIPDualEncoder(model, tokenizer, pre, meta={"name": preset.name, "preset": preset.name})
