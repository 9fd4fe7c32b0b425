"""``nobackfill collection ...``: collections that hold several embedding spaces, searched across all
of them (live upgrades). A collection is a directory; NAME is its path."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.markup import escape

from ._common import console, fail, langs_option, report_skipped, skip_bad_hint, user_errors, warn_truncated
from .gallery import print_hits

collection_app = typer.Typer(no_args_is_help=True, help="Collections: a gallery that keeps working across model "
                                                        "upgrades (several embedding spaces, one search).")

_NAME = typer.Argument(..., help="The collection: a directory or a storage URI (milvus-lite:PATH#NAME or "
                       "milvus://HOST:PORT#NAME), either followed by ?catalog=postgresql://... for a shared catalog.")


def _open(name: str):
    from ..index.collection import Collection

    return Collection.open(name)


@collection_app.command("create")
def create(
    name: str = _NAME,
    model: Path = typer.Option(..., help="The model that embeds the collection's items (a model directory, or "
                                         "'minilm' for the shipped all-MiniLM-L6-v2)."),
    backend: str = typer.Option("auto", help="Vector index of every space: auto (exact search below 50,000 vectors, an HNSW32 graph index past it, built in the background), a faiss factory string (Flat, HNSW32, HNSW32:efSearch=128, IVF1024,PQ16:nprobe=32) or flat | hnsw:M=16,ef=64."),
) -> None:
    """Create an empty collection whose current model is MODEL."""
    from ..index.collection import Collection
    from ..search.models import ModelPool, model_ref

    try:
        ref = model_ref(model)
        enc = ModelPool().get(ref)
        c = Collection.create(name, space_id=enc.space_id, dim=enc.embed_dim, model=ref, name=getattr(enc, "name", ""),
                              modalities=list(getattr(enc, "modalities", ("image", "text"))), backend=backend)
    except user_errors() as e:
        fail(str(e))
    console.print(f"collection {c.path}: current model {getattr(enc, 'name', '')} (space {enc.space_id}, "
                  f"embeds {', '.join(enc.modalities)})")


@collection_app.command("add")
def add(
    name: str = _NAME,
    data: Optional[Path] = typer.Option(None, help="A data folder (images and/or captions.jsonl) or a world root "
                                                   "(with --split). Images no caption mentions are added too."),
    split: str = typer.Option("test", help="Split when --data is a world root."),
    langs: str = langs_option(),
    texts: Optional[Path] = typer.Option(None, help="A text file (one text a line) or JSONL ({\"text\", \"id\", ...}) "
                                                    "of texts to add."),
    skip_bad: bool = typer.Option(False, help="Skip malformed lines and unreadable images (and report how many)."),
    wait: bool = typer.Option(False, help="If another process is adding to this collection, wait for it instead "
                                          "of stopping."),
    chunk_size: int = typer.Option(256, help="Items embedded and committed together."),
) -> None:
    """Embed new items with the collection's current model (items already there are skipped; an
    id with new content replaces its old version). Resumable: re-run after a crash."""
    from ..evaluate import resolve_data
    from ..index.ingest import add_items, folder_items, text_file_items
    from ..search.models import ModelPool

    if (data is None) == (texts is None):
        fail("give exactly one of --data or --texts")
    folder, bad_images, bad_lines = None, {}, []
    try:
        c = _open(name)
        if data is not None:
            folder = resolve_data(data, split) if not (data / "captions.jsonl").is_file() and (data / split).is_dir() \
                else data
            fi = folder_items(folder, langs=[x for x in langs.split(",") if x] or None, skip_bad=skip_bad)
            items, skipped, uncaptioned = fi.items, fi.skipped, fi.uncaptioned
            bad_images, bad_lines = dict(fi.skipped_images), list(fi.problems)
        else:
            items, skipped, uncaptioned = text_file_items(texts), 0, 0
        entry = c.space(c.current_space)
        enc = ModelPool().get(entry.model, c.current_space, what="collection's current model")

        def warn(todo):  # only about the captions embedded now
            text_items = [it for it in todo if it.modality == "text"]
            warn_truncated(enc, [it.source["text"] for it in text_items], [f"item {it.id}" for it in text_items])

        t0 = time.time()
        rep = add_items(c, enc, items, chunk_size=chunk_size, skip_bad=skip_bad, progress=True, wait=wait,
                        before_embed=warn)
    except user_errors() as e:
        fail(skip_bad_hint(e))
    n_img = sum(1 for it in items if it.modality == "image")
    console.print(f"{len(items)} item(s) read ({n_img} images, {len(items) - n_img} texts"
                  + (f"; {uncaptioned} images without captions" if uncaptioned else "") + ")")
    console.print(f"added {rep.added}, already there {rep.unchanged}"
                  + (f", metadata updated {rep.metadata_updated}" if rep.metadata_updated else "")
                  + (f", recovered from an interrupted run {rep.recovered}" if rep.recovered else "")
                  + f" in {time.time() - t0:.1f}s")
    bad_images.update(rep.skipped_images)
    bad_lines += [p for p in rep.problems if not any(p.startswith(f"{k}: ") for k in rep.skipped_images)]
    report_skipped(skipped + rep.skipped, bad_images, bad_lines, root=folder)
    if rep.added:
        c.build_graph_indexes(log=console.print)
    st = c.status()
    console.print(f"collection {c.path}: {st['items']['image']} images, {st['items']['text']} texts")


@collection_app.command("import")
def import_(
    name: str = _NAME,
    model: Path = typer.Option(..., help="The model that made the vectors (a model directory, or 'minilm'): the "
                                         "collection's current model, checked on a sample unless --trust-model."),
    from_: str = typer.Option(..., "--from", help="What to import: clip-retrieval:DIR (its inference output), "
                                                  "npy:FILE.npy, npz:FILE.npz[:KEY] or faiss:FILE (with --table), or a "
                                                  "Milvus collection to adopt in place (milvus://HOST:PORT#NAME or "
                                                  "milvus-lite:PATH#NAME, in the Milvus that holds NAME's collection)."),
    table: Optional[Path] = typer.Option(None, help="Parquet, JSONL or CSV table of the vectors' rows (ids, "
                                                    "sources, metadata), row for row."),
    id_column: Optional[str] = typer.Option(None, help="The table's id column (default: ids from content, as add "
                                                       "gives them)."),
    source_column: Optional[str] = typer.Option(None, help="The table's column of image paths / urls or caption "
                                                           "texts (what a backfill embeds again)."),
    modality: Optional[str] = typer.Option(None, help="image or text, for a table without a 'modality' column "
                                                      "(and for an adopted Milvus collection)."),
    vector_field: Optional[str] = typer.Option(None, help="Milvus in place: the field holding the vectors."),
    id_field: Optional[str] = typer.Option(None, help="Milvus in place: the primary-key field (the item ids)."),
    source_field: Optional[str] = typer.Option(None, help="Milvus in place: the field with image paths / caption "
                                                          "texts (what a backfill embeds again)."),
    images_root: Optional[Path] = typer.Option(None, help="Where relative image paths are resolved."),
    trust_model: bool = typer.Option(False, help="Skip the model check (the plan records that it was skipped)."),
    lossy: bool = typer.Option(False, help="Accept a faiss index that stores vectors lossily (PQ, SQ): its "
                                           "reconstructions are imported."),
    samples: int = typer.Option(64, help="Items re-embedded by the model check."),
    backend: str = typer.Option("auto", help="Vector index of a collection created by this import (see create)."),
    wait: bool = typer.Option(False, help="If another process is adding to this collection, wait for it."),
) -> None:
    """Adopt vectors embedded elsewhere: nothing is embedded again but a small sample that checks
    they were made by MODEL. A Milvus collection is adopted in place: never copied, written to or
    dropped. Resumable: re-run after a crash."""
    from ..index.importing import import_source
    from ..index.sources import open_source
    from ..search.models import ModelPool, model_ref

    if from_.startswith(("milvus://", "milvus-lite:")):
        return _adopt(name, model, from_, vector_field, id_field, source_field, modality, images_root, trust_model,
                      samples, backend, wait)
    try:
        ref = model_ref(model)
        enc = ModelPool().get(ref)
        src = open_source(from_, table=table, id_column=id_column, source_column=source_column, modality=modality,
                          images_root=images_root, lossy=lossy, expect_dim=int(enc.embed_dim))
        rep = import_source(name, src, enc, model=ref, trust_model=trust_model, samples=samples, backend=backend,
                            progress=True, wait=wait)
    except user_errors() as e:
        fail(str(e))
    for w in rep.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    mc = rep.model_check
    console.print("model check: skipped (--trust-model)" if mc.get("skipped") else f"model check: {escape(mc['message'])}")
    console.print(f"{rep.items} item(s) read from {escape(rep.source)}: added {rep.added}, already there "
                  f"{rep.unchanged} in {rep.seconds:.1f}s ({rep.items_per_s:,.0f} items/s)")
    c = _open(name)
    if rep.added:
        c.build_graph_indexes(log=console.print)
    st = c.status()
    console.print(f"collection {c.path}: {st['items']['image']} images, {st['items']['text']} texts"
                  + (f"; {st['unsourced']} without a source (cannot be backfilled)" if st.get("unsourced") else ""))


def _adopt(name: str, model: Path, source: str, vector_field: Optional[str], id_field: Optional[str],
           source_field: Optional[str], modality: Optional[str], images_root: Optional[Path], trust_model: bool,
           samples: int, backend: str, wait: bool) -> None:
    """``collection import --from milvus://...``: the user's Milvus collection adopted in place."""
    from ..index.adopt import adopt_milvus
    from ..search.models import ModelPool, model_ref

    missing = [o for o, v in (("--vector-field", vector_field), ("--id-field", id_field), ("--modality", modality))
               if not v]
    if missing:
        fail(f"adopting a Milvus collection needs {', '.join(missing)}")
    try:
        ref = model_ref(model)
        rep = adopt_milvus(name, source, ModelPool().get(ref), model=ref, vector_field=vector_field,
                           id_field=id_field, source_field=source_field, modality=modality, trust_model=trust_model,
                           samples=samples, images_root=str(images_root) if images_root else None, backend=backend,
                           progress=True, wait=wait)
    except user_errors() as e:
        fail(str(e))
    mc = rep["model_check"]
    console.print("model check: skipped (--trust-model)" if mc.get("skipped") else f"model check: {escape(mc['message'])}")
    console.print(f"adopted {escape(source)} in place: {rep['items']} item(s), added {rep['added']}, already there "
                  f"{rep['unchanged']}" + (f"; {rep['unsourced']} without a source (cannot be backfilled)"
                                          if rep.get("unsourced") else "")
                  + "; its vectors were not copied and nobackfill never writes to it")


