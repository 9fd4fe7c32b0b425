"""Task-specific LoRA for the LoRA baseline of the CLL-CLIP paper (seed 004, Reproducibility: LoRA
on the key and value projections of the text tower's self-attention, rank 8, scaling 8; task
identity needed at inference). One peft adapter per language; :func:`use_language` switches the
text tower to a language's adapter (or to none, for English and unlearned languages) and gives the
encoder a space id of its own per adapter, so cached embeddings never mix adapters.
"""

from __future__ import annotations

import warnings

import torch

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
        prompt.active = lang if lang in prompt.ids else None
        tags.append(f"prompt-{prompt.active or 'none'}")
    encoder.invalidate_space_id()
    encoder._space_id = f"{encoder.space_id}-{'-'.join(tags)}"


__all__ = ["add_task_lora", "use_language", "LORA_TARGETS"]
