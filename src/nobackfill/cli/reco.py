"""``nobackfill reco ...``: retrieval-enhanced embeddings (Iscen et al. 2023)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from ._common import command_line, from_project, on_interrupt, report_skipped, results, skip_bad_hint
from ._common import (_bench, check_new_output, config_option, fail, json_flag, langs_option, resolve_config, set_option,
                      show_config_option)


from ..data.labels import LABEL_SETS

if TYPE_CHECKING:
    from ..reco.train import RecoTrainConfig

reco_app = typer.Typer(no_args_is_help=True,
                       help="RECO: refine frozen-encoder embeddings with knowledge retrieved from a memory (Iscen et al. 2023).")


@reco_app.command("build-memory")
def build_memory_cmd(
    model: Path = typer.Option(..., help="The frozen encoder (its space is the memory's)."),
    data: Path = typer.Option(..., help="Image-text pairs: a user data folder or a world root (see --split)."),
    out: Path = typer.Option(..., help="Memory directory to create."),
    split: str = typer.Option("train", help="Split when --data is a world root."),
    langs: str = langs_option(),
    exclude: Optional[List[Path]] = typer.Option(None, "--exclude", help="Test data whose images, exact copies and "
                                                 "near-duplicates are removed (data folder; repeat)."),
    threshold: float = typer.Option(0.95, help="Near-duplicate cosine threshold (see --dedup)."),
    dedup: str = typer.Option("pixels", help="Near-duplicate space: pixels (16x16 thumbnails) | embedding."),
    backend: str = typer.Option("flat", help="FAISS backend of the memory's indexes."),
    skip_bad: bool = typer.Option(False, help="Skip malformed lines / unreadable images."),
) -> None:
    """Embed a pair folder once with the frozen encoder into a memory (a gallery of both modalities),
    without test items and their near-duplicates."""
    from ..encoders import load_encoder
    from ..evaluate import load_eval_data
    from ..reco.memory import MEMORY_FILE, build_memory

    # before anything is read: a new or empty folder, or one a killed build left (its gallery resumes)
    check_new_output(out, sources=(model,), finished=MEMORY_FILE, what="memory", also=("gallery",))
    on_interrupt(f"what was embedded, if embedding had begun, stays in {out / 'gallery'}: the same command goes "
                 "on from it")
    lang_l = [x for x in langs.split(",") if x]
    try:
        ds = load_eval_data(data, split, langs=lang_l, skip_bad=skip_bad)
        ex = [load_eval_data(p, "test", langs=None) for p in exclude or []]
        enc = load_encoder(model)
        mem = build_memory(enc, ds, out, exclude=ex, threshold=threshold, dedup=dedup, model_ref=str(model),
                           backend=backend, progress=True)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        fail(skip_bad_hint(e))
    report_skipped(ds.skipped, ds.skipped_images, ds.problems, root=ds.root)
    r = mem.removal
    results.print(f"memory {out}: {r['kept_images']} images, {r['kept_texts']} texts, space {mem.space_id}; "
                     f"removed {r['test_items']} test item(s) and {r['near_duplicates']} near-duplicate(s) "
                     f"({r['dedup']} cosine > {r['threshold']})")


@reco_app.command("train")
def train_cmd(
    memory: Path = typer.Option(..., help="Memory directory (from `reco build-memory`)."),
    out: Path = typer.Option(..., help="RECO directory to write (reco.json + fusion.safetensors)."),
    k: Optional[int] = typer.Option(None, help="Retrieved neighbours per query (k; default 10)."),
    search: Optional[str] = typer.Option(None, help="kNN search: uni (v->v, t->t; the paper's, default) | cross."),
    fuse: Optional[str] = typer.Option(None, help="Fused modality: cross (image query gets texts; the paper's, "
                                                  "default) | uni."),
    fusion: Optional[str] = typer.Option(None, help="transformer (one layer, default) | mean (ablation, untrained)."),
    heads: Optional[int] = typer.Option(None, help="Attention heads (default 4)."),
    steps: Optional[int] = typer.Option(None, help="Optimiser steps (default 1500; a budget when --val is given)."),
    batch_size: Optional[int] = typer.Option(None, help="Pairs per step (default 512)."),
    lr: Optional[float] = typer.Option(None, help="Learning rate (default: the paper's 1e-3)."),
    val: Optional[Path] = typer.Option(None, help="Validation pairs (data folder or world root, val split): "
                                                  "early stopping on mean R@1 with refined queries."),
    model: Optional[Path] = typer.Option(None, help="The memory's encoder (needed with --val / --pairs)."),
    pairs: Optional[Path] = typer.Option(None, help="Train on these pairs (data folder or world root, train split) "
                                                    "instead of the memory's own; a pair whose image is in the "
                                                    "memory is excluded from its own neighbours."),
    seed: Optional[int] = typer.Option(None, help="Seed (default 0)."),
    threads: Optional[int] = typer.Option(None, min=1, help="torch threads (default 1)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Train phi_image and phi_text on the memory's pairs (each excluded from its own neighbours) with
    L = NCE(V_bar, T_bar) + NCE(V_bar, T) + NCE(V, T_bar); the encoder stays frozen."""
    from ..config import warn_warmup
    from ..reco.memory import Memory
    from ..reco.train import RecoTrainConfig, train_reco, training_inputs

    if not show_config:  # a finished RECO model there is not overwritten (trial R)
        check_new_output(out, sources=(memory,), finished="reco.json", what="RECO model")
    try:
        cfg = resolve_config(RecoTrainConfig, None, config, set_, show=show_config, flags=_train_flags(
            k=k, search=search, fuse=fuse, fusion=fusion, heads=heads, batch_size=batch_size, steps=steps, lr=lr,
            seed=seed, threads=threads))
        warn_warmup(cfg)
        command = _rerun_command(cfg, memory=memory, out=out, val=val, model=model, pairs=pairs)
        mem = Memory.open(memory)
        pair_emb, evaluate = training_inputs(mem, model, pairs=pairs, val=val, progress=True)
        rm, res = train_reco(mem, out, cfg, pairs=pair_emb, evaluate=evaluate, early_stop="score" if evaluate else "",
                             memory_ref=memory, progress=True, recipe={"command": command})
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    msg = f"RECO {out}: k={cfg.k}, {cfg.search} search, {cfg.fuse} fusion, {cfg.fusion}"
    if res is not None:
        msg += f"; {res.steps} steps in {res.seconds:.0f}s, loss {res.last_loss:.3f}"
        if res.best_step is not None:
            msg += f", best val score {res.best_value:.3f} at step {res.best_step}"
    results.print(msg)