def _calibration(data: Path, split: str, limit: Optional[int], langs: str):
    """Calibration tasks from a data folder / world root (t2i, i2t) or a Multi30K root (t2t: caption
    1 -> caption 2 of ``split``)."""
    from ..evaluate import load_eval_data
    from ..lifecycle.calibrate import pair_tasks, text_pair_task

    if (data / "task2" / "raw").is_dir():
        from ..data.multi30k import read_task2

        cs = read_task2(data, split, "en", ks=(1, 2), limit=limit)
        return [text_pair_task(cs.column(1), cs.column(2))], f"Multi30K {split} ({cs.n_images} caption pairs)"
    ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x], limit=limit)
    return pair_tasks(ds), f"{data} {split} ({len(ds)} images, {len(ds.captions)} captions)"


def _print_routes(plan: Any) -> None:
    from ..lifecycle.plan_changes import route_table

    for sid, dirs in route_table(plan).items():
        for d, r in dirs.items():
            cal = r["calibration"]
            nums = ", ".join(f"{k} R@1 {v['R@1']:.3f}" + (f" (w={v['w']})" if "w" in v else "")
                             for k, v in cal.items() if isinstance(v, dict) and "R@1" in v)
            how = "pinned" if r["pinned"] else "calibrated" if r["calibrated"] else "default, uncalibrated"
            console.print(escape(f"  space {sid} {d}: {r['route']}" + (f" w={r['w']}" if r["w"] is not None else "")
                                 + f" ({how})" + (f"  {nums}" if nums else "")))


