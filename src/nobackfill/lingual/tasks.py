"""The data a continual-language-learning task trains on (CLL-CLIP, Yang et al. 2024): the
:class:`LanguageTask` (triplets of one language), the :class:`LingualBatch` of the loop, the
:class:`ReplayBuffer` of earlier tasks (ER / DER) and the :class:`TaskBatches` that draw from both.
Below the methods and the learner: it imports neither."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]


@dataclass
class LanguageTask:
    """Training triplets of one language: foreign texts, their English counterparts (parallel) and
    optionally L2-normalised image features from the frozen image tower (one row per text); the
    vocabulary may be trained on a larger corpus of the language (``vocab_texts``)."""

    lang: str
    foreign: list[str]
    english: list[str]
    images: np.ndarray | None = None
    #: the task's corpus for its vocabulary ``V_hat_t`` and token statistics (default: ``foreign``)
    vocab_texts: list[str] | None = None

    @property
    def corpus(self) -> list[str]:
        return self.foreign if self.vocab_texts is None else self.vocab_texts

    def __post_init__(self) -> None:
        if len(self.foreign) != len(self.english):
            raise ValueError(f"task {self.lang}: {len(self.foreign)} foreign texts but {len(self.english)} English")
        if self.images is not None and len(self.images) != len(self.foreign):
            raise ValueError(f"task {self.lang}: {len(self.images)} image rows for {len(self.foreign)} texts")
        if not self.foreign:
            raise ValueError(f"task {self.lang}: no training texts")


@dataclass
class LingualBatch:
    """One training batch of triplets ``(x^I, x^E, x^F)``: foreign texts, the frozen English
    features ``r^E`` and (when the data has images) the frozen image features ``r^I``; plus an
    optional replay batch (ER: triplets; DER: foreign texts with stored features ``r^M``)."""

    foreign: list[str]
    english: torch.Tensor
    images: torch.Tensor | None = None
    replay: "LingualBatch | None" = None
    replay_targets: torch.Tensor | None = None  # DER: r^M of the replayed foreign texts


@dataclass
class ReplayBuffer:
    """Reservoir buffer of earlier tasks' triplets (ER) and their stored features (DER)."""

    capacity: int
    foreign: list[str] = field(default_factory=list)
    english: list[np.ndarray] = field(default_factory=list)
    images: list[np.ndarray | None] = field(default_factory=list)
    stored: list[np.ndarray | None] = field(default_factory=list)
    seen: int = 0

    def add(self, task, english: np.ndarray, rng: np.random.Generator) -> list[int]:
        """Reservoir-sample the task's items; returns the slots written."""
        written = []
        for i in range(len(task.foreign)):
            slot = len(self.foreign) if len(self.foreign) < self.capacity else int(rng.integers(self.seen + 1))
            self.seen += 1
            if slot >= self.capacity:
                continue
            item = (task.foreign[i], english[i], None if task.images is None else task.images[i], None)
            if slot == len(self.foreign):
                for lst, v in zip((self.foreign, self.english, self.images, self.stored), item):
                    lst.append(v)
            else:
                self.foreign[slot], self.english[slot], self.images[slot], self.stored[slot] = item
            written.append(slot)
        return sorted(set(written))

    def __len__(self) -> int:
        return len(self.foreign)

    def to_state(self) -> tuple[Tensors, dict[str, Any]]:
        """Features as tensors (absent entries: a 0/1 mask), texts and counters as JSON."""
        tensors: Tensors = {}
        for key in ("english", "images", "stored"):
            rows = getattr(self, key)
            have = [r is not None for r in rows]
            if any(have):
                dim = next(r for r in rows if r is not None).shape[-1]
                tensors[key] = torch.from_numpy(np.stack([np.zeros(dim, np.float32) if r is None
                                                          else np.asarray(r, np.float32) for r in rows]))
                tensors[f"{key}_present"] = torch.tensor(have, dtype=torch.uint8)
        return tensors, {"capacity": self.capacity, "seen": self.seen, "foreign": list(self.foreign)}

    @classmethod
    def from_state(cls, tensors: Tensors, meta: dict[str, Any]) -> "ReplayBuffer":
        buf = cls(int(meta["capacity"]), list(meta["foreign"]), seen=int(meta["seen"]))
        for key in ("english", "images", "stored"):
            if key in tensors:
                have = tensors[f"{key}_present"].bool().tolist()
                setattr(buf, key, [r.numpy() if h else None for r, h in zip(tensors[key], have)])
            else:
                setattr(buf, key, [None] * len(buf.foreign))
        return buf


class TaskBatches:
    """Deterministic batches (epoch-wise permutations seeded by ``(seed, epoch)``) of a task, with
    an optional replay batch drawn from a :class:`ReplayBuffer` (seeded by the step;
    with the stored features ``r^M`` when every drawn item has them, as DER's do)."""

    def __init__(self, task: LanguageTask, english: np.ndarray, batch_size: int, seed: int,
                 memory: ReplayBuffer | None = None) -> None:
        self.task, self.english = task, torch.from_numpy(np.asarray(english, np.float32))
        self.images = None if task.images is None else torch.from_numpy(np.asarray(task.images, np.float32))
        self.n = len(task.foreign)
        self.bs = min(batch_size, self.n)
        self.seed, self.memory = seed, memory

    def batch(self, index: int) -> LingualBatch:
        per_epoch = max(1, self.n // self.bs)
        epoch, k = divmod(index, per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        idx = perm[k * self.bs:(k + 1) * self.bs]
        b = LingualBatch([self.task.foreign[i] for i in idx], self.english[idx],
                         None if self.images is None else self.images[idx])
        if self.memory is not None and len(self.memory):
            m = self.memory
            ridx = np.random.default_rng([self.seed, 7919, index]).choice(len(m), size=min(self.bs, len(m)), replace=False)
            imgs = [m.images[i] for i in ridx]
            b.replay = LingualBatch([m.foreign[i] for i in ridx], torch.from_numpy(np.stack([m.english[i] for i in ridx])),
                                    None if any(x is None for x in imgs) else torch.from_numpy(np.stack(imgs)))
            stored = [m.stored[i] for i in ridx]
            if all(x is not None for x in stored):
                b.replay_targets = torch.from_numpy(np.stack(stored))
        return b


__all__ = ["LanguageTask", "LingualBatch", "ReplayBuffer", "TaskBatches", "Tensors"]
