"""``nobackfill bench backfill``: accuracy against the fraction backfilled, for every order and merge.

World test split (English captions): a collection embedded by ``world-old`` is upgraded to
``world-new`` with the shipped XBT upgrade (routes and merge calibrated on val), then backfilled by
the real backfill job to 0, 5, 10, 20, 40, 60, 80 and 100 %, every merge measured at each step
(:mod:`nobackfill.lifecycle.measuring.backfill_curve`: R@1, negative flips, step time; per curve the AUC,
the no-regret check and the half-gap fraction).

Cost: seconds until the first improved query (registering the upgrade, no calibration, then one
search) and seconds for a full backfill at N items of the world's train split, measured at the
sizes of ``cost_sizes`` and extrapolated (flagged) from the measured throughput beyond.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .host import shipped_path
from ..collection.ingest import folder_items
from ..lifecycle.backfill import ORDERS, run_backfill
from ..lifecycle.measuring.backfill_curve import (DEFAULT_ORDER, FRACTIONS, BackfillCurveConfig, curves_markdown,
                                        measure_backfill, no_regret, plot_curves)
from ..lifecycle.measuring.measure import embedded_collection
from ..lifecycle.plan_changes import upgrade_collection
from ..search import MERGES, ModelPool, Searcher
from ..search.models import model_ref
from .runner import Report


@dataclass
class BackfillBenchConfig:
    models: Path = Path("models")
    world: Path = Path("data/world")
    upgrade: Path = Path("upgrades/world-old-to-new")
    work: Path = Path("runs/bench/backfill-work")
    test_images: int | None = None
    calib_images: int | None = None
    orders: tuple[str, ...] = ORDERS
    merges: tuple[str, ...] = MERGES
    fractions: tuple[float, ...] = FRACTIONS
    batch_size: int = 64
    seed: int = 0
    cost_sizes: tuple[int, ...] = (1000, 10000)
    extrapolate: tuple[int, ...] = (100000,)

    @classmethod
    def quick(cls, **kw: Any) -> "BackfillBenchConfig":
        """Calibration on 500 val images; cost measured at 1k and 10k items."""
        return cls(**{"calib_images": 500, **kw})

    def curve(self) -> BackfillCurveConfig:
        """The curves' part: world-old -> world-new of ``models`` on the world."""
        return BackfillCurveConfig(old_model=self.models / "world-old", new_model=self.models / "world-new",
                                   upgrade=shipped_path(self.upgrade), data=self.world, work=self.work,
                                   test_images=self.test_images, calib_images=self.calib_images, orders=self.orders,
                                   merges=self.merges, fractions=self.fractions, batch_size=self.batch_size,
                                   seed=self.seed)


def _cost(cfg: BackfillBenchConfig, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Upgrade and full-backfill seconds at N train items (images and captions, all languages)."""
    from ..evaluate import resolve_data

    train = folder_items(resolve_data(cfg.world, "train"), uncaptioned=False).items
    rows = []
    throughput = None
    for n in cfg.cost_sizes:
        if n > len(train):
            log(f"  cost: only {len(train)} train items, skipping N={n}")
            continue
        items = _take(train, n)
        pool = ModelPool()
        old_ref, new_ref = model_ref(cfg.models / "world-old"), model_ref(cfg.models / "world-new")
        c = embedded_collection(cfg.work / f"cost-{n}", pool, old_ref, items, log)
        fresh = ModelPool()  # the upgrade's own cost: load the new model, register, first query
        t0 = time.time()
        upgrade_collection(c, new_ref, bridges=[shipped_path(cfg.upgrade)], pool=fresh)
        Searcher(c, pool=fresh).search(text="a red circle", k=10)
        upgrade_s = time.time() - t0
        t0 = time.time()
        st = run_backfill(c, fresh.get(new_ref), order="sequential", workers=1, batch_size=cfg.batch_size)
        full_s = time.time() - t0
        throughput = st["done"] / full_s
        rows.append({"n": len(items), "upgrade_s": round(upgrade_s, 2), "full_backfill_s": round(full_s, 1),
                     "items_per_s": round(throughput, 1), "extrapolated": False})
        log(f"  cost N={len(items)}: upgrade + first query {upgrade_s:.1f}s, full backfill {full_s:.0f}s "
            f"({throughput:.0f} items/s)")
        shutil.rmtree(cfg.work / f"cost-{n}", ignore_errors=True)
    if throughput:
        measured = rows[-1]
        for n in cfg.extrapolate:
            rows.append({"n": n, "upgrade_s": measured["upgrade_s"], "full_backfill_s": round(n / throughput, 1),
                         "items_per_s": measured["items_per_s"], "extrapolated": True,
                         "from": f"N={measured['n']} measured throughput; upgrade_s does not grow with N"})
    return rows


def _take(items: list[Any], n: int) -> list[Any]:
    """The first images with all their captions until ``n`` items."""
    images = [it for it in items if it.modality == "image"]
    caps: dict[str, list[Any]] = {}
    for it in items:
        if it.modality == "text":
            caps.setdefault(it.metadata["image_id"], []).append(it)
    out: list[Any] = []
    for im in images:
        if len(out) >= n:
            break
        out += [im] + caps.get(im.id, [])
    return out[:n]


def run_backfill_bench(cfg: BackfillBenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every order x merge curve, the references, the default's checks and the cost rows."""
    say = log or (lambda _m: None)
    t_all = time.time()
    out = measure_backfill(cfg.curve(), log=say)
    routes, calib_s = out.pop("routes"), out.pop("calibration_s")
    if cfg.cost_sizes:
        say("cost of an upgrade and of a full backfill ...")
    out["cost"] = _cost(cfg, say)
    out["routes"] = routes
    out["calibration_s"] = calib_s
    out["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    out["seconds"] = round(time.time() - t_all, 1)
    return out


def format_markdown(result: dict[str, Any]) -> str:
    """The curves' tables (:func:`~nobackfill.lifecycle.measuring.backfill_curve.curves_markdown`) and the cost table."""
    lines = ["| N items | upgrade + first query s | full backfill s | items/s | |", "|---:|---:|---:|---:|---|"]
    for r in result["cost"]:
        lines.append(f"| {r['n']} | {r['upgrade_s']} | {r['full_backfill_s']} | {r['items_per_s']} | "
                     f"{'extrapolated' if r['extrapolated'] else 'measured'} |")
    lines.append("")
    return curves_markdown(result) + "\n".join(lines) + "\n"


def write_report(result: dict[str, Any], json_path: str | Path) -> str:
    """JSON, markdown (``.md``), the plot (``.png``) and an HTML page (``.html``) beside each other."""
    from ..report import markdown_html, write_html, write_json_and_markdown

    md = format_markdown(result)
    write_json_and_markdown(result, json_path, md)
    fig = plot_curves(result)
    p = Path(json_path)
    fig.savefig(p.with_suffix(".png"), dpi=110)
    write_html(p.with_suffix(".html"), "nobackfill: R@1 while backfilling", [("Curves", markdown_html(md))], [fig])
    return md


#: the JSON, its tables (``.md``), the plot (``.png``) and a page (``.html``); the tables are shown
REPORT = Report(write_report, (".md", ".png", ".html"))


__all__ = ["REPORT", "BackfillBenchConfig", "DEFAULT_ORDER", "FRACTIONS", "format_markdown", "no_regret", "plot_curves",
           "run_backfill_bench", "write_report"]
