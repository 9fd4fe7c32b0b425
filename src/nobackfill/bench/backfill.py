"""``nobackfill bench backfill``: accuracy against the fraction backfilled, for every order and merge.

World test split (English captions): a collection embedded by ``world-old`` is upgraded to
``world-new`` with the shipped XBT upgrade (routes and merge calibrated on val), then backfilled by
the real backfill job (:mod:`nobackfill.lifecycle.backfill`) to 0, 5, 10, 20, 40, 60, 80 and 100 %. At
each step every merge answers the test queries through the :class:`~nobackfill.search.Searcher`:
t2i / i2t R@1, negative flips against old/old, the step's wall time; per curve the area under it
(mean R@1 over the steps, Online Backfilling / FastFill's metric) and the no-regret check (every
step >= old/old - 0.5 point and >= the previous step - 0.5 point; the last equals new/new).

Cost: seconds until the first improved query (registering the upgrade, no calibration, then one
search) and seconds for a full backfill at N items of the world's train split, measured at the
sizes of ``cost_sizes`` and extrapolated (flagged) from the measured throughput beyond.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..index.collection import Collection
from ..index.ingest import folder_items
from ..metrics.flips import flip_rates
from ..search import MERGES, ModelPool, Searcher
from ..lifecycle.backfill import ORDERS, BackfillJob, backfill_status, run_backfill, run_worker, start_backfill
from ..search.models import model_ref
from ..lifecycle.plan_changes import upgrade_collection
from .world_collection import embedded_collection, fresh_dir, upgraded_world_collection, world_eval

FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
#: the order ``collection backfill`` uses unless told
DEFAULT_ORDER = "uncertainty"
REGRET_TOLERANCE = 0.005


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


def _auc(points: Sequence[dict[str, float]]) -> float:
    return float(np.mean([p["R@1"] for p in points]))


def no_regret(points: Sequence[dict[str, float]], old_old: float, new_new: float,
              tol: float = REGRET_TOLERANCE) -> dict[str, Any]:
    """The issue's no-regret check of one curve (R@1 as fractions, ``tol`` = 0.5 point)."""
    r = [p["R@1"] for p in points]
    above_old = all(x >= old_old - tol for x in r)
    monotone = all(b >= a - tol for a, b in zip(r, r[1:]))
    ends_new = abs(r[-1] - new_new) <= 1e-9 if points[-1]["fraction"] >= 1.0 else None
    return {"above_old_old": above_old, "monotone": monotone, "ends_at_new_new": ends_new,
            "ok": bool(above_old and monotone and ends_new is not False)}


