"""The main job (``nobackfill demo``): show the backfill problem on the world test split.

Indexes the test split with the OLD model into a model-versioned gallery, then scores
old/old, new/new and the raw new-query/old-gallery comparison (near chance: the reason to
upgrade without backfilling). Later capabilities append rows via :data:`DEMO_ROWS`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .data.folder import PairDataset
from .encoders import load_encoder
from .encoders.base import DualEncoder
from .evaluate import Embedded, cross_retrieval, embed_dataset, load_eval_data
from .index import Gallery
from .index.ingest import index_pairs, pair_ids
from .report import recall_bar_plot, recall_table_rows, text_table, html_table, write_html

DEMO_WORLD = dict(n_train=5000, n_val=1000, n_test=1000)


@dataclass
class DemoContext:
    """What every demo row can use."""

    data: PairDataset
    old: DualEncoder
    new: DualEncoder
    gallery: Gallery
    old_queries: Embedded
    new_queries: Embedded
    gallery_vectors: Embedded
    models_dir: Path
    extras: dict = field(default_factory=dict)


def _old_old(ctx: DemoContext) -> dict:
    return cross_retrieval(ctx.old_queries, ctx.gallery_vectors, ctx.data.caption_image)


def _new_new(ctx: DemoContext) -> dict:
    return cross_retrieval(ctx.new_queries, ctx.new_queries, ctx.data.caption_image)


def _new_old_raw(ctx: DemoContext) -> dict:
    return cross_retrieval(ctx.new_queries, ctx.gallery_vectors, ctx.data.caption_image)


#: where the demo finds the shipped XBT upgrade (relative to the models folder's parent)
XBT_UPGRADE = Path("upgrades") / "world-old-to-new"


def _xbt(ctx: DemoContext) -> dict:
    """New-model queries through the shipped XBT upgrade (seed 000) against the OLD gallery: the
    gallery accepts them (same space id) and nothing is re-embedded."""
    from .compat.upgrade import load_upgrade
    from .index.store import SpaceMismatchError

    up_dir = ctx.models_dir.parent / XBT_UPGRADE
    upgrade = load_upgrade(up_dir)  # FileNotFoundError -> row skipped
    new = load_encoder(ctx.models_dir / "world-new")  # a fresh copy: apply() attaches adapters in place
    if upgrade.target_id != ctx.gallery.space_id:
        raise FileNotFoundError(f"{up_dir} targets space {upgrade.target_id}, not this gallery's "
                                f"{ctx.gallery.space_id}; re-run the command in its upgrade.json recipe")
    try:
        up = upgrade.apply(new)
    except SpaceMismatchError as e:  # the shipped upgrade belongs to another world-new
        raise FileNotFoundError(f"{up_dir}: {e}; re-run the command in its upgrade.json recipe") from None
    q = embed_dataset(up, ctx.data)
    ctx.gallery.search("image", q.texts[:1], k=1, space_id=up.space_id)  # refused unless compatible
    with up.switched(False):
        off = embed_dataset(up, ctx.data)
    ctx.extras["xbt_onoff_max_abs_diff"] = float(max(np.abs(off.images - ctx.new_queries.images).max(),
                                                     np.abs(off.texts - ctx.new_queries.texts).max()))
    return cross_retrieval(q, ctx.gallery_vectors, ctx.data.caption_image)


_READING_GUIDE = """<p>A gallery of the world's test images and captions was embedded once, with the
<b>old</b> model (world-old). Each row searches it with queries from one model; <b>t2i</b> is text to
image (a caption finds its image), <b>i2t</b> image to text (an image finds one of its captions).
R@K is the share of queries whose right answer is in the top K: <b>higher is better</b>.</p>
<ul><li><b>old/old</b>: old queries against the old gallery, what users have today.</li>
<li><b>new/new</b>: the better model on a gallery re-embedded with it: what a full backfill would give.</li>
<li><b>raw new/old</b>: new-model queries against the old gallery as they are: incompatible spaces, near
chance. This is why an upgrade normally forces a backfill.</li>
<li><b>XBT new/old</b>: new-model queries through the shipped XBT upgrade (a small projection and adapters
trained without the old images, seed paper Eq. 3-5) against the <i>same</i> old gallery: nothing was
re-embedded.</li></ul>
<p>The live-upgrade plot below shows a collection upgraded to world-new while it keeps serving, and how
R@1 rises as the backfill re-embeds more of it (never below old/old).</p>"""

#: (json key, table label, function) — later issues append rows here
DEMO_ROWS: list[tuple[str, str, Callable[[DemoContext], dict]]] = [
    ("old_old", "old/old", _old_old),
    ("new_new", "new/new", _new_new),
    ("new_old_raw", "raw new/old", _new_old_raw),
    ("xbt", "XBT new/old", _xbt),
]

#: the plot shows these rows first, in this order (old/old, raw, XBT, new/new side by side)
PLOT_ORDER = ["old_old", "new_old_raw", "xbt", "new_new"]


def _gallery_in_data_order(gallery: Gallery, data: PairDataset, space_id: str) -> Embedded:
    img_ids, cap_ids = pair_ids(data)
    pos_img = {i: k for k, i in enumerate(gallery.ids("image"))}
    pos_txt = {i: k for k, i in enumerate(gallery.ids("text"))}
    img = gallery.vectors("image")[[pos_img[i] for i in img_ids]]
    txt = gallery.vectors("text")[[pos_txt[t] for t in cap_ids]]
    return Embedded(space_id, np.asarray(img), np.asarray(txt))


def live_upgrade(world: Path, models_dir: Path, out: Path, limit: int | None,
                 log: Callable[[str], None]) -> dict | None:
    """The system end to end on the test split: a collection embedded by world-old is upgraded to
    world-new (the shipped XBT upgrade; routes calibrated on 300 val images) and backfilled in the
    default order, every merge measured at 0, 10, 30, 60 and 100 %
    (:func:`nobackfill.lifecycle.backfill_curve.measure_backfill`, what ``bench backfill`` runs, small)."""
    from .lifecycle.backfill_curve import BackfillCurveConfig, measure_backfill

    upgrade = models_dir.parent / XBT_UPGRADE
    if not (upgrade / "upgrade.json").is_file():
        log(f"skipping the live upgrade: {upgrade} is not there")
        return None
    if not (world / "val" / "captions.jsonl").is_file():
        log(f"skipping the live upgrade: {world / 'val'} is not there (its routes are calibrated on val, never on test)")
        return None
    log("live upgrade: a world-old collection upgraded to world-new and backfilled while it serves ...")
    cfg = BackfillCurveConfig(old_model=models_dir / "world-old", new_model=models_dir / "world-new", upgrade=upgrade,
                              data=world, work=out / "live", test_images=limit, calib_images=300,
                              orders=("uncertainty",), fractions=(0.0, 0.1, 0.3, 0.6, 1.0))
    return measure_backfill(cfg, log=log)


def run_demo(world: str | Path = "data/world", models_dir: str | Path = "models", out: str | Path = "runs/demo",
             progress: bool = True, log: Callable[[str], None] = print, limit: int | None = None) -> dict:
    """Run the demo; ``limit`` keeps only the first N test images (quick checks)."""
    world, models_dir, out = Path(world), Path(models_dir), Path(out)
    t0 = time.time()
    if not (world / "test" / "captions.jsonl").is_file():
        from .data.world import WorldSpec, generate_world

        log(f"generating the world in {world} ...")
        generate_world(world, WorldSpec(**DEMO_WORLD), progress=progress)
    data = load_eval_data(world, "test", langs=["en"], limit=limit)
    log(f"loading world-old and world-new from {models_dir} ...")
    old = load_encoder(models_dir / "world-old")
    new = load_encoder(models_dir / "world-new")
    log(f"indexing {len(data)} test images + {len(data.captions)} captions with the old model ...")
    gallery = index_pairs(old, data, out / "gallery-old", model_ref=str(models_dir / "world-old"), progress=progress)
    log("embedding the queries with both models ...")
    ctx = DemoContext(
        data=data, old=old, new=new, gallery=gallery,
        old_queries=embed_dataset(old, data, progress=progress),
        new_queries=embed_dataset(new, data, progress=progress),
        gallery_vectors=_gallery_in_data_order(gallery, data, gallery.space_id),
        models_dir=models_dir,
    )
    rows = {}
    labels = {}
    for key, label, fn in DEMO_ROWS:
        log(f"row {label} ...")
        try:
            rows[key] = fn(ctx)
            labels[key] = label
        except FileNotFoundError as e:  # a row whose artefact is not shipped yet
            log(f"skipping row {label}: {e}")
    result = {k: {d: {m: v for m, v in r[d].items()} for d in ("t2i", "i2t")} for k, r in rows.items()}
    result.update({"n_images": len(data), "n_captions": len(data.captions),
                   "spaces": {"old": old.space_id, "new": new.space_id, "gallery": gallery.space_id},
                   "seconds": round(time.time() - t0, 1), **ctx.extras})
    header, body = recall_table_rows({labels[k]: rows[k] for k in rows})
    table = text_table(header, body)
    log(table)
    order = [k for k in PLOT_ORDER if k in rows] + [k for k in rows if k not in PLOT_ORDER]
    fig = recall_bar_plot({labels[k]: rows[k] for k in order}, f"world test split: {len(data)} images, {len(data.captions)} captions")
    figures, sections = [fig], [("How to read this", _READING_GUIDE),
                                ("Retrieval (recall in %, higher is better)", html_table(header, body))]
    live = live_upgrade(world, models_dir, out, limit, log)
    if live is not None:
        from .lifecycle.backfill_curve import curves_markdown, plot_curves

        result["live_upgrade"] = {k: live[k] for k in ("old_old", "new_new", "default", "routes")}
        result["live_upgrade"]["curve"] = live["curves"][live["default"]]
        figures.append(plot_curves(live))
        sections.append(("Live upgrade: R@1 while the collection is backfilled", f"<pre>{curves_markdown(live)}</pre>"))
    sections.append(("Details", "<details><summary>every number above, as JSON (also in report.json)</summary>"
                                f"<pre>{json.dumps(result, indent=2)}</pre></details>"))
    write_html(out / "report.html", "nobackfill demo: upgrading without a backfill", sections, figures)
    log(f"report: {out / 'report.html'}")
    return result
