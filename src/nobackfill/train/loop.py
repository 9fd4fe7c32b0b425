"""The one training loop of nobackfill. Every method (contrastive pre-training, XBT, the
compatibility-learning family, CLL-CLIP, RECO, ...) is a :class:`Method` plug-in: it names its
trainable parameter groups and its loss; the loop owns optimisation, schedules, logging,
periodic crash-safe checkpoints, exact resume after a kill, and fixed seeds.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
import torch

from .._atomic import atomic_write_text, file_above
from .._interrupts import held_interrupts
from .checkpoint import CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, NotRunState, load_state, save_state
from ..progress import progress_bar


@dataclass
class LoopConfig:
    """Optimisation settings shared by every method."""

    steps: int = 1000
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    seed: int = 0
    #: intervals in steps; 0 = scaled to ``steps``: a log line every steps/20, a checkpoint every
    #: steps/4 (at least 25), an evaluation at the end only
    log_every: int = 50
    checkpoint_every: int = 250
    eval_every: int = 500
    threads: int = 0  # 0 = leave torch's default
    schedule: str = "cosine"  # cosine | constant
    #: early stopping: the key of ``evaluate()``'s result to watch (higher is better; "" = off).
    #: Training stops after ``patience`` evaluations without a strict improvement and the method is
    #: restored to its best evaluated state before export (``steps`` is then a budget).
    early_stop: str = ""
    patience: int = 3

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ValueError(f"steps must be positive, got {self.steps}")
        for name in ("lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
                raise ValueError(f"{name} must be finite and {'> 0' if name == 'lr' else '>= 0'}, got {value}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = torch's default), got {self.threads}")
        if self.early_stop and self.patience < 1:
            raise ValueError(f"patience must be >= 1 with early_stop, got {self.patience}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        for name in ("log_every", "checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = scaled to steps), got {getattr(self, name)}")

    @property
    def log_interval(self) -> int:
        return self.log_every or max(1, self.steps // 20)

    @property
    def checkpoint_interval(self) -> int:
        return self.checkpoint_every or max(25, self.steps // 4)

    @property
    def eval_interval(self) -> int:
        return self.eval_every or self.steps


class BatchSource(Protocol):
    """Deterministic batches: ``batch(i)`` is the same on every call, so resume is exact."""

    def batch(self, index: int) -> Any: ...


class Method:
    """A training method plug-in. Subclasses set :attr:`name` and implement the hooks."""

    name: str = "method"
    #: what else decides what is trained (the data, the batch size, the model's shape): recorded in a
    #: checkpoint, and a resume with other values is refused (:func:`check_resume`); the caller sets it
    run_settings: dict | None = None

    def param_groups(self) -> list[dict]:
        """Optimiser parameter groups; a group may carry ``lr_scale`` (multiplies the base lr)."""
        raise NotImplementedError

    def loss(self, batch: Any, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one batch and scalars to log."""
        raise NotImplementedError

    def train_mode(self, training: bool) -> None:
        """Switch modules between train and eval mode."""

    def before_backward(self, step: int) -> None:
        """Called after :meth:`loss` and before ``backward()`` and the optimiser step (e.g. take
        a snapshot of parameters whose update the method rescales in :meth:`after_step`)."""

    def after_step(self, step: int) -> None:
        """Called after every optimiser step (e.g. clamp a temperature)."""

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def export(self, out: Path) -> None:
        """Write the trained artefact (model directory, adapter, ...) to ``out``."""
        raise NotImplementedError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def deterministic(seed: int, threads: int) -> Iterator[None]:
    """Within the block, a run's numbers are the same run to run on one machine and library set:
    ``threads`` torch threads (how a reduction is split, so its rounding, depends on it), torch's
    deterministic algorithms only (an op without one raises instead of varying), every RNG seeded.
    The previous threads and algorithm setting come back after the block (``bench lingual-*``
    workers; tests/test_lingual_determinism.py)."""
    if threads < 0:
        raise ValueError(f"threads must be >= 0 (0 = torch's default), got {threads}")
    prev_threads, prev_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    seed_everything(seed)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det)
        torch.set_num_threads(prev_threads)


