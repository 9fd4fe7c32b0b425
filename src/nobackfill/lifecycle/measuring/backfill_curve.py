"""Accuracy against the fraction backfilled: a collection embedded by an old model is upgraded to a
new one (an upgrade directory; routes and merge calibrated on a val split), then backfilled by the
real backfill job (:mod:`.backfill`) step by step. At each step every merge answers the split's
queries through the :class:`~nobackfill.search.Searcher`: t2i / i2t R@1, negative flips against
old/old, the step's wall time; per curve the area under it (mean R@1 over the steps, Online
Backfilling / FastFill's metric), the no-regret check (every step >= old/old - 0.5 point and >= the
previous step - 0.5 point; the last equals new/new) and the fraction at which half the old -> new
gap is closed. ``bench backfill`` and the demo's live upgrade report it."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ...collection.collection import Collection
from ...metrics.flips import flip_rates
from ...search import MERGES, ModelPool, Searcher
from ...search.models import model_ref
from ..backfill import ORDERS, BackfillJob, backfill_status, run_worker, start_backfill
from .measure import embedded_collection, split_queries, upgraded_collection

FRACTIONS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
#: the order ``collection backfill`` uses unless told
DEFAULT_ORDER = "uncertainty"
REGRET_TOLERANCE = 0.005


@dataclass
class BackfillCurveConfig:
    """What :func:`measure_backfill` runs: the two models, the upgrade between them, the data (a
    world root or a folder with ``test/`` and ``val/`` splits: test items and queries, val
    calibration), a scratch folder, and the orders x merges x fractions to measure."""

    old_model: Path
    new_model: Path
    upgrade: Path
    data: Path
    work: Path
    test_images: int | None = None
    calib_images: int | None = None
    orders: tuple[str, ...] = ORDERS
    merges: tuple[str, ...] = MERGES
    fractions: tuple[float, ...] = FRACTIONS
    batch_size: int = 64
    seed: int = 0


def _auc(points: Sequence[dict[str, float]]) -> float:
    return float(np.mean([p["R@1"] for p in points]))


def no_regret(points: Sequence[dict[str, float]], old_old: float, new_new: float,
              tol: float = REGRET_TOLERANCE) -> dict[str, Any]:
    """The no-regret check of one curve (R@1 as fractions, ``tol`` = 0.5 point)."""
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


def _curve(pts: dict[str, list], ref: dict[str, Any]) -> dict[str, Any]:
    """One order/merge curve with its AUC, no-regret check and half-gap fraction per direction."""
    dirs = ("t2i", "i2t")
    old, new = ({d: ref[k][d]["R@1"] for d in dirs} for k in ("old_old", "new_new"))
    return {**pts, "auc": {d: _auc(pts[d]) for d in dirs},
            "no_regret": {d: no_regret(pts[d], old[d], new[d]) for d in dirs},
            "half_gap_at": {d: _half_gap_fraction(pts[d], old[d], new[d]) for d in dirs}}


def _order_curves(cfg: BackfillCurveConfig, base: Collection, order: str, new, pool: ModelPool, ev,
                  old_old: dict[str, np.ndarray], zero: dict[str, Any]) -> tuple[dict[str, dict], Any]:
    """The points of every merge while ``order`` backfills a copy of ``base``; returns them and the job."""
    path = cfg.work / order
    shutil.rmtree(path, ignore_errors=True)
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
    return pts, BackfillJob.load(c) or job  # the head is fitted once the workers have embedded the sample


def measure_backfill(cfg: BackfillCurveConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every order x merge curve, the references (old/old, new/new), the default curve, the
    routes of the old space and the upgrade's (calibration's) seconds."""
    from ...evaluate import resolve_data

    say = log or (lambda _m: None)
    pool = ModelPool()
    ev = split_queries(resolve_data(cfg.data, "test"), cfg.test_images)
    old_ref, new_ref = model_ref(cfg.old_model), model_ref(cfg.new_model)
    base, plan, calib_s = upgraded_collection(ev, cfg.work / "base", pool, old_ref=old_ref, new_ref=new_ref,
                                              upgrade=cfg.upgrade, calibration=cfg.data,
                                              calib_images=cfg.calib_images, log=say)
    old_sid = plan.old_spaces()[0].space_id
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
        pts, job = _order_curves(cfg, base, order, new, pool, ev, old_old, zero)
        for m in cfg.merges:
            key = f"{order}/{m}"
            curves[key] = _curve(pts[m], ref)
            say(f"  {key}: AUC t2i {curves[key]['auc']['t2i']:.3f} i2t {curves[key]['auc']['i2t']:.3f}; no regret "
                f"{curves[key]['no_regret']['t2i']['ok']}/{curves[key]['no_regret']['i2t']['ok']}")
        if job.head:
            curves[f"{order}/{cfg.merges[0]}"]["head"] = job.head
    default = f"{DEFAULT_ORDER}/{plan.merge_method}"
    out: dict[str, Any] = {**ref, "default": default, "curves": curves}
    if default in curves and f"random/{plan.merge_method}" in curves:
        rnd = curves[f"random/{plan.merge_method}"]
        out["default_vs_random_auc"] = {d: curves[default]["auc"][d] - rnd["auc"][d] for d in ("t2i", "i2t")}
    out["routes"] = {d: r.route + (f" w={r.w}" if r.w is not None else "")
                     for d, r in plan.routes[old_sid].items() if d in ("t2i", "i2t")}
    out["calibration_s"] = round(calib_s, 1)
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
    refs = {d: (result["old_old"][d]["R@1"], result["new_new"][d]["R@1"]) for d in ("t2i", "i2t")}
    return finish_r1_figure(fig, axes, refs, "{d}: R@1 while backfilling (world test)", "% of the gallery backfilled")


def finish_r1_figure(fig, axes, refs: dict[str, tuple[float, float]], title: str, xlabel: str,
                     ref_labels: tuple[str, str] = ("old/old", "new/new"), ncol: int = 6):
    """A two-panel (t2i, i2t) R@1 figure finished: old/old and new/new (``refs[d]``, fractions) as
    dashed lines, titles (``title`` with ``{d}``), axis labels and one legend below."""
    for ax, d in zip(axes, ("t2i", "i2t")):
        ax.axhline(100 * refs[d][0], color="k", ls="--", lw=0.8, label=ref_labels[0])
        ax.axhline(100 * refs[d][1], color="k", ls="-.", lw=0.8, label=ref_labels[1])
        ax.set_title(title.format(d=d))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("R@1 %")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=ncol, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def curves_markdown(result: dict[str, Any]) -> str:
    """The references and routes in a line, then per direction a table of R@1 at each fraction with
    the AUC, the no-regret check and the half-gap fraction of every curve."""
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
    return "\n".join(lines) + "\n"


__all__ = ["BackfillCurveConfig", "DEFAULT_ORDER", "FRACTIONS", "REGRET_TOLERANCE", "curves_markdown",
           "finish_r1_figure", "measure_backfill", "no_regret", "plot_curves"]
