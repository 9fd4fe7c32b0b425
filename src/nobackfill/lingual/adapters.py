"""Task-specific LoRA for the LoRA baseline of the CLL-CLIP paper (Yang et al. 2024, Reproducibility: LoRA
on the key and value projections of the text tower's self-attention, rank 8, scaling 8; task
identity needed at inference). One peft adapter per language; :func:`use_language` switches the
text tower to a language's adapter (or to none, for English and unlearned languages) and gives the
encoder a space id of its own per adapter, so cached embeddings never mix adapters.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from .base import LingualMethod, Tensors, register

#: CLIP text tower k/v projections (never the vision tower) or BERT self-attention key/value
LORA_TARGETS = r"(.*text_model\.encoder\.layers\.\d+\.self_attn\.(k_proj|v_proj)|(.*\.)?encoder\.layer\.\d+\.attention\.self\.(key|value))$"


def _lora_layers(model: torch.nn.Module) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def add_task_lora(encoder, name: str, rank: int = 8, alpha: int = 8, seed: int = 0) -> list[torch.nn.Parameter]:
    """Inject a LoRA adapter ``name`` into the text tower, make it the active one, and return its
    parameters (B starts at zero, so the model's outputs are unchanged until it trains)."""
    from peft import LoraConfig, inject_adapter_in_model

    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings():  # one adapter per language is the point here
            warnings.filterwarnings("ignore", message="Already found a `peft_config`")
            inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                                               target_modules=LORA_TARGETS), encoder.model, adapter_name=name)
    finally:
        torch.random.set_rng_state(state)
    params = [p for n, p in encoder.model.named_parameters() if "lora_" in n and n.split(".")[-2] == name]
    if not params:
        raise ValueError(f"LoRA matched no text attention projection in {type(encoder.model).__name__}")
    use_language(encoder, name)
    return params


def use_language(encoder, lang: str | None) -> None:
    """Activate ``lang``'s LoRA adapter and soft prompt (:mod:`nobackfill.lingual.prompts`), or
    run the plain text tower where it has none (a no-op for a model with neither). The encoder's
    space id names what is active, so cached embeddings never mix languages' adapters."""
    from .prompts import soft_prompt

    layers = _lora_layers(encoder.model)
    prompt = soft_prompt(encoder)
    if not layers and prompt is None:
        return
    tags = []
    if layers:
        has = any(lang in getattr(m, "lora_A", {}) for m in layers)
        for m in layers:
            if has:
                m.enable_adapters(True)
                m.set_adapter(lang, inference_mode=True)
            else:
                m.enable_adapters(False)
        tags.append(f"lora-{lang if has else 'none'}")
    if prompt is not None:
        tags.append(prompt.select(lang))
    encoder.invalidate_space_id()
    encoder._space_id = f"{encoder.space_id}-{'-'.join(tags)}"


def without_adapters(encoder):
    """A copy of ``encoder`` whose LoRA-wrapped layers are replaced by their base layers (the
    model as it was before any adapter; ``save_pretrained`` cannot write injected adapters)."""
    twin = copy.deepcopy(encoder)
    wrapped = {id(m) for m in _lora_layers(twin.model)}
    for name, module in list(twin.model.named_modules()):
        if name and id(module) in wrapped:
            parent, _, leaf = name.rpartition(".")
            setattr(twin.model.get_submodule(parent) if parent else twin.model, leaf, module.get_base_layer())
    return twin


def lora_tensors(encoder, lang: str) -> Tensors:
    """The LoRA parameters of ``lang``'s adapter, by parameter name."""
    return {n: p.detach().contiguous() for n, p in encoder.model.named_parameters()
            if "lora_" in n and n.split(".")[-2] == lang}


@register
class TaskLoRA(LingualMethod):
    """``lora``: a LoRA adapter per language on the text tower's k/v projections (Hu et al. 2022;
    Yang et al. 2024 Reproducibility: rank 8, scaling 8); the language picks its adapter at inference.
    The adapters are saved beside the model (safetensors) and re-injected on load."""

    NAME = "lora"
    PER_LANGUAGE = True

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.langs: list[str] = []
        self.encoder = None

    def begin_task(self, learner, task) -> list[torch.nn.Parameter]:
        self.encoder = learner.encoder
        self.langs.append(task.lang)
        return add_task_lora(learner.encoder, task.lang, self.cfg.lora_rank, self.cfg.lora_alpha, self.cfg.seed)

    def state(self) -> tuple[Tensors, dict[str, Any]]:
        tensors = {k: v for lang in self.langs for k, v in lora_tensors(self.encoder, lang).items()}
        return tensors, {"langs": list(self.langs)}

    def load_state(self, encoder, tensors: Tensors, meta: dict[str, Any]) -> None:
        self.encoder, self.langs = encoder, list(meta.get("langs", []))
        for lang in self.langs:
            add_task_lora(encoder, lang, self.cfg.lora_rank, self.cfg.lora_alpha, self.cfg.seed)
        with torch.no_grad():
            for name, p in encoder.model.named_parameters():
                if name in tensors:
                    p.copy_(tensors[name])
                    p.requires_grad_(False)
        use_language(encoder, None)

    def model_to_save(self, encoder):
        return without_adapters(encoder)


__all__ = ["add_task_lora", "use_language", "without_adapters", "TaskLoRA", "LORA_TARGETS"]
