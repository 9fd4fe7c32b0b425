"""The step runner: train one method over ``T`` model updates with the ONE training loop
(:func:`nobackfill.train.loop.train`), then measure the tutorial's metrics.

``C[t, k]`` (:mod:`nobackfill.metrics.compat`) is the top-1 class-matched search accuracy of queries
embedded by model ``t`` against the open-set gallery embedded by model ``k``, with near-duplicate
renderings of the query's class as junk (:mod:`.data`); AC / AA / ACA follow the tutorial's
equations. Flips (:mod:`nobackfill.metrics.flips`) are measured between consecutive models, for
classification (closed-set held-out images of the classes the old model knows) and
retrieval top-1 (open-set self-tests ``t/t`` vs ``t-1/t-1``).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ...metrics.class_search import common_space, search_accuracy, top1_hits, verification_accuracy
from ...metrics.compat import compatibility_summary, criterion_rates
from ...metrics.flips import flip_rates, prediction_flip_rates
from ...train.loop import LoopConfig, train
from .base import CompatMethod, StepContext, StepModel, to_numpy
from .data import ClassData, DataConfig, ReplayMemory, StepBatches, class_schedule
from .registry import create_method


def search_with_duplicates(query, gallery, query_labels, gallery_labels, query_groups=None,
                           gallery_groups=None) -> float:
    """Top-1 search over every gallery item, near-duplicate renderings of the query included."""
    return search_accuracy(query, gallery, query_labels, gallery_labels)


def verification(query, gallery, query_labels, gallery_labels, query_groups=None,
                 gallery_groups=None) -> float:
    """Pair verification accuracy (the CoReS protocol; rendering groups are not used)."""
    return verification_accuracy(query, gallery, query_labels, gallery_labels)


#: the performance measures M a compatibility matrix can use
#: ``(query, gallery, query labels, gallery labels, query groups, gallery groups) -> score``; "search"
#: treats a gallery item of the query's class and rendering group as junk (the Market-1501 rule;
#: :mod:`.data` "Renderings and the junk rule")
METRICS: dict[str, Callable[..., float]] = {"search": search_accuracy,
                                            "search-with-duplicates": search_with_duplicates,
                                            "verification": verification}


@dataclass
class SequenceConfig:
    """How the ``T`` models are trained (every model gets the same budget)."""

    steps: int = 2  # T, the number of models
    train_steps: int = 600  # optimiser steps per model (when epochs == 0)
    #: > 0: every model trains for this many passes over its step's items (later, larger steps get
    #: proportionally more optimiser steps, as a fixed-epoch schedule does); overrides train_steps
    epochs: float = 0.0
    batch_size: int = 128
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 5e-4
    grad_clip: float = 5.0
    memory_per_class: int = 10  # replay memory of the continual regime
    first_fraction: float = 0.0  # share of the classes at step 1; 0: T equal tasks (data.class_schedule)
    seed: int = 0
    threads: int = 1
    strict: bool = True  # a tie C[t,k] == C[k,k] is NOT compatible (the tutorial's ">")
    #: M of C[t,k]: "search" (top-1 1:N class-matched search accuracy: the issue's open-set retrieval
    #: protocol, the M of the tutorial's d-Simplex-HOC table, and the only reading of its CoReS / BCT
    #: table - a baseline AA of 29.6 % cannot be a best-threshold verification accuracy, which is >= 50 %
    #: on balanced pairs - with the junk rule for near-duplicate renderings, see :mod:`.data`),
    #: "search-with-duplicates" (the same without the junk rule) or "verification" (pair verification
    #: accuracy: the M named on the tutorial's CoReS-vs-BCT comparison slide and computed by the CoReS
    #: code); the others are reported too
    metric: str = "search"

    def __post_init__(self) -> None:
        if self.steps < 2:  # compatibility is between models: one has nothing to be compatible with (AC was nan)
            raise ValueError(f"steps (T, the models of the sequence) must be >= 2, got {self.steps}")
        if self.train_steps < 1:  # (trial AL: 0 was refused as the loop's "--steps must be positive")
            raise ValueError(f"train_steps (optimiser steps per model) must be >= 1, got {self.train_steps}")
        if not self.epochs >= 0:
            raise ValueError(f"epochs must be >= 0 (0: train_steps per model), got {self.epochs}")
        if not 0 <= self.first_fraction < 1:  # (before the data is read, not after)
            raise ValueError(f"first_fraction must be in [0, 1) (0: {self.steps} equal tasks), "
                             f"got {self.first_fraction}")
        for name, low in (("batch_size", 1), ("memory_per_class", 0), ("threads", 0)):  # (threads 0: torch's default)
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)}, got {self.metric!r}")

    def optimiser_steps(self, n_items: int) -> int:
        """Optimiser steps for a step with ``n_items`` training items."""
        if self.epochs > 0:
            return max(1, int(np.ceil(self.epochs * n_items / self.batch_size)))
        return self.train_steps

    def loop_config(self, seed: int, n_items: int = 0) -> LoopConfig:
        steps = self.optimiser_steps(n_items)
        return LoopConfig(steps=steps, lr=self.lr, warmup=self.warmup, weight_decay=self.weight_decay,
                          grad_clip=self.grad_clip, seed=seed, log_every=max(1, steps // 4),
                          checkpoint_every=10 ** 9, eval_every=10 ** 9, threads=self.threads)


@dataclass
class MethodRunConfig:
    """``nobackfill compat train``: how the T models are trained, where the images come from, and the
    method's own options (``--config`` / ``--set sequence.lr=1e-3``, ``--set options.lam=0.5``)."""

    sequence: SequenceConfig = field(default_factory=lambda: SequenceConfig(epochs=40, batch_size=256, lr=3e-3))
    data: DataConfig = field(default_factory=DataConfig)
    options: dict = field(default_factory=dict)


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    return path


