"""``nobackfill compat ...``: compatibility learning over a sequence of model updates (Biondi et al.'s tutorial)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from ..report import json_finite
from ._common import _bench, config_option, console, fail, json_flag, resolve_config, set_option, show_config_option


compat_app = typer.Typer(no_args_is_help=True,
                         help="Compatibility learning over a sequence of model updates (Biondi et al.'s tutorial).")
STEP_BACKBONES_HELP = ("Backbone upgrades: per step (comma-separated) the +-joined parts of --backbone that step's "
                       "model sees; later steps repeat the last. Empty: every step sees all parts.")
BACKBONE_HELP = ("Frozen feature extractors joined by + (world model dirs, randconv, pixels) for an MLP per step, "
                 "or image<R> (e.g. image32): R x R pixels for a small CNN trained from scratch per step.")
METRIC_HELP = ("M of C[t,k]: search (top-1 1:N search accuracy; a gallery item of the query's class rendered in the "
               "query's size, texture and background is junk, as in Market-1501), search-with-duplicates (no junk "
               "rule) or verification (pair verification accuracy).")
_BACKBONE = typer.Option(None, help=BACKBONE_HELP + " Default: randconv+models/world-new.")
_SPLIT = typer.Option(None, help="Evaluation split: test (report, default) or val (tuning).")
_N_RENDER_TRAIN = typer.Option(None, help="Rendered training items (about 1/3 single-object).")
_N_RENDER_EVAL = typer.Option(None, help="Rendered evaluation items.")
_N_TRAIN_CLASSES = typer.Option(None, help="Training pool size (the rest is the open set).")
_FIRST_FRACTION = typer.Option(None, help="Share of the pool seen at step 1 "
                                           "(default: T equal tasks, the tutorial's split).")
_CACHE_DIR = typer.Option(None, help="Feature cache (default runs/compat_steps/cache).")
_STEP_BACKBONES = typer.Option(None, help=STEP_BACKBONES_HELP)
_METRIC = typer.Option(None, help=METRIC_HELP + " Default: search.")
_SEED = typer.Option(None, help="Seed (default 0).")
_THREADS = typer.Option(None, help="torch threads (default 1).")


def _parse_options(items: list[str] | None) -> dict:
    """``key=value`` pairs; values parsed as JSON when possible (numbers, true/false), else strings."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--option {item!r}: expected key=value")
        key, value = item.split("=", 1)
        try:
            out[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip().replace("-", "_")] = value
    return out


def _data_flags(backbone: Optional[str], split: Optional[str], n_render_train: Optional[int],
                n_render_eval: Optional[int], n_train_classes: Optional[int], cache_dir: Optional[Path],
                step_backbones: Optional[str]) -> dict:
    """The DataConfig fields given on the command line (None: not given)."""
    return {"backbone": backbone, "eval_split": split, "n_render_train": n_render_train, "n_render_eval": n_render_eval,
            "n_train_classes": n_train_classes, "cache_dir": str(cache_dir) if cache_dir else None,
            "step_backbones": step_backbones}


def _check_out(out: Path) -> None:
    """Refuse (``ValueError``) an ``--out`` holding a finished result (of any method: named) or other
    files; a killed run's step folders are trained afresh (compat train does not resume)."""
    from ..train.loop import check_output

    what = "compat train result"
    try:
        what = f"result of {json.loads((out / 'result.json').read_text())['method']}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    check_output(out, finished="result.json", what=what, also=("step*",))


@compat_app.command("methods")
def methods_cmd() -> None:
    """List the registered methods."""
    from ..compat.learning import method_class, method_names

    for name in method_names():
        cls = method_class(name)
        typer.echo(f"{name:14s} regime={cls.regime:10s} fine-tune={cls.init_from_previous!s:5s} "
                   f"simplex={cls.fixed_simplex!s:5s} {(cls.__doc__ or '').strip().splitlines()[0] if cls.__doc__ else ''}")


