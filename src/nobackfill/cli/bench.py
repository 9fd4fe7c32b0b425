"""``nobackfill bench ...``: the benchmarks of the system (each writes JSON and a table or plot); the
methods' benchmarks live beside their commands (compat, late, lingual, reco). A command parses its
arguments into its benchmark's config and hands it, with the benchmark's ``run`` and ``report``, to
:func:`nobackfill.bench.runner.run_bench` (through :func:`._common._bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ._common import (_bench, config_option, fail, from_project, json_flag, multi30k_default, resolve_config,
                      set_option, show_config_option)


def bench_encode(
    models: Path = typer.Option(Path("models"), callback=from_project,
                                help="Folder of model directories: every CLIP model in it is timed "
                                     "(the shipped ones: world-old, world-new, world-newer)."),
    n_images: Optional[int] = typer.Option(None, help="Images per timed pass (default 512)."),
    n_texts: Optional[int] = typer.Option(None, help="Texts per timed pass (default 2048)."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default 2)."),
    minilm: Optional[bool] = typer.Option(None, "--minilm/--no-minilm", help="Also time all-MiniLM-L6-v2 (default on)."),
    json_out: Path = typer.Option(Path("runs/bench/encode.json"), "--out", help="JSON output (a .md table is written beside it)."),
    as_json: bool = json_flag(),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Encoding throughput of each preset: ours vs a plain transformers loop (images/s, texts/s)."""
    from ..bench.encode import EncodeBenchConfig, run_encode_config
    from ..bench.encode_report import REPORT

    cfg = resolve_config(EncodeBenchConfig, None, config, set_, show=show_config, flags={
        "n_images": n_images, "n_texts": n_texts, "threads": threads, "minilm": minilm})
    _bench(cfg, lambda c, _log: run_encode_config(c, models), REPORT, json_out, as_json)