def _half_gap_fraction(points: Sequence[dict[str, float]], old_old: float, new_new: float) -> float | None:
    """The first measured fraction at which half of the old->new gap is closed."""
    half = old_old + 0.5 * (new_new - old_old)
    return next((p["fraction"] for p in points if p["R@1"] >= half), None)


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
        upgrade_collection(c, new_ref, bridges=[cfg.upgrade], pool=fresh)
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
    from ..evaluate import resolve_data

    say = log or (lambda _m: None)
    t_all = time.time()
    pool = ModelPool()
    ev = world_eval(resolve_data(cfg.world, "test"), cfg.test_images)
    base, plan, calib_s = upgraded_world_collection(cfg, pool, ev, cfg.work / "base", say)
    old_sid = plan.old_spaces()[0].space_id
    new_ref = model_ref(cfg.models / "world-new")
    new = pool.get(new_ref)
    old_old = ev.measure(Searcher(base, pool=pool, routes={old_sid: "old-model"}))
    done = embedded_collection(cfg.work / "new", pool, new_ref, ev.items, say)
    new_new = ev.measure(Searcher(done, pool=pool))
    ref = {"old_old": {d: {"R@1": float(np.mean(r == 1))} for d, r in old_old.items()},
           "new_new": {d: {"R@1": float(np.mean(r == 1))} for d, r in new_new.items()}}
    say("old/old R@1 " + ", ".join(f"{d} {v['R@1']:.3f}" for d, v in ref["old_old"].items())
        + "; new/new " + ", ".join(f"{d} {v['R@1']:.3f}" for d, v in ref["new_new"].items()))
    zero = {m: ev.measure(Searcher(base, pool=pool, merge=m)) for m in cfg.merges}  # 0 %: the same for every order
    curves: dict[str, Any] = {}
    for order in cfg.orders:
        path = fresh_dir(cfg.work / order)
        shutil.copytree(base.path, path)
        c = Collection.open(path)
        t0 = time.time()
        job = start_backfill(c, new, order=order, seed=cfg.seed, pool=pool)
        pending_s = time.time() - t0  # the uncertainty sample's failures are measured here: charged to the first step
        total = backfill_status(c)["total"]
        pts: dict[str, dict[str, list]] = {m: {"t2i": [], "i2t": []} for m in cfg.merges}
        for f in cfg.fractions:
            if f <= 0:
                frac, step_s, results = 0.0, 0.0, zero
            else:
                t0 = time.time()
                have, want = backfill_status(c)["done"], int(round(f * total))
                if want > have:
                    run_worker(c, new, batch_size=cfg.batch_size, limit=want - have)
                step_s, pending_s = time.time() - t0 + pending_s, 0.0
                frac = backfill_status(c)["fraction"]
                results = {m: ev.measure(Searcher(c, pool=pool, merge=m)) for m in cfg.merges}
            for m in cfg.merges:
                for d in ("t2i", "i2t"):
                    r = results[m][d]
                    pts[m][d].append({"fraction": round(frac, 4), "R@1": float(np.mean(r == 1)),
                                      "nfr": flip_rates(old_old[d] == 1, r == 1)["NFR"], "step_s": round(step_s, 2)})
        for m in cfg.merges:
            key = f"{order}/{m}"
            curves[key] = {**pts[m], "auc": {d: _auc(pts[m][d]) for d in ("t2i", "i2t")},
                           "no_regret": {d: no_regret(pts[m][d], ref["old_old"][d]["R@1"], ref["new_new"][d]["R@1"])
                                         for d in ("t2i", "i2t")},
                           "half_gap_at": {d: _half_gap_fraction(pts[m][d], ref["old_old"][d]["R@1"],
                                                                  ref["new_new"][d]["R@1"]) for d in ("t2i", "i2t")}}
            say(f"  {key}: AUC t2i {curves[key]['auc']['t2i']:.3f} i2t {curves[key]['auc']['i2t']:.3f}; no regret "
                f"{curves[key]['no_regret']['t2i']['ok']}/{curves[key]['no_regret']['i2t']['ok']}")
        job = BackfillJob.load(c) or job  # the head is fitted once the workers have embedded the sample
        if job.head:
            curves[f"{order}/{cfg.merges[0]}"]["head"] = job.head
    default = f"{DEFAULT_ORDER}/{plan.merge_method}"
    out: dict[str, Any] = {**ref, "default": default, "curves": curves}
    if default in curves and f"random/{plan.merge_method}" in curves:
        rnd = curves[f"random/{plan.merge_method}"]
        out["default_vs_random_auc"] = {d: curves[default]["auc"][d] - rnd["auc"][d] for d in ("t2i", "i2t")}
    if cfg.cost_sizes:
        say("cost of an upgrade and of a full backfill ...")
    out["cost"] = _cost(cfg, say)
    out["routes"] = {d: r.route + (f" w={r.w}" if r.w is not None else "")
                     for d, r in plan.routes[old_sid].items() if d in ("t2i", "i2t")}
    out["calibration_s"] = round(calib_s, 1)
    out["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    out["seconds"] = round(time.time() - t_all, 1)
    return out


def plot_curves(result: dict[str, Any]):
    """R@1 against the fraction backfilled: one line per order/merge, old/old and new/new dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.0), sharey=False)
    styles = {"calibrated": "-", "raw": "--", "rank": ":"}
    colours = {"uncertainty": "tab:red", "random": "tab:blue", "sequential": "tab:grey"}
    for ax, d in zip(axes, ("t2i", "i2t")):
        for key, cur in result["curves"].items():
            order, merge = key.split("/")
            xs = [100 * p["fraction"] for p in cur[d]]
            ys = [100 * p["R@1"] for p in cur[d]]
            ax.plot(xs, ys, styles.get(merge, "-"), color=colours.get(order), marker="o", ms=3,
                    lw=2.2 if key == result["default"] else 1.0, label=key + (" (default)" if key == result["default"] else ""))
        ax.axhline(100 * result["old_old"][d]["R@1"], color="k", ls="--", lw=0.8, label="old/old")
        ax.axhline(100 * result["new_new"][d]["R@1"], color="k", ls="-.", lw=0.8, label="new/new")
        ax.set_title(f"{d}: R@1 while backfilling (world test)")
        ax.set_xlabel("% of the gallery backfilled")
        ax.set_ylabel("R@1 %")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=6, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def format_markdown(result: dict[str, Any]) -> str:
    lines = [f"Default: **{result['default']}**. old/old R@1 t2i {100 * result['old_old']['t2i']['R@1']:.1f}, "
             f"i2t {100 * result['old_old']['i2t']['R@1']:.1f}; new/new t2i {100 * result['new_new']['t2i']['R@1']:.1f}, "
             f"i2t {100 * result['new_new']['i2t']['R@1']:.1f}. Routes to the old space: "
             + ", ".join(f"{d} {r}" for d, r in result["routes"].items()) + ".", ""]
    fracs = [p["fraction"] for p in next(iter(result["curves"].values()))["t2i"]]
    for d in ("t2i", "i2t"):
        lines.append(f"| {d} R@1 % at fraction | " + " | ".join(f"{100 * f:.0f}%" for f in fracs)
                     + " | AUC | no regret | half gap at |")
        lines.append("|---|" + "---:|" * (len(fracs) + 3))
        for key, cur in result["curves"].items():
            nr = cur["no_regret"][d]
            half = cur["half_gap_at"][d]
            lines.append(f"| {key}{' (default)' if key == result['default'] else ''} | "
                         + " | ".join(f"{100 * p['R@1']:.1f}" for p in cur[d])
                         + f" | {100 * cur['auc'][d]:.1f} | {'yes' if nr['ok'] else 'NO'} | "
                         + (f"{100 * half:.0f}%" if half is not None else "-") + " |")
        lines.append("")
    lines.append("| N items | upgrade + first query s | full backfill s | items/s | |")
    lines.append("|---:|---:|---:|---:|---|")
    for r in result["cost"]:
        lines.append(f"| {r['n']} | {r['upgrade_s']} | {r['full_backfill_s']} | {r['items_per_s']} | "
                     f"{'extrapolated' if r['extrapolated'] else 'measured'} |")
    lines.append("")
    return "\n".join(lines) + "\n"


def write_report(result: dict[str, Any], json_path: str | Path) -> str:
    """JSON, markdown (``.md``), the plot (``.png``) and an HTML page (``.html``) beside each other."""
    from ..report import write_html, write_json_and_markdown

    md = format_markdown(result)
    write_json_and_markdown(result, json_path, md)
    fig = plot_curves(result)
    p = Path(json_path)
    fig.savefig(p.with_suffix(".png"), dpi=110)
    write_html(p.with_suffix(".html"), "nobackfill: R@1 while backfilling", [("Curves", f"<pre>{md}</pre>")], [fig])
    return md


__all__ = ["BackfillBenchConfig", "DEFAULT_ORDER", "FRACTIONS", "format_markdown", "no_regret", "plot_curves",
           "run_backfill_bench", "write_report"]