def lr_factor(step: int, cfg: LoopConfig) -> float:
    """Linear warm-up then cosine decay to 0 (or constant)."""
    if step < cfg.warmup:
        return (step + 1) / max(1, cfg.warmup)
    if cfg.schedule == "constant":
        return 1.0
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))



@dataclass
class TrainResult:
    steps: int
    seconds: float
    last_loss: float
    history: list[dict]
    out: Path
    #: with early stopping: the step whose state was kept, its value, and whether the run stopped early
    best_step: int | None = None
    best_value: float | None = None
    stopped_early: bool = False


#: settings that do not change what is trained (a resume may change them): a run's data folder is
#: one (the same data elsewhere resumes); what it holds is compared (``"data contents"``), and so is
#: what an XBT stage 2 starts from (``"stage 1 (phi)"``, trained on its ``"text corpus"``)
_RESUME_FREE = ("threads", "log_every", "checkpoint_every", "data", "text corpus")
#: a compared setting -> the resume-free one that says where it came from (named when both differ)
_SOURCE_OF = {"data contents": "data", "stage 1 (phi)": "text corpus"}


class ResumeMismatch(ValueError):
    """A checkpoint written by a run with other loop settings (or of another method) than this one's."""


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``d`` with nested dicts as dotted keys (``model.text_layers``)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def setting_changes(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``"key old (now new)"`` for each setting recorded in both (nested dicts as dotted keys) whose
    values differ, leaving out those that change nothing trained (:data:`_RESUME_FREE`, at any depth)."""
    was, now = _flat(was), _flat(now)
    return [f"{k} {was[k]!r} (now {now[k]!r})" for k in now if k in was and k.rsplit(".", 1)[-1] not in _RESUME_FREE
            and was[k] != now[k]]


def check_resume(path: Path, saved: dict[str, Any] | None, cfg: LoopConfig, *, method: str | None = None,
                 saved_method: str | None = None, run: dict | None = None, saved_run: dict | None = None) -> None:
    """:class:`ResumeMismatch` naming each setting where the run that wrote the checkpoint ``path``
    (``saved``: its loop config) and this one differ: resuming would train on with the old ones
    (the optimiser's state, the schedule) while the new ones were recorded. A checkpoint of another
    method (``saved_method``, recorded since the checkpoints name it) is refused too."""
    if method is not None and saved_method is not None and saved_method != method:
        raise ResumeMismatch(f"{path} was written by a run of {saved_method} (now {method}): give another --out "
                             f"(or delete {path.name} to start afresh)")
    diff = setting_changes({**(saved_run or {}), **(saved or {})}, {**(run or {}), **asdict(cfg)})  # data first
    for compared, source in reversed(_SOURCE_OF.items()):  # (where the other data came from)
        was_at, now_at = (saved_run or {}).get(source), (run or {}).get(source)
        if any(d.startswith(f"{compared} ") for d in diff) and was_at and now_at and was_at != now_at:
            diff.insert(0, f"{source} {was_at!r} (now {now_at!r})")
    if diff:
        raise ResumeMismatch(f"{path} was written by a run with {', '.join(diff)}: rerun with its settings to "
                             f"resume it, or give another --out (or delete {path.name} to start afresh)")


#: what a run leaves in its output folder before it finishes (globs): its checkpoint, its log and the
#: temporary files of their atomic writes (:mod:`nobackfill._atomic`) that a kill left
RUN_FILES = (CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, "train_log.jsonl", f".{CHECKPOINT_FILE}.*",
             f".{LEGACY_CHECKPOINT_FILE}.*", ".train_log.jsonl.*")


def check_output(out: Path, *, finished: str | None, what: str = "", also: Iterable[str] = (),
                 sources: Iterable[Any] = (), resumable: bool = True) -> None:
    """``ValueError`` (one line, naming ``--out``) unless the folder ``out`` can take this command's run,
    checked before anything is read or trained: absent or empty; holding a checkpoint (a killed run of
    the command: the loop resumes it, refusing one of other settings); or holding only what an unfinished
    run leaves (:data:`RUN_FILES` and the names matching a glob of ``also``, e.g. an earlier stage's
    folder; a rerun starts afresh). A finished run (its file ``finished`` is there: ``what`` names it),
    a file, one of ``sources`` (the models the command reads) or a folder of other files is refused:
    nothing is overwritten. ``resumable=False``: a command that never resumes, for which any file is
    another's (a checkpoint or log included)."""
    out = Path(out)
    for src in sources:
        if src is not None and Path(src).exists() and out.exists() and Path(src).resolve() == out.resolve():
            raise ValueError(f"--out {out}: is the model this command starts from; give another folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file; give a folder")
    if not out.exists() and (above := file_above(out)) is not None:
        raise ValueError(f"--out {out}: {above} is a file, not a folder")
    checkpoints = (CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE)
    if not out.is_dir() or (resumable and any((out / name).is_file() for name in checkpoints)):
        return
    odd = out / CHECKPOINT_FILE
    if resumable and os.path.lexists(odd):  # a folder, a link to nothing or to a device (trial AB)
        raise ValueError(f"--out {out}: {odd.name} there is not a file; remove it (a run resumes only from the "
                         "file a run wrote), or give another folder")
    if finished is not None and (out / finished).exists():
        raise ValueError(f"--out {out}: holds a finished {what} already ({finished}); give a new folder, or remove "
                         "it first to train again")
    run_files = RUN_FILES if resumable else ()
    other = sorted(p.name for p in out.iterdir()
                   if not (any(fnmatch.fnmatch(p.name, pattern) for pattern in also)
                           or (p.is_file() and any(fnmatch.fnmatch(p.name, pattern) for pattern in run_files))))
    if other:
        raise ValueError(f"--out {out}: holds files already ({', '.join(other[:4])}{', ...' if len(other) > 4 else ''})"
                         "; give a new or empty folder (or remove it first)")


def write_recipe(out: str | Path, recipe: dict[str, Any]) -> Path:
    """Write ``out/recipe.json`` (what a run was: settings, data, the command), atomically. A ``data``
    that names an existing file or folder is recorded as its absolute path, and the working folder the
    command ran in beside it (``cwd``), so the recorded command line can be run again from anywhere."""
    recipe = dict(recipe)
    data = recipe.get("data")
    if isinstance(data, (str, Path)) and data and Path(data).exists():
        recipe["data"] = str(Path(data).resolve())
    recipe.setdefault("cwd", os.getcwd())
    path = Path(out) / "recipe.json"
    atomic_write_text(path, json.dumps(recipe, indent=2, default=str))
    return path


class TrainingDiverged(FloatingPointError):
    """The loss was not finite at a step (the run diverged: a learning rate too high, bad data): the
    message says so, and what a rerun needs (the checkpoint in ``out``, if any, was written with the
    same settings and would diverge again). A command prints it as one line (trial AB: a traceback)."""

    def __init__(self, method: str, loss: float, step: int, out: Path, checkpoint_step: int | None = None) -> None:
        self.method, self.loss, self.step = method, loss, step
        self.out, self.checkpoint_step = Path(out), checkpoint_step
        kept = (f"; the checkpoint at step {checkpoint_step} in {out} has these settings: delete it (or give another "
                "--out) to train with others" if checkpoint_step else "")
        super().__init__(f"{method}: the loss is {loss} at step {step}: the training diverged; try a lower learning "
                         f"rate (or check the data){kept}")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`train`: where the run stood (the step reached; the checkpoint left in
    ``out``, if any, and its step when known) and :meth:`message`, the line a command prints. Still a
    ``KeyboardInterrupt``."""

    def __init__(self, method: str, step: int, steps: int, out: Path, checkpoint: Path | None = None,
                 checkpoint_step: int | None = None, keeps_checkpoints: bool = True) -> None:
        super().__init__(method, step, steps, str(out))
        self.method, self.step, self.steps, self.out = method, step, steps, Path(out)
        self.checkpoint, self.checkpoint_step = checkpoint, checkpoint_step
        self.keeps_checkpoints = keeps_checkpoints

    def message(self) -> str:
        head = f"interrupted at step {self.step} of {self.steps} ({self.method})"
        if self.checkpoint is None:
            return f"{head}; {'no checkpoint yet' if self.keeps_checkpoints else 'this run keeps no checkpoint'}: " \
                   "a rerun starts afresh"
        at = f" at step {self.checkpoint_step}" if self.checkpoint_step else ""
        return f"{head}; the checkpoint{at} in {self.out} resumes it: rerun the same command"


def train(method: Method, batches: BatchSource, cfg: LoopConfig, out: str | Path,
          evaluate: Callable[[], dict[str, float]] | None = None, progress: bool = True,
          export: bool = True) -> TrainResult:
    """Run ``cfg.steps`` optimiser steps of ``method`` on ``batches``; resumes from
    ``out/checkpoint.safetensors`` if present; writes ``out/train_log.jsonl`` and, at the end, the
    method's export into ``out``. Ctrl-C raises :class:`TrainingInterrupted` (where the run stood)."""
    out = Path(out)
    where: dict = {"step": 0, "checkpoint": None}  # the step reached, the step of the last checkpoint
    try:
        return _train(method, batches, cfg, out, evaluate, progress, export, where)
    except TrainingInterrupted:
        raise  # a run inside this one (e.g. a method's reference model) says where it stood
    except KeyboardInterrupt:
        ckpt = out / CHECKPOINT_FILE
        raise TrainingInterrupted(method.name, where["step"], cfg.steps, out, ckpt if ckpt.is_file() else None,
                                  where["checkpoint"], keeps_checkpoints=cfg.checkpoint_interval < cfg.steps) from None


def _read_checkpoint(path: Path) -> dict:
    """The run state in ``path`` (written by this loop, atomically); one that cannot be read (a file
    damaged on disk or in a copy) is refused naming it (:class:`ResumeMismatch`): torch's own error
    was a traceback (trial Y)."""
    try:
        state = load_state(path)
    except NotRunState:
        state = None
    except Exception as e:
        raise ResumeMismatch(f"{path}: cannot be read as a checkpoint, it is damaged ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160] if str(e) else 'no detail'}): delete it to start afresh "
                             "(or give another --out)") from None
    if not isinstance(state, dict) or "step" not in state:
        raise ResumeMismatch(f"{path}: not a checkpoint of this training loop: delete it to start afresh "
                             "(or give another --out)")
    return state


def _train(method: Method, batches: BatchSource, cfg: LoopConfig, out: Path,
           evaluate: Callable[[], dict[str, float]] | None, progress: bool, export: bool, where: dict) -> TrainResult:
    """:func:`train`; ``where`` follows the step reached and the last checkpoint written."""
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    groups = method.param_groups()
    for g in groups:
        g["base_lr"] = cfg.lr * g.pop("lr_scale", 1.0)
        g.setdefault("weight_decay", cfg.weight_decay)
        g["lr"] = g["base_lr"]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    params = [p for g in groups for p in g["params"]]
    ckpt_path = out / CHECKPOINT_FILE
    if not ckpt_path.is_file() and (out / LEGACY_CHECKPOINT_FILE).is_file():
        raise ResumeMismatch(f"{out / LEGACY_CHECKPOINT_FILE}: a checkpoint of an earlier nobackfill, a pickle, which "
                             "is not read (loading it could run code): delete it to start afresh "
                             "(or give another --out)")
    log_path = out / "train_log.jsonl"
    start, history, elapsed = 0, [], 0.0
    # early-stopping state: best value, its step, evaluations since, a copy of the best state
    es: dict = {"best": None, "step": None, "bad": 0, "state": None, "stopped": False}
    if ckpt_path.is_file():
        state = _read_checkpoint(ckpt_path)
        check_resume(ckpt_path, state.get("config"), cfg, method=method.name, saved_method=state.get("method_name"),
                     run=method.run_settings, saved_run=state.get("run_settings"))
        try:
            method.load_state_dict(state["method"])
        except (RuntimeError, KeyError, ValueError) as e:  # another model: other shapes or parameters
            why = " ".join(str(e).split())[:200]  # (torch's message spans lines: trial AB saw it cut at its first)
            raise ResumeMismatch(f"{ckpt_path} holds a model that is not this run's ({why}): "
                                 f"give another --out (or delete {ckpt_path.name} to start afresh)") from None
        opt.load_state_dict(state["optimizer"])
        start, history, elapsed = state["step"], state["history"], state["elapsed"]
        where.update(step=start, checkpoint=start)
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        es = state.get("early_stop", es)
        # drop log lines written after the checkpoint (the steps are re-run and logged again)
        atomic_write_text(log_path, "".join(json.dumps(r) + "\n" for r in history))
        if progress:
            print(f"resuming {method.name} in {out} from step {start} of {cfg.steps} (its checkpoint)",
                  file=sys.stderr)
            if (out / LEGACY_CHECKPOINT_FILE).is_file():
                print(f"{LEGACY_CHECKPOINT_FILE} beside it is an earlier version's (a pickle): not read, and removed "
                      "when the run ends", file=sys.stderr)
    elif log_path.exists():  # a finished run's output trained again from step 0: its log starts afresh
        log_path.unlink()
    t0 = time.time() - elapsed
    last = float("nan")
    method.train_mode(True)
    before_backward = getattr(method, "before_backward", None)  # duck-typed methods may lack the hook
    with progress_bar(progress, f"train {method.name}", cfg.steps) as advance:
        advance(start)
        for step in range(start, cfg.steps):
            if es["stopped"]:
                break
            f = lr_factor(step, cfg)
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * f
            loss, logs = method.loss(batches.batch(step), step)
            if not torch.isfinite(loss):
                raise TrainingDiverged(method.name, loss.item(), step, out, where["checkpoint"])
            if before_backward is not None:
                before_backward(step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            method.after_step(step)
            last = float(loss.item())
            advance(1)
            done = where["step"] = step + 1
            record = None
            if done % cfg.log_interval == 0 or done == cfg.steps:
                record = {"step": done, "loss": last, "lr": opt.param_groups[0]["lr"],
                          "seconds": round(time.time() - t0, 2), **logs}
            if evaluate is not None and (done % cfg.eval_interval == 0 or done == cfg.steps):
                method.train_mode(False)
                metrics = evaluate()
                record = dict(record or {"step": done, "loss": last, "seconds": round(time.time() - t0, 2)},
                              **{f"eval/{k}": v for k, v in metrics.items()})
                if cfg.early_stop:
                    if cfg.early_stop not in metrics:
                        raise KeyError(f"early_stop key {cfg.early_stop!r} not in evaluate() result {sorted(metrics)}")
                    value = float(metrics[cfg.early_stop])
                    if es["best"] is None or value > es["best"]:
                        es.update(best=value, step=done, bad=0, state=copy.deepcopy(method.state_dict()))
                    else:
                        es["bad"] += 1
                        es["stopped"] = es["bad"] >= cfg.patience
                method.train_mode(True)
            with held_interrupts():  # a log line and a checkpoint are written whole
                if record is not None:
                    history.append(record)
                    with open(log_path, "a") as fh:
                        fh.write(json.dumps(record) + "\n")
                if done % cfg.checkpoint_interval == 0 and done < cfg.steps:
                    save_state({"method": method.state_dict(), "optimizer": opt.state_dict(), "step": done,
                                        "history": history, "elapsed": time.time() - t0,
                                        "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                                        "python_rng": random.getstate(), "config": asdict(cfg),
                                        "early_stop": es, "method_name": method.name,
                                        "run_settings": method.run_settings}, ckpt_path)
                    where["checkpoint"] = done
    method.train_mode(False)
    if cfg.early_stop and es["state"] is not None:
        method.load_state_dict(es["state"])
    seconds = time.time() - t0
    if export:
        method.export(out)
    # the run is finished: its checkpoint goes, with what kills left of earlier ones (their temporary
    # files; trial AB: 3.5 MB in the finished model) and a pickled one of an earlier version, never read
    for stale in [ckpt_path, out / LEGACY_CHECKPOINT_FILE, *out.glob(f".{CHECKPOINT_FILE}.*"),
                  *out.glob(f".{LEGACY_CHECKPOINT_FILE}.*")]:
        if stale.is_file():
            stale.unlink()
    steps_done = history[-1]["step"] if es["stopped"] and history else cfg.steps
    return TrainResult(steps=steps_done, seconds=seconds, last_loss=last, history=history, out=out,
                       best_step=es["step"], best_value=es["best"], stopped_early=bool(es["stopped"]))


def trainable(params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return [p for p in params if p.requires_grad]