def bench_world(
    n: Optional[int] = typer.Option(None, help="Items (images) to generate (default 50000)."),
    workers: Optional[int] = typer.Option(None, help="Processes (default 2)."),
    json_out: Path = typer.Option(Path("runs/bench/world.json"), "--out", help="JSON output."),
    as_json: bool = json_flag(),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """World generation throughput (items/s) into a scratch folder; a .md table beside the JSON."""
    from ..bench.world import REPORT, WorldBenchConfig, run_world_bench

    cfg = resolve_config(WorldBenchConfig, None, config, set_, show=show_config, flags={"n": n, "workers": workers})
    _bench(cfg, lambda c, _log: run_world_bench(c.n, workers=c.workers, seed=c.seed), REPORT, json_out, as_json)


def bench_xbt(
    quick: bool = typer.Option(False, help="Under 10 minutes on 2 cores: 1 seed, fewer steps, sweep 1k/4k."),
    seeds: Optional[int] = typer.Option(None, help="Training seeds to average (default: 1 quick, 3 full)."),
    json_out: Path = typer.Option(Path("runs/bench/xbt.json"), "--out", help="JSON output (.md and .html beside it)."),
    models: Path = typer.Option(Path("models"), callback=from_project,
                                help="Folder with world-old / world-new (/ world-newer)."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (only world.json is read; splits are rendered)."),
    split: str = typer.Option("test", help="Evaluation split: test (report) or val (tuning)."),
    n_eval: int = typer.Option(1000, help="Evaluation images."),
    n_pairs: Optional[int] = typer.Option(None, help="Image-text pairs of the main rows (default 4000)."),
    threads: int = typer.Option(2, help="torch threads per training process."),
    continual: bool = typer.Option(True, help="Also old -> new -> newer (needs models/world-newer)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """XBT vs its baselines and training-free bridges on the world (tables, sweep, cost, matrix)."""
    from ..bench.xbt import XBTBenchConfig, run_xbt_bench
    from ..bench.xbt_report import REPORT

    kw = {"split": split, "n_eval": n_eval, "threads": threads, "continual": continual}
    kw.update({k: v for k, v in (("seeds", seeds), ("n_pairs", n_pairs)) if v is not None})
    cfg = resolve_config(XBTBenchConfig, XBTBenchConfig.quick_preset(**kw) if quick else XBTBenchConfig.full(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_xbt_bench(models, world, json_out, c, log=log), REPORT, json_out, as_json,
           errors=(RuntimeError,))


def bench_xbt_text(
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED)."),
    eval_dir: Optional[Path] = typer.Option(None, help="Folder laid out like task2/raw holding val.{1..5}.en.gz: "
                                                       "evaluate on it instead of the shared val split."),
    quick: bool = typer.Option(False, help="Smaller stage-1 corpus and fewer steps (minutes, given cached embeddings)."),
    old_model: Path = typer.Option(Path("models/m30k-old-text"), callback=from_project,
                                   help="The old text model (gallery side)."),
    new_model: Optional[Path] = typer.Option(None, help="The new text model (default: the real all-MiniLM-L6-v2)."),
    cache_dir: Path = typer.Option(Path("runs/cache"), help="Embedding cache (keyed by space id + text hash)."),
    work_dir: Path = typer.Option(Path("runs/xbt-text"), help="Training scratch (checkpoints; resumable)."),
    stage1_steps: Optional[int] = typer.Option(None, help="Override the stage-1 (phi) steps."),
    xbt_steps: Optional[int] = typer.Option(None, help="Override the XBT (stage 2) steps."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, help="torch threads."),
    json_out: Path = typer.Option(Path("runs/bench/xbt_text.json"), "--out", help="JSON output (a .md table beside it)."),
    save_upgrade: Optional[Path] = typer.Option(None, help="Write the trained xbt-text upgrade here (default: "
                                                           "under --work-dir); the xbt_new_old row is what it gives."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """XBT on real text: Multi30K caption-to-caption retrieval with an old small text model and MiniLM
    (rows old_old, new_new, phi_stage1_new_old, xbt_new_old; R@1/5/10 on val)."""
    from ..bench.xbt_text import REPORT, TextXBTUpgradeConfig, run_xbt_text

    base = TextXBTUpgradeConfig.quick(seed=seed, threads=threads) if quick else TextXBTUpgradeConfig(seed=seed, threads=threads)
    cfg = resolve_config(TextXBTUpgradeConfig, base, config, set_, show=show_config, flags={
        "stage1": {"steps": stage1_steps},
        "xbt": {"steps": xbt_steps, "eval_every": min(base.xbt.loop.eval_every, xbt_steps) if xbt_steps else None}})
    _bench(cfg, lambda c, log: run_xbt_text(data or multi30k_default(), eval_dir=eval_dir, quick=quick,
                                            old_model=old_model, new_model=new_model, cache_dir=cache_dir,
                                            work_dir=work_dir, config=c, save_upgrade=save_upgrade, log=log),
           REPORT, json_out, as_json)


def bench_routes(
    quick: bool = typer.Option(False, help="Calibrate on half the world val split and 500 Multi30K train pairs."),
    json_out: Path = typer.Option(Path("runs/bench/routes.json"), "--out", help="JSON output (a .md table beside it)."),
    eval_dir: Optional[Path] = typer.Option(None, help="Folder laid out like Multi30K task2/raw holding "
                                                       "val.{1..5}.en.gz: the text part evaluates on it."),
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED)."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (test: report, val: calibration)."),
    models: Path = typer.Option(Path("models"), callback=from_project,
                                help="Folder with world-old / world-new / m30k-old-text."),
    parts: str = typer.Option("world,text", help="Which parts to run: world, text."),
    work: Path = typer.Option(Path("runs/bench/routes-work"), help="Scratch collections."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """Every route of a live-upgraded collection, through the Searcher: old/old, bridge, fused (w chosen
    on a calibration split), new/new on the world (t2i, i2t) and on Multi30K (caption 1 -> 2); merges
    and negative flips."""
    from ..bench.routes import RoutesBenchConfig, format_markdown, run_routes_bench
    from ..bench.runner import markdown_report

    kw = dict(models=models, world=world, text_old=models / "m30k-old-text", multi30k=data, eval_dir=eval_dir,
              work=work, parts=tuple(p.strip() for p in parts.split(",") if p.strip()))
    cfg = resolve_config(RoutesBenchConfig, RoutesBenchConfig.quick(**kw) if quick else RoutesBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_routes_bench(c, log=log), markdown_report(format_markdown), json_out, as_json)


def bench_fitted_bridge(
    quick: bool = typer.Option(False, help="Every point, the MLPs capped at 1,500 steps."),
    json_out: Path = typer.Option(Path("runs/bench/fitted_bridge.json"), "--out", help="JSON output (.md and .png "
                                                                                       "beside it)."),
    eval_dir: Optional[Path] = typer.Option(None, help="Folder laid out like Multi30K task2/raw holding "
                                                       "val.{1,2}.en.gz: the text part evaluates on it."),
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED)."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (train: the collection, test: evaluation)."),
    models: Path = typer.Option(Path("models"), callback=from_project,
                                help="Folder with world-old / world-new / m30k-old-text."),
    points: Optional[str] = typer.Option(None, help="Backfilled pairs per modality at each point (default "
                                                    "128,256,512,1000,2000,5000)."),
    parts: str = typer.Option("world,text", help="Which parts to run: world, text."),
    cache_dir: Path = typer.Option(Path("runs/cache"), help="Embedding cache."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """Bridges fitted from the backfill itself: R@1 of every family and of the label-free choice as the
    pairs grow, against old/old, the shipped XBT and new/new (world t2i / i2t, Multi30K t2t)."""
    from ..bench.fitted_bridge import FittedBridgeBenchConfig, run_fitted_bridge_bench
    from ..bench.fitted_bridge_report import REPORT

    kw: dict = dict(models=models, world=world, text_old=models / "m30k-old-text", multi30k=data, eval_dir=eval_dir,
                    cache_dir=cache_dir, parts=tuple(p.strip() for p in parts.split(",") if p.strip()))
    if points:
        kw["points"] = tuple(int(x) for x in points.split(",") if x.strip())
    cfg = resolve_config(FittedBridgeBenchConfig, FittedBridgeBenchConfig.quick(**kw) if quick
                         else FittedBridgeBenchConfig(**kw), config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_fitted_bridge_bench(c, log=log), REPORT, json_out, as_json)


def bench_backfill(
    quick: bool = typer.Option(False, help="Calibrate on half the val split."),
    json_out: Path = typer.Option(Path("runs/bench/backfill.json"), "--out", help="JSON output (.md, .png and "
                                                                                  ".html beside it)."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (test: report, val: calibration, train: cost)."),
    models: Path = typer.Option(Path("models"), callback=from_project, help="Folder with world-old / world-new."),
    orders: str = typer.Option("sequential,random,uncertainty", help="Backfill orders to compare."),
    cost_sizes: str = typer.Option("1000,10000", help="Collection sizes whose upgrade and full backfill are timed "
                                                      "('' to skip); 100k is extrapolated."),
    work: Path = typer.Option(Path("runs/bench/backfill-work"), help="Scratch collections."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """R@1 while backfilling 0 -> 100 % for every order x merge (AUC, no-regret check, flips), and the
    cost of an upgrade and of a full backfill."""
    from ..bench.backfill import REPORT, BackfillBenchConfig, run_backfill_bench

    kw = dict(models=models, world=world, work=work, orders=tuple(o for o in orders.split(",") if o),
              cost_sizes=tuple(int(x) for x in cost_sizes.split(",") if x.strip()))
    if not kw["cost_sizes"]:
        kw["extrapolate"] = ()
    cfg = resolve_config(BackfillBenchConfig, BackfillBenchConfig.quick(**kw) if quick else BackfillBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_backfill_bench(c, log=log), REPORT, json_out, as_json)


def bench_backfill_engine(
    quick: bool = typer.Option(False, help="4000 items (full: 20000)."),
    json_out: Path = typer.Option(Path("runs/bench/backfill_engine.json"), "--out", help="JSON output (.md beside it)."),
    models: Path = typer.Option(Path("models"), callback=from_project, help="Folder with world-old / world-new."),
    items: Optional[int] = typer.Option(None, help="World items backfilled (overrides --quick's / the full default)."),
    work: Path = typer.Option(Path("runs/bench/backfill-engine-work"), help="Scratch world and collections."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """Items/s of the local lease workers vs Ray Data (1 and 2 nodes) on the same world items, Ray's
    overhead per batch, peak RSS, and a fault run (actor kills, node removals, crashed commits):
    committed, lost, twice (needs pip install 'nobackfill[ray]')."""
    from ..bench.backfill_engine import REPORT, BackfillEngineConfig, run_backfill_engine_bench

    kw: dict = dict(models=models, work=work, **({"items": items} if items else {}))
    cfg = resolve_config(BackfillEngineConfig, BackfillEngineConfig.quick(**kw) if quick else BackfillEngineConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_backfill_engine_bench(c, log=log), REPORT, json_out, as_json)


def bench_store(
    quick: bool = typer.Option(False, help="N = 100k (full: 1M), 20k real MiniLM captions (full: 145k)."),
    json_out: Path = typer.Option(Path("runs/bench/store.json"), "--out", help="JSON output (a .md table beside it)."),
    n: Optional[int] = typer.Option(None, help="Vectors per row (overrides --quick's / the full default)."),
    datasets: str = typer.Option("minilm,world,random", help="Comma list: minilm, world, random."),
    backends: Optional[str] = typer.Option(None, help="Comma list of <kind>:<index> (faiss:HNSW32, milvus-lite:FLAT, "
                                                      "milvus-server:HNSW32 ...)."),
    server: Optional[str] = typer.Option(None, help="HOST:PORT of a running Milvus server (default: start one)."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (train: gallery, test: queries)."),
    models: Path = typer.Option(Path("models"), callback=from_project, help="Folder with world-new."),
    cache_dir: Path = typer.Option(Path("runs/cache"), help="Embedding cache."),
    work: Path = typer.Option(Path("runs/bench/store-work"), help="Scratch (stores, vectors)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """Storage backends at scale: ingest, build, search latency (batch 1 / 64), recall@10 against exact
    search, peak RSS, for real MiniLM, world and random vectors; a two-space search against one."""
    from ..bench.store import StoreBenchConfig, format_markdown, run_store_bench
    from ..bench.runner import markdown_report

    kw: dict = dict(datasets=tuple(d for d in datasets.split(",") if d), world=world, models=models,
                    cache_dir=cache_dir, work=work)
    if backends:
        kw["backends"] = tuple(b for b in backends.split(",") if b)
    if n is not None:
        kw["n"] = n
    cfg = resolve_config(StoreBenchConfig, StoreBenchConfig.quick(**kw) if quick else StoreBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_store_bench(c, log=log, server=server), markdown_report(format_markdown), json_out, as_json)


def bench_serve(
    quick: bool = typer.Option(False, help="2,000 requests and 20 fault trials (full: 2,400 and 24)."),
    json_out: Path = typer.Option(Path("runs/bench/serve.json"), "--out", help="JSON output (a .md table beside it)."),
    concurrency: int = typer.Option(8, help="Concurrent clients."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (test: the collection, val: calibration)."),
    models: Path = typer.Option(Path("models"), callback=from_project, help="Folder with world-old / world-new."),
    work: Path = typer.Option(Path("runs/bench/serve-work"), help="Scratch (the served collection)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """The service on 127.0.0.1 under a bounded load during a backfill, SIGKILL fault trials, and every
    class of bad input."""
    from ..bench.serve import ServeBenchConfig, format_markdown, run_serve_bench
    from ..bench.runner import markdown_report

    kw = dict(concurrency=concurrency, world=world, models=models, work=work)
    cfg = resolve_config(ServeBenchConfig, ServeBenchConfig.quick(**kw) if quick else ServeBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_serve_bench(c, log=log), markdown_report(format_markdown), json_out, as_json)


def bench_scale(
    quick: bool = typer.Option(False, help="N = 100k only (full: 100k and 1M)."),
    json_out: Path = typer.Option(Path("runs/bench/scale.json"), "--out", help="JSON output (a .md table beside it)."),
    sizes: Optional[str] = typer.Option(None, help="Comma list of N (overrides --quick's / the full default)."),
    indexes: Optional[str] = typer.Option(None, help="Comma list of faiss factory strings (default Flat,HNSW32)."),
    model: Path = typer.Option(Path("models/world-new"), callback=from_project,
                               help="The model the collection records (CLI search loads it)."),
    work: Path = typer.Option(Path("runs/bench/scale-work"), help="Scratch (collections, vectors)."),
    shared: bool = typer.Option(False, help="Also a row at the smallest N with a PostgreSQL catalog and a Milvus "
                                            "server, both started on 127.0.0.1 (run it under scripts/isolated.sh)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """A collection at 100k / 1M items as a user runs it: add, open, search through the Searcher beside the
    raw index, memory, disk, search during a backfill, filtered search, cold CLI commands; Chroma and LanceDB
    beside it where installed."""
    from ..bench.scale import ScaleBenchConfig, format_markdown, run_scale_bench
    from ..bench.runner import markdown_report

    kw: dict = dict(model=model, work=work, shared=shared)
    if sizes:
        kw["sizes"] = tuple(int(s) for s in sizes.split(",") if s)
    if indexes:
        kw["indexes"] = tuple(i for i in indexes.split(",") if i)
    cfg = resolve_config(ScaleBenchConfig, ScaleBenchConfig.quick(**kw) if quick else ScaleBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_scale_bench(c, log=log), markdown_report(format_markdown), json_out, as_json)


def bench_import(
    quick: bool = typer.Option(False, help="N = 100k only (full: 100k and 1M), a 300-image world, 20 trials per case "
                                           "(full: 50)."),
    json_out: Path = typer.Option(Path("runs/bench/import.json"), "--out", help="JSON output (a .md table beside it)."),
    sizes: Optional[str] = typer.Option(None, help="Comma list of N for the throughput rows (overrides --quick's / "
                                                   "the full default)."),
    world: Optional[Path] = typer.Option(None, help="World root or split folder (its test split is used; default: a "
                                                    "world generated in --work)."),
    models: Path = typer.Option(Path("models"), callback=from_project,
                                help="Folder with world-old / world-new / m30k-old-text."),
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED)."),
    work: Path = typer.Option(Path("runs/bench/import-work"), help="Scratch (world, clip-retrieval folders, "
                                                                   "collections, vectors)."),
    shared: bool = typer.Option(False, help="Adopt in place on a Milvus server with a PostgreSQL catalog, both "
                                            "started on 127.0.0.1 (run it under scripts/isolated.sh); default "
                                            "milvus-lite."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """Bring your own index: hits of imported clip-retrieval folders vs the same collection built with add
    (t2i, i2t, t2t), import rows/s and peak RSS, and model-check trials with the right and wrong models
    declared."""
    from ..bench.importing import ImportBenchConfig, format_markdown, run_import_bench
    from ..bench.runner import markdown_report

    kw: dict = dict(world=world, models=models, multi30k=data, work=work, shared=shared)
    if sizes:
        kw["sizes"] = tuple(int(s) for s in sizes.split(",") if s)
    cfg = resolve_config(ImportBenchConfig, ImportBenchConfig.quick(**kw) if quick else ImportBenchConfig(**kw),
                         config, set_, show=show_config)
    _bench(cfg, lambda c, log: run_import_bench(c, log=log), markdown_report(format_markdown), json_out, as_json)


def bench_lingual_lambda(
    data: str = typer.Option("data/world", callback=from_project,
                             help="World root, or the Multi30K root (then --model minilm)."),
    model: str = typer.Option("models/world-new", callback=from_project,
                              help="The model whose tokenizer is the base vocabulary."),
    langs: str = typer.Option("de,fr,es,ru,el,zh", help="Languages in task order."),
    vocab_size: Optional[int] = typer.Option(None, help="Task vocabulary size (default: the bench's, world 1000, "
                                                        "text 10000)."),
    train_images: Optional[int] = typer.Option(None, help="World: training images (default 5000)."),
    train_lines: Optional[int] = typer.Option(None, help="Multi30K: lines trained on (default 3840; quick: 60 x 64)."),
    json_out: Path = typer.Option(Path("runs/bench/lingual_lambda.json"), "--out",
                                  help="JSON output (the rows; a .md table beside it)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """Where each language's training tokens land under TEIR (Eq. 6): shares of token occurrences on
    rows with lambda = 0, overlap and lambda = 1, and the mean lambda, per language."""
    from ..bench.lingual_lambda import REPORT, LingualLambdaConfig, lambda_usage

    cfg = resolve_config(LingualLambdaConfig, None, config, set_, show=show_config, flags={
        "data": data, "model": model, "langs": tuple(x for x in langs.split(",") if x), "vocab_size": vocab_size,
        "train_images": train_images, "train_lines": train_lines})
    _bench(cfg, lambda c, _log: lambda_usage(c), REPORT, json_out, as_json)


def bench_merged(
    repeats: Optional[int] = typer.Option(None, help="Timed text queries per encoder (default 200)."),
    world: Path = typer.Option(Path("data/world"), callback=from_project,
                               help="World root (its val captions and images are compared)."),
    models: Path = typer.Option(Path("models"), callback=from_project, help="Folder with world-new."),
    upgrades: Path = typer.Option(Path("upgrades"), callback=from_project,
                                  help="Folder with world-old-to-new and m30k-old-text-to-minilm."),
    json_out: Path = typer.Option(Path("runs/bench/merged.json"), "--out", help="JSON output (a .md table beside it)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
    as_json: bool = json_flag(),
) -> None:
    """An upgrade's adapters merged into the weights (what the Searcher serves) against the switchable
    upgrade: equal outputs, and the time of one text query (1 thread)."""
    from ..bench.merged import MergedBenchConfig, format_markdown, run_merged_bench
    from ..bench.runner import markdown_report

    cfg = resolve_config(MergedBenchConfig, MergedBenchConfig(world=world, models=models, upgrades=upgrades), config,
                         set_, show=show_config, flags={"repeats": repeats})
    _bench(cfg, lambda c, _log: run_merged_bench(c), markdown_report(format_markdown), json_out, as_json)


def bench_tables(
    check: bool = typer.Option(False, "--check", help="Exit 1 if a page's tables are out of date (write nothing)."),
    results: Optional[Path] = typer.Option(None, help="The benchmark outputs (default: benchmarks/results)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Refresh the result tables of the README and docs/*.md from the committed benchmark outputs
    (each <!-- results:NAME --> block is benchmarks/results/NAME.md)."""
    from ..bench.tables import TablesConfig, refresh_documents

    cfg = resolve_config(TablesConfig, None, config, set_, show=show_config, flags={"check": check or None,
                                                                                   "results": results})
    try:
        stale = refresh_documents(cfg, log=typer.echo)
    except FileNotFoundError as e:
        fail(e)
    if cfg.check and stale:
        typer.echo("out of date: " + ", ".join(str(p) for p in stale))
        raise typer.Exit(1)
