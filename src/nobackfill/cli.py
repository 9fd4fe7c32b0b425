"""The ``nobackfill`` command line (typer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Cross-modal retrieval whose embedding model improves without re-embedding the gallery.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate models and galleries.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON for machines, tables/plots for people).")
app.add_typer(eval_app, name="eval")
app.add_typer(bench_app, name="bench")
upgrade_app = typer.Typer(no_args_is_help=True,
                          help="Backfill-free upgrades: XBT and training-free bridges from a new model to an old space.")
app.add_typer(upgrade_app, name="upgrade")
from .reco.cli import reco_app  # noqa: E402  (light: no torch at import)
app.add_typer(reco_app, name="reco")
from .late.cli import bench_late, late_app  # noqa: E402  (light: no torch at import)
app.add_typer(late_app, name="late")
bench_app.command("late")(bench_late)
from .compat.cli import bench_compat_steps, compat_app  # noqa: E402  (light: no torch at import)
app.add_typer(compat_app, name="compat")
bench_app.command("compat-steps")(bench_compat_steps)
console = Console(stderr=True, soft_wrap=True)  # never wrap: paths in messages stay whole at any width


def _fail(msg: str) -> None:
    # escape: a path or value containing "[...]" is text, not rich markup.
    console.print(f"[red]error:[/red] {escape(msg)}")
    raise typer.Exit(code=2)


def _write_json(path: Optional[Path], obj: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)
    console.print(f"wrote {path}")


@app.command()
def world(
    out: Path = typer.Option(Path("data/world"), help="Output folder (train/ val/ test/ + world.json)."),
    n_train: int = typer.Option(20000, help="Training images."),
    n_val: int = typer.Option(1000, help="Validation images."),
    n_test: int = typer.Option(1000, help="Test images."),
    seed: int = typer.Option(0, help="World seed (every item is a function of seed, split, index)."),
    langs: str = typer.Option("", help="Comma-separated languages (default: all grammars)."),
    captions_per_image: int = typer.Option(2, help="Captions per image and language."),
    workers: int = typer.Option(0, help="Processes (0 = up to 2)."),
) -> None:
    """Generate the synthetic multilingual world in the user data format."""
    from .data.grammars import languages
    from .data.world import WorldSpec, generate_world

    lang_t = tuple(x.strip() for x in langs.split(",") if x.strip()) or tuple(languages())
    spec = WorldSpec(seed=seed, n_train=n_train, n_val=n_val, n_test=n_test, langs=lang_t,
                     captions_per_image=captions_per_image)
    try:
        generate_world(out, spec, workers=workers or None)
    except ValueError as e:
        _fail(str(e))
    console.print(f"world written to {out} ({n_train}/{n_val}/{n_test} images, langs {','.join(lang_t)})")


def _train_command(preset: str, data: Path, out: Path, steps: Optional[int], seed: int, threads: int,
                   stream: bool) -> str:
    """The exact ``nobackfill train`` command line that reproduces a run (saved in recipe.json)."""
    parts = ["nobackfill train", f"--preset {preset}", f"--data {data}", f"--out {out}"]
    parts += [f"--steps {steps}"] if steps is not None else []
    parts += [f"--seed {seed}"] if seed else []
    parts += [f"--threads {threads}"] if threads else []
    parts += [] if stream else ["--no-stream"]
    return " ".join(parts)


@app.command("train")
def train_cmd(
    preset: str = typer.Option(..., help="Zoo preset name (world-old, world-new, world-newer) or TOML path."),
    data: Path = typer.Option(..., help="A world folder (streams fresh scenes) or a user data folder."),
    out: Path = typer.Option(..., help="Output model directory (resumes from its checkpoint)."),
    steps: Optional[int] = typer.Option(None, help="Override the preset's number of steps."),
    seed: int = typer.Option(0, help="Training seed."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
    stream: bool = typer.Option(True, help="On a world folder, sample fresh scenes every step."),
) -> None:
    """Contrastive training of a zoo preset (symmetric InfoNCE, learnable temperature)."""
    from .config import ConfigError
    from .train.world_model import train_preset

    try:
        r = train_preset(preset, data, out, steps=steps, seed=seed, threads=threads, stream=stream,
                         command=_train_command(preset, data, out, steps, seed, threads, stream))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"trained {preset} for {r.steps} steps in {r.seconds:.0f}s -> {out}")
    if r.history:
        console.print(json.dumps(r.history[-1]))


@app.command()
def index(
    model: Path = typer.Option(..., help="Model directory that embeds the gallery."),
    data: Path = typer.Option(..., help="User data folder (captions.jsonl + images) or a world root."),
    out: Path = typer.Option(..., help="Gallery directory (created, or resumed if it exists)."),
    split: str = typer.Option("test", help="Split to use when --data is a world root."),
    langs: str = typer.Option("", help="Comma-separated caption languages to index (default: all)."),
    backend: str = typer.Option("flat", help="Vector index backend: flat | hnsw | hnsw:M=16,ef=64."),
    skip_bad: bool = typer.Option(False, help="Skip malformed lines and unreadable images (and report how many)."),
    tokens: str = typer.Option("", help="Also store token outputs for CMLI re-ranking: float16 | float32."),
    token_dim: Optional[int] = typer.Option(None, help="With --tokens: PCA-project the tokens to this many dims."),
) -> None:
    """Embed a data folder's images and captions into a model-versioned gallery (resumable)."""
    from .demo import index_dataset
    from .encoders import load_encoder
    from .evaluate import load_eval_data

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x], skip_bad=skip_bad)
        enc = load_encoder(model)
        g = index_dataset(enc, ds, out, model_ref=str(model), backend=backend)
        if tokens:
            from .late.rerank import store_dataset_tokens

            store_dataset_tokens(enc, ds, out, dtype=tokens, dim=token_dim)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    if ds.skipped:
        console.print(f"[yellow]skipped {ds.skipped} bad line(s)/image(s)[/yellow]")
    console.print(f"gallery {out}: {g.count('image')} images, {g.count('text')} texts, space {g.space_id}")


