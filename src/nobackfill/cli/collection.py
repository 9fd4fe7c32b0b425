"""``nobackfill collection ...``: collections that hold several embedding spaces, searched across all
of them (live upgrades). NAME is a directory, a storage URI, or the URL of a running ``nobackfill
serve`` (its key in ``NOBACKFILL_API_KEY``). Each command is its arguments, one call of
:class:`nobackfill.Client` and the printing of what it returned."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, List, Optional

import typer

from ._common import (console, emit_json, fail, langs_option, redact, report_skipped, results, skip_bad_hint,
                      user_errors, warn_truncated)
from ._collection_print import (interrupt_report, parse_filter, parse_fit_sample, print_backfill, print_backfill_run,
                                print_fitted, print_import, print_indexes, print_routes, print_spaces, print_upgrade,
                                retired_words, upgraded_already)
from .gallery import print_hits

collection_app = typer.Typer(no_args_is_help=True, help="Collections: a gallery that keeps working across model "
                                                        "upgrades (several embedding spaces, one search).")

_STORED = ("The collection: a directory or a storage URI (milvus-lite:PATH#NAME or milvus://HOST:PORT#NAME), either "
           "followed by ?catalog=postgresql://... for a shared catalog")
_NAME = typer.Argument(..., help=_STORED + "; or the http(s):// URL of a running `nobackfill serve` (API key in "
                       "NOBACKFILL_API_KEY; files the server reads are named relative to its --data-root, "
                       "--models-root and --upgrades-root).")
_NEW = typer.Argument(..., help=_STORED + " (not a server's URL: a server serves a collection that exists).")


_JSON = typer.Option(False, "--json", help="Print what the call returned as JSON (what nobackfill.Client returns).")


def _echo(obj: Any) -> None:
    """``--json``: the client's return value as JSON (a result dataclass by its ``to_dict``)."""
    emit_json(obj.to_dict() if hasattr(obj, "to_dict") else obj, True)


def _client(name: str):
    """The :class:`nobackfill.Client` of NAME (over HTTP for a URL, with ``NOBACKFILL_API_KEY``)."""
    from ..client import Client

    if name.startswith(("http://", "https://")):
        return Client(name, api_key=os.environ.get("NOBACKFILL_API_KEY"))
    return Client(name)


@collection_app.command("create")
def create(
    name: str = _NEW,
    model: Path = typer.Option(..., help="The model that embeds the collection's items (a model directory, or "
                                         "'minilm' for the shipped all-MiniLM-L6-v2)."),
    backend: str = typer.Option("auto", help="Vector index of every space: auto (exact search below 50,000 vectors, an HNSW32 graph index past it, built in the background), a faiss factory string (Flat, HNSW32, HNSW32:efSearch=128, IVF1024,PQ16:nprobe=32) or flat | hnsw:M=16,ef=64."),
    as_json: bool = _JSON,
) -> None:
    """Create an empty collection whose current model is MODEL."""
    try:
        st = _client(name).create(model, backend=backend)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(st)
    cur = st["spaces"][st["current"]]
    results.print(f"collection {st['path']}: current model {cur['name']} (space {st['current']}, "
                  f"embeds {', '.join(cur['modalities']) if cur.get('modalities') else 'image, text'})")


