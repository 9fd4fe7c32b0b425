"""The main job (``nobackfill demo``): show the backfill problem on the world test split.

Indexes the test split with the OLD model into a model-versioned gallery, then scores old/old,
new/new, the raw new-query/old-gallery comparison (near chance: the reason to upgrade without
backfilling) and new-model queries through the shipped XBT upgrade, all from the one compatibility
report; then a collection upgraded live and backfilled while it serves, with the XBT bridge and
with no bridge (bridges fitted from the backfill itself as it advances).
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .data.folder import PairDataset
from .encoders import load_encoder
from .encoders.base import DualEncoder
from .evaluate import load_eval_data
from .gallery import Gallery
from .collection.ingest import index_pairs
from .report import figure_html, html_table, markdown_html, recall_bar_plot, recall_table_rows, text_table, write_html

DEMO_WORLD = dict(n_train=5000, n_val=1000, n_test=1000)


#: where the demo finds the shipped XBT upgrade (relative to the models folder's parent)
XBT_UPGRADE = Path("upgrades") / "world-old-to-new"


def compat_rows(old: DualEncoder, new: DualEncoder, data: PairDataset, gallery: Gallery, models_dir: Path,
                log: Callable[[str], None]) -> tuple[dict, dict]:
    """The demo's rows from the one compatibility report (:func:`~nobackfill.search.compat_report.compat_report`):
    old/old, new/new, raw new/old and, where the shipped XBT upgrade (XBT, Jang & Lim, Eq. 3-5) fits
    these models, new-model queries through it against the old gallery, which accepts them (same
    space id) with nothing re-embedded. Returns (rows, extras)."""
    from .compat.upgrade import load_upgrade
    from .search.compat_report import compat_report

    up_dir = models_dir.parent / XBT_UPGRADE
    bridges: list[Path] = []
    try:
        upgrade = load_upgrade(up_dir)
        if upgrade.target_id != gallery.space_id or upgrade.source_id != new.space_id:
            raise FileNotFoundError(f"{up_dir} takes space {upgrade.source_id} to {upgrade.target_id}, not this "
                                    f"demo's {new.space_id} to {gallery.space_id}; re-run the command in its "
                                    "upgrade.json recipe")
        bridges = [up_dir]
    except FileNotFoundError as e:  # the row is skipped, the others stand
        log(f"skipping row XBT new/old: {e}")
    rep = compat_report(old, new, data, bridges=bridges)
    rows = {k: rep["rows"][k] for k in ("old_old", "new_new", "new_old_raw")}
    if not bridges:
        return rows, {}
    from .search.searcher import query_side_for

    side = query_side_for(new, gallery.space_id, bridges=bridges)
    gallery.search("image", side.embed("text", data.captions[:1]), k=1, space_id=side.space_id)  # refused unless compatible
    rows["xbt"] = rep["rows"]["upgraded_new_old"]
    return rows, {"xbt_onoff_max_abs_diff": rep["onoff_max_abs_diff"], "xbt_gap_closure": rep["gap_closure"]}


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
re-embedded.</li>
<li><b>fitted bridge (N pairs)</b>: new-model queries through bridges fitted on the (new, old) vectors of
the first N backfilled scenes (images and their captions) of a collection of train items, chosen per
direction without labels: no paired corpus, no training run.</li></ul>
<p>The live-upgrade plot below shows a collection upgraded to world-new while it keeps serving, and how
R@1 rises as the backfill re-embeds more of it (never below old/old). The last plot shows the same
upgrade with no bridge at all: the backfill starts with a sample, bridges are fitted on its pairs and
refitted as the pairs double, and the served R@1 follows the pairs (the numbers on the points).</p>"""

#: scenes (an image and its captions) of the train split the demo's fitted bridge is fitted on
FITTED_SCENES = 512

#: the rows' labels, in the table's order
LABELS = {"old_old": "old/old", "new_new": "new/new", "new_old_raw": "raw new/old", "xbt": "XBT new/old"}

#: the plot shows these rows first, in this order (old/old, raw, XBT, new/new side by side)
PLOT_ORDER = ["old_old", "new_old_raw", "xbt", "fitted", "new_new"]


def live_upgrade(world: Path, models_dir: Path, out: Path, limit: int | None,
                 log: Callable[[str], None]) -> dict | None:
    """The system end to end on the test split: a collection embedded by world-old is upgraded to
    world-new (the shipped XBT upgrade; routes calibrated on 300 val images) and backfilled in the
    default order, every merge measured at 0, 10, 30, 60 and 100 %
    (:func:`nobackfill.lifecycle.measuring.backfill_curve.measure_backfill`, what ``bench backfill`` runs, small)."""
    from .lifecycle.measuring.backfill_curve import BackfillCurveConfig, measure_backfill

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


