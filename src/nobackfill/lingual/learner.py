"""Continual language learning: a deployed model learns languages one after another (CLL-CLIP,
Yang et al. 2024). :class:`ContinualLearner` owns the state that survives between tasks - the growing
vocabulary and table, the token statistics ``c_t`` of TEIR and the registered method (its ER/DER
buffer, EWC Fisher, adapters, prompts) - and runs each task through the one training loop
(:func:`nobackfill.train.loop.train`), calling the method's hooks around it.

English is task 1: the starting model already knows it, so it is not trained; its corpus only
initialises the token statistics (``c = 1 + count in the English corpus``). The English targets
``r^E`` of Eq. 3 always come from the *starting* model (``Omega_emb`` of Eq. 1), and images (when
the data has them) only pass through the frozen image tower, before training.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from safetensors.torch import load_file

from .._safetensors import save_tensors

from ..train.loop import LoopConfig, train
from .adapters import use_language
from .base import LingualMethod, scoped
from .embeddings import PLAIN_INIT_STD, embedding_stats, expand_token_embeddings, token_embedding
from .losses import PAPER_GAMMA_CL, PAPER_GAMMA_CM, PAPER_TEMPERATURE
from .methods import CLLCLIPMethod
from .registry import create_lingual_method, lingual_method_names
from .tasks import LanguageTask, TaskBatches
from .teir import teir_row_scales
from .vocab import ids_of, merge_vocab, oracle_vocab, task_token_set, token_counts, train_task_vocab

LINGUAL_STATE = "lingual.json"
#: token counts and the method's tensors (safetensors; never pickle)
LINGUAL_TENSORS = "lingual.safetensors"
LEGACY_COUNTS_FILE = "token_counts.npy"


@dataclass
class CLLConfig:
    """Continual language learning settings. Paper values (Implementation Details / Reproducibility)
    in comments; ours are CPU-sized, chosen on validation splits (see the benches)."""

    method: str = "cll_clip"
    teir: bool = False
    task_vocab_size: int = 10_000       # paper: 10K per task
    min_frequency: int = 2
    oracle_vocab: bool = False          # Table 3 setting 7
    #: how lambda acts with Adam: "grad" (literal Eq. 5: scale the gradient) or "update" (scale
    #: each row's optimiser step, Eq. 5's per-row learning rate; see nobackfill.lingual.teir)
    #: default "update": chosen a priori (Adam cancels a constant gradient factor, see the unit
    #: test) and checked on Multi30K val against "grad" (bench lingual-text runs both)
    teir_scale: str = "update"
    #: TEIR's identical-distribution initialisation (False: the regularisation alone, new rows ~
    #: N(0, 0.02^2) as in plain CLL-CLIP; the Table 3 ablation of the two halves)
    teir_init: bool = True
    #: which ids form ``V_hat_t`` for Eq. 6: "vocab" (the task vocabulary's tokens, the paper's
    #: sets) or "used" (those plus every old token the merged tokenizer emits on the task's
    #: corpus, so no row the language's input uses gets lambda = 0; a world-bench diagnostic:
    #: old BPE merges outrank the task's, so merged tokenisation emits old pieces outside V_hat_t)
    teir_task_tokens: str = "vocab"
    gamma_cm: float = PAPER_GAMMA_CM    # 0.01
    gamma_cl: float = PAPER_GAMMA_CL    # 1
    temperature: float = PAPER_TEMPERATURE  # 0.07
    batch_size: int = 128               # paper: 128
    steps: int = 300                    # per task (paper: 3 epochs)
    #: paper: 5e-5 over ~14K steps/task; ours: far fewer steps. 1e-2: TEIR's rate chosen on val by
    #: both benches (Multi30K val AR 0.827; world val t2i AR 0.684), see nobackfill.bench.lingual
    lr: float = 1e-2
    warmup_frac: float = 0.1            # paper: 10% warm-up, then fixed
    weight_decay: float = 0.05          # paper: 0.05
    grad_clip: float = 0.0
    memory_size: int = 8000             # ER / DER buffer (paper: 8,000)
    der_alpha: float = 1.0              # paper: 1
    ewc_strength: float = 1000.0        # paper: lambda 1000
    ewc_gamma: float = 1.0              # paper: 1
    ewc_batches: int = 10
    lora_rank: int = 8                  # paper: rank 8, scaling 8, on k and v
    lora_alpha: int = 8
    #: soft-prompt tokens per language (paper's P-Tuning: 30 per layer, as prefixes in every layer;
    #: ours: input-level prompt tuning, 8 tokens, CPU-sized)
    prompt_length: int = 8
    #: DualPrompt's shared G-prompt length (paper: 2); its E-prompts have ``prompt_length``
    g_prompt_length: int = 2
    #: weight of DualPrompt's key-query matching loss
    key_match_weight: float = 1.0
    #: CODA-Prompt components added per task (paper: 5 per task, pool 36 x 5); each ``prompt_length`` long
    coda_components: int = 5
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.method not in lingual_method_names():
            raise ValueError(f"method must be one of {', '.join(lingual_method_names())}, got {self.method!r}")
        if self.teir_scale not in ("grad", "update"):
            raise ValueError(f"teir_scale must be 'grad' or 'update', got {self.teir_scale!r}")
        if self.teir_task_tokens not in ("vocab", "used"):
            raise ValueError(f"teir_task_tokens must be 'vocab' or 'used', got {self.teir_task_tokens!r}")
        self._check_ranges()

    #: the numeric fields and their least value (``> 0`` for the floats marked so, else ``>=``)
    _AT_LEAST_1 = ("steps", "batch_size", "task_vocab_size", "min_frequency", "ewc_batches", "lora_rank", "lora_alpha",
                   "prompt_length", "coda_components", "threads")
    _AT_LEAST_0 = ("memory_size", "g_prompt_length", "seed")
    _POSITIVE = ("lr", "temperature")
    _NON_NEGATIVE = ("weight_decay", "grad_clip", "gamma_cm", "gamma_cl", "der_alpha", "ewc_strength", "ewc_gamma",
                     "key_match_weight")

    def _check_ranges(self) -> None:
        """A ValueError (one line naming the field) for a value no run can use: counts below their least
        value, rates and weights that are not finite or out of range. Checked when the config is built,
        so ``--show-config`` refuses them too, before anything is read or trained."""
        for least, names in ((1, self._AT_LEAST_1), (0, self._AT_LEAST_0)):
            for name in names:
                if getattr(self, name) < least:
                    raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        for positive, names in ((True, self._POSITIVE), (False, self._NON_NEGATIVE)):
            for name in names:
                v = float(getattr(self, name))
                if not math.isfinite(v) or v < 0 or (positive and v == 0):
                    raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v:g}")
        if not 0.0 <= self.warmup_frac <= 1.0:
            raise ValueError(f"warmup_frac must be in [0, 1], got {self.warmup_frac:g}")

    @property
    def label(self) -> str:
        teir = (f"_teir_{self.teir_scale}{'' if self.teir_init else '_reg'}"
                f"{'_used' if self.teir_task_tokens == 'used' else ''}") if self.teir else ""
        return f"{self.method}{teir}{'_oracle' if self.oracle_vocab else ''}"

    def loop(self) -> LoopConfig:
        return LoopConfig(steps=self.steps, lr=self.lr, warmup=max(1, int(self.warmup_frac * self.steps)),
                          weight_decay=self.weight_decay, grad_clip=self.grad_clip, seed=self.seed,
                          log_every=max(1, self.steps // 5), checkpoint_every=10 ** 9, eval_every=10 ** 9,
                          threads=self.threads, schedule="constant")



#: ``nobackfill lingual learn``'s starting config: TEIR on, CPU-sized steps and batches
LEARN_DEFAULTS = CLLConfig(teir=True, steps=200, batch_size=64)


def frozen_english_features(encoder) -> Callable[[Sequence[str]], np.ndarray]:
    """``r^E`` from a frozen copy of the starting model (Eq. 1 uses the original ``Omega_emb``)."""
    frozen = copy.deepcopy(encoder)
    return lambda texts: frozen.encode_texts(list(texts))


@dataclass
class LearnedState:
    """What :func:`open_learned` restores from a saved model besides the encoder: the languages,
    the history, TEIR's token statistics and the method with its state (buffer, Fisher, adapters,
    prompts), already attached to the encoder."""

    learned: list[str]
    history: list[dict]
    counts: np.ndarray | None
    config: dict
    method: LingualMethod | None


class ContinualLearner:
    """Learn languages one after another with CLL-CLIP (+ TEIR); the baseline is the registered
    :class:`~.base.LingualMethod` that ``cfg.method`` names, driven through its hooks.
    ``resume``: a saved model's state (:func:`open_learned`) to continue from."""

    def __init__(self, encoder, cfg: CLLConfig, english_corpus: Sequence[str],
                 english_features: Callable[[Sequence[str]], np.ndarray] | None = None,
                 oracle_corpora: Sequence[Sequence[str]] = (), log: Callable[[str], None] = lambda m: None,
                 resume: LearnedState | None = None) -> None:
        self.encoder, self.cfg, self.log = encoder, cfg, log
        torch.manual_seed(cfg.seed)
        self.english_features = english_features or frozen_english_features(encoder)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.learned: list[str] = ["en"]
        self.history: list[dict] = []
        self.method = create_lingual_method(cfg)
        if resume is not None:
            self._resume(resume)
            return
        if cfg.oracle_vocab:
            if not oracle_corpora:
                raise ValueError("oracle_vocab needs the corpora of all languages (oracle_corpora)")
            merged = oracle_vocab(encoder.tokenizer, oracle_corpora, cfg.task_vocab_size, n_rows=self._rows())
            self._grow(merged)
        self.counts = 1.0 + token_counts(encoder.tokenizer, english_corpus, self._rows())

    def _resume(self, state: LearnedState) -> None:
        if state.method is not None and state.method.NAME != self.cfg.method:
            raise ValueError(f"the model was learned with method {state.method.NAME!r}; continue it with that method")
        if state.counts is None or len(state.counts) != self._rows():
            raise ValueError("the saved token statistics do not match the model's table")
        self.counts = np.asarray(state.counts, np.float64)
        self.learned, self.history = list(state.learned), list(state.history)
        if state.method is not None:
            self.method = state.method

    def _rows(self) -> int:
        return int(token_embedding(self.encoder).weight.shape[0])

    def new_row_stats(self) -> tuple[float, float]:
        """TEIR: ``(mu_{t-1}, sigma_{t-1})`` of the table so far; plain: ``(0, 0.02)``."""
        if self.cfg.teir and self.cfg.teir_init:
            return embedding_stats(token_embedding(self.encoder).weight)
        return 0.0, PLAIN_INIT_STD

    def _grow(self, merged) -> None:
        mean, std = self.new_row_stats()
        expand_token_embeddings(self.encoder, merged, mean=mean, std=std, generator=self.generator)
        self.log(f"vocabulary {merged.old_size} -> {merged.size} (+{len(merged.new_tokens)}); "
                 f"new rows ~ N({mean:.4g}, {std:.4g}^2)")

    def trainer(self, scales: np.ndarray, extra: Sequence[torch.nn.Parameter] = (),
                plugin: LingualMethod | None = None) -> CLLCLIPMethod:
        """The loop plug-in that trains the table (row scales ``scales``) and ``extra``."""
        cfg = self.cfg
        return CLLCLIPMethod(self.encoder, scales, cfg.loop(), plugin=plugin, teir=cfg.teir, gamma_cm=cfg.gamma_cm,
                             gamma_cl=cfg.gamma_cl, temperature=cfg.temperature, scale_mode=cfg.teir_scale,
                             extra_params=extra)

    def learn(self, task: LanguageTask, work_dir: str | Path, progress: bool = False) -> dict:
        """Learn one language: grow the vocabulary, ``begin_task``, set TEIR's scales, train,
        ``end_task``, update the token statistics."""
        cfg, enc = self.cfg, self.encoder
        if task.lang in self.learned:
            raise ValueError(f"language {task.lang!r} was already learned ({', '.join(self.learned)})")
        old_size = self._rows()
        if cfg.oracle_vocab:  # V_hat_t: the oracle tokens this task's data uses
            task_ids = np.flatnonzero(token_counts(enc.tokenizer, task.corpus, old_size))
            n_new = 0
        else:
            tv = train_task_vocab(enc.tokenizer, task.corpus, cfg.task_vocab_size, cfg.min_frequency)
            merged = merge_vocab(enc.tokenizer, tv, n_rows=old_size)
            self._grow(merged)
            task_ids = ids_of(enc.tokenizer, task_token_set(tv))
            n_new = len(merged.new_tokens)
        extra = self.method.begin_task(self, task)  # rows it appends (prompts) are V_{t,new}
        use_language(enc, task.lang)
        size = self._rows()
        if cfg.teir_task_tokens == "used":
            task_ids = np.union1d(task_ids, np.flatnonzero(token_counts(enc.tokenizer, task.corpus, size)))
        self.counts = np.concatenate([self.counts, np.ones(size - len(self.counts))])
        scales = teir_row_scales(size, old_size, task_ids, self.counts) if cfg.teir else np.ones(size)
        english = np.asarray(self.english_features(task.english), np.float32)
        batches = TaskBatches(task, english, cfg.batch_size, cfg.seed + len(self.learned), self.method.replay())
        trainer = self.trainer(scales, extra, plugin=self.method)
        try:
            res = train(trainer, batches, cfg.loop(), Path(work_dir) / task.lang, progress=progress, export=False)
        finally:
            trainer.close()
        enc.model.requires_grad_(False)
        enc.invalidate_space_id()
        self.method.end_task(self, task, english, batches)
        self.counts += token_counts(enc.tokenizer, task.corpus, size)
        self.learned.append(task.lang)
        info = {"lang": task.lang, "vocab_before": old_size, "vocab_after": size, "new_tokens": n_new,
                "task_tokens": int(len(task_ids)), "steps": res.steps, "seconds": round(res.seconds, 1),
                "last_loss": res.last_loss,
                "lambda": {"zero": int((scales == 0).sum()), "overlap": int(((scales > 0) & (scales < 1)).sum()),
                           "one": int((scales == 1).sum())}}
        self.history.append(info)
        self.log(f"learned {task.lang}: {info}")
        return info

    # ----------------------------------------------------------------- persistence
    def save(self, out: str | Path) -> Path:
        """The model (loadable with ``load_encoder``; :func:`open_learned` also restores the
        method's per-language modules) plus ``lingual.json`` (languages, config, history, the
        method's metadata) and ``lingual.safetensors`` (token counts, the method's tensors)."""
        out = Path(out)
        model = self.method.model_to_save(self.encoder)
        earlier = model.meta.get("lingual") or {}
        base = earlier.get("base_name") or model.name  # the model the first languages were learned on
        added = [h["lang"] for h in self.history if h.get("lang")]
        model.meta["lingual"] = {"learned": self.learned, "method": self.cfg.label, "base_name": base}
        model.meta["name"] = f"{base}+{'+'.join(added)}" if added else base  # not its parent's name in a status
        model.invalidate_space_id()
        model.save(out)
        tensors, meta = self.method.state()
        blob = {f"method/{k}": v.detach().contiguous() for k, v in tensors.items()}
        blob["counts"] = torch.from_numpy(np.asarray(self.counts, np.float64))
        save_tensors(blob, str(out / LINGUAL_TENSORS))
        (out / LINGUAL_STATE).write_text(json.dumps({
            "learned": self.learned, "config": asdict(self.cfg), "history": self.history,
            "method": {"name": self.method.NAME, "state": meta}}, indent=2))
        return out


