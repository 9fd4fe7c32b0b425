"""``nobackfill bench routes``: every route of a live-upgraded collection, end to end through the
:class:`~nobackfill.search.Searcher`.

(a) **World** (test split, English captions): a collection embedded by ``world-old`` is upgraded to
``world-new`` with the shipped XBT upgrade, routes and merge calibrated on the val split. Rows, R@K
of the Searcher's answers: ``old_old`` (route old-model), ``bridge`` (XBT), ``fused`` (the val
weight), ``new_new`` (a collection embedded by ``world-new``: a finished backfill).

(b) **Multi30K** task 2, caption 1 -> caption 2 on val (or ``--eval-dir``): a text collection of the
captions 2 embedded by ``models/m30k-old-text``, upgraded to all-MiniLM-L6-v2 with the text XBT
upgrade, calibrated on caption pairs of train images (a split carved from train).

Also: the merges (raw / calibrated / rank) on the calibration split and on the test split of a
collection backfilled at random to ``backfill_fraction``; negative / positive flips of every row
against old/old (a query right before the upgrade and wrong after, and the reverse).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .world_collection import UpgradeInputs, embedded_collection, hit_ranks, upgraded_world_collection, world_eval

from ..collection.collection import Collection
from ..collection.ingest import text_item
from ..metrics.flips import flip_rates
from ..metrics.retrieval import recall_from_ranks
from ..search import MERGES, ModelPool, Searcher
from ..lifecycle.calibrate import text_pair_task
from ..search.models import model_ref
from ..lifecycle.plan_changes import upgrade_collection

KS = (1, 5, 10)
ROWS = ("old_old", "bridge", "fused", "new_new")
ROUTE_OF_ROW = {"old_old": "old-model", "bridge": "bridge", "fused": "fused"}


@dataclass
class RoutesBenchConfig(UpgradeInputs):
    """Where the models, data and upgrades are, and how much of each split is used."""

    work: Path = Path("runs/bench/routes-work")
    test_images: int | None = None  # None: the whole split
    calib_images: int | None = None
    text_calib: int = 1000
    text_limit: int | None = None
    backfill_fraction: float = 0.5
    seed: int = 0
    parts: tuple[str, ...] = ("world", "text")

    @classmethod
    def quick(cls, **kw: Any) -> "RoutesBenchConfig":
        """Half the val split for calibration and 500 train caption pairs for the text part."""
        return cls(**{"calib_images": 500, "text_calib": 500, **kw})


def _row(ranks: np.ndarray) -> dict[str, float]:
    return recall_from_ranks(ranks, KS)


def _flips(rows_ranks: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    base = rows_ranks["old_old"] == 1
    return {name: {k: v for k, v in flip_rates(base, r == 1).items() if k in ("NFR", "PFR", "rel_NFR")}
            for name, r in rows_ranks.items() if name != "old_old"}


def _backfill_half(c: Collection, done: Collection, fraction: float, seed: int) -> int:
    """Copy the vectors of a random ``fraction`` of the items from ``done`` (the same items embedded
    by the new model) into ``c``'s current space: a backfill stopped part-way."""
    rng = np.random.default_rng(seed)
    snap = done.snapshot()
    moved = 0
    for m in ("image", "text"):
        view = snap.views(m).get(done.current_space)
        if view is None or not view.count:
            continue
        vecs = np.asarray(view.gallery.vectors(m))
        pick = [p for p in np.flatnonzero(view.mask) if rng.random() < fraction]
        keys = [snap.items[view.item_ids[p]].key for p in pick]
        moved += c.put_vectors(c.current_space, m, keys, vecs[pick])
    return moved


def _merge_on_test(c: Collection, pool: ModelPool, run: Callable[[Searcher], dict[str, float]]) -> dict[str, Any]:
    return {m: run(Searcher(c, pool=pool, merge=m)) for m in MERGES}