def train_sequence(method: CompatMethod, data: ClassData, cfg: SequenceConfig, out: str | Path,
                   log: Callable[[str], None] | None = None) -> list[StepModel]:
    """Train ``cfg.steps`` models of ``method`` (the class schedule of :func:`.data.class_schedule`);
    writes each step's loop log and exported model to ``out/step{t}/``. Returns the frozen models."""
    out = Path(out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    schedule = class_schedule(data.n_train_classes, cfg.steps, cfg.first_fraction)
    memory = ReplayMemory(cfg.memory_per_class, cfg.seed)
    train_x, train_y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    models: list[StepModel] = []
    for t, n_seen in enumerate(schedule):
        n_prev = schedule[t - 1] if t else 0
        if method.regime == "cumulative":
            current, mem = np.flatnonzero(data.train_y < n_seen), np.zeros(0, np.int64)
        else:
            current = np.flatnonzero((data.train_y >= n_prev) & (data.train_y < n_seen))
            mem = memory.indices.copy()
        step_idx = torch.from_numpy(np.concatenate([current, mem]))
        step_dir = _fresh_dir(out / f"step{t + 1}")
        ctx = StepContext(t=t, n_seen=n_seen, n_prev=n_prev, previous=list(models), train_x=train_x[step_idx],
                          train_y=train_y[step_idx], in_dim=data.in_dim, seed=cfg.seed,
                          input_mask=data.input_mask(t))

        def train_reference(i: int, ctx: StepContext = ctx, step_dir: Path = step_dir) -> StepModel:
            """An independently trained model of this step (ELODI's ensemble, MUSCLE's reference)."""
            ref = create_method("baseline", model=method.model_cfg)
            rctx = dataclasses.replace(ctx, previous=[], seed=cfg.seed + 7919 * (i + 1))
            ref.on_step_start(rctx)
            rseed = rctx.seed * 100 + t
            train(ref, StepBatches(data.train_x, data.train_y, current, mem, cfg.batch_size, rseed),
                  cfg.loop_config(rseed, len(step_idx)), step_dir / f"reference{i}", progress=False, export=False)
            model = ref.on_step_end(rctx)
            model.n_seen = n_seen
            return model

        ctx.extra["train_reference"] = train_reference
        method.on_step_start(ctx)
        seed = cfg.seed * 100 + t
        t0 = time.time()
        train(method, StepBatches(data.train_x, data.train_y, current, mem, cfg.batch_size, seed),
              cfg.loop_config(seed, len(step_idx)), step_dir, progress=False)
        model = method.on_step_end(ctx)
        model.n_seen = n_seen
        models.append(model)
        if method.regime == "continual":
            memory.add_classes(data.train_y, range(n_prev, n_seen))
        if log:
            log(f"{method.name} T={cfg.steps} step {t + 1}: {n_seen} classes, {len(step_idx)} items, "
                f"{time.time() - t0:.1f}s")
    return models


def _mean(rows: list[dict]) -> dict:
    """Mean of every float over the updates (NaNs skipped), sum of the counts."""
    out: dict = {}
    for key, value in rows[0].items():
        vals = [r[key] for r in rows]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, int):
            out[key] = int(sum(vals))
        else:
            finite = [v for v in vals if not np.isnan(v)]
            out[key] = float(np.mean(finite)) if finite else float("nan")
    return out


