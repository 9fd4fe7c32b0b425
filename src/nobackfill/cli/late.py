"""``nobackfill late ...``: cross-modal late interaction (the Target-CMLI paper)."""

from __future__ import annotations

import dataclasses

from pathlib import Path
from typing import List, Optional

import typer

from ._common import (_bench, config_option, fail, json_flag, resolve_config, results, set_option,
                      show_config_option)


late_app = typer.Typer(no_args_is_help=True, help="Cross-modal late interaction (CMLI, Target-CMLI distillation).")


@late_app.command("train")
def late_train(
    kind: Optional[str] = typer.Option(None, help="cmli (global + CMLI InfoNCE, FILIP-style; default) | global | kd "
                                                  "(Target-CMLI)."),
    world: Path = typer.Option(Path("data/world"), help="World root (only world.json is read; scenes are streamed)."),
    out: Path = typer.Option(..., help="Output model directory (resumes from its checkpoint; a finished model there "
                                       "is refused)."),
    preset: Optional[str] = typer.Option(None, help="Zoo preset or TOML path of the model to train (default "
                                                    "world-tiny)."),
    teacher: Path = typer.Option(Path("models/world-new"), help="Teacher (kd) and tokenizer source."),
    steps: Optional[int] = typer.Option(None, help="Optimiser steps (default 2000)."),
    batch_size: Optional[int] = typer.Option(None, help="Image-caption pairs per step (default 64)."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default 2e-3)."),
    empty_target: Optional[bool] = typer.Option(None, "--empty-target/--no-empty-target",
                                                help="kd: the learnable empty target + L_Reg (Eq. 8; default on)."),
    kd_mode: Optional[str] = typer.Option(None, help="kd: target-cmli (Eq. 5-7; default) | global (global targets "
                                                     "only)."),
    seed: Optional[int] = typer.Option(None, help="Seed (default 0)."),
    threads: Optional[int] = typer.Option(None, min=1, help="torch threads (default 1)."),
    swap_twins: Optional[bool] = typer.Option(None, "--swap-twins/--no-swap-twins",
                                              help="Batches of scenes + their attribute-swap twins (in-batch hard "
                                                   "negatives from training scenes)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Train a world model with CMLI logits, or a Target-CMLI student of a teacher, from scratch
    (settings: late.world.LateTrainConfig, from --config / --set)."""
    from ..data.world import load_world_spec
    from ..encoders import load_encoder
    from ..encoders.zoo import shipped
    from ..late.world import LateTrainConfig, train_world_method
    from ..train.loop import check_output

    cfg = resolve_config(LateTrainConfig, None, config, set_, show=show_config, flags={
        "kind": kind, "preset": preset, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
        "threads": threads, "swap_twins": swap_twins, "kd": {"mode": kd_mode, "empty_target": empty_target}})
    try:
        teacher = shipped(teacher)  # the default, models/world-new, from any working directory
        check_output(out, finished="nobackfill.json", what="model", sources=(teacher,))  # before anything is read
        world = shipped(world)  # the default, data/world, from any working directory
        spec = load_world_spec(world)
        if spec is None:
            raise FileNotFoundError(f"{world}: {'no world.json' if Path(world).is_dir() else 'no such folder'}")
        t = load_encoder(teacher)
        if cfg.kind == "kd" and "image" not in getattr(t, "modalities", ("image", "text")):  # (trial AL)
            raise ValueError(f"{teacher}: the model embeds only text (it has no image tower): a kd teacher must "
                             "embed images (its image patches are distilled)")
        loop = cfg.loop
        kd = dataclasses.replace(cfg.kd, seed=loop.seed) if cfg.kind == "kd" else None
        _, r = train_world_method(cfg.kind, out, spec, t.tokenizer, preset=cfg.preset, batch_size=cfg.batch_size,
                                  cmli=cfg.cmli, kd=kd, teacher=t if cfg.kind == "kd" else None,
                                  swap_twins=cfg.swap_twins, progress=True, loop=loop)
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    results.print(f"trained {cfg.kind} model {out} in {r.seconds:.0f}s (last loss {r.last_loss:.3f})")


def bench_late(
    quick: bool = typer.Option(False, help="Under 15 minutes on 2 cores: fewer steps, smaller val sets."),
    json_out: Path = typer.Option(Path("runs/bench/late.json"), "--out", help="JSON output (a .md table beside it)."),
    models: Path = typer.Option(Path("models"), help="Folder with world-new (teacher and reference)."),
    world: Path = typer.Option(Path("data/world"), help="World root (test split files + world.json)."),
    work: Optional[Path] = typer.Option(None, help="Trained models (reused when their recipe matches); "
                                                   "default: <json dir>/late-work."),
    steps: Optional[int] = typer.Option(None, help="Override the training steps of the CMLI / global models."),
    kd_steps: Optional[int] = typer.Option(None, help="Override the training steps of the KD students."),
    world_new: bool = typer.Option(True, help="Also score the shipped world-new globally and re-ranked."),
    threads: int = typer.Option(1, min=1, help="torch threads per training process."),
    jobs: Optional[int] = typer.Option(None, help="Models trained at once in separate processes (quick: 2, else 1)."),
    extra_seeds: str = typer.Option("", help="Comma-separated extra training seeds of the global and CMLI models "
                                              "(per-seed and mean re-ranking gains), e.g. 1,2."),
    swap_twins: bool = typer.Option(False, help="Train the global and CMLI models with in-batch attribute-swap twins "
                                                "of training scenes (hard negatives)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """CMLI on the world: global vs re-ranked vs CMLI-trained R@K (incl. attribute-swap hard
    negatives), Target-CMLI students, naive vs streamed CMLI memory/time."""
    from ..bench.late import LateBenchConfig, run_late_bench
    from ..bench.late_report import REPORT
    from ..encoders.zoo import shipped

    kw = {"threads": threads, "world_new": world_new}
    try:
        kw["extra_seeds"] = tuple(int(x) for x in extra_seeds.split(",") if x.strip())
    except ValueError:
        fail(f"--extra-seeds must be comma-separated integers, got {extra_seeds!r}")
    if swap_twins:
        kw["swap_twins"] = True
    kw.update({k: v for k, v in {"steps": steps, "kd_steps": kd_steps, "jobs": jobs}.items() if v is not None})
    try:
        cfg = resolve_config(LateBenchConfig, LateBenchConfig.quick_preset(**kw) if quick else LateBenchConfig(**kw),
                             config, set_, show=show_config)
    except ValueError as e:
        fail(e)
    # the trained models go beside the JSON unless --work says where; the report writes the JSON
    work = work or json_out.parent / "late-work"
    models, world = shipped(models), shipped(world)  # the defaults from any working directory
    _bench(cfg, lambda c, log: run_late_bench(models, world, None, c, work=work, log=log), REPORT, json_out, as_json,
           errors=(RuntimeError,))