# ----------------------------------------------------------------------------- (a) world
def run_world(cfg: RoutesBenchConfig, pool: ModelPool, log: Callable[[str], None]) -> dict[str, Any]:
    from ..evaluate import resolve_data

    ev = world_eval(resolve_data(cfg.world, "test"), cfg.test_images)
    c, plan, upgrade_s = upgraded_world_collection(cfg, pool, ev, cfg.work / "world-old", log)
    new_ref = model_ref(cfg.models / "world-new")
    old_sid = plan.old_spaces()[0].space_id
    log(f"  upgrade + calibration in {upgrade_s:.0f}s: routes " + ", ".join(
        f"{d} {r.route}" + (f" w={r.w}" if r.w is not None else "")
        for d, r in plan.routes[old_sid].items()))
    ranks: dict[str, dict[str, np.ndarray]] = {}
    for row, route in ROUTE_OF_ROW.items():
        t0 = time.time()
        ranks[row] = ev.measure(Searcher(c, pool=pool, routes={old_sid: route}))
        log(f"  {row}: t2i R@1 {np.mean(ranks[row]['t2i'] == 1):.3f}, i2t R@1 {np.mean(ranks[row]['i2t'] == 1):.3f} "
            f"({time.time() - t0:.0f}s)")
    done = embedded_collection(cfg.work / "world-new", pool, new_ref, ev.items, log)
    ranks["new_new"] = ev.measure(Searcher(done, pool=pool))
    moved = _backfill_half(c, done, cfg.backfill_fraction, cfg.seed)
    merge_test = {d: {} for d in ("t2i", "i2t")}
    for m in MERGES:
        r = ev.measure(Searcher(c, pool=pool, merge=m))
        for d in merge_test:
            merge_test[d][m] = _row(r[d])
    out: dict[str, Any] = {d: {row: _row(ranks[row][d]) for row in ROWS} for d in ("t2i", "i2t")}
    out["weights"] = {d: r.w if r.route == "fused" else r.calibration.get("fused", {}).get("w")
                      for d, r in plan.routes[old_sid].items() if d in ("t2i", "i2t")}
    out["routes_chosen"] = {d: r.route for d, r in plan.routes[old_sid].items()}
    out["calibration"] = {d: {k: v for k, v in r.calibration.items() if k != "curve"}
                          for d, r in plan.routes[old_sid].items()}
    out["fused_curve_val"] = {d: r.calibration.get("curve") for d, r in plan.routes[old_sid].items()}
    out["merge"] = {"default": plan.merge.method, "calibration": dict(plan.merge.calibration),
                    "test_partly_backfilled": {"fraction": cfg.backfill_fraction, "items_moved": moved, **merge_test}}
    out["nfr"] = {d: _flips({row: ranks[row][d] for row in ROWS}) for d in ("t2i", "i2t")}
    out["n"] = {"images": len(ev.images), "captions": len(ev.texts),
                "val_images": plan.calibration["sizes"]["t2i"]["gallery"]}
    out["upgrade_s"] = round(upgrade_s, 1)
    return out


# ----------------------------------------------------------------------------- (b) Multi30K text
def run_text(cfg: RoutesBenchConfig, pool: ModelPool, log: Callable[[str], None]) -> dict[str, Any]:
    from ..data.multi30k import default_multi30k_dir, read_task2

    root = cfg.multi30k or default_multi30k_dir()
    val = read_task2(root, "val", "en", ks=(1, 2), eval_dir=cfg.eval_dir, limit=cfg.text_limit)
    q, g = val.column(1), val.column(2)
    train = read_task2(root, "train", "en", ks=(1, 2), limit=cfg.text_calib)
    old_ref, new_ref = model_ref(cfg.text_old), model_ref(cfg.text_new)
    log(f"text: {len(q)} val caption pairs ({cfg.eval_dir or 'Multi30K task2 val'}); calibration on "
        f"{train.n_images} train pairs")
    items = [text_item(t, id=f"val-{i}") for i, t in enumerate(g)]
    c = embedded_collection(cfg.work / "text-old", pool, old_ref, items, log)
    t0 = time.time()
    plan = upgrade_collection(c, new_ref, bridges=[cfg.text_upgrade],
                              calibration=[text_pair_task(train.column(1), train.column(2))],
                              calibration_label=f"Multi30K task2 train, first {train.n_images} images", pool=pool)
    upgrade_s = time.time() - t0
    old_sid = plan.old_spaces()[0].space_id
    rel = [{f"val-{i}"} for i in range(len(q))]
    ranks = {}
    for row, route in ROUTE_OF_ROW.items():
        ranks[row] = hit_ranks(Searcher(c, pool=pool, routes={old_sid: route}).search_batch(texts=q, k=10, target="text"),
                            rel, 10)
        log(f"  {row}: R@1 {np.mean(ranks[row] == 1):.3f}")
    done = embedded_collection(cfg.work / "text-new", pool, new_ref, items, log)
    ranks["new_new"] = hit_ranks(Searcher(done, pool=pool).search_batch(texts=q, k=10, target="text"), rel, 10)
    moved = _backfill_half(c, done, cfg.backfill_fraction, cfg.seed)
    merge_test = {m: _row(hit_ranks(Searcher(c, pool=pool, merge=m).search_batch(texts=q, k=10, target="text"), rel, 10))
                  for m in MERGES}
    r = plan.routes[old_sid]["t2t"]
    return {**{row: _row(ranks[row]) for row in ROWS},
            "weights": {"t2t": r.w if r.route == "fused" else r.calibration.get("fused", {}).get("w")},
            "routes_chosen": {"t2t": r.route},
            "calibration": {"t2t": {k: v for k, v in r.calibration.items() if k != "curve"}},
            "fused_curve_calibration": r.calibration.get("curve"),
            "merge": {"default": plan.merge.method, "calibration": dict(plan.merge.calibration),
                      "test_partly_backfilled": {"fraction": cfg.backfill_fraction, "items_moved": moved,
                                                 "t2t": merge_test}},
            "nfr": {"t2t": _flips(ranks)}, "n": {"val_pairs": len(q), "calibration_pairs": train.n_images},
            "upgrade_s": round(upgrade_s, 1)}


