"""Run a task sequence of continual language learning and name its variants.

* :func:`method_config` - the method-name grammar of the benches and ``lingual learn``:
  ``<method>[_teir[_grad|_update][_reg][_used]][_oracle]``, ``<method>`` a registered name
  (:mod:`.registry`), e.g. ``cll_clip``, ``oewc_teir``, ``dualprompt_teir``, ``der_teir_oracle``.
* :func:`run_sequence` - evaluate the starting model, learn the tasks in order, evaluate after
  each; :func:`summarise` turns the evaluations into the recall matrix ``a[j, i]`` with AR / F.
* :func:`map_methods` - one sequence per method, in worker processes when asked.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from ..metrics.continual import continual_summary
from .learner import CLLConfig, ContinualLearner, LanguageTask
from .registry import lingual_method_names

StageEval = Callable[[object], dict]


def method_config(name: str, base: CLLConfig) -> CLLConfig:
    """``cll_clip``, ``oewc_teir``, ``cll_clip_teir_grad``, ``der_teir_oracle``, ... -> a
    :class:`CLLConfig` (``_grad`` / ``_update`` after ``teir`` pick how lambda acts with Adam;
    ``_reg`` keeps TEIR's regularisation but drops its initialisation; ``_used`` counts every
    token the task's text uses as a task token, ``CLLConfig.teir_task_tokens``)."""
    parts = name.split("_")
    kw: dict = {"oracle_vocab": parts[-1] == "oracle"}
    if kw["oracle_vocab"]:
        parts = parts[:-1]
    if parts[-1] == "used" and "teir" in parts:
        kw["teir_task_tokens"] = "used"
        parts = parts[:-1]
    if parts[-1] == "reg" and "teir" in parts:  # TEIR's regularisation without its initialisation
        kw["teir_init"] = False
        parts = parts[:-1]
    if parts[-1] in ("grad", "update") and len(parts) > 1 and parts[-2] == "teir":
        kw["teir_scale"] = parts.pop()
    kw["teir"] = parts[-1] == "teir"
    if kw["teir"]:
        parts = parts[:-1]
    try:
        return replace(base, method="_".join(parts), **kw)
    except ValueError as e:
        raise ValueError(f"unknown lingual method {name!r}: {e}") from None


def method_variants() -> list[str]:
    """Every registered method with and without TEIR, then the TEIR and vocabulary ablations."""
    return [f"{m}{t}" for m in lingual_method_names() for t in ("", "_teir")] + [
        "cll_clip_teir_grad", "cll_clip_teir_update", "cll_clip_teir_reg", "cll_clip_teir_used", "cll_clip_oracle",
        "cll_clip_teir_oracle"]


@dataclass
class SequenceResult:
    """The evaluations before and after each task, the learner's history and wall time."""

    stages: list[dict]
    history: list[dict]
    seconds: float
    learner: ContinualLearner


def run_sequence(encoder, tasks: Sequence[LanguageTask], cfg: CLLConfig, evaluate: StageEval, *,
                 english_corpus: Sequence[str], english_features, work_dir: Path,
                 oracle_corpora: Sequence[Sequence[str]] = (), log: Callable[[str], None] = lambda m: None,
                 after_all: Callable[[ContinualLearner], None] | None = None) -> SequenceResult:
    """Evaluate the starting model, then learn ``tasks`` in order, evaluating after each."""
    t0 = time.time()
    learner = ContinualLearner(encoder, cfg, english_corpus, english_features=english_features,
                               oracle_corpora=oracle_corpora, log=log)
    stages = [evaluate(encoder)]
    for task in tasks:
        learner.learn(task, Path(work_dir) / cfg.label)
        stages.append(evaluate(encoder))
        log(f"{cfg.label} after {task.lang}: {json.dumps(stages[-1])}")
    if after_all is not None:
        after_all(learner)
    return SequenceResult(stages, learner.history, time.time() - t0, learner)


def summarise(stages: list[dict], langs: Sequence[str], key: str) -> dict:
    """The ``len(langs)`` x ``len(langs)`` matrix of ``stages[1:][key][lang]`` and its AR / F."""
    m = [[stages[j + 1][key][lang] for lang in langs] for j in range(len(langs))]
    return continual_summary(m)


def prefixed_print(prefix: str) -> Callable[[str], None]:
    """A logger that prints ``[prefix] message`` (worker processes)."""
    return lambda m: print(f"[{prefix}] {m}", flush=True)


def map_methods(fn: Callable, names: Sequence[str], args: tuple, jobs: int, log: Callable[[str], None]) -> list:
    """``[fn(name, *args) for name in names]``, in ``jobs`` spawned worker processes when > 1 (one
    torch thread each; workers log to stdout with the method name as prefix)."""
    if jobs <= 1 or len(names) <= 1:
        return [fn(name, *args, log=log) for name in names]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(names)), mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(fn, name, *args) for name in names]
        return [f.result() for f in futures]


__all__ = ["method_config", "method_variants", "run_sequence", "SequenceResult", "summarise", "map_methods",
           "prefixed_print", "StageEval"]
