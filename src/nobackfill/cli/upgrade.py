"""``nobackfill upgrade ...``: backfill-free upgrades (XBT, text XBT, training-free bridges)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._common import command_line, console, fail


def upgrade_xbt(
    old: Path = typer.Option(..., help="The old model (its space is the gallery's); used in stage 1 only."),
    new: Path = typer.Option(..., help="The new model to upgrade."),
    text_corpus: Path = typer.Option(..., help="Stage-1 text: a text file (one caption a line), a data folder "
                                               "(its train captions) or a world root (train-split captions)."),
    pairs: Path = typer.Option(..., help="Stage-2 image-text pairs: a data folder (train split) or a world root."),
    out: Path = typer.Option(..., help="Upgrade directory to write (resumes a killed run)."),
    n_pairs: int = typer.Option(4000, help="Number of distinct image-text pairs for stage 2."),
    corpus_size: int = typer.Option(40000, help="Maximum stage-1 captions (deduplicated)."),
    stage1_steps: int = typer.Option(1500, help="Stage-1 optimiser steps."),
    stage1_lr: float = typer.Option(1e-3, help="Stage-1 learning rate (paper: 1e-4 on GPUs)."),
    steps: int = typer.Option(300, help="Stage-2 optimiser steps."),
    batch_size: int = typer.Option(128, help="Stage-2 batch size (paper: 1,024)."),
    lr: float = typer.Option(1e-4, help="Stage-2 learning rate (prompts x100; the paper's 1e-4)."),
    phi_train: str = typer.Option("layernorm", help="Which part of phi stage 2 trains: layernorm (App. A.2) | all."),
    stage1: Optional[Path] = typer.Option(None, help="Reuse this stage-1 (phi) upgrade instead of training one."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
) -> None:
    """XBT (seed 000): stage 1 trains phi on text only (Eq. 3), stage 2 trains LoRA + vision prompts +
    LayerNorms of the new model with phi on image-text pairs (Eq. 5) without the old model."""
    import gc
    from dataclasses import replace

    import torch

    from ..compat.adapters import AdapterConfig
    from ..compat.data import load_pair_source, read_text_corpus
    from ..compat.phi import Projection
    from ..compat.upgrade import load_upgrade, space_info
    from ..compat.xbt import Stage1Config, XBTConfig, pretrain_phi, train_xbt
    from ..encoders import load_encoder

    command = command_line("upgrade xbt", old=old, new=new, text_corpus=text_corpus, pairs=pairs, out=out, n_pairs=n_pairs,
                   corpus_size=corpus_size, stage1_steps=stage1_steps, stage1_lr=stage1_lr, steps=steps,
                   batch_size=batch_size, lr=lr, phi_train=phi_train, stage1=stage1, seed=seed, threads=threads or None)
    if threads:
        torch.set_num_threads(threads)
    try:
        s1 = Stage1Config(steps=stage1_steps, lr=stage1_lr, corpus_size=corpus_size, seed=seed, threads=threads)
        s2 = XBTConfig(steps=steps, batch_size=batch_size, lr=lr, phi_train=phi_train, seed=seed, threads=threads,
                       adapters=AdapterConfig(seed=seed))
        new_enc = load_encoder(new)
        if stage1 is None:
            old_enc = load_encoder(old)
            target = space_info(old_enc)
            corpus = read_text_corpus(text_corpus, corpus_size)
            console.print(f"stage 1: phi on {len(corpus)} captions (text only) ...")
            phi, r1, info = pretrain_phi(new_enc, old_enc, corpus, s1, out / "stage1", progress=True,
                                         command=command)
            console.print(f"stage 1 done in {info['embed_seconds'] + info['train_seconds']:.0f}s "
                          f"(loss {r1.last_loss:.3f})")
            del old_enc  # stage 2 never touches the old model
            gc.collect()
        else:
            up1 = load_upgrade(stage1)
            if up1.kind != "phi" or up1.source_id != new_enc.space_id:
                raise ValueError(f"{stage1}: not a stage-1 (phi) upgrade of {new}")
            phi, target = Projection.load(stage1), up1.target
        pair_data = load_pair_source(pairs, n_pairs)
        console.print(f"stage 2: XBT on {len(pair_data)} image-text pairs (old model not loaded) ...")
        up, r2 = train_xbt(new_enc, phi, pair_data, replace(s2), out, target=target, progress=True,
                           command=command)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    console.print(f"upgrade {out}: {up.source} -> {up.target} (stage 2 loss {r2.last_loss:.3f}, {r2.seconds:.0f}s)")


def upgrade_xbt_text(
    old: Path = typer.Option(Path("models/m30k-old-text"), help="The old text model (the gallery's space); "
                                                                "used before stage 2 only."),
    new: str = typer.Option("pretrained", help="The new text model: 'pretrained' (all-MiniLM-L6-v2, offline) or "
                                               "a model directory."),
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: $NOBACKFILL_SHARED/data/multi30k); "
                                                   "task2 train captions only."),
    out: Path = typer.Option(..., help="Upgrade directory to write (resumes a killed run)."),
    quick: bool = typer.Option(False, help="Stage 1 on 8,000 images for 1,500 steps, pairs from the same images."),
    cache_dir: Optional[Path] = typer.Option(Path("runs/cache"), help="Embedding cache of the frozen models "
                                                                      "(space id + text hash)."),
    stage1_steps: Optional[int] = typer.Option(None, help="Override the stage-1 (phi) steps."),
    xbt_steps: Optional[int] = typer.Option(None, help="Override the stage-2 (XBT) steps."),
    stage1_positives: str = typer.Option("same", help="Stage 1 aligns a caption with its own old embedding (same, "
                                                      "Eq. 3) or with another caption of its image (sibling)."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, help="torch threads."),
) -> None:
    """XBT on a text model (kind xbt-text): stage 1 trains phi on cached caption embeddings (Eq. 3),
    stage 2 trains LoRA + LayerNorms of the new text model with phi on Multi30K caption pairs (Eq. 5
    with a second caption in place of the image), without the old model. Apply it with
    load_upgrade(out).apply(MiniLMTextEncoder.pretrained())."""
    from ..compat.text_upgrade import XBTTextConfig, train_text_upgrade
    from ..data.multi30k import default_multi30k_dir

    parts = ["nobackfill upgrade xbt-text", f"--old {old}", f"--new {new}"] + ([f"--data {data}"] if data else [])
    parts += [f"--out {out}"] + (["--quick"] if quick else [])
    parts += [f"--cache-dir {cache_dir}"] if cache_dir is not None and cache_dir != Path("runs/cache") else []
    for flag, v in (("stage1-steps", stage1_steps), ("xbt-steps", xbt_steps)):
        parts += [f"--{flag} {v}"] if v is not None else []
    parts += [f"--stage1-positives {stage1_positives}"] if stage1_positives != "same" else []
    parts += ([f"--seed {seed}"] if seed else []) + ([f"--threads {threads}"] if threads != 1 else [])
    kw = {"seed": seed, "threads": threads, "stage1_positives": stage1_positives}
    cfg = XBTTextConfig.quick(**kw) if quick else XBTTextConfig(**kw)
    if stage1_steps is not None:
        cfg.stage1.steps = stage1_steps
    if xbt_steps is not None:
        cfg.xbt.steps = xbt_steps
    try:
        res = train_text_upgrade(old, new, data or default_multi30k_dir(), out, cfg, cache_dir=cache_dir,
                                 command=" ".join(parts), progress=True, log=lambda m: console.print(m))
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    console.print(f"upgrade {out}: {res.source['name']} {res.source['space_id']} -> {res.target['name']} "
                  f"{res.target['space_id']} (stage 1 loss {res.stage1.last_loss:.3f}, stage 2 loss "
                  f"{res.xbt.last_loss:.3f}, {res.stage1.seconds + res.xbt.seconds:.0f}s training)")


def upgrade_procrustes(
    old: Path = typer.Option(..., help="The old model (the gallery's space)."),
    new: Path = typer.Option(..., help="The new model."),
    text_corpus: Path = typer.Option(..., help="Paired text: a text file, a data folder or a world root."),
    out: Path = typer.Option(..., help="Upgrade directory to write."),
    corpus_size: int = typer.Option(40000, help="Maximum captions (deduplicated)."),
) -> None:
    """A training-free orthogonal Procrustes bridge new -> old, fitted on the corpus embedded by both
    text encoders."""
    from ..compat.bridges import ProcrustesBridge
    from ..compat.data import dedupe, read_text_corpus
    from ..compat.upgrade import save_vector_upgrade, space_info
    from ..encoders import load_encoder

    try:
        o, n = load_encoder(old), load_encoder(new)
        texts = dedupe(read_text_corpus(text_corpus, corpus_size))[:corpus_size]
        b = ProcrustesBridge.fit(n.encode_texts(texts, progress=True), o.encode_texts(texts, progress=True),
                                 n.space_id, o.space_id)
        save_vector_upgrade(out, b, space_info(n), space_info(o),
                            recipe={"corpus_size": len(texts), "command": command_line(
                                "upgrade procrustes", old=old, new=new, text_corpus=text_corpus, out=out,
                                corpus_size=corpus_size)})
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    console.print(f"procrustes bridge {out}: {n.space_id} -> {o.space_id} ({len(texts)} captions)")
