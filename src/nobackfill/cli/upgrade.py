"""``nobackfill upgrade ...``: backfill-free upgrades (XBT, text XBT, training-free bridges)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ._common import (check_new_output, command_line, config_option, console, fail, resolve_config, results, set_option,
                      show_config_option)


def upgrade_xbt(
    old: Path = typer.Option(..., help="The old model (its space is the gallery's); used in stage 1 only."),
    new: Path = typer.Option(..., help="The new model to upgrade."),
    text_corpus: Path = typer.Option(..., help="Stage-1 text: a text file (one caption a line), a data folder "
                                               "(its train captions) or a world root (train-split captions generated "
                                               "from its seed: stage1.corpus_size of them, however many it wrote)."),
    pairs: Path = typer.Option(..., help="Stage-2 image-text pairs: a data folder (train split) or a world root "
                                         "(train items rendered from its seed: n_pairs of them)."),
    out: Path = typer.Option(..., help="Upgrade directory to write (resumes a killed run; a finished upgrade there is "
                                       "refused)."),
    stage1: Optional[Path] = typer.Option(None, help="Reuse this stage-1 (phi) upgrade instead of training one."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    n_pairs: Optional[int] = typer.Option(None, help="Distinct image-text pairs for stage 2 (n_pairs)."),
    corpus_size: Optional[int] = typer.Option(None, help="Maximum stage-1 captions (stage1.corpus_size)."),
    stage1_steps: Optional[int] = typer.Option(None, help="Stage-1 optimiser steps (stage1.steps)."),
    stage1_lr: Optional[float] = typer.Option(None, help="Stage-1 learning rate (stage1.lr)."),
    steps: Optional[int] = typer.Option(None, help="Stage-2 optimiser steps (stage2.steps)."),
    batch_size: Optional[int] = typer.Option(None, help="Stage-2 batch size (stage2.batch_size)."),
    lr: Optional[float] = typer.Option(None, help="Stage-2 learning rate (stage2.lr; prompts x100)."),
    phi_train: Optional[str] = typer.Option(None, help="What of phi stage 2 trains: layernorm | all (stage2.phi_train)."),
    seed: int = typer.Option(0, help="Seed of both stages and of the adapters."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
) -> None:
    """XBT (Jang & Lim 2024): stage 1 trains phi on text only (Eq. 3), stage 2 trains LoRA + vision prompts +
    LayerNorms of the new model with phi on image-text pairs (Eq. 5) without the old model. Settings:
    compat.xbt.XBTUpgradeConfig (defaults tuned on the world val split), from --config / --set."""
    import torch

    from ..config import warn_warmup
    from ..compat.xbt import XBTUpgradeConfig
    from ..compat.xbt import upgrade_xbt as run_upgrade
    from ..train.loop import check_output

    base = XBTUpgradeConfig().with_seed(seed)
    if threads:
        base = updated_threads(base, threads)
    cfg = resolve_config(XBTUpgradeConfig, base, config, set_, show=show_config, flags={
        "n_pairs": n_pairs, "stage1": {"corpus_size": corpus_size, "steps": stage1_steps, "lr": stage1_lr},
        "stage2": {"steps": steps, "batch_size": batch_size, "lr": lr, "phi_train": phi_train}})
    command = command_line("upgrade xbt", old=old, new=new, text_corpus=text_corpus, pairs=pairs, out=out,
                           stage1=stage1, config=config, n_pairs=n_pairs, corpus_size=corpus_size,
                           stage1_steps=stage1_steps, stage1_lr=stage1_lr, steps=steps, batch_size=batch_size, lr=lr,
                           phi_train=phi_train, seed=seed or None, threads=threads or None)
    command += "".join(f" --set {s}" for s in set_ or ())
    if threads:
        torch.set_num_threads(threads)
    try:
        check_output(out, finished="upgrade.json", what="upgrade", also=("stage1",), sources=(old, new, stage1))
        warn_warmup(cfg if stage1 is None else cfg.stage2, "" if stage1 is None else "stage2")
        up, res = run_upgrade(old, new, text_corpus, pairs, out, cfg, stage1=stage1, progress=True, command=command,
                              log=lambda m: console.print(m))
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    r2 = res["stage2"]
    results.print(f"upgrade {out}: {up.source} -> {up.target} (stage 2 loss {r2.last_loss:.3f}, {r2.seconds:.0f}s)")


def updated_threads(cfg, threads: int):
    """``cfg`` with ``threads`` in the loop of each stage it holds."""
    from ..config import updated

    stages = {name: {"loop": {"threads": threads}} for name in ("stage1", "stage2", "xbt") if hasattr(cfg, name)}
    return updated(cfg, **stages)


def upgrade_xbt_text(
    old: Path = typer.Option(Path("models/m30k-old-text"), help="The old text model (the gallery's space); "
                                                                "used before stage 2 only."),
    new: str = typer.Option("pretrained", help="The new text model: 'pretrained' (all-MiniLM-L6-v2, offline) or "
                                               "a model directory."),
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED); "
                                                   "task2 train captions only."),
    out: Path = typer.Option(..., help="Upgrade directory to write (resumes a killed run; a finished upgrade there is "
                                       "refused)."),
    quick: bool = typer.Option(False, help="Stage 1 on 8,000 images for 1,500 steps, pairs from the same images."),
    cache_dir: Optional[Path] = typer.Option(Path("runs/cache"), help="Embedding cache of the frozen models "
                                                                      "(space id + text hash)."),
    stage1_steps: Optional[int] = typer.Option(None, help="Override the stage-1 (phi) steps."),
    xbt_steps: Optional[int] = typer.Option(None, help="Override the stage-2 (XBT) steps."),
    stage1_positives: str = typer.Option("same", help="Stage 1 aligns a caption with its own old embedding (same, "
                                                      "Eq. 3) or with another caption of its image (sibling)."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, help="torch threads."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """XBT on a text model (kind xbt-text): stage 1 trains phi on cached caption embeddings (Eq. 3),
    stage 2 trains LoRA + LayerNorms of the new text model with phi on Multi30K caption pairs (Eq. 5
    with a second caption in place of the image), without the old model. Apply it with
    load_upgrade(out).apply(MiniLMTextEncoder.pretrained())."""
    from ..compat.text_upgrade import TextXBTUpgradeConfig, train_text_upgrade
    from ..config import warn_warmup
    from ..data.multi30k import default_multi30k_dir
    from ..encoders.zoo import shipped
    from ..train.loop import check_output

    parts = ["nobackfill upgrade xbt-text", f"--old {old}", f"--new {new}"] + ([f"--data {data}"] if data else [])
    parts += [f"--out {out}"] + (["--quick"] if quick else [])
    parts += [f"--cache-dir {cache_dir}"] if cache_dir is not None and cache_dir != Path("runs/cache") else []
    for flag, v in (("stage1-steps", stage1_steps), ("xbt-steps", xbt_steps)):
        parts += [f"--{flag} {v}"] if v is not None else []
    parts += [f"--stage1-positives {stage1_positives}"] if stage1_positives != "same" else []
    parts += ([f"--seed {seed}"] if seed else []) + ([f"--threads {threads}"] if threads != 1 else [])
    parts += ([f"--config {config}"] if config else []) + [f"--set {x}" for x in set_ or ()]
    kw = {"seed": seed, "threads": threads, "stage1_positives": stage1_positives}
    cfg = resolve_config(TextXBTUpgradeConfig, TextXBTUpgradeConfig.quick(**kw) if quick else TextXBTUpgradeConfig(**kw), config, set_,
                         flags={"stage1": {"steps": stage1_steps}, "xbt": {"steps": xbt_steps}}, show=show_config)
    try:
        old = shipped(old)  # the default, models/m30k-old-text, from any working directory
        check_output(out, finished="upgrade.json", what="upgrade", also=("stage1",), sources=(old,))
        warn_warmup(cfg)
        res = train_text_upgrade(old, new, data or default_multi30k_dir(), out, cfg, cache_dir=cache_dir,
                                 command=" ".join(parts), progress=True, log=lambda m: console.print(m))
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    results.print(f"upgrade {out}: {res.source['name']} {res.source['space_id']} -> {res.target['name']} "
                  f"{res.target['space_id']} (stage 1 loss {res.stage1.last_loss:.3f}, stage 2 loss "
                  f"{res.xbt.last_loss:.3f}, {res.stage1.seconds + res.xbt.seconds:.0f}s training)")


def upgrade_procrustes(
    old: Path = typer.Option(..., help="The old model (the gallery's space)."),
    new: Path = typer.Option(..., help="The new model."),
    text_corpus: Path = typer.Option(..., help="Paired text: a text file (every line), the English captions of a "
                                                "data folder, or of a world root (train-split captions generated from "
                                                "its seed: --corpus-size of them, however many it wrote)."),
    out: Path = typer.Option(..., help="Upgrade directory to write (a new or empty folder)."),
    corpus_size: Optional[int] = typer.Option(None, help="Maximum captions, deduplicated (default 40000)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """A training-free orthogonal Procrustes bridge new -> old, fitted on the corpus embedded by both
    text encoders."""
    from ..compat.bridges import ProcrustesBridge, ProcrustesConfig
    from ..compat.data import dedupe, read_text_corpus
    from ..compat.upgrade import save_vector_upgrade, space_info
    from ..encoders import load_encoder

    cfg = resolve_config(ProcrustesConfig, None, config, set_, show=show_config, flags={"corpus_size": corpus_size})
    check_new_output(out, sources=(old, new))  # an earlier upgrade (of any kind) there is not overwritten
    try:
        o, n = load_encoder(old), load_encoder(new)
        texts = dedupe(read_text_corpus(text_corpus, cfg.corpus_size))[:cfg.corpus_size]
        b = ProcrustesBridge.fit(n.encode_texts(texts, progress=True), o.encode_texts(texts, progress=True),
                                 n.space_id, o.space_id)
        save_vector_upgrade(out, b, space_info(n), space_info(o),
                            recipe={"corpus_size": len(texts), "command": command_line(
                                "upgrade procrustes", old=old, new=new, text_corpus=text_corpus, out=out,
                                corpus_size=cfg.corpus_size)})
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    results.print(f"procrustes bridge {out}: {n.space_id} -> {o.space_id} ({len(texts)} captions)")
