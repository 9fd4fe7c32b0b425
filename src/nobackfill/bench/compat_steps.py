"""``nobackfill bench compat-steps``: the compatibility-learning tutorial's tables (Biondi et al.'s tutorial) on the
world - AC / AA / ACA per method for ``T`` model updates side by side, NFR of the flip-reduction
methods against the independently trained baseline, and a heatmap of every method's compatibility
matrix ``C[t, k]`` in an HTML report.

Setting: :mod:`nobackfill.compat.learning.data` (single-object world images, frozen backbone
features for an MLP per step - or, with ``backbone="image32"``, the pixels for a small CNN trained
per step -, a training pool of classes arriving over the steps, open-set retrieval on the remaining
classes); methods: :mod:`nobackfill.compat.learning`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from .._atomic import atomic_write_text

from ..compat import learning
from ..compat.learning import DataConfig, SequenceConfig
from .runner import Report


#: table order: the tutorial's rows first, then softmax features, continual methods, flip reduction
METHOD_ORDER: tuple[str, ...] = ("baseline", "bct", "lce", "bt2", "advbct", "cores", "dsimplex-hoc", "cl2r",
                                 "psp", "lsp", "fd-kl", "fd-lm", "elodi", "muscle")


@dataclass
class CompatStepsConfig:
    """What the benchmark trains. ``quick()``: 12 epochs per model at lr 5e-3, 2-model ELODI ensembles."""

    steps: tuple[int, ...] = (2, 5, 10)
    methods: tuple[str, ...] = METHOD_ORDER
    #: full: 40 passes over each step's items (every model near convergence); quick: 12 at a higher lr
    sequence: SequenceConfig = field(
        default_factory=lambda: SequenceConfig(epochs=40, batch_size=256, lr=3e-3))
    data: DataConfig = field(default_factory=DataConfig)
    #: per-method option overrides {name: {field: value}}, chosen on val (T = 2, quick schedule, seeds
    #: 0-2, mean C[2,1] - C[1,1] with the junk rule) for each method alone; a tie goes to the paper.
    #: BCT: none - lambda 1 / 3, from scratch or warm-started, all clear the old self-test by +0.229 to
    #: +0.239, so the paper's lambda = 1 from scratch stays. d-Simplex-HOC: lambda = 0.9 (the slide
    #: leaves lambda in [0, 1] open): per seed, 0.2 (rho 32) -0.05 -0.01 -0.06, 0.5 -0.00 +0.05 -0.01,
    #: 0.7 +0.02 +0.06 +0.01, 0.9 +0.03 +0.09 +0.06.
    options: dict = field(default_factory=lambda: {"dsimplex-hoc": {"ce_weight": 0.9}})

    @classmethod
    def quick(cls, **kw) -> "CompatStepsConfig":
        cfg = cls(**kw)
        if cfg.sequence.epochs > 0:
            cfg.sequence.epochs = min(cfg.sequence.epochs, 12)
            cfg.sequence.lr = 5e-3
        cfg.options.setdefault("elodi", {}).setdefault("ensemble", 2)
        return cfg

    def __post_init__(self) -> None:
        known = set(learning.method_names())
        bad = [m for m in self.methods if m not in known]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(METHOD_ORDER)}")
        if not self.steps or min(self.steps) < 2:
            raise ValueError(f"steps must be >= 2 each, got {self.steps}")


def run_compat_steps(cfg: CompatStepsConfig, json_out: str | Path | None,
                     work_dir: str | Path = "runs/compat_steps/work", log: Callable[[str], None] = lambda m: None) -> dict:
    """Train and evaluate every method for every T; write JSON, markdown and HTML at ``json_out``
    (None: nothing, the command line writes them through :data:`REPORT`); return the result."""
    L = learning
    t0 = time.time()
    data = L.load_class_data(cfg.data)
    log(f"data: {len(data.train_y)} training items ({data.n_train_classes} classes), {len(data.gallery_y)} gallery / "
        f"{len(data.query_y)} query open-set items, {len(data.test_y)} closed-set test items ({time.time() - t0:.0f}s)")
    result: dict = {"config": {"steps": list(cfg.steps), "methods": list(cfg.methods),
                               "sequence": asdict(cfg.sequence), "data": asdict(cfg.data), "options": cfg.options},
                    "nfr": {}}
    for T in cfg.steps:
        seq = L.SequenceConfig(**{**asdict(cfg.sequence), "steps": T})
        rows, flips, trained = {}, {}, {}
        for name in cfg.methods:
            like = L.method_class(name).trains_like
            shared = trained.get(like) if like and not cfg.options.get(name) and not cfg.options.get(like) else None
            r = L.run_method(name, data, seq, Path(work_dir) / f"T{T}" / name, options=cfg.options.get(name),
                             models=shared, keep_models=True)
            trained[name] = r.pop("models")
            rows[name] = {k: r[k] for k in ("AC", "AA", "ACA", "C", "metric", "criterion", "test_accuracy", "regime",
                                            "init_from_previous", "seconds") + tuple(_other_metrics(r))}
            flips[name] = r["flips"]
            log(f"T={T} {name}: AC {r['AC']:.2f} AA {100 * r['AA']:.1f} ACA {100 * r['ACA']:.1f} "
                f"NFR {100 * r['flips']['classification']['NFR']:.2f}% ({r['seconds']:.0f}s)")
        result[f"T{T}"] = rows
        result["nfr"][f"T{T}"] = flips
    result["nfr_reduction"] = nfr_reductions(result)
    result["seconds"] = round(time.time() - t0, 1)
    if json_out is not None:
        write_compat_steps_outputs(result, json_out)
    return result


def _other_metrics(row: dict) -> list[str]:
    """The metrics besides the primary M whose C / AC / AA / ACA a result row also carries."""
    from ..compat.learning.sequence import METRICS

    return [m for m in METRICS if m in row]


def _flip_methods(result: dict) -> list[str]:
    return [m for m in result["config"]["methods"] if learning.method_class(m).reduces_flips]


def nfr_reduction(result: dict, method: str, T: int, kind: str = "classification") -> float | None:
    """Relative NFR reduction of ``method`` against the baseline: ``1 - NFR_method / NFR_baseline``."""
    flips = result["nfr"].get(f"T{T}", {})
    if "baseline" not in flips or method not in flips or not flips[method]:
        return None
    base = flips["baseline"][kind]["NFR"]
    return float(1 - flips[method][kind]["NFR"] / base) if base > 0 else None


def nfr_reductions(result: dict) -> dict[str, float | None]:
    """Mean relative NFR reduction against the baseline over the T values, per flip-reduction method."""
    out = {}
    for m in _flip_methods(result):
        red = [r for r in (nfr_reduction(result, m, T) for T in result["config"]["steps"]) if r is not None]
        out[m] = float(np.mean(red)) if red else None
    return out


def _f(x: float | None, scale: float = 100.0, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{scale * x:.{digits}f}"


def compat_table(result: dict, metric: str | None = None) -> tuple[list[str], list[list[str]]]:
    """One row per method, AC / AA / ACA for every T side by side (the tutorial's layout); ``metric``:
    a secondary M the rows carry (e.g. "verification") instead of the primary one."""
    steps = result["config"]["steps"]
    header = ["method"] + [f"T={T} {k}" for T in steps for k in ("AC", "AA", "ACA")]
    body = []
    for m in result["config"]["methods"]:
        row = [m]
        for T in steps:
            r = result.get(f"T{T}", {}).get(m)
            r = r.get(metric) if r is not None and metric else r
            row += ["-"] * 3 if r is None else [f"{r['AC']:.2f}", _f(r["AA"]), _f(r["ACA"])]
        body.append(row)
    return header, body


def nfr_table(result: dict, methods: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """NFR (classification and retrieval top-1, %) and the relative reduction against the baseline."""
    steps = result["config"]["steps"]
    methods = list(methods) if methods is not None else ["baseline"] + _flip_methods(result)
    header = ["method"] + [f"T={T} {k}" for T in steps for k in ("NFR cls", "relNFR", "vs base", "NFR ret")]
    body = []
    for m in methods:
        row = [m]
        for T in steps:
            f = result["nfr"].get(f"T{T}", {}).get(m)
            if not f:
                row += ["-"] * 4
                continue
            red = nfr_reduction(result, m, T)
            row += [_f(f["classification"]["NFR"], digits=2), _f(f["classification"]["rel_NFR"], 1, 2),
                    "-" if m == "baseline" or red is None else f"{-100 * red:+.0f}%",
                    _f(f["retrieval"]["NFR"], digits=2)]
        body.append(row)
    return header, body


_METRIC_NAMES = {"search": "top-1 open-set search accuracy, near-duplicate renderings as junk (Market-1501)",
                 "search-with-duplicates": "top-1 open-set search accuracy, near-duplicate renderings kept",
                 "verification": "open-set pair verification accuracy (CoReS protocol)"}


def _has_metric(result: dict, metric: str) -> bool:
    return any(metric in row for T in result["config"]["steps"] for row in result.get(f"T{T}", {}).values())


def _no_baseline(result: dict) -> list[str]:
    """A line saying why every reduction is '-' when the baseline was not run (else none)."""
    return [] if "baseline" in result["config"]["methods"] else \
        ["- (the baseline is not among the methods: there is nothing to reduce against)"]


def format_compat_steps(result: dict) -> str:
    """Markdown: the AC / AA / ACA table, the NFR table, the relative NFR reductions."""
    from ..report import markdown_table

    primary = result["config"]["sequence"].get("metric", "search")
    parts = [f"## AC / AA / ACA (AA, ACA in %; M = {_METRIC_NAMES[primary]})", "", markdown_table(*compat_table(result)), ""]
    for other in (m for m in _METRIC_NAMES if m != primary and _has_metric(result, m)):
        parts += [f"## AC / AA / ACA with M = {_METRIC_NAMES[other]}", "", markdown_table(*compat_table(result, other)), ""]
    parts += ["## Negative flips between consecutive models (%)", "", markdown_table(*nfr_table(result)), ""]
    if result.get("nfr_reduction"):  # no flip-reduction method selected: no section (trial Y: an empty one)
        parts += ["## Relative NFR reduction against the baseline (mean over T)", ""]
        parts += [f"- {k}: {_f(v)}%" for k, v in result["nfr_reduction"].items()] + _no_baseline(result)
    return "\n".join(parts) + "\n"


def heatmaps(result: dict, T: int):
    """One figure: a ``C[t, k]`` heatmap per method for ``T`` models."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result[f"T{T}"]
    names = list(rows)
    cols = min(5, len(names))
    nrows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(2.6 * cols, 2.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        c = np.array([[np.nan if v is None else v for v in row] for row in rows[name]["C"]], float)
        ax.imshow(100 * c, vmin=0, vmax=100, cmap="viridis")
        for t in range(T):
            for k in range(t + 1):
                if T <= 5:
                    ax.text(k, t, f"{100 * c[t, k]:.0f}", ha="center", va="center", fontsize=7, color="w")
                if k < t and c[t, k] > c[k, k]:
                    ax.add_patch(plt.Rectangle((k - 0.5, t - 0.5), 1, 1, fill=False, ec="r", lw=1.2))
        ax.set_title(f"{name} AC {rows[name]['AC']:.2f}", fontsize=8)
        ax.set_xticks(range(T), [str(i + 1) for i in range(T)], fontsize=6)
        ax.set_yticks(range(T), [str(i + 1) for i in range(T)], fontsize=6)
        ax.set_xlabel("gallery k", fontsize=7)
        ax.set_ylabel("query t", fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"C[t,k] (%), T = {T}; red: C[t,k] > C[k,k]", fontsize=9)
    fig.tight_layout()
    return fig


def write_compat_steps_outputs(result: dict, json_out: str | Path) -> dict[str, Path]:
    """``json_out`` plus ``.md`` and ``.html`` beside it."""
    from ..report import html_table, write_html

    json_out = Path(json_out)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_out, json.dumps(result, indent=2))
    md = json_out.with_suffix(".md")
    md.write_text(format_compat_steps(result))
    sections = [("AC / AA / ACA", html_table(*compat_table(result))), ("Negative flips", html_table(*nfr_table(result)))]
    if result.get("nfr_reduction"):
        sections.append(("Relative NFR reduction (mean over T)", "<ul>" + "".join(
            f"<li>{k}: {_f(v)}%</li>" for k, v in result["nfr_reduction"].items()) + "</ul>"
            + "".join(f"<p>{line[2:]}</p>" for line in _no_baseline(result))))
    figs = [heatmaps(result, T) for T in result["config"]["steps"] if f"T{T}" in result]
    page = write_html(json_out.with_suffix(".html"), "Compatibility learning over T model updates", sections, figs)
    return {"json": json_out, "md": md, "html": page}


def _write_report(result: dict, json_out: Path) -> str:
    write_compat_steps_outputs(result, json_out)
    return format_compat_steps(result)


#: how ``bench compat-steps`` reports: the JSON, the tables (``.md``, shown) and the C heatmaps (``.html``)
REPORT = Report(_write_report, (".md", ".html"))