@app.command()
def search(
    gallery: Path = typer.Option(..., help="Gallery directory."),
    model: Path = typer.Option(..., help="Model that embeds the query."),
    text: Optional[str] = typer.Option(None, help="Text query (searches the gallery's images)."),
    image: Optional[Path] = typer.Option(None, help="Image query (searches the gallery's captions)."),
    k: int = typer.Option(10, help="Number of results."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    bridge: Optional[List[Path]] = typer.Option(None, "--bridge", help="Upgrade directory taking the model's "
                                                "queries into the gallery's space (XBT, phi, Procrustes); repeat "
                                                "to chain bridges."),
    reco: Optional[Path] = typer.Option(None, "--reco", help="RECO directory: refine the query with its memory "
                                        "(the gallery is searched as stored)."),
    rerank: str = typer.Option("", help="Re-score the first-stage top --rerank-k: cmli | cmli-sym (needs index "
                                        "--tokens)."),
    rerank_k: int = typer.Option(100, help="First-stage candidates to re-rank."),
    rerank_weight: float = typer.Option(1.0, help="Re-rank score = global + weight * CMLI (inf: CMLI only)."),
) -> None:
    """Search a gallery with a text or an image query (from another model through --bridge)."""
    from .encoders import load_encoder
    from .index import Gallery

    if (text is None) == (image is None):
        _fail("give exactly one of --text or --image")
    try:
        g = Gallery.open(gallery)
        enc, br = load_encoder(model), None
        if bridge:
            from .compat.upgrade import load_upgrade, query_side

            enc, br = query_side(enc, [load_upgrade(b) for b in bridge], g.space_id)
        if text is not None:
            q, modality = enc.encode_texts([text]), "image"
        else:
            q, modality = enc.encode_images([image]), "text"
        if reco is not None:
            from .reco.cli import refine_query

            q = refine_query(reco, enc, q, "text" if text is not None else "image")
        res = g.search(modality, q, k=max(k, rerank_k) if rerank else k, space_id=enc.space_id, bridge=br)
        if rerank:
            from .late.rerank import rerank_search

            res = rerank_search(g, enc, modality, text if text is not None else str(image), res, k, rerank_weight,
                                rerank)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    meta = {i: m for i, m in zip(g.ids(modality), g.metadata(modality))}
    hits = [{"rank": r + 1, "score": float(s), "id": i, **meta.get(i, {})}
            for r, (s, i) in enumerate(zip(res.scores[0], res.ids[0]))]
    if as_json:
        typer.echo(json.dumps({"query": text or str(image), "modality": modality, "hits": hits}, indent=2))
        return
    from rich.table import Table

    t = Table(title=f"top {k} {modality}s for {text or image!s}")
    for col in ("rank", "score", "id", "item"):
        t.add_column(col)
    for h in hits:
        t.add_row(str(h["rank"]), f"{h['score']:.3f}", h["id"], str(h.get("path") or h.get("text", "")))
    Console().print(t)


@eval_app.command("retrieval")
def eval_retrieval(
    query_model: Path = typer.Option(..., help="Model that embeds the queries."),
    gallery_model: Path = typer.Option(..., help="Model that embedded the gallery."),
    data: Path = typer.Option(..., help="User data folder or world root."),
    split: str = typer.Option("test", help="Split when --data is a world root."),
    langs: str = typer.Option("en", help="Comma-separated caption languages."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write results as JSON here."),
    bridge: Optional[List[Path]] = typer.Option(None, "--bridge", help="Upgrade directory taking the query model "
                                                "into the gallery model's space; repeat to chain bridges."),
    reco: Optional[Path] = typer.Option(None, "--reco", help="RECO directory: refine the queries (queries only; "
                                        "the gallery embeddings stay the original ones)."),
) -> None:
    """Text->image and image->text R@1/5/10, median rank, mAP for a query model x gallery model."""
    from .encoders import load_encoder
    from .evaluate import cross_retrieval, embed_dataset, load_eval_data
    from .report import recall_table_rows, text_table

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        q = load_encoder(query_model)
        g = q if gallery_model == query_model else load_encoder(gallery_model)
        if bridge:
            from .compat.upgrade import bridged_embeddings

            ge = embed_dataset(g, ds, progress=True)
            qe = bridged_embeddings(q, [Path(b) for b in bridge], g.space_id, ds, progress=True)
        else:
            qe = embed_dataset(q, ds, progress=True)
            ge = qe if g is q else embed_dataset(g, ds, progress=True)
        if reco is not None:
            from .reco.cli import refined_embedded

            qe = refined_embedded(reco, qe)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    res = cross_retrieval(qe, ge, ds.caption_image)
    res.update({"query_model": str(query_model), "gallery_model": str(gallery_model), "n_images": len(ds),
                "n_captions": len(ds.captions), "query_space": q.space_id, "gallery_space": g.space_id,
                "bridges": [str(b) for b in bridge or []], "reco": str(reco) if reco else None})
    typer.echo(text_table(*recall_table_rows({f"{query_model.name}/{gallery_model.name}": res})))
    _write_json(json_out, res)


@app.command()
def demo(
    world: Path = typer.Option(Path("data/world"), help="World folder (generated if absent)."),
    models: Path = typer.Option(Path("models"), help="Folder with the shipped checkpoints."),
    out: Path = typer.Option(Path("runs/demo"), help="Output folder (gallery, report.html)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the table as JSON here."),
    limit: Optional[int] = typer.Option(None, help="Only the first N test images (a quick look)."),
) -> None:
    """The main job: old gallery, new model, and how they compare (report.html + JSON)."""
    from .demo import run_demo

    try:
        result = run_demo(world, models, out, log=lambda m: console.print(m), limit=limit)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    _write_json(json_out, result)


@bench_app.command("encode")
def bench_encode(
    models: Path = typer.Option(Path("models"), help="Folder with world-old / world-new / world-newer."),
    n_images: int = typer.Option(512, help="Images per timed pass."),
    n_texts: int = typer.Option(2048, help="Texts per timed pass."),
    threads: int = typer.Option(2, help="torch threads."),
    minilm: bool = typer.Option(True, help="Also time all-MiniLM-L6-v2."),
    json_out: Path = typer.Option(Path("runs/bench/encode.json"), "--json", help="JSON output (a .md table is written beside it)."),
) -> None:
    """Encoding throughput of each preset: ours vs a plain transformers loop (images/s, texts/s)."""
    from .bench.encode import format_encode_table, run_encode_bench, write_report

    def is_clip(p: Path) -> bool:  # text-only models (e.g. m30k-old-text) have no image tower to time
        try:
            return json.loads((p / "config.json").read_text()).get("model_type") == "clip"
        except (OSError, ValueError):
            return False

    dirs = {p.name: p for p in sorted(models.iterdir()) if is_clip(p)} if models.is_dir() else {}
    if not dirs:
        _fail(f"{models}: no model directories found")
    result = run_encode_bench(dirs, n_images=n_images, n_texts=n_texts, threads=threads,
                              minilm="pretrained" if minilm else None)
    write_report(result, json_out.parent)
    if json_out.name != "encode.json":
        _write_json(json_out, result)
    typer.echo(format_encode_table(result))


@bench_app.command("world")
def bench_world(
    n: int = typer.Option(50000, help="Items (images) to generate."),
    workers: int = typer.Option(2, help="Processes."),
    json_out: Path = typer.Option(Path("runs/bench/world.json"), "--json", help="JSON output."),
) -> None:
    """World generation throughput (items/s) into a scratch folder."""
    from .bench.world import run_world_bench

    result = run_world_bench(n, workers=workers)
    typer.echo(f"{result['n_items']} items ({result['n_captions']} captions, {len(result['languages'])} languages) "
               f"in {result['seconds']} s = {result['items_per_s']} items/s, {result['disk_mb']} MB")
    _write_json(json_out, result)


# ----------------------------------------------------------------------------- upgrades (XBT, seed 000)
def _cmd(name: str, **opts) -> str:
    """The command line that reproduces a run (recorded in the upgrade's recipe)."""
    parts = [f"nobackfill {name}"]
    for k, v in opts.items():
        if v is None or v is False:
            continue
        parts.append(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}"))
    return " ".join(parts)


@upgrade_app.command("xbt")
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

    from .compat.adapters import AdapterConfig
    from .compat.data import load_pair_source, read_text_corpus
    from .compat.phi import Projection
    from .compat.upgrade import load_upgrade, space_info
    from .compat.xbt import Stage1Config, XBTConfig, pretrain_phi, train_xbt
    from .encoders import load_encoder

    command = _cmd("upgrade xbt", old=old, new=new, text_corpus=text_corpus, pairs=pairs, out=out, n_pairs=n_pairs,
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
        _fail(str(e))
    console.print(f"upgrade {out}: {up.source} -> {up.target} (stage 2 loss {r2.last_loss:.3f}, {r2.seconds:.0f}s)")


@upgrade_app.command("xbt-text")
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
    from .compat.text_upgrade import XBTTextConfig, train_text_upgrade
    from .data.multi30k import default_multi30k_dir

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
        _fail(str(e))
    console.print(f"upgrade {out}: {res.source['name']} {res.source['space_id']} -> {res.target['name']} "
                  f"{res.target['space_id']} (stage 1 loss {res.stage1.last_loss:.3f}, stage 2 loss "
                  f"{res.xbt.last_loss:.3f}, {res.stage1.seconds + res.xbt.seconds:.0f}s training)")


@upgrade_app.command("procrustes")
def upgrade_procrustes(
    old: Path = typer.Option(..., help="The old model (the gallery's space)."),
    new: Path = typer.Option(..., help="The new model."),
    text_corpus: Path = typer.Option(..., help="Paired text: a text file, a data folder or a world root."),
    out: Path = typer.Option(..., help="Upgrade directory to write."),
    corpus_size: int = typer.Option(40000, help="Maximum captions (deduplicated)."),
) -> None:
    """A training-free orthogonal Procrustes bridge new -> old, fitted on the corpus embedded by both
    text encoders."""
    from .compat.bridges import ProcrustesBridge
    from .compat.data import dedupe, read_text_corpus
    from .compat.upgrade import save_vector_upgrade, space_info
    from .encoders import load_encoder

    try:
        o, n = load_encoder(old), load_encoder(new)
        texts = dedupe(read_text_corpus(text_corpus, corpus_size))[:corpus_size]
        b = ProcrustesBridge.fit(n.encode_texts(texts, progress=True), o.encode_texts(texts, progress=True),
                                 n.space_id, o.space_id)
        save_vector_upgrade(out, b, space_info(n), space_info(o),
                            recipe={"corpus_size": len(texts), "command": _cmd(
                                "upgrade procrustes", old=old, new=new, text_corpus=text_corpus, out=out,
                                corpus_size=corpus_size)})
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"procrustes bridge {out}: {n.space_id} -> {o.space_id} ({len(texts)} captions)")


@eval_app.command("compat")
def eval_compat(
    old: Path = typer.Option(..., help="The old model (gallery side)."),
    new: Path = typer.Option(..., help="The new model (query side)."),
    bridge: List[Path] = typer.Option(..., "--bridge", help="Upgrade directory new -> old (repeat to chain)."),
    data: Path = typer.Option(..., help="User data folder or world root."),
    split: str = typer.Option("test", help="Split when --data is a world root."),
    langs: str = typer.Option("en", help="Comma-separated caption languages."),
    strict: bool = typer.Option(False, help="Eq. 1 with strict inequalities (a tie fails); default: ties satisfy "
                                            "<= / >= as written."),
    n_unpaired: int = typer.Option(20000, help="Sampled unpaired (i, j) for the criterion rates."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write results as JSON here."),
) -> None:
    """Backward compatibility of an upgraded new model with an old gallery: old/old, new/new (upgrade
    off), raw new/old, upgraded new/old R@1/5/10, gap closure, Eq. 1 criterion rates, on/off check."""
    from .compat.upgrade import load_upgrade, query_side
    from .encoders import load_encoder
    from .evaluate import Embedded, cross_retrieval, embed_dataset, load_eval_data
    from .metrics.compat import cross_modal_criterion
    from .report import recall_table_rows, text_table

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        o, n = load_encoder(old), load_encoder(new)
        eo, en = embed_dataset(o, ds, progress=True), embed_dataset(n, ds, progress=True)
        ups = [load_upgrade(b) for b in bridge]
        enc, br = query_side(n, ups, o.space_id)
        eu = embed_dataset(enc, ds, progress=True)
        if br is not None:
            eu = Embedded(br.target, br(eu.images), br(eu.texts))
        onoff = None
        if hasattr(enc, "switched"):
            with enc.switched(False):
                off = embed_dataset(enc, ds)
            onoff = float(max(abs(off.images - en.images).max(), abs(off.texts - en.texts).max()))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    c2i = ds.caption_image
    rows = {"old_old": cross_retrieval(eo, eo, c2i), "new_new": cross_retrieval(en, en, c2i),
            "new_old_raw": cross_retrieval(en, eo, c2i), "upgraded_new_old": cross_retrieval(eu, eo, c2i)}
    gap = {d: ((rows["upgraded_new_old"][d]["R@1"] - rows["old_old"][d]["R@1"])
               / (rows["new_new"][d]["R@1"] - rows["old_old"][d]["R@1"]))
           if rows["new_new"][d]["R@1"] != rows["old_old"][d]["R@1"] else None for d in ("t2i", "i2t")}
    crit = cross_modal_criterion(eu.texts, eu.images, eo.texts, eo.images, c2i, n_unpaired=n_unpaired, strict=strict)
    labels = {"old_old": "old/old", "new_new": "new/new (off)", "new_old_raw": "raw new/old",
              "upgraded_new_old": "upgraded new/old"}
    typer.echo(text_table(*recall_table_rows({labels[k]: v for k, v in rows.items()})))
    typer.echo("gap closure: " + ", ".join(f"{d} {v:.2f}" if v is not None else f"{d} -" for d, v in gap.items()))
    for case, r in crit.items():
        typer.echo(f"criterion {case}: paired {100 * r['paired']:.1f}%  unpaired {100 * r['unpaired']:.1f}%")
    if onoff is not None:
        typer.echo(f"upgrade off vs original new model: max abs diff {onoff}")
    _write_json(json_out, {"rows": rows, "gap_closure": gap, "criterion": crit, "onoff_max_abs_diff": onoff,
                           "strict": strict, "n_images": len(ds), "n_captions": len(ds.captions),
                           "bridges": [str(b) for b in bridge], "spaces": {"old": o.space_id, "new": n.space_id}})


@bench_app.command("xbt")
def bench_xbt(
    quick: bool = typer.Option(False, help="Under 10 minutes on 2 cores: 1 seed, fewer steps, sweep 1k/4k."),
    seeds: Optional[int] = typer.Option(None, help="Training seeds to average (default: 1 quick, 3 full)."),
    json_out: Path = typer.Option(Path("runs/bench/xbt.json"), "--json", help="JSON output (.md and .html beside it)."),
    models: Path = typer.Option(Path("models"), help="Folder with world-old / world-new (/ world-newer)."),
    world: Path = typer.Option(Path("data/world"), help="World root (only world.json is read; splits are rendered)."),
    split: str = typer.Option("test", help="Evaluation split: test (report) or val (tuning)."),
    n_eval: int = typer.Option(1000, help="Evaluation images."),
    n_pairs: Optional[int] = typer.Option(None, help="Image-text pairs of the main rows (default 4000)."),
    threads: int = typer.Option(2, help="torch threads per training process."),
    continual: bool = typer.Option(True, help="Also old -> new -> newer (needs models/world-newer)."),
) -> None:
    """XBT vs its baselines and training-free bridges on the world (tables, sweep, cost, matrix)."""
    from .bench.xbt import XBTBenchConfig, format_xbt_tables, run_xbt_bench

    kw = {"split": split, "n_eval": n_eval, "threads": threads, "continual": continual}
    if seeds is not None:
        kw["seeds"] = seeds
    if n_pairs is not None:
        kw["n_pairs"] = n_pairs
    cfg = XBTBenchConfig.quick_preset(**kw) if quick else XBTBenchConfig.full(**kw)
    try:
        result = run_xbt_bench(models, world, json_out, cfg, log=lambda m: console.print(m))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        _fail(str(e))
    typer.echo(format_xbt_tables(result))
    console.print(f"wrote {json_out} (+ .md, .html) in {result['seconds']:.0f}s")


# ----------------------------------------------------------------------------- Multi30K text (XBT on real text)
def _multi30k_default() -> Path:
    from .data.multi30k import default_multi30k_dir

    return default_multi30k_dir()


@app.command("train-text")
def train_text_cmd(
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: $NOBACKFILL_SHARED/data/multi30k, "
                                                   "i.e. ../shared/data/multi30k)."),
    out: Path = typer.Option(Path("models/m30k-old-text"), help="Output model directory (resumes from its checkpoint)."),
    steps: Optional[int] = typer.Option(None, help="Step budget (early stopping on val R@1 ends it sooner)."),
    batch_size: Optional[int] = typer.Option(None, help="Caption pairs per step."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate."),
    hidden: Optional[int] = typer.Option(None, help="BERT hidden size."),
    layers: Optional[int] = typer.Option(None, help="BERT layers."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate val R@1 every N steps."),
    patience: Optional[int] = typer.Option(None, help="Stop after N evaluations without improvement."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, help="torch threads (1 is fastest on a shared 2-core machine)."),
) -> None:
    """Train the small Multi30K text encoder (the "old" model of `bench xbt-text`): a tiny BERT with its
    own BPE vocabulary on task2 train caption pairs, until val R@1 (caption 1 -> caption 2) stops
    improving."""
    from dataclasses import replace

    from .data.multi30k import read_task2
    from .train.text_pairs import TextModelSpec, TextTrainSpec, train_text_model

    model, ts = TextModelSpec(), TextTrainSpec(seed=seed, threads=threads)
    overrides = {"steps": steps, "batch_size": batch_size, "lr": lr, "eval_every": eval_every, "patience": patience}
    ts = replace(ts, **{k: v for k, v in overrides.items() if v is not None})
    model = replace(model, **{k: v for k, v in {"hidden": hidden, "layers": layers}.items() if v is not None})
    root = data or _multi30k_default()
    parts = ["nobackfill train-text"] + ([f"--data {data}"] if data else []) + [f"--out {out}"]
    for flag, v in (("steps", steps), ("batch-size", batch_size), ("lr", lr), ("hidden", hidden), ("layers", layers),
                    ("eval-every", eval_every), ("patience", patience)):
        parts += [f"--{flag} {v}"] if v is not None else []
    parts += ([f"--seed {seed}"] if seed else []) + ([f"--threads {threads}"] if threads != 1 else [])
    try:
        train_caps = read_task2(root, "train", "en")
        val = read_task2(root, "val", "en", ks=(1, 2))
        r = train_text_model(train_caps.captions, val.column(1), val.column(2), out, model=model, train_spec=ts,
                             command=" ".join(parts), data=str(root))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"trained {out} for {r.steps} steps in {r.seconds:.0f}s; best val R@1 {r.best_value:.3f} "
                  f"at step {r.best_step}{' (early stop)' if r.stopped_early else ''}")


@bench_app.command("xbt-text")
def bench_xbt_text(
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: $NOBACKFILL_SHARED/data/multi30k)."),
    eval_dir: Optional[Path] = typer.Option(None, help="Folder laid out like task2/raw holding val.{1..5}.en.gz: "
                                                       "evaluate on it instead of the shared val split."),
    quick: bool = typer.Option(False, help="Smaller stage-1 corpus and fewer steps (minutes, given cached embeddings)."),
    old_model: Path = typer.Option(Path("models/m30k-old-text"), help="The old text model (gallery side)."),
    new_model: Optional[Path] = typer.Option(None, help="The new text model (default: the real all-MiniLM-L6-v2)."),
    cache_dir: Path = typer.Option(Path("runs/cache"), help="Embedding cache (keyed by space id + text hash)."),
    work_dir: Path = typer.Option(Path("runs/xbt-text"), help="Training scratch (checkpoints; resumable)."),
    stage1_steps: Optional[int] = typer.Option(None, help="Override the stage-1 (phi) steps."),
    xbt_steps: Optional[int] = typer.Option(None, help="Override the XBT (stage 2) steps."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, help="torch threads."),
    json_out: Path = typer.Option(Path("runs/bench/xbt_text.json"), "--json", help="JSON output (a .md table beside it)."),
    save_upgrade: Optional[Path] = typer.Option(None, help="Write the trained xbt-text upgrade here (default: "
                                                           "under --work-dir); the xbt_new_old row is what it gives."),
) -> None:
    """XBT on real text: Multi30K caption-to-caption retrieval with an old small text model and MiniLM
    (rows old_old, new_new, phi_stage1_new_old, xbt_new_old; R@1/5/10 on val)."""
    from .bench.xbt_text import XBTTextConfig, run_xbt_text, write_outputs

    cfg = XBTTextConfig.quick(seed=seed, threads=threads) if quick else XBTTextConfig(seed=seed, threads=threads)
    if stage1_steps is not None:
        cfg.stage1.steps = stage1_steps
    if xbt_steps is not None:
        cfg.xbt.steps = xbt_steps
        cfg.xbt.eval_every = min(cfg.xbt.eval_every, xbt_steps)
    try:
        result = run_xbt_text(data or _multi30k_default(), eval_dir=eval_dir, quick=quick, old_model=old_model,
                              new_model=new_model, cache_dir=cache_dir, work_dir=work_dir, config=cfg,
                              save_upgrade=save_upgrade, log=lambda m: console.print(m))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(write_outputs(result, json_out))
    console.print(f"wrote {json_out}")


from .lingual.cli import bench_lingual_text, bench_lingual_world, lingual_app  # noqa: E402

app.add_typer(lingual_app, name="lingual")
bench_app.command("lingual-text")(bench_lingual_text)
bench_app.command("lingual-world")(bench_lingual_world)


from .bench.reco import bench_reco  # noqa: E402
bench_app.command("reco")(bench_reco)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