@collection_app.command("add")
def add(
    name: str = _NAME,
    data: Optional[Path] = typer.Option(None, help="A data folder (images and/or captions.jsonl) or a world root "
                                                   "(with --split). Images no caption mentions are added too."),
    split: str = typer.Option("test", help="Split when --data is a world root."),
    langs: str = langs_option(),
    texts: Optional[Path] = typer.Option(None, help="A text file (one text a line) or, named *.jsonl, JSONL ({\"text\", \"id\", ...}) "
                                                    "of texts to add."),
    skip_bad: bool = typer.Option(False, help="Skip malformed lines and unreadable images (and report how many)."),
    wait: bool = typer.Option(False, help="If another process is adding to this collection, wait for it instead "
                                          "of stopping."),
    chunk_size: int = typer.Option(256, help="Items embedded and committed together."),
    as_json: bool = _JSON,
) -> None:
    """Embed new items with the collection's current model (items already there are skipped; an
    id with new content replaces its old version). Resumable: re-run after a crash."""
    if (data is None) == (texts is None):
        fail("give exactly one of --data or --texts")
    client = _client(name)

    def warn(todo):  # only about the captions embedded now
        text_items = [it for it in todo if it.modality == "text"]
        warn_truncated(client.encoder(), [it.source["text"] for it in text_items], [f"item {it.id}" for it in text_items])

    t0 = time.time()
    with interrupt_report(client, name):  # Ctrl-C: what is committed, and that re-running resumes
        try:
            rep = client.add(folder=data, split=split, text_file=texts, langs=[x for x in langs.split(",") if x]
                             or None, skip_bad=skip_bad, wait=wait, chunk_size=chunk_size, progress=True,
                             before_embed=warn, build_indexes=True, log=console.print)
        except user_errors() as e:
            fail(skip_bad_hint(e))
    if as_json:
        return _echo(rep)
    twice = len(rep.ids) - len(set(rep.ids))  # the same content twice (two files of the same bytes): one item
    results.print(f"{len(rep.ids)} item(s) read" + (f" ({rep.uncaptioned} images without captions)"
                                                      if rep.uncaptioned else "")
                  + (f"; {twice} of them the same content as another (one item each, the first kept)"
                     if twice else ""))
    results.print(f"added {rep.added}" + (f" (of them {rep.replaced} replacing other content under their ids)"
                                          if rep.replaced else "") + f", already there {rep.unchanged}"
                  + (f", metadata updated {rep.metadata_updated}" if rep.metadata_updated else "")
                  + (f", vectors found stored (an interrupted run's or a deleted item's; not embedded again) "
                     f"{rep.recovered}" if rep.recovered else "")
                  + f" in {time.time() - t0:.1f}s")
    bad_lines = [p for p in rep.problems if not any(p.startswith(f"{k}: ") for k in rep.skipped_images)]
    report_skipped(rep.skipped, rep.skipped_images, bad_lines, root=data)
    st = client.status()
    results.print(f"collection {st['path']}: {st['items']['image']} images, {st['items']['text']} texts")


@collection_app.command("import")
def import_(
    name: str = _NAME,
    model: Optional[Path] = typer.Option(None, help="The model that made the vectors (a model directory, or "
                                                   "'minilm'): the collection's current model, checked on a sample "
                                                   "unless --trust-model (default: an existing collection's current "
                                                   "model; needed to create one)."),
    from_: str = typer.Option(..., "--from", help="What to import: clip-retrieval:DIR (its inference output), "
                                                  "npy:FILE.npy, npz:FILE.npz[:KEY] or faiss:FILE (with --table), or a "
                                                  "Milvus collection to adopt in place: milvus://HOST:PORT#NAME or "
                                                  "milvus-lite:PATH#NAME, in the Milvus that holds NAME's collection."),
    table: Optional[Path] = typer.Option(None, help="Parquet, JSONL or CSV table of the vectors' rows (ids, "
                                                    "sources, metadata), row for row."),
    id_column: Optional[str] = typer.Option(None, help="The table's id column (default: ids from content, as add "
                                                       "gives them, never a column not named here, even one called "
                                                       "'id': a warning says when one is left)."),
    metadata_columns: Optional[str] = typer.Option(None, help="The table's columns each item keeps in its metadata, "
                                                              "comma-separated (default: every other one); its "
                                                              "source (path / url, caption text) is kept too."),
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
    as_json: bool = _JSON,
) -> None:
    """Adopt vectors embedded elsewhere: nothing is embedded again but a small sample that checks
    they were made by MODEL. A Milvus collection is adopted in place: never copied, written to or
    dropped. Resumable: re-run after a crash."""
    client = _client(name)
    with interrupt_report(client, name):  # Ctrl-C: what is committed, and that re-running resumes
        try:
            if from_.startswith(("milvus://", "milvus-lite:")):
                missing = [o for o, v in (("--model", model), ("--vector-field", vector_field),
                                          ("--id-field", id_field), ("--modality", modality)) if not v]
                if missing:
                    fail(f"adopting a Milvus collection needs {', '.join(missing)}")
                rep = client.adopt(from_, model=model, vector_field=vector_field, id_field=id_field,
                                   source_field=source_field, modality=modality, images_root=images_root,
                                   trust_model=trust_model, samples=samples, backend=backend, progress=True,
                                   wait=wait)
            else:
                rep = client.import_(from_, table=table, id_column=id_column, source_column=source_column,
                                     modality=modality, images_root=images_root, model=model,
                                     trust_model=trust_model, lossy=lossy, samples=samples, backend=backend,
                                     progress=True, wait=wait,
                                     **({} if metadata_columns is None else
                                        {"metadata_columns": [c.strip() for c in metadata_columns.split(",")
                                                              if c.strip()]}))
            if as_json:
                return _echo(rep)
            print_import(client, from_, rep)
        except user_errors() as e:
            fail(e)