def load_lingual_state(model_dir: str | Path) -> tuple[dict, np.ndarray | None]:
    """``lingual.json`` and the token counts of a model written by :meth:`ContinualLearner.save`."""
    d = Path(model_dir)
    path = d / LINGUAL_STATE
    state = json.loads(path.read_text()) if path.is_file() else {"learned": ["en"]}
    if (d / LINGUAL_TENSORS).is_file():
        counts = load_file(str(d / LINGUAL_TENSORS))["counts"].numpy()
    elif (d / LEGACY_COUNTS_FILE).is_file():  # written before lingual.safetensors
        counts = np.load(d / LEGACY_COUNTS_FILE, allow_pickle=False)
    else:
        counts = None
    return state, counts


def open_learned(model_dir: str | Path) -> tuple[Any, LearnedState]:
    """Load a model written by :meth:`ContinualLearner.save` with its method's per-language
    modules (adapters, prompts) attached; returns ``(encoder, LearnedState)``."""
    from ..encoders import load_encoder

    d = Path(model_dir)
    encoder = load_encoder(d)
    state, counts = load_lingual_state(d)
    method = None
    if "method" in state:
        known = {f.name for f in fields(CLLConfig)}
        cfg = CLLConfig(**{k: v for k, v in state["config"].items() if k in known})
        method = create_lingual_method(cfg)
        tensors = load_file(str(d / LINGUAL_TENSORS)) if (d / LINGUAL_TENSORS).is_file() else {}
        method.load_state(encoder, scoped(tensors, "method"), state["method"]["state"])
        encoder.invalidate_space_id()
    return encoder, LearnedState(list(state.get("learned", ["en"])), list(state.get("history", [])), counts,
                                 dict(state.get("config", {})), method)


__all__ = ["CLLConfig", "LanguageTask", "ContinualLearner", "LearnedState", "TaskBatches", "frozen_english_features",
           "load_lingual_state", "open_learned"]