@compat_app.command("train")
def train_cmd(
    method: str = typer.Option(..., help="Method name (see `nobackfill compat methods`)."),
    steps: Optional[int] = typer.Option(None, help="T, the number of models (model updates + 1; default 2)."),
    out: Path = typer.Option(Path("runs/compat"), help="Output folder (step models, loop logs, result.json); one "
                                                       "holding a finished result is refused, a killed run's is "
                                                       "trained afresh."),
    epochs: Optional[float] = typer.Option(None, help="Passes over each step's items (default 40; 0: use "
                                                      "--train-steps)."),
    train_steps: Optional[int] = typer.Option(None, help="Optimiser steps per model when epochs is 0 (default 600)."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default 3e-3)."),
    option: Optional[List[str]] = typer.Option(None, "--option", help="Method option key=value (repeatable), "
                                                                       "e.g. influence_weight=0.5, regime=continual."),
    backbone: str = _BACKBONE,
    split: str = _SPLIT,
    n_render_train: Optional[int] = _N_RENDER_TRAIN,
    n_render_eval: Optional[int] = _N_RENDER_EVAL,
    n_train_classes: Optional[int] = _N_TRAIN_CLASSES,
    first_fraction: Optional[float] = _FIRST_FRACTION,
    cache_dir: Path = _CACHE_DIR,
    step_backbones: str = _STEP_BACKBONES,
    metric: str = _METRIC,
    seed: Optional[int] = _SEED,
    threads: Optional[int] = _THREADS,
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Train one method over T model updates with the one training loop and print C(t,k), AC, AA, ACA
    and the flips between consecutive models."""
    from ..report import text_table
    from ..compat.learning.data import load_class_data
    from ..compat.learning.registry import check_options
    from ..compat.learning.sequence import MethodRunConfig, run_method
    from ..config import warn_warmup

    try:
        cfg = resolve_config(MethodRunConfig, None, config, set_, show=show_config, flags={
            "sequence": {"steps": steps, "train_steps": train_steps, "epochs": epochs, "lr": lr, "seed": seed,
                         "threads": threads, "metric": metric, "first_fraction": first_fraction},
            "data": _data_flags(backbone, split, n_render_train, n_render_eval, n_train_classes, cache_dir,
                                step_backbones),
            "options": _parse_options(option)},  # the method and its options checked before anything is
            check=lambda c: check_options(method, c.options))  # loaded, trained or written (--show-config too)
        _check_out(out)
        if not cfg.sequence.epochs:  # (with epochs the steps follow each model's data)
            warn_warmup(cfg.sequence.loop_config(cfg.sequence.seed), "sequence")
        data = load_class_data(cfg.data)
        result = run_method(method, data, cfg.sequence, out, options=cfg.options, log=lambda m: console.print(m))
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    n = len(result["C"])
    header = ["query \\ gallery"] + [f"phi{k + 1}" for k in range(n)]
    body = [[f"phi{t + 1}"] + ["" if v is None else f"{100 * v:.1f}" for v in row] for t, row in enumerate(result["C"])]
    typer.echo(text_table(header, body))
    typer.echo(f"{method} T={cfg.sequence.steps}: AC {result['AC']:.2f}  AA {100 * result['AA']:.1f}  ACA {100 * result['ACA']:.1f}"
               f"  (ties incompatible: strict={result['strict']})")
    if result["flips"]:
        f = result["flips"]
        typer.echo(f"NFR classification {100 * f['classification']['NFR']:.2f}% (relative "
                   f"{f['classification']['rel_NFR']:.2f}), retrieval top-1 {100 * f['retrieval']['NFR']:.2f}%")
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(json_finite(result), indent=2, default=str))  # NaN: null
    console.print(f"wrote {out / 'result.json'}")


def bench_compat_steps(
    steps: str = typer.Option("2,5,10", help="Comma-separated T values."),
    quick: bool = typer.Option(False, help="12 epochs per model (instead of 40) at lr 5e-3, 2-model ELODI ensembles."),
    json_out: Path = typer.Option(Path("runs/bench/compat_steps.json"), "--out",
                                  help="JSON output (.md and .html with C heatmaps beside it)."),
    methods: str = typer.Option("", help="Comma-separated subset of methods (default: all)."),
    train_steps: Optional[int] = typer.Option(None, help="Fixed optimiser steps per model (instead of epochs)."),
    epochs: Optional[float] = typer.Option(None, help="Passes over each step's items (default 40, quick 12)."),
    backbone: str = _BACKBONE,
    split: str = _SPLIT,
    n_render_train: Optional[int] = _N_RENDER_TRAIN,
    n_render_eval: Optional[int] = _N_RENDER_EVAL,
    n_train_classes: Optional[int] = _N_TRAIN_CLASSES,
    first_fraction: Optional[float] = _FIRST_FRACTION,
    cache_dir: Path = _CACHE_DIR,
    work_dir: Path = typer.Option(Path("runs/compat_steps/work"), help="Step models and loop logs."),
    step_backbones: str = _STEP_BACKBONES,
    metric: str = _METRIC,
    seed: int = _SEED,
    threads: int = _THREADS,
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """The compatibility-learning tutorial's tables on the world: AC / AA / ACA per method for each T,
    NFR of the flip-reduction methods, C heatmaps (HTML)."""
    from ..bench.compat_steps import METHOD_ORDER, REPORT, CompatStepsConfig, run_compat_steps
    from ..compat.learning.data import DataConfig
    from ..compat.learning.sequence import SequenceConfig
    from ..config import updated

    try:
        kw = {"steps": tuple(int(s) for s in steps.split(",") if s.strip()),
              "methods": tuple(m.strip() for m in methods.split(",") if m.strip()) or METHOD_ORDER,
              "sequence": updated(SequenceConfig(epochs=40, batch_size=256, lr=3e-3), seed=seed or 0,
                                  threads=threads or 1, metric=metric or "search", first_fraction=first_fraction or 0.0),
              "data": updated(DataConfig(), **{k: v for k, v in _data_flags(
                  backbone, split, n_render_train, n_render_eval, n_train_classes, cache_dir, step_backbones).items()
                  if v is not None})}
        seq = {"epochs": 0.0, "train_steps": train_steps} if train_steps else {"epochs": epochs}
        cfg = resolve_config(CompatStepsConfig, CompatStepsConfig.quick(**kw) if quick else CompatStepsConfig(**kw),
                             config, set_, flags={"sequence": seq}, show=show_config)
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    _bench(cfg, lambda c, log: run_compat_steps(c, None, work_dir, log=log), REPORT, json_out, as_json)