#: the live upgrade without a bridge: the fractions backfilled at which the served R@1 is measured,
#: and the fit (a sample of 2 % of each modality, at least 64; three families, short MLP runs: seconds)
FIT_FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0)
FIT_SAMPLE = {"fraction": 0.02, "min_pairs": 64, "max_pairs": 2000,
              "fit": {"families": ("orthogonal", "ridge", "mlp-plain"), "max_steps": 400}}


def live_fitted(world: Path, models_dir: Path, out: Path, limit: int | None,
                log: Callable[[str], None]) -> dict | None:
    """The live upgrade with no bridge at all: a collection of the test split embedded by world-old
    is upgraded to world-new with nothing but the model (``collection upgrade --model``), and the
    backfill (default order) starts with a sample of each modality, fits bridges on its (new, old)
    pairs and refits at each doubling (:mod:`nobackfill.lifecycle.backfill_fit`). At each fraction:
    the R@1 served (routes as the plan chose them, without labels), the pairs backfilled, and per
    direction the bridge in service and the route."""
    from .collection.collection import Collection
    from .evaluate import resolve_data
    from .lifecycle.backfill import backfill_status, run_worker, start_backfill
    from .lifecycle.measuring.backfill_curve import DEFAULT_ORDER
    from .lifecycle.backfill_fit import backfilled_count
    from .lifecycle.fit_bridges import fitted_status
    from .lifecycle.measuring.measure import embedded_collection, split_queries
    from .lifecycle.plan_changes import route_table, upgrade_collection
    from .search import ModelPool, Searcher
    from .search.models import model_ref

    if not (world / "test" / "captions.jsonl").is_file():
        log(f"skipping the live upgrade without a bridge: {world / 'test'} is not there")
        return None
    log("live upgrade without a bridge: world-old -> world-new, bridges fitted from the backfill itself ...")
    pool = ModelPool()
    ev = split_queries(resolve_data(world, "test"), limit)
    old_ref, new_ref = model_ref(models_dir / "world-old"), model_ref(models_dir / "world-new")
    c = embedded_collection(out / "live-fitted", pool, old_ref, ev.items, log)
    old_sid = c.current_space
    upgrade_collection(c, new_ref, pool=pool, fit_bridges=True, fit_sample=FIT_SAMPLE)
    new = pool.get(new_ref)
    start_backfill(c, new, order=DEFAULT_ORDER, pool=pool)
    total = backfill_status(c)["total"]
    steps = []
    for f in FIT_FRACTIONS:
        have, want = backfill_status(c)["done"], int(round(f * total))
        if want > have:
            run_worker(c, new, limit=want - have)  # fits inside, as the pairs cross each threshold
        c = Collection.open(c.path)
        r = ev.measure(Searcher(c, pool=pool))
        table = route_table(c.plan).get(old_sid, {})
        bridges = {b["direction"]: f"{b['candidate']} on {b['pairs']} pairs (v{b['version']})"
                   for b in fitted_status(c.plan) if b["space"] == old_sid}
        step = {"fraction": round(backfill_status(c)["fraction"], 4), "pairs": backfilled_count(c, c.current_space),
                **{d: float(np.mean(r[d] == 1)) for d in ("t2i", "i2t")},
                "routes": {d: table[d]["route"] + (f" w={table[d]['w']}" if table[d].get("w") is not None else "")
                           for d in ("t2i", "i2t") if d in table},
                "bridges": bridges}
        steps.append(step)
        log(f"  {100 * step['fraction']:.0f}% backfilled ({step['pairs']} pairs): R@1 t2i {step['t2i']:.3f} "
            f"i2t {step['i2t']:.3f}; routes {step['routes']}; bridges {bridges or 'none yet'}")
    return {"steps": steps, "sample": FIT_SAMPLE, "items": total}


