"""The ``nobackfill`` command line (typer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Cross-modal retrieval whose embedding model improves without re-embedding the gallery.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate models and galleries.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON for machines, tables/plots for people).")
app.add_typer(eval_app, name="eval")
app.add_typer(bench_app, name="bench")
console = Console(stderr=True)


def _fail(msg: str) -> None:
    console.print(f"[red]error:[/red] {msg}")
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
) -> None:
    """Embed a data folder's images and captions into a model-versioned gallery (resumable)."""
    from .demo import index_dataset
    from .encoders import load_encoder
    from .evaluate import load_eval_data

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x], skip_bad=skip_bad)
        enc = load_encoder(model)
        g = index_dataset(enc, ds, out, model_ref=str(model), backend=backend)
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
) -> None:
    """Search a gallery with a text or an image query."""
    from .encoders import load_encoder
    from .index import Gallery

    if (text is None) == (image is None):
        _fail("give exactly one of --text or --image")
    try:
        g = Gallery.open(gallery)
        enc = load_encoder(model)
        if text is not None:
            q, modality = enc.encode_texts([text]), "image"
        else:
            q, modality = enc.encode_images([image]), "text"
        res = g.search(modality, q, k=k, space_id=enc.space_id)
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
) -> None:
    """Text->image and image->text R@1/5/10, median rank, mAP for a query model x gallery model."""
    from .encoders import load_encoder
    from .evaluate import cross_retrieval, embed_dataset, load_eval_data
    from .report import recall_table_rows, text_table

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        q = load_encoder(query_model)
        g = q if gallery_model == query_model else load_encoder(gallery_model)
        qe = embed_dataset(q, ds, progress=True)
        ge = qe if g is q else embed_dataset(g, ds, progress=True)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    res = cross_retrieval(qe, ge, ds.caption_image)
    res.update({"query_model": str(query_model), "gallery_model": str(gallery_model), "n_images": len(ds),
                "n_captions": len(ds.captions), "query_space": q.space_id, "gallery_space": g.space_id})
    typer.echo(text_table(*recall_table_rows({f"{query_model.name}/{gallery_model.name}": res})))
    _write_json(json_out, res)


@app.command()
def demo(
    world: Path = typer.Option(Path("data/world"), help="World folder (generated if absent)."),
    models: Path = typer.Option(Path("models"), help="Folder with the shipped checkpoints."),
    out: Path = typer.Option(Path("runs/demo"), help="Output folder (gallery, report.html)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the table as JSON here."),
) -> None:
    """The main job: old gallery, new model, and how they compare (report.html + JSON)."""
    from .demo import run_demo

    try:
        result = run_demo(world, models, out, log=lambda m: console.print(m))
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

    dirs = {p.name: p for p in sorted(models.iterdir()) if (p / "config.json").is_file()} if models.is_dir() else {}
    if not dirs:
        _fail(f"{models}: no model directories found")
    result = run_encode_bench(dirs, n_images=n_images, n_texts=n_texts, threads=threads,
                              minilm="pretrained" if minilm else None)
    write_report(result, json_out.parent)
    if json_out.name != "encode.json":
        _write_json(json_out, result)
    typer.echo(format_encode_table(result))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