@collection_app.command("index")
def index(
    name: str = _NAME,
    as_json: bool = _JSON,
) -> None:
    """Build now the graph index of every auto space that lacks it (an import returns when its rows
    are in: they are searched exactly until then). Killed, it leaves the index it replaces; run it
    again. Over HTTP the server builds them in the background."""
    try:
        rep = _client(name).index(log=console.print, progress=True)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(rep)
    print_indexes(rep)


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
    calibrate_langs: str = typer.Option("en", help="Caption languages of --calibrate: those your queries come in "
                                                   "(unlike other commands' --langs, English unless named)."),
    fit_bridge: Optional[bool] = typer.Option(None, "--fit-bridge/--no-fit-bridge",
                                              help="Fit bridges from the backfill's own pairs: it starts with a "
                                                   "sample of each modality (default: when no --bridge is given). "
                                                   "Off with no --bridge, the old-model route serves and the "
                                                   "merge's score maps are still fitted from the pairs."),
    queries: Optional[Path] = typer.Option(None, help="Example search texts, no labels (one a line, or JSONL "
                                                      "{\"text\"}; at most 2,000 of 300 characters): the fitted "
                                                      "bridges for text queries are scored on them, the only text "
                                                      "queries of a collection of images alone."),
    fit_sample: Optional[str] = typer.Option(None, help="The first sample of each modality when bridges are "
                                                        "fitted: FRACTION, or FRACTION,MIN or FRACTION,MIN,MAX "
                                                        "(default 0.01,512,20000)."),
    as_json: bool = _JSON,
) -> None:
    """Make MODEL the current model at once: new items and queries use it, items of older spaces are
    reached through the best route. Re-embeds nothing (see `collection backfill`)."""
    if calibrate_limit is not None and calibrate_limit < 1:
        fail(f"--calibrate-limit must be >= 1, got {calibrate_limit} (leave it out to use all the data)")
    client = _client(name)
    t0 = time.time()
    try:
        from ..collection.ingest import text_file_items

        texts = [it.source["text"] for it in text_file_items(queries)] if queries is not None else []
        with interrupt_report(client, name, "upgrade"):
            rep = client.upgrade(model, bridges=bridge or [], calibrate=calibrate, calibrate_split=calibrate_split,
                                 calibrate_limit=calibrate_limit, calibrate_langs=calibrate_langs,
                                 log=console.print, fit_bridges=fit_bridge, queries=texts,
                                 fit_sample=parse_fit_sample(fit_sample))
        st = client.status()
    except user_errors() as e:
        given = [flag for flag, value in (("--bridge", bridge), ("--calibrate", calibrate), ("--queries", queries),
                                          ("--fit-sample", fit_sample), ("--fit-bridge", fit_bridge)) if value]
        if not upgraded_already(name, model, e, given):  # (a rerun after an upgrade that committed: nothing to do)
            fail(e)
        return
    if as_json:
        return _echo(rep)
    print_upgrade(name, rep, st, time.time() - t0, calibrated=bool(calibrate), bridged=bool(bridge))


