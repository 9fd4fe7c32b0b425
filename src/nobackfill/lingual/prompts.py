"""Task-specific soft prompts: the prompt-tuning baseline of the CLL-CLIP paper (Yang et al. 2024, Table 2
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

import hashlib
from typing import Any

import torch

from .base import LingualMethod, Tensors, register
from .embeddings import append_token_rows, token_embedding


def text_tower(encoder) -> torch.nn.Module:
    """The module that embeds token ids: CLIP's ``text_model`` or the whole BERT-style model."""
    tower = getattr(encoder.model, "text_model", None)
    return encoder.model if tower is None else tower


class SoftPrompt:
    """Forward hooks on the text tower: insert the active language's prompt ids after the first
    token (pre-hook) and drop those positions from ``last_hidden_state`` (post-hook). A callable
    object, so ``copy.deepcopy`` of the encoder copies it with the module. Subclasses choose the
    prompt per text (:meth:`prompt_ids`)."""

    def __init__(self, max_positions: int | None) -> None:
        self.ids: dict[str, torch.Tensor] = {}
        self.active: str | None = None
        self.max_positions = max_positions
        self._width = 0  # the caller's sequence width, restored on the way out
        self._len = 0  # prompt positions inserted into the current call

    def prompt_ids(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """``(n, L)`` ids to insert after each text's first token (None: run the plain tower)."""
        p = None if self.active is None else self.ids.get(self.active)
        return None if p is None else p.to(ids.dtype).expand(len(ids), -1)

    def select(self, lang: str | None) -> str:
        """Activate ``lang``'s prompt (none for a language without one); returns a space-id tag."""
        self.active = lang if lang in self.ids else None
        return f"prompt-{self.active or 'none'}"

    def before(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None:
            if not args:
                raise ValueError("soft prompt: the text tower was called without input_ids")
            ids, args = args[0], args[1:]
        mask = kwargs.get("attention_mask")
        p = self.prompt_ids(ids, mask)
        self._len = 0 if p is None else p.shape[1]
        if p is None:
            return None
        n, self._width = ids.shape
        limit = self.max_positions
        if limit is not None and self._width + self._len > limit:
            ids, mask = _fit(ids, mask, limit - self._len)
        ids = torch.cat([ids[:, :1], p, ids[:, 1:]], dim=1)
        if mask is not None:
            mask = torch.cat([mask[:, :1], mask.new_ones(n, self._len), mask[:, 1:]], dim=1)
        kwargs["input_ids"] = ids
        if mask is not None:
            kwargs["attention_mask"] = mask
        return args, kwargs

    def after(self, module, args, kwargs, output):
        if not self._len:
            return None
        hs = output.last_hidden_state
        hs = torch.cat([hs[:, :1], hs[:, 1 + self._len:]], dim=1)
        if hs.shape[1] < self._width:  # give back the padding dropped in before() (zeros, masked out)
            hs = torch.cat([hs, hs.new_zeros(hs.shape[0], self._width - hs.shape[1], hs.shape[2])], dim=1)
        output.last_hidden_state = hs
        return output


class PromptVectors(SoftPrompt):
    """Per-text prompt *vectors* (DualPrompt, CODA-Prompt): ``pool(ids, mask) -> (n, L, D)``
    chooses or assembles each text's prompt from its ids; placeholder ids (the text's first token)
    take the prompt positions and a forward hook on the tower's embedding layer puts the vectors
    there (the input of the first transformer layer). Off for English, the starting model's
    language (:meth:`select`); on for every other text, which needs no language id."""

    def __init__(self, max_positions: int | None, pool: torch.nn.Module) -> None:
        super().__init__(max_positions)
        self.pool = pool
        self.enabled = False
        self._vectors: torch.Tensor | None = None

    def prompt_ids(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        if not self.enabled:
            return None
        self._vectors = self.pool(ids, torch.ones_like(ids) if mask is None else mask)
        return None if self._vectors is None else ids[:, :1].expand(-1, self._vectors.shape[1])

    def select(self, lang: str | None) -> str:
        self.enabled = lang not in (None, "en")
        if not self.enabled:
            return "pool-off"
        digest = hashlib.sha1(str(tuple(self.pool.query.table.shape)).encode())
        for t in self.pool.parameters():  # the frozen query rows never change once added
            digest.update(t.detach().float().numpy().tobytes())
        return f"pool-{digest.hexdigest()[:12]}"

    def embeddings_out(self, module, args, output):
        v, self._vectors = self._vectors, None
        if v is None:
            return None
        return torch.cat([output[:, :1], v.to(output.dtype), output[:, 1 + v.shape[1]:]], dim=1)


class FrozenQuery(torch.nn.Module):
    """The query function of the key-query prompt methods: the L2-normalised mean of a *frozen*
    copy of the token rows over a text's tokens. DualPrompt and CODA-Prompt query with the frozen
    pre-trained encoder; ours is its frozen input layer (no second forward pass). Rows added to
    the vocabulary later join at their initial values (:meth:`extend`)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table.detach().clone())

    def extend(self, weight: torch.Tensor) -> None:
        n = self.table.shape[0]
        if weight.shape[0] > n:
            self.table = torch.cat([self.table, weight.detach()[n:].clone()])

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(self.table.dtype)
        rows = self.table[ids.clamp(max=self.table.shape[0] - 1)]
        return torch.nn.functional.normalize((rows * m).sum(1) / m.sum(1).clamp(min=1.0), dim=-1)


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
    """The prompt hooks installed on ``encoder`` (None: none)."""
    return getattr(encoder, "_soft_prompt", None)


def install_prompt(encoder, state: SoftPrompt) -> SoftPrompt:
    """Register ``state``'s hooks on ``encoder``'s text tower (and, for :class:`PromptVectors`, on
    its embedding layer); one prompt mechanism per encoder."""
    if soft_prompt(encoder) is not None:
        raise ValueError("the encoder already has prompt hooks")
    tower = text_tower(encoder)
    tower.register_forward_pre_hook(state.before, with_kwargs=True)
    tower.register_forward_hook(state.after, with_kwargs=True)
    if isinstance(state, PromptVectors):
        tower.embeddings.register_forward_hook(state.embeddings_out)
    encoder._soft_prompt = state
    return state


@torch.no_grad()
def embedding_output_stats(encoder, texts) -> tuple[float, float]:
    """``(mu, sigma)`` of the text tower's embedding-layer outputs over ``texts``' tokens."""
    enc = encoder.tokenize(list(texts))
    out = text_tower(encoder).embeddings(input_ids=enc["input_ids"])
    x = out[enc["attention_mask"].bool()].double()
    return float(x.mean()), float(x.std())


def max_positions(encoder) -> int | None:
    """The text tower's position limit."""
    return getattr(text_tower(encoder).config, "max_position_embeddings", None)


def add_task_prompt(encoder, lang: str, length: int, *, mean: float, std: float,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Append ``length`` prompt rows ~ N(mean, std^2) for ``lang`` to the token table, install the
    hooks on first use, activate ``lang`` and return the prompt's ids."""
    if length < 1:
        raise ValueError(f"prompt length must be >= 1, got {length}")
    state = soft_prompt(encoder) or install_prompt(encoder, SoftPrompt(max_positions(encoder)))
    if lang in state.ids:
        raise ValueError(f"language {lang!r} already has a prompt")
    start = token_embedding(encoder).weight.shape[0]
    append_token_rows(encoder, length, mean=mean, std=std, generator=generator)
    state.ids[lang] = torch.arange(start, start + length)
    state.active = lang
    encoder.invalidate_space_id()
    return state.ids[lang]


@register
class PromptTuning(LingualMethod):
    """``prompt``: ``prompt_length`` soft-prompt rows per language (appended to the table after
    the task's vocabulary, so TEIR treats them as new rows); the language picks its prompt at
    inference. The rows are saved with the table; the ids per language in the metadata."""

    NAME = "prompt"
    PER_LANGUAGE = True

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.ids: dict[str, list[int]] = {}

    def begin_task(self, learner, task) -> list[torch.nn.Parameter]:
        mean, std = learner.new_row_stats()
        ids = add_task_prompt(learner.encoder, task.lang, self.cfg.prompt_length, mean=mean, std=std,
                              generator=learner.generator)
        self.ids[task.lang] = ids.tolist()
        return []

    def state(self) -> tuple[Tensors, dict[str, Any]]:
        return {}, {"ids": self.ids}

    def load_state(self, encoder, tensors: Tensors, meta: dict[str, Any]) -> None:
        self.ids = {k: list(v) for k, v in meta.get("ids", {}).items()}
        if self.ids:
            state = soft_prompt(encoder) or install_prompt(encoder, SoftPrompt(max_positions(encoder)))
            state.ids.update({k: torch.tensor(v) for k, v in self.ids.items()})
            state.active = None


class PromptPoolMethod(LingualMethod):
    """The shared part of the key-query prompt methods (DualPrompt, CODA-Prompt): a prompt pool
    (an ``nn.Module`` with a :class:`FrozenQuery` ``query``, ``add_task(mean, std, generator)``
    returning the task's trainable parameters, ``end_task()`` and ``n_tasks``) behind
    :class:`PromptVectors` hooks. New prompt vectors start at ``N(mu, sigma^2)`` of the embedding
    layer's outputs on the task's texts (the vectors they stand beside: BERT's are layer-normed,
    CLIP's are token + position); the pool is saved with safetensors."""

    PER_LANGUAGE = False

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.pool: torch.nn.Module | None = None

    def make_pool(self, query: FrozenQuery) -> torch.nn.Module:
        """A fresh, empty pool over ``query``."""
        raise NotImplementedError

    def _attach(self, encoder, query: FrozenQuery) -> None:
        self.pool = self.make_pool(query)
        install_prompt(encoder, PromptVectors(max_positions(encoder), self.pool))

    def begin_task(self, learner, task) -> list[torch.nn.Parameter]:
        w = token_embedding(learner.encoder).weight
        if self.pool is None:
            self._attach(learner.encoder, FrozenQuery(w))
        else:
            self.pool.query.extend(w)
        mean, std = embedding_output_stats(learner.encoder, task.foreign[:64])
        return self.pool.add_task(mean, std, learner.generator)

    def end_task(self, learner, task, english, batches) -> None:
        self.pool.end_task()
        self.pool.requires_grad_(False)

    def state(self) -> tuple[Tensors, dict[str, Any]]:
        if self.pool is None:
            return {}, {}
        return ({k: v.detach().contiguous() for k, v in self.pool.state_dict().items()},
                {"tasks": self.pool.n_tasks})

    def load_state(self, encoder, tensors: Tensors, meta: dict[str, Any]) -> None:
        if not meta.get("tasks"):
            return
        self._attach(encoder, FrozenQuery(tensors["query.table"]))
        for _ in range(int(meta["tasks"])):
            self.pool.add_task(0.0, 1.0, None)
        self.pool.end_task()
        self.pool.load_state_dict(tensors)
        self.pool.requires_grad_(False)


__all__ = ["SoftPrompt", "PromptVectors", "FrozenQuery", "PromptTuning", "PromptPoolMethod", "add_task_prompt", "install_prompt",
           "soft_prompt", "text_tower", "max_positions"]