@collection_app.command("upgrade")
def upgrade(
    name: str = _NAME,
    model: Path = typer.Option(..., help="The new model (a model directory, or 'minilm')."),
    bridge: Optional[List[Path]] = typer.Option(None, "--bridge", help="Upgrade directory taking the new model's "
                                                "queries into an older space (XBT, phi, Procrustes); repeat to chain."),
    calibrate: Optional[Path] = typer.Option(None, help="Labelled data to choose routes, fused weights and the "
                                                        "merge on: a data folder / world root, or a Multi30K root."),
    calibrate_split: str = typer.Option("val", help="Split of --calibrate (never the one you evaluate on)."),
    calibrate_limit: Optional[int] = typer.Option(None, help="Use only the first N images / caption pairs."),
    calibrate_langs: str = typer.Option("en", help="Caption languages of --calibrate."),
) -> None:
    """Make MODEL the current model at once: new items and queries use it, items of older spaces are
    reached through the best route. Re-embeds nothing (see `collection backfill`)."""
    from ..search.models import ModelPool
    from ..lifecycle.plan_changes import upgrade_collection

    try:
        c = _open(name)
        tasks, label = _calibration(calibrate, calibrate_split, calibrate_limit, calibrate_langs) if calibrate \
            else (None, "")
        t0 = time.time()
        plan = upgrade_collection(c, model, bridges=bridge or [], calibration=tasks, calibration_label=label,
                                  pool=ModelPool(), log=lambda m: console.print(m))
    except user_errors() as e:
        fail(str(e))
    cur = plan.current_space
    console.print(f"collection {c.path}: current model is now {cur.name} (space {cur.space_id}) "
                  f"after {time.time() - t0:.1f}s; nothing was re-embedded")
    _print_routes(plan)
    if plan.merge is not None:
        console.print(f"  merge: {plan.merge.method} (chosen on the calibration split)")
    elif not calibrate:
        console.print("  routes and merge are uncalibrated defaults (bridge where one exists; raw merge): pass "
                      "--calibrate DATA to choose them on labelled data")