@torch.no_grad()
def evaluate_sequence(method: CompatMethod, models: list[StepModel], data: ClassData, strict: bool = True,
                      n_unpaired: int = 20000, metric: str = "search", n_paired: int = 100000) -> dict:
    """Compatibility matrix (``metric`` as M, every other metric of :data:`METRICS` under its name),
    AC / AA / ACA, consecutive-pair criterion rates and flips."""
    q, g = torch.from_numpy(data.query_x), torch.from_numpy(data.gallery_x)
    gallery = [to_numpy(method.retrieval_features(m, g)) for m in models]
    query_self = [to_numpy(method.retrieval_features(m, q)) for m in models]
    queries = {(t, k): to_numpy(method.query_features(models, t, k, q)) for t in range(len(models)) for k in range(t + 1)}
    names = [f"phi{t + 1}" for t in range(len(models))]

    qg, gg = data.query_groups, data.gallery_groups

    def summary_for(name: str) -> dict:
        fn = METRICS[name]
        c = _matrix(lambda t, k: fn(queries[t, k], gallery[k], data.query_y, data.gallery_y, qg, gg), len(models))
        return compatibility_summary(c, strict=strict, names=names)

    summary = summary_for(metric)
    summary["metric"] = metric
    for other in METRICS:
        if other != metric and not (qg is None and other == "search-with-duplicates"):
            summary[other] = {k: v for k, v in summary_for(other).items() if k in ("C", "AC", "AA", "ACA")}
    unseen_q, unseen_g = data.query_y >= data.n_train_classes, data.gallery_y >= data.n_train_classes
    if unseen_q.any() and unseen_g.any() and not (unseen_q.all() and unseen_g.all()):
        def score_unseen(t: int, k: int) -> float:
            return METRICS[metric](queries[t, k][unseen_q], gallery[k][unseen_g], data.query_y[unseen_q],
                                   data.gallery_y[unseen_g], None if qg is None else qg[unseen_q],
                                   None if gg is None else gg[unseen_g])

        sub = compatibility_summary(_matrix(score_unseen, len(models)), strict=strict, names=names)
        summary["open_set"] = {k: sub[k] for k in ("C", "AC", "AA", "ACA")}
    criterion, cls_flips, ret_flips = [], [], []
    test_x = torch.from_numpy(data.test_x)
    preds = [method.predict(m, test_x).numpy() for m in models]
    junk = {"query_groups": qg, "gallery_groups": gg} if metric == "search" else {}
    hits = [top1_hits(query_self[t], gallery[t], data.query_y, data.gallery_y, **junk) for t in range(len(models))]
    for t in range(1, len(models)):
        qn, qo = common_space(queries[t, t - 1], query_self[t - 1])
        _, go = common_space(qn, gallery[t - 1])
        criterion.append(criterion_rates(qn, qo, go, data.query_y, data.gallery_y, n_unpaired=n_unpaired,
                                         n_paired=n_paired, strict=strict, seed=t))
        known = data.test_y < models[t - 1].n_seen
        cls_flips.append(prediction_flip_rates(preds[t - 1][known], preds[t][known], data.test_y[known]))
        ret_flips.append(flip_rates(hits[t - 1], hits[t]))
    summary["criterion"] = ({"paired": float(np.mean([r["paired"] for r in criterion])),
                             "unpaired": float(np.mean([r["unpaired"] for r in criterion])), "strict": strict}
                            if criterion else None)
    summary["flips"] = ({"classification": _mean(cls_flips), "retrieval": _mean(ret_flips),
                         "per_update": {"classification": cls_flips, "retrieval": ret_flips}} if cls_flips else None)
    summary["test_accuracy"] = [float((preds[t][data.test_y < m.n_seen] == data.test_y[data.test_y < m.n_seen]).mean())
                                for t, m in enumerate(models)]
    return summary


def _matrix(score: Callable[[int, int], float], n: int) -> np.ndarray:
    from ...metrics.compat import compatibility_matrix

    return compatibility_matrix(score, n)


def run_method(name: str, data: ClassData, cfg: SequenceConfig, out: str | Path, options: dict | None = None,
               log: Callable[[str], None] | None = None, models: list[StepModel] | None = None,
               keep_models: bool = False) -> dict:
    """Train ``name`` over ``cfg.steps`` models and evaluate it; returns the summary (+ seconds).
    ``models``: evaluate these instead of training (a method that trains exactly like another, e.g.
    PSP / LSP like the baseline, reuses its models). ``keep_models``: add them under ``"models"``."""
    method = create_method(name, **(options or {}))
    t0 = time.time()
    if models is None:
        models = train_sequence(method, data, cfg, out, log=log)
    result = evaluate_sequence(method, models, data, strict=cfg.strict, metric=cfg.metric)
    result.update(method=name, regime=method.regime, init_from_previous=method.init_from_previous,
                  seconds=round(time.time() - t0, 2), steps=cfg.steps)
    if keep_models:
        result["models"] = models
    return result