def plot_live_fitted(live_fit: dict, live: dict | None = None):
    """Served R@1 against the fraction backfilled (pairs on the points): the upgrade without a
    bridge, and (``live``) the default curve of the upgrade with the shipped XBT bridge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .lifecycle.measuring.backfill_curve import finish_r1_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    steps = live_fit["steps"]
    for ax, d in zip(axes, ("t2i", "i2t")):
        xs = [100 * s["fraction"] for s in steps]
        ax.plot(xs, [100 * s[d] for s in steps], "-o", color="tab:green", lw=2, label="no bridge: fitted as it goes")
        for x, s in zip(xs, steps):
            ax.annotate(str(s["pairs"]), (x, 100 * s[d]), fontsize=7, textcoords="offset points", xytext=(2, -10))
        if live is not None:
            cur = live["curves"][live["default"]][d]
            ax.plot([100 * p["fraction"] for p in cur], [100 * p["R@1"] for p in cur], "--o", ms=3, color="tab:red",
                    label=f"XBT bridge ({live['default']})")
    return finish_r1_figure(fig, axes, {d: (steps[0][d], steps[-1][d]) for d in ("t2i", "i2t")},
                            "{d}: R@1 served while backfilling (pairs on the points)", "% of the collection backfilled",
                            ("old/old (0 %)", "new/new (100 %)"), ncol=4)


def live_fitted_markdown(live_fit: dict) -> str:
    """One row per step: fraction, pairs, R@1 per direction, the route and the bridge in service."""
    lines = ["| backfilled | pairs | t2i R@1 % | t2i route (bridge) | i2t R@1 % | i2t route (bridge) |",
             "|---:|---:|---:|---|---:|---|"]
    for s in live_fit["steps"]:
        cells = [f"{100 * s['fraction']:.0f}%", str(s["pairs"])]
        for d in ("t2i", "i2t"):
            cells += [f"{100 * s[d]:.1f}", f"{s['routes'].get(d, '-')} ({s['bridges'].get(d, 'no bridge yet')})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def row_labels(result: dict) -> dict[str, str]:
    """The table's name of each row of ``result``: :data:`LABELS`, and the fitted bridge's with its pairs."""
    labels = {k: v for k, v in LABELS.items() if k in result}
    if "fitted" in result:
        labels["fitted"] = f"fitted bridge ({result.get('fitted_bridge', {}).get('scenes', '?')} pairs)"
    return labels


def write_report(path: Path, result: dict, live: dict | None = None, live_fit: dict | None = None) -> Path:
    """The demo's page: how to read it, the retrieval table and plot of ``result``'s rows, the live
    upgrade's curves and tables (``live``: what :func:`live_upgrade` measured) and every number as
    JSON. Tables are HTML tables and plots scale to the window (:func:`nobackfill.report.write_html`)."""
    labels = row_labels(result)
    header, body = recall_table_rows({labels[k]: result[k] for k in labels})
    order = [k for k in PLOT_ORDER if k in labels]
    title = f"world test split: {result['n_images']} images, {result['n_captions']} captions"
    bars = figure_html(recall_bar_plot({labels[k]: result[k] for k in order}, title))
    sections = [("How to read this", _READING_GUIDE),
                ("Retrieval (recall in %, higher is better)", bars + html_table(header, body))]
    if live is not None:
        from .lifecycle.measuring.backfill_curve import curves_markdown, plot_curves

        sections.append(("Live upgrade: R@1 while the collection is backfilled",
                         figure_html(plot_curves(live)) + markdown_html(curves_markdown(live))))
    if live_fit is not None:
        sections.append(("Live upgrade without a bridge: R@1 served as the fitted bridges' pairs grow",
                         figure_html(plot_live_fitted(live_fit, live)) + markdown_html(live_fitted_markdown(live_fit))))
    sections.append(("Details", "<details><summary>every number above, as JSON (also in report.json)</summary>"
                                f"<pre>{html.escape(json.dumps(result, indent=2))}</pre></details>"))
    return write_html(path, "nobackfill demo: upgrading without a backfill", sections)


def run_demo(world: str | Path = "data/world", models_dir: str | Path = "models", out: str | Path = "runs/demo",
             progress: bool = True, log: Callable[[str], None] = print, limit: int | None = None,
             show: Callable[[str], None] | None = None) -> dict:
    """Run the demo; ``limit`` keeps only the first N test images (quick checks). ``log`` hears its
    progress, ``show`` (default ``log``) its results: the table, the R@1 served along the live
    upgrades, where the report is (the command prints them on stdout, the progress on stderr)."""
    show = show or log
    world, models_dir, out = Path(world), Path(models_dir), Path(out)
    t0 = time.time()
    for name in ("world-old", "world-new"):  # before a world is written (trial X: 150 MB, then this error)
        if not (models_dir / name / "config.json").is_file():
            raise FileNotFoundError(f"{models_dir / name}: no model there (the demo runs the shipped world-old and "
                                    "world-new: --models names the folder holding them)")
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
    log("scoring old/old, new/new, raw new/old and XBT new/old (one compatibility report) ...")
    rows, extras = compat_rows(old, new, data, gallery, models_dir, log)
    try:  # bridges fitted from a backfill's first scenes, beside XBT
        log(f"fitting bridges on the first {FITTED_SCENES} train scenes, or as many as the split holds (no bridge, "
            "no training) ...")
        rows["fitted"], more = fitted_row(old, new, world, data, FITTED_SCENES, log)
        extras.update(more)
    except (FileNotFoundError, ValueError) as e:  # no train split, or too few scenes to fit on
        log(f"skipping row fitted bridge: {e}")
    result = {k: {d: {m: v for m, v in r[d].items()} for d in ("t2i", "i2t")} for k, r in rows.items()}
    result.update({"n_images": len(data), "n_captions": len(data.captions),
                   "spaces": {"old": old.space_id, "new": new.space_id, "gallery": gallery.space_id},
                   "seconds": round(time.time() - t0, 1), **extras})
    labels = row_labels(result)
    header, body = recall_table_rows({labels[k]: result[k] for k in labels})
    show(text_table(header, body))
    live = live_upgrade(world, models_dir, out, limit, log)
    if live is not None:
        result["live_upgrade"] = {k: live[k] for k in ("old_old", "new_new", "default", "routes")}
        result["live_upgrade"]["curve"] = live["curves"][live["default"]]
    live_fit = live_fitted(world, models_dir, out, limit, log)
    if live_fit is not None:
        result["live_upgrade_fitted"] = live_fit
    write_report(out / "report.html", result, live, live_fit)
    if show is not log:  # the curves again, where results go (the steps were progress)
        xbt = result.get("live_upgrade", {}).get("curve") or {}
        points = [(p["fraction"], p["R@1"], q["R@1"]) for p, q in zip(xbt.get("t2i", []), xbt.get("i2t", []))]
        for name, curve in (("with the XBT bridge", points),
                            ("without a bridge", [(p["fraction"], p["t2i"], p["i2t"])
                                                  for p in (live_fit or {}).get("steps", [])])):
            said = [f"{100 * f:.0f}% t2i {100 * t:.1f} i2t {100 * i:.1f}" for f, t, i in curve]
            said = [p for n, p in enumerate(said) if not n or p != said[n - 1]]  # (a first batch spans steps)
            if said:
                show(f"live upgrade {name}, R@1 served as the backfill advances: " + "; ".join(said))
    show(f"report: {out / 'report.html'}")
    return result


FITTED_DIRS = {"t2i": ("texts", "images"), "i2t": ("images", "texts")}


def fitted_row(old: DualEncoder, new: DualEncoder, world: Path, data: Any, n_scenes: int = 512,
               log: Callable[[str], None] = print) -> tuple[dict, dict]:
    """(row, details): R@1/5/10 per direction of the route chosen without labels (bridge, fused or
    old-model) through bridges fitted on ``n_scenes`` train images and their captions."""
    from .compat.fitted import choose_direction, fit_candidates, held_out_set, heldout_mask
    from .metrics.retrieval import best_relevant_ranks, recall_from_ranks

    train = load_eval_data(world, "train", langs=["en"], limit=n_scenes)
    paths = train.image_paths()
    pairs = {"images": (new.encode_images(paths), old.encode_images(paths)),
             "texts": (new.encode_texts(train.captions), old.encode_texts(train.captions))}
    scenes = {"images": range(len(train)), "texts": train.caption_image}  # an image and its captions held out together
    masks = {m: heldout_mask([f"scene-{int(i)}" for i in scenes[m]]) for m in pairs}
    mods = {"images": "image", "texts": "text"}
    cands = fit_candidates({mods[m]: (v[0][~masks[m]], v[1][~masks[m]]) for m, v in pairs.items()})
    all_pairs = {mods[m]: v for m, v in pairs.items()}
    test = {m: (getattr(new, f"encode_{m}")(x), getattr(old, f"encode_{m}")(x))
            for m, x in (("images", data.image_paths()), ("texts", data.captions))}
    c2i = np.asarray(data.caption_image)
    row, details = {}, {}
    for d, (qm, gm) in FITTED_DIRS.items():
        qi = np.flatnonzero(masks[qm])
        held = held_out_set(d, pairs[qm][0][qi], pairs[gm][0], pairs[gm][1], masks[gm], pairs[qm][1][qi])[0]
        ch = choose_direction(held, cands, pairs=all_pairs)
        q_new, q_old = test[qm]
        w = {"old-model": 0.0, "bridge": 1.0}.get(ch.route, ch.routes.get("w"))
        q = q_old if w == 0.0 else (1 - w) * q_old + w * ch.bridge(q_new)
        row[d] = recall_from_ranks(best_relevant_ranks(q, test[gm][1], c2i, d), (1, 5, 10))
        details[d] = {"chosen": ch.chosen, "members": ch.members, "route": ch.route, "w": ch.routes.get("w"),
                      "heldout": ch.heldout}
        log(f"  fitted bridge {d}: {ch.bridge.meta.get('candidate') if ch.bridge else ch.chosen} on "
            f"{ch.bridge.meta.get('pairs') if ch.bridge else 0} pairs -> "
            f"route {ch.route}, R@1 {row[d]['R@1']:.3f}")
    return row, {"fitted_bridge": {"scenes": len(train), "directions": details}}