def _parse_filter(items: Optional[List[str]]) -> dict:
    out: dict = {}
    for it in items or []:
        key, eq, value = it.partition("=")
        if not eq or not key:
            raise ValueError(f"--filter must look like key=value (got {it!r})")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@collection_app.command("search")
def search(
    name: str = _NAME,
    text: Optional[str] = typer.Option(None, help="Text query."),
    image: Optional[Path] = typer.Option(None, help="Image query."),
    k: int = typer.Option(10, help="Number of results."),
    target: Optional[str] = typer.Option(None, help="What to return: image | text (default: images for a text "
                                                    "query and captions for an image query, when there are any)."),
    filter: Optional[List[str]] = typer.Option(None, "--filter", help="Metadata filter key=value (dotted keys for "
                                               "nested fields, JSON values; repeat to AND)."),
    merge: Optional[str] = typer.Option(None, help="Override the plan's merge: raw | calibrated | rank."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Search every space of the collection (each through its route) and print one merged list."""
    from ..search import Searcher

    if (text is None) == (image is None):
        fail("give exactly one of --text or --image")
    from ..index.store import Gallery

    # one search, then exit: a background graph build would only compete with it (add builds it)
    background, Gallery.build_in_background = Gallery.build_in_background, False
    try:
        s = Searcher(_open(name), merge=merge)
        r = s.search(text=text, image=image, k=k, target=target, filter=_parse_filter(filter))
    except user_errors() as e:
        fail(str(e))
    finally:
        Gallery.build_in_background = background
    print_hits(r, as_json, k)


def _index_line(info: dict) -> str:
    """``auto: HNSW32 for 1200000 images, Flat for 3000 texts (graph index building)``."""
    parts = []
    for m, i in info.items():
        what = i.get("in_use") or "not loaded yet"
        parts.append(f"{what} for {i['count']} {m}s" + (" (graph index building; searches exact meanwhile)"
                                                        if i.get("building") else ""))
    backend = next(iter(info.values()))["backend"]
    return f"{backend}: " + ", ".join(parts)


@collection_app.command("status")
def status(
    name: str = _NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Spaces with their item counts, the current model, and the route to every older space."""
    from ..lifecycle.backfill import backfill_status
    from ..lifecycle.plan_changes import route_table

    try:
        c = _open(name)
        st = c.status()
        plan = c.plan
        st["backfill"] = backfill_status(c)
        st["routes"] = route_table(plan)
        st["merge"] = plan.merge_method or "raw (uncalibrated default)"
        st["calibrated"] = bool(plan.calibration)
    except user_errors() as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(st, indent=2))
        return
    console.print(f"collection {st['path']}: {st['items']['image']} images, {st['items']['text']} texts "
                  f"(generation {st['generation']}, catalog in {st['catalog']})")
    for sid, s in st["spaces"].items():
        console.print(f"  {'*' if s['current'] else ' '} {s['name']:<16} {sid}  images {s.get('image', 0)}, texts "
                      f"{s.get('text', 0)}  ({s['model']})")
        for imp in s.get("imports", []):
            mc = imp.get("model_check") or {}
            how = "model check skipped (--trust-model)" if mc.get("skipped") else \
                f"model check median cosine {mc.get('median_cosine', 0):.4f} over {mc.get('n')} items"
            console.print(escape(f"      imported {imp.get('items')} item(s) from {imp.get('from')} at {imp.get('at')}; "
                                 + how))
        if s.get("index"):
            console.print("      index: " + _index_line(s["index"]))
    _print_routes(plan)
    console.print(f"  merge: {st['merge']}" + ("" if st["calibrated"] else "; routes uncalibrated"))
    bf = st["backfill"]
    per = ", ".join(f"{m} {v['done']}/{v['total']}" for m, v in bf["per_modality"].items())
    eta = f", ETA {bf['eta_s']:.0f}s at {bf['rate']:.1f} items/s" if bf.get("eta_s") else ""
    console.print(f"  backfill into the current space: {bf['done']}/{bf['total']} ({100 * bf['fraction']:.1f}%; {per})"
                  + escape(f" [{bf['state']}{', order ' + bf['order'] if bf.get('order') else ''}{eta}]"))
    if bf.get("no_source"):
        console.print(f"    no source: cannot be backfilled: {bf['no_source']} item(s) (imported without one; "
                      "searched in their space until it is retired)")
    for w in bf.get("holders", []):
        console.print(f"    worker: pid {w['pid']} on {w['host']} (shard {w['shard']}, since {w['since']})")
    if bf.get("note"):
        console.print(f"    [yellow]{escape(bf['note'])}[/yellow]")


@collection_app.command("delete")
def delete(
    name: str = _NAME,
    ids: List[str] = typer.Option(..., "--id", help="Item id to delete (repeat for several)."),
) -> None:
    """Delete items: they are never returned again (all or nothing: an unknown id changes nothing)."""
    try:
        c = _open(name)
        n = c.delete(ids)
    except user_errors() as e:
        fail(str(e))
    console.print(f"deleted {n} item(s) from {c.path}")


@collection_app.command("route")
def route(
    name: str = _NAME,
    space: str = typer.Option(..., help="An older space id (see `collection status`)."),
    direction: str = typer.Option(..., help="t2i | i2t | t2t | i2i."),
    use: Optional[str] = typer.Option(None, "--route", help="Pin this route: old-model | bridge | fused."),
    w: Optional[float] = typer.Option(None, help="Weight of the bridge score for a fused route, in [0, 1]."),
    unpin: bool = typer.Option(False, help="Remove the pin (the calibrated or default route applies)."),
) -> None:
    """Pin the route to one older space for one direction (or unpin it)."""
    from ..lifecycle.plan_changes import pin_route

    if (use is None) == (not unpin):
        fail("give --route ROUTE or --unpin")
    try:
        plan = pin_route(_open(name), space, direction, None if unpin else use, w)
    except user_errors() as e:
        fail(str(e))
    _print_routes(plan)


@collection_app.command("calibrate")
def calibrate(
    name: str = _NAME,
    data: Path = typer.Option(..., help="Labelled data: a data folder / world root, or a Multi30K root."),
    split: str = typer.Option("val", help="Split of --data (never the one you evaluate on)."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N images / caption pairs."),
    langs: str = typer.Option("en", help="Caption languages."),
) -> None:
    """Choose routes, fused weights and the merge of the current plan on labelled data (pinned
    routes stay; their numbers are refreshed)."""
    from ..lifecycle.plan_changes import calibrate_collection

    try:
        tasks, label = _calibration(data, split, limit, langs)
        plan = calibrate_collection(_open(name), tasks, label=label)
    except user_errors() as e:
        fail(str(e))
    _print_routes(plan)
    console.print(f"  merge: {plan.merge_method} (chosen on the calibration split)")


@collection_app.command("backfill")
def backfill(
    name: str = _NAME,
    order: str = typer.Option("uncertainty", help="sequential | random | uncertainty (FastFill-style: the items "
                                                  "predicted worst served first)."),
    workers: int = typer.Option(1, help="Worker processes (disjoint shards, leases in the collection)."),
    limit: Optional[int] = typer.Option(None, help="Stop after this many items (resume later)."),
    rate: Optional[float] = typer.Option(None, help="Items per second, all workers together."),
    batch_size: int = typer.Option(64, help="Items embedded and committed together."),
    pause: bool = typer.Option(False, help="Pause the running backfill (workers stop after their batch)."),
    resume: bool = typer.Option(False, help="Resume a paused backfill (then run workers)."),
    cancel: bool = typer.Option(False, help="Forget the backfill job (what was committed stays)."),
) -> None:
    """Re-embed the items of older spaces into the current model's space, in the chosen order, while
    the collection keeps serving queries. Resumable; search sees each committed batch at once."""
    from ..lifecycle.backfill import BackfillError, cancel_backfill, pause_backfill, run_backfill
    from ..search.models import ModelPool

    if sum([pause, resume, cancel]) > 1:
        fail("give at most one of --pause, --resume, --cancel")
    try:
        c = _open(name)
        if pause or cancel:
            if pause:
                job = pause_backfill(c)
                console.print(f"backfill of {c.path} is {job.state}")
            else:
                cancel_backfill(c)
                console.print(f"backfill job of {c.path} removed")
            return
        if resume:
            pause_backfill(c, paused=False)
        pool = ModelPool()
        enc = pool.get(c.space(c.current_space).model, c.current_space, what="collection's current model")
        from ..progress import progress_bar
        from ..lifecycle.backfill import backfill_status

        st0 = backfill_status(c)
        todo = st0["total"] - st0["done"] if limit is None else min(limit, st0["total"] - st0["done"])
        with progress_bar(True, f"backfilling ({order})", todo) as advance:
            st = run_backfill(c, enc, order=order, workers=workers, limit=limit, rate=rate, batch_size=batch_size,
                              pool=pool, progress=advance, log=lambda m: console.print(m))
    except (BackfillError,) + user_errors() as e:
        fail(str(e))
    head = f"backfill of {c.path}: {st['done']}/{st['total']} items in the current space ({100 * st['fraction']:.1f}%)"
    sample = (f" ({st['sample_committed']} of them the training sample of the uncertainty order)"
              if st.get("sample_committed") else "")
    done = f"{st['committed']} committed{sample} in {st['seconds']:.1f}s"
    if st.get("busy"):  # every unfinished shard is leased: say who works, not a silent "0 committed"
        who = "; ".join(f"pid {w['pid']} on {w['host']} (shard {w['shard']}, since {w['since']})" for w in st["busy"])
        console.print(f"{head}; another process is doing the work: {who}; nothing was left for this one"
                      + (f" ({done} before that)" if st["committed"] else "")
                      + ". Follow it with `nobackfill collection status`.")
        return
    stopped = {"limit": f"stopped at --limit {limit}; run again to go on"}.get(st.get("stopped"), st.get("stopped"))
    console.print(f"{head}; {done}" + (f" ({escape(stopped)})" if stopped else ""))


@collection_app.command("retire")
def retire(
    name: str = _NAME,
    space: str = typer.Option(..., help="The old space to drop (see `collection status`)."),
    drop_unsourced: bool = typer.Option(False, help="Delete the items it serves that have no source (imported "
                                                    "without one: they cannot be backfilled) with it."),
) -> None:
    """Drop an old space's vectors once every item has a vector in the current space."""
    from ..lifecycle.backfill import BackfillError, retire_space

    try:
        c = _open(name)
        dropped = len(c.unsourced_ids(space)) if drop_unsourced else 0
        retire_space(c, space, drop_unsourced=drop_unsourced)
    except (BackfillError,) + user_errors() as e:
        fail(str(e))
    console.print(f"space {space} of {c.path} retired; its vectors were removed"
                  + (f"; {dropped} item(s) without a source were deleted with it" if dropped else ""))