def _train_flags(*, k: int | None, search: str | None, fuse: str | None, fusion: str | None, heads: int | None,
                 batch_size: int | None, steps: int | None, lr: float | None, seed: int | None,
                 threads: int | None) -> dict:
    """The ``reco train`` options as config layers (None = not given); ``--steps`` also sets the
    evaluation interval (every min(250, steps) steps)."""
    return {"k": k, "search": search, "fuse": fuse, "fusion": fusion, "heads": heads, "batch_size": batch_size,
            "loop": {"steps": steps, "lr": lr, "seed": seed, "threads": threads,
                     "eval_every": max(1, min(250, steps)) if steps else None}}


def _rerun_command(cfg: RecoTrainConfig, **paths: Path | None) -> str:
    """A ``reco train`` command that rebuilds ``cfg``: every option at its effective value, plus a
    ``--set`` for each other field those options would leave different (from --config / --set)."""
    import shlex

    from ..config import to_dict
    from ..reco import train as reco_train

    opts = {"k": cfg.k, "search": cfg.search, "fuse": cfg.fuse, "fusion": cfg.fusion, "heads": cfg.heads,
            "batch_size": cfg.batch_size, "steps": cfg.loop.steps, "lr": cfg.loop.lr, "seed": cfg.loop.seed,
            "threads": cfg.loop.threads}
    rerun = dict(_leaves(to_dict(resolve_config(reco_train.RecoTrainConfig, None, None, None,
                                                flags=_train_flags(**opts)))))
    sets = [f"--set {shlex.quote(f'{key}={json.dumps(value)}')}"
            for key, value in _leaves(to_dict(cfg)) if value != rerun[key]]
    return " ".join([command_line("reco train", **{k: shlex.quote(str(v)) for k, v in paths.items() if v is not None},
                                  **opts), *sets])


def _leaves(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``."""
    out: list[tuple[str, object]] = []
    for key, value in d.items():
        out += _leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]
    return out


def bench_reco(
    quick: bool = typer.Option(False, help="Under 15 minutes on 2 cores: fewer training steps."),
    json_out: Path = typer.Option(Path("runs/bench/reco.json"), "--out", help="JSON output (a .md table beside it)."),
    model: Path = typer.Option(Path("models/world-old"), callback=from_project, help="The frozen encoder."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (val: tuning, test: report)."),
    memory_size: int = typer.Option(20000, help="Memory pairs (a fresh world train split, cached)."),
    steps: Optional[int] = typer.Option(None, help="Training step budget per variant (early stopping on val)."),
    label_set: str = typer.Option("size_colour_texture", help=f"Main zero-shot label set: {', '.join(LABEL_SETS)}."),
    k: Optional[int] = typer.Option(None, help="Neighbours of the main row and ablations (default: chosen on val)."),
    threads: int = typer.Option(1, min=1, help="torch threads."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """RECO on the world: fine-grained zero-shot and retrieval for base, RECO (queries only / both), the
    ablations (cross-modal search, uni-modal fusion, mean fusion) and k in {1, 5, 10, 20}; latency."""
    from ..bench.reco import RecoBenchConfig, run_reco_bench
    from ..bench.reco_report import REPORT

    if label_set not in LABEL_SETS:
        fail(f"--label-set: unknown label set {label_set!r}; choose one of {', '.join(LABEL_SETS)}")
    kw = dict(model=str(model), world=str(world), memory_size=memory_size, threads=threads, label_set=label_set, k=k)
    if steps is not None:
        kw["steps"] = steps
    cfg = resolve_config(RecoBenchConfig, RecoBenchConfig.quick_preset(**kw) if quick else RecoBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_reco_bench(json_out, c, log=log, write=False), REPORT, json_out, as_json)