def run_routes_bench(cfg: RoutesBenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both parts (``cfg.parts``); the JSON of the issue: world, text, weights, merge, nfr."""
    say = log or (lambda _m: None)
    pool = ModelPool()
    t0 = time.time()
    parts: dict[str, Any] = {}
    if "world" in cfg.parts:
        parts["world"] = run_world(cfg, pool, say)
    if "text" in cfg.parts:
        parts["text"] = run_text(cfg, pool, say)
    out: dict[str, Any] = {}
    if "world" in parts:
        out["world"] = {d: parts["world"][d] for d in ("t2i", "i2t")}
    if "text" in parts:
        out["text"] = {row: parts["text"][row] for row in ROWS}
    out["weights"] = {p: v["weights"] for p, v in parts.items()}
    out["routes_chosen"] = {p: v["routes_chosen"] for p, v in parts.items()}
    out["merge"] = {p: v["merge"] for p, v in parts.items()}
    out["nfr"] = {p: v["nfr"] for p, v in parts.items()}
    out["calibration"] = {p: v["calibration"] for p, v in parts.items()}
    out["details"] = {p: {k: v[k] for k in ("n", "upgrade_s") + (("fused_curve_val",) if p == "world" else
                                                                  ("fused_curve_calibration",))} for p, v in parts.items()}
    out["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    out["seconds"] = round(time.time() - t0, 1)
    return out


def format_markdown(result: dict[str, Any]) -> str:
    """The tables: R@1/5/10 per row and direction, the chosen weights, merges and flips."""
    lines = []
    dirs = [("world", d) for d in ("t2i", "i2t") if d in result.get("world", {})]
    dirs += [("text", "t2t")] if "text" in result else []
    lines.append("| row | " + " | ".join(f"{p} {d} R@1 / R@5 / R@10" for p, d in dirs) + " |")
    lines.append("|---|" + "---:|" * len(dirs))
    for row in ROWS:
        cells = []
        for p, d in dirs:
            r = result["world"][d][row] if p == "world" else result["text"][row]
            cells.append(" / ".join(f"{100 * r[f'R@{k}']:.1f}" for k in KS))
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Fused weight w (chosen on the calibration split): " + "; ".join(
        f"{p} {d} {w}" for p, ws in result["weights"].items() for d, w in ws.items()))
    lines.append("")
    lines.append("| merge | " + " | ".join(f"{p} {d} calibration R@1" for p, d in dirs)
                 + " | " + " | ".join(f"{p} {d} test R@1 (partly backfilled)" for p, d in dirs) + " |")
    lines.append("|---|" + "---:|" * (2 * len(dirs)))
    for m in MERGES:
        cal = [result["merge"][p]["calibration"].get(d, {}).get(m, {}).get("R@1") for p, d in dirs]
        tst = [result["merge"][p]["test_partly_backfilled"].get(d, {}).get(m, {}).get("R@1") for p, d in dirs]
        fmt = lambda x: f"{100 * x:.1f}" if x is not None else "-"  # noqa: E731
        default = [p for p, _ in dirs if result["merge"][p]["default"] == m]
        lines.append(f"| {m}{' (default: ' + ', '.join(sorted(set(default))) + ')' if default else ''} | "
                     + " | ".join(map(fmt, cal)) + " | " + " | ".join(map(fmt, tst)) + " |")
    lines.append("")
    lines.append("| flips vs old/old | " + " | ".join(f"{p} {d} NFR / PFR" for p, d in dirs) + " |")
    lines.append("|---|" + "---:|" * len(dirs))
    for row in ROWS[1:]:
        cells = [f"{100 * result['nfr'][p][d][row]['NFR']:.1f} / {100 * result['nfr'][p][d][row]['PFR']:.1f}"
                 for p, d in dirs]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Recall, NFR and PFR in %. World: test split, English captions; text: Multi30K task2 val, "
                 "caption 1 -> caption 2. Every number is the Searcher's answer over a collection.")
    return "\n".join(lines) + "\n"


__all__ = ["RoutesBenchConfig", "format_markdown", "run_routes_bench", "run_text", "run_world"]
