"""Task-specific soft prompts: the prompt-tuning baseline of the CLL-CLIP paper (seed 004, Table 2
"P-Tuning", task identity needed at inference; Reproducibility: 30 prompt tokens).

Each language gets ``length`` learnable prompt vectors. They are extra rows of the token embedding
table (ids past the vocabulary, so the optimiser, TEIR's initialisation and its row scales treat
them like any new token row: ``lambda = 1`` while their task trains, ``0`` afterwards with TEIR),
and :class:`SoftPrompt` inserts their ids right after the first token ([CLS] / BOS) of every text
the text tower encodes while that language is active. The prompt positions are dropped from the
tower's last hidden states, so pooling (mean pooling for MiniLM; CLIP's EOS pooling is computed
inside the tower and unaffected) sees only the text's own tokens: the prompt acts through
attention. English and languages without a prompt run the plain tower.
"""

from __future__ import annotations

import torch

from .embeddings import append_token_rows, token_embedding


def text_tower(encoder) -> torch.nn.Module:
    """The module that embeds token ids: CLIP's ``text_model`` or the whole BERT-style model."""
    tower = getattr(encoder.model, "text_model", None)
    return encoder.model if tower is None else tower


class SoftPrompt:
    """Forward hooks on the text tower: insert the active language's prompt ids after the first
    token (pre-hook) and drop those positions from ``last_hidden_state`` (post-hook). A callable
    object, so ``copy.deepcopy`` of the encoder copies it with the module."""

    def __init__(self, max_positions: int | None) -> None:
        self.ids: dict[str, torch.Tensor] = {}
        self.active: str | None = None
        self.max_positions = max_positions
        self._width = 0  # the caller's sequence width, restored on the way out

    def prompt(self) -> torch.Tensor | None:
        return None if self.active is None else self.ids.get(self.active)

    def before(self, module, args, kwargs):
        p = self.prompt()
        if p is None:
            return None
        ids = kwargs.get("input_ids")
        if ids is None:
            if not args:
                raise ValueError("soft prompt: the text tower was called without input_ids")
            ids, args = args[0], args[1:]
        n, self._width = ids.shape
        mask = kwargs.get("attention_mask")
        limit = self.max_positions
        if limit is not None and self._width + len(p) > limit:
            ids, mask = _fit(ids, mask, limit - len(p))
        ids = torch.cat([ids[:, :1], p.to(ids.dtype).expand(n, -1), ids[:, 1:]], dim=1)
        if mask is not None:
            mask = torch.cat([mask[:, :1], mask.new_ones(n, len(p)), mask[:, 1:]], dim=1)
        kwargs["input_ids"] = ids
        if mask is not None:
            kwargs["attention_mask"] = mask
        return args, kwargs

    def after(self, module, args, kwargs, output):
        p = self.prompt()
        if p is None:
            return None
        hs = output.last_hidden_state
        hs = torch.cat([hs[:, :1], hs[:, 1 + len(p):]], dim=1)
        if hs.shape[1] < self._width:  # give back the padding dropped in before() (zeros, masked out)
            hs = torch.cat([hs, hs.new_zeros(hs.shape[0], self._width - hs.shape[1], hs.shape[2])], dim=1)
        output.last_hidden_state = hs
        return output


def _fit(ids: torch.Tensor, mask: torch.Tensor | None, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut a batch to ``width`` columns so the prompt fits the tower's positions: padding goes
    first; a text still too long loses its last tokens but keeps its final one (EOS / [SEP])."""
    if width < 2:
        raise ValueError(f"soft prompt: the prompt leaves {width} positions for the text")
    mask = torch.ones_like(ids) if mask is None else mask
    out_ids, out_mask = ids[:, :width].clone(), mask[:, :width].clone()
    lengths = mask.sum(1)
    for i in torch.nonzero(lengths > width).flatten().tolist():
        out_ids[i, width - 1] = ids[i, int(lengths[i]) - 1]
    return out_ids, out_mask


def soft_prompt(encoder) -> SoftPrompt | None:
    return getattr(encoder, "_soft_prompt", None)


def add_task_prompt(encoder, lang: str, length: int, *, mean: float, std: float,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Append ``length`` prompt rows ~ N(mean, std^2) for ``lang`` to the token table, install the
    hooks on first use, activate ``lang`` and return the prompt's ids."""
    if length < 1:
        raise ValueError(f"prompt length must be >= 1, got {length}")
    state = soft_prompt(encoder)
    if state is None:
        tower = text_tower(encoder)
        state = SoftPrompt(getattr(tower.config, "max_position_embeddings", None))
        tower.register_forward_pre_hook(state.before, with_kwargs=True)
        tower.register_forward_hook(state.after, with_kwargs=True)
        encoder._soft_prompt = state
    if lang in state.ids:
        raise ValueError(f"language {lang!r} already has a prompt")
    start = token_embedding(encoder).weight.shape[0]
    append_token_rows(encoder, length, mean=mean, std=std, generator=generator)
    state.ids[lang] = torch.arange(start, start + length)
    state.active = lang
    encoder.invalidate_space_id()
    return state.ids[lang]


__all__ = ["SoftPrompt", "add_task_prompt", "soft_prompt", "text_tower"]