@collection_app.command("search")
def search(
    name: str = _NAME,
    text: Optional[str] = typer.Option(None, help="Text query."),
    image: Optional[Path] = typer.Option(None, help="Image query."),
    k: int = typer.Option(10, "--k", "-k", help="Number of results."),
    target: Optional[str] = typer.Option(None, help="What to return: image | text (default: images for a text "
                                                    "query and captions for an image query, when there are any)."),
    filter: Optional[List[str]] = typer.Option(None, "--filter", help="Metadata filter key=value (dotted keys for "
                                               "nested fields, JSON values; repeat to AND)."),
    merge: Optional[str] = typer.Option(None, help="Override the plan's merge: raw | calibrated | rank."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Search every space of the collection (each through its route) and print one merged list."""
    if (text is None) == (image is None):
        fail("give exactly one of --text or --image")
    from ..gallery.gallery import Gallery

    # one search, then exit: a background graph build would only compete with it (add builds it)
    background, Gallery.build_in_background = Gallery.build_in_background, False
    try:
        client = _client(name)
        r = client.search(text=text, image=image, k=k, target=target, filter=parse_filter(filter), merge=merge)
        names = {} if as_json else {sid: s.get("name") or "" for sid, s in client.status()["spaces"].items()}
    except user_errors() as e:
        fail(e)
    finally:
        Gallery.build_in_background = background
    print_hits(r, as_json, k, names)


@collection_app.command("status")
def status(
    name: str = _NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Spaces with their item counts, the current model, and the route to every older space."""
    try:
        st = _client(name).status()
    except user_errors() as e:
        fail(e)
    if as_json:
        emit_json(st, True)
        return
    results.print(f"collection {st['path']}: {st['items']['image']} images, {st['items']['text']} texts "
              f"(generation {st['generation']}, catalog in {st.get('catalog', 'the server')})")
    print_spaces(st["spaces"])
    print_routes(st["routes"])
    fitted_routes = any("fitted" in (r.get("calibration") or {}) for ds in st["routes"].values() for r in ds.values())
    if not st["routes"]:  # one space (never upgraded, or the older ones retired): nothing to route or merge
        results.print("  one space: every search is answered in it (no routes to older spaces, no merge)")
    else:
        if st["calibrated"]:
            basis = ""
        elif st.get("merge_without_labels"):
            basis = " (score maps fitted without labels, on the queries both models answer alike); routes " + \
                    ("chosen without labels" if fitted_routes else "uncalibrated (bridge fits off)"
                     if (st.get("fitted_bridges") or {}).get("maps_only") else "uncalibrated (no bridge fitted yet)")
        else:
            basis = " (uncalibrated default); routes " + ("chosen without labels (no labels calibrated them)"
                                                         if fitted_routes else "uncalibrated")
        results.print(f"  merge: {st['merge']}{basis}")
    print_fitted(st.get("fitted_bridges"), st["spaces"])
    print_backfill(st["backfill"])


@collection_app.command("delete")
def delete(
    name: str = _NAME,
    ids: List[str] = typer.Option(..., "--id", help="Item id to delete (repeat for several)."),
    as_json: bool = _JSON,
) -> None:
    """Delete items: they are never returned again (all or nothing: an unknown id changes nothing)."""
    try:
        n = _client(name).delete(*ids)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo({"deleted": n})
    results.print(f"deleted {n} item(s) from {name}")


@collection_app.command("get")
def get(
    name: str = _NAME,
    item_id: str = typer.Option(..., "--id", help="The item's id."),
    as_json: bool = _JSON,
) -> None:
    """One item: its modality, metadata and the space whose vector serves it."""
    try:
        item = _client(name).get(item_id)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(item)
    results.print(f"{item.id}: {item.modality}, served by space {item.space}")
    for k, v in item.metadata.items():
        results.print(f"  {k}: {json.dumps(v, ensure_ascii=False)}")


@collection_app.command("route")
def route(
    name: str = _NAME,
    space: str = typer.Option(..., help="An older space: its id, or its name where no other space has it (see "
                                        "`collection status`)."),
    direction: str = typer.Option(..., help="t2i | i2t | t2t | i2i."),
    use: Optional[str] = typer.Option(None, "--route", help="Pin this route: old-model | bridge | fused."),
    w: Optional[float] = typer.Option(None, help="Weight of the bridge score for a fused route, in [0, 1] (default: the "
                                                 "calibrated weight, else 0.5)."),
    unpin: bool = typer.Option(False, help="Remove the pin (the calibrated or default route applies)."),
    as_json: bool = _JSON,
) -> None:
    """Pin the route to one older space for one direction (or unpin it)."""
    if (use is None) == (not unpin):
        fail("give --route ROUTE or --unpin" + (", not both" if unpin else ""))
    try:
        routes = _client(name).route(space, direction, None if unpin else use, w=w)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(routes)
    print_routes(routes)


@collection_app.command("calibrate")
def calibrate(
    name: str = _NAME,
    data: Path = typer.Option(..., help="Labelled data: a data folder / world root, or a Multi30K root."),
    split: str = typer.Option("val", help="Split of --data (never the one you evaluate on)."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N images / caption pairs."),
    langs: str = typer.Option("en", help="Caption languages of the calibration queries: those your queries come "
                                         "in (unlike other commands' --langs, English unless named)."),
    as_json: bool = _JSON,
) -> None:
    """Choose routes, fused weights and the merge of the current plan on labelled data (pinned
    routes stay; their numbers are refreshed)."""
    try:
        res = _client(name).calibrate(data, split=split, limit=limit, langs=langs)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(res)
    print_routes(res["routes"])
    results.print(f"  merge: {res['merge']} (chosen on the calibration split)")


@collection_app.command("backfill")
def backfill(
    name: str = _NAME,
    order: str = typer.Option("uncertainty", help="sequential | random | uncertainty (FastFill-style: the items "
                                                  "predicted worst served first)."),
    workers: int = typer.Option(1, help="Worker processes (disjoint shards, leases in the collection)."),
    shards: Optional[int] = typer.Option(None, help="A new job's shards (default: --workers): at most this many "
                                                    "workers share it, on this machine or others (each runs this "
                                                    "command); a worker with no free shard stops."),
    limit: Optional[int] = typer.Option(None, help="Stop after this many items (resume later)."),
    rate: Optional[float] = typer.Option(None, help="Items per second, all workers together."),
    batch_size: int = typer.Option(64, help="Items embedded and committed together."),
    pause: bool = typer.Option(False, help="Pause the running backfill (workers stop after their batch)."),
    resume: bool = typer.Option(False, help="Resume a paused backfill (then run workers). A paused backfill holds "
                                            "until this: without --resume the command refuses to run it."),
    cancel: bool = typer.Option(False, help="Forget the backfill job (what was committed stays)."),
    engine: str = typer.Option("local", help="Who embeds: local (worker processes here) or ray (a Ray Data "
                                             "pipeline; pip install 'nobackfill[ray]')."),
    address: Optional[str] = typer.Option(None, help="Ray: the cluster (auto: the one `ray start` runs; default: "
                                                     "a Ray started for this run on this machine)."),
    actors: Optional[int] = typer.Option(None, help="Ray: embedding actors (default 2)."),
    gpus_per_actor: float = typer.Option(0.0, help="Ray: GPUs per embedding actor (0: CPU)."),
    as_json: bool = _JSON,
) -> None:
    """Re-embed the items of older spaces into the current model's space, in the chosen order, while
    the collection keeps serving queries. Resumable; search sees each committed batch at once. On a
    server's URL the server's own worker does the work and this command follows it (--workers,
    --shards, --limit and --batch-size are taken where the collection is stored)."""
    from ..progress import progress_bar

    if sum([pause, resume, cancel]) > 1:
        fail("give at most one of --pause, --resume, --cancel")
    if engine == "local" and (address or actors is not None or gpus_per_actor):
        fail("--address, --actors and --gpus-per-actor are for --engine ray")
    if name.startswith(("http://", "https://")) and (limit is not None or workers != 1 or shards is not None
                                                       or batch_size != 64):
        fail("over HTTP the server's own worker does the backfill: --limit, --workers, --shards and --batch-size "
             "are taken where the collection is stored")
    client = _client(name)
    try:
        if pause or cancel:
            st = client.backfill_pause() if pause else client.backfill_cancel()
            if as_json:
                return _echo(st)
            results.print(f"backfill of {name} is {st['state']}" if pause else f"backfill job of {name} removed")
            return
        st0 = client.backfill_status()
        if st0["state"] == "paused" and not resume:
            fail(f"the backfill of {name} is paused ({st0['done']}/{st0['total']} done): resume it with "
                 f"`nobackfill collection backfill {name} --resume`")
        if st0["state"] not in ("none", "done") and st0.get("order") not in (None, order):
            console.print(f"the backfill goes on in the order it started with ({st0['order']}); --order {order} is "
                          "for a new job (--cancel, then run again)")
        todo = st0["total"] - st0["done"] if limit is None else min(limit, st0["total"] - st0["done"])
        extra = {"engine": engine, "ray_address": address, "actors": actors, "gpus_per_actor": gpus_per_actor} \
            if engine != "local" or address or actors or gpus_per_actor else {}
        extra.update({"shards": shards} if shards is not None else {})
        with interrupt_report(client, name, "backfill"), \
                progress_bar(True, f"backfilling ({order}, {engine})", todo, unit="items") as advance:
            say = getattr(advance, "say", None)  # (on a terminal: lines above the bar, whichever thread says them)
            st = client.backfill_start(order, rate, wait=True, resume=resume, limit=limit, workers=workers,
                                       batch_size=batch_size, progress=advance,
                                       log=(lambda m: say(redact(m))) if say else console.print, **extra)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(st)
    print_backfill_run(name, st, limit)


@collection_app.command("retire")
def retire(
    name: str = _NAME,
    space: str = typer.Option(..., help="The old space to drop: its id, or its name (see `collection status`)."),
    drop_unsourced: bool = typer.Option(False, help="Delete the items it serves that have no source (imported "
                                                    "without one: they cannot be backfilled) with it."),
    as_json: bool = _JSON,
) -> None:
    """Drop an old space's vectors once every item has a vector in the current space."""
    try:
        res = _client(name).retire(space, drop_unsourced=drop_unsourced)
    except user_errors() as e:
        fail(e)
    if as_json:
        return _echo(res)
    dropped = res["dropped_unsourced"]
    gone = "" if res.get("already") else retired_words(_client(name).status()["spaces"].get(res["retired"], {}))
    results.print(f"space {space} of {name} was retired already; nothing to do" if res.get("already") else
                  f"space {space} of {name} retired; {gone}"
                  + (f"; {dropped} item(s) without a source were deleted with it" if dropped else ""))
