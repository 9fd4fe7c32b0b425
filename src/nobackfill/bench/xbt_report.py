"""Tables and plots of ``bench xbt`` (markdown, HTML)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from .._atomic import atomic_write_text

from .runner import Report

MAIN_ROWS = ["old_old", "new_new", "new_old_raw", "phi_text_only", "xbt", "direct_full", "direct_lora",
             "direct_base", "procrustes", "slerp"]
LABELS = {"old_old": "old/old", "new_new": "new/new (upgrade off)", "new_old_raw": "raw new/old",
          "phi_text_only": "text-only phi", "xbt": "XBT", "direct_full": "Direct Full-tune",
          "direct_lora": "Direct LoRA-only", "direct_base": "Direct Base", "procrustes": "Procrustes",
          "slerp": "SLERP"}


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.1f}"


def _ratio(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.2f}"


def format_xbt_tables(result: dict) -> str:
    """Markdown tables: main rows, pair sweep, cost, zero-shot, continual matrix, summary."""
    rows = result["rows"]
    lines = [f"XBT benchmark, world {result['split']} split: {result['n_images']} images, {result['n_captions']} "
             f"captions; mean of {result['config']['seeds']} seed(s) (Direct Full-tune / LoRA-only, budgets "
             f"above 4k and the continual matrix: the first {result['config'].get('extra_seeds', 1)}); recall in %", "",
             "| row | t2i R@1 | R@5 | R@10 | i2t R@1 | R@5 | R@10 | gap closure t2i / i2t | criterion w/v paired / unpaired | criterion v/w paired / unpaired | new/new off t2i / i2t R@1 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in [k for k in MAIN_ROWS if k in rows] + [k for k in rows if k not in MAIN_ROWS]:
        r = rows[key]
        cr = r.get("criterion", {})
        crit = [f"{_pct(cr[c]['paired'])} / {_pct(cr[c]['unpaired'])}" if c in cr else "-"
                for c in ("w_new/v_old", "v_new/w_old")]
        nn = r.get("new_new_off")
        gc = r.get("gap_closure", {})
        lines.append(f"| {LABELS.get(key, key)} | " + " | ".join(_pct(r['t2i'][f'R@{k}']) for k in (1, 5, 10)) + " | "
                     + " | ".join(_pct(r['i2t'][f'R@{k}']) for k in (1, 5, 10))
                     + f" | {_ratio(gc.get('t2i'))} / {_ratio(gc.get('i2t'))} | {crit[0]} | {crit[1]} | "
                     + (f"{_pct(nn['t2i']['R@1'])} / {_pct(nn['i2t']['R@1'])}" if nn else "-") + " |")
    lines += ["", f"upgrade off vs original new model: max abs diff = {result['onoff_max_abs_diff']}", ""]
    bc = {k: r["by_concept"] for k, r in rows.items() if r.get("by_concept")}
    if bc:
        frac = next(iter(bc.values())).get("frac_images_seen", float("nan"))
        lines += [f"R@1 % by the image's main object: concepts the old model was trained on (seen, "
                  f"{100 * frac:.0f}% of images) vs not (unseen)", "",
                  "| row | t2i seen | t2i unseen | i2t seen | i2t unseen |", "|---|---:|---:|---:|---:|"]
        for k, b in bc.items():
            lines.append(f"| {LABELS.get(k, k)} | " + " | ".join(_pct(b.get(f"{d}_R@1_{m}")) for d in ("t2i", "i2t")
                                                                for m in ("seen", "unseen")) + " |")
        lines.append("")
    sw = result.get("sweep", {})
    if sw:
        budgets = sorted({int(k.split("@")[1]) for k in sw})
        lines += ["Pair budget sweep (R@1 %, t2i / i2t)", "", "| pairs | XBT | Direct Base |", "|---:|---:|---:|"]
        for n in budgets:
            cells = []
            for m in ("xbt", "direct_base"):
                r = sw.get(f"{m}@{n}")
                cells.append(f"{_pct(r['t2i']['R@1'])} / {_pct(r['i2t']['R@1'])}" if r else "-")
            lines.append(f"| {n} | {cells[0]} | {cells[1]} |")
        lines.append("")
    if result.get("cost"):
        lines += ["Cost (training wall time; peak RSS of the training process, and its growth over the process "
                  "start with torch imported)", "",
                  "| method | train s | peak RSS MB | RSS growth MB | models loaded | old model loaded |",
                  "|---|---:|---:|---:|---|---|"]
        for k, c in result["cost"].items():
            lines.append(f"| {k} | {c['train_seconds']:.1f} | {c['peak_rss_mb']:.0f} | {c.get('rss_growth_mb', 0):.0f} | "
                         f"{', '.join(c['loaded_models'])} | "
                         f"{'yes' if c['old_model_loaded'] else 'no'} |")
        lines.append("")
    if result.get("zero_shot"):
        lines += ["Zero-shot classification, 64 world classes ('a photo of a {colour} {shape}'), top-1 %", "",
                  "| model | accuracy |", "|---|---:|"]
        lines += [f"| {k} | {_pct(v)} |" for k, v in result["zero_shot"].items()] + [""]
    if result.get("matrix"):
        for d, m in result["matrix"].items():
            s, ns = m["strict"], m["non_strict"]
            lines += [f"Continual compatibility matrix C[t,k] ({d} R@1 %, query model t, gallery model k)", "",
                      "| query \\ gallery | " + " | ".join(s["models"]) + " |", "|---|" + "---:|" * len(s["models"])]
            for name, row in zip(s["models"], s["C"]):
                lines.append(f"| {name} | " + " | ".join(_pct(v) if v is not None else "" for v in row) + " |")
            lines += ["", f"strict (>): AC {s['AC']:.2f}, AA {100 * s['AA']:.1f}, ACA {100 * s['ACA']:.1f}; "
                          f"non-strict (>=): AC {ns['AC']:.2f}, AA {100 * ns['AA']:.1f}, ACA {100 * ns['ACA']:.1f}", ""]
    if result.get("summary"):
        lines += ["Summary (R@1 pairs are [this row, the row compared])", ""]
        lines += [f"- {k}: {json.dumps(_rounded(v), default=str)}" for k, v in result["summary"].items()]
    return "\n".join(lines) + "\n"


def _rounded(v, digits: int = 3):
    """``v`` with every float rounded (the summary's numbers as a reader compares them)."""
    if isinstance(v, float):
        return round(v, digits)
    if isinstance(v, dict):
        return {k: _rounded(x, digits) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_rounded(x, digits) for x in v]
    return v


def write_xbt_report(result: dict, out_json: str | Path) -> dict[str, Path]:
    from ..report import markdown_html, recall_bar_plot, write_html

    out_json = Path(out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    md = out_json.with_suffix(".md")
    atomic_write_text(out_json, json.dumps(result, indent=2, default=str))
    text = format_xbt_tables(result)
    md.write_text("# XBT benchmark\n\n" + text)
    figs = []
    try:
        rows = {LABELS.get(k, k): result["rows"][k] for k in ("old_old", "new_old_raw", "phi_text_only", "xbt",
                                                              "direct_base", "procrustes", "slerp", "new_new")
                if k in result["rows"]}
        figs.append(recall_bar_plot(rows, f"world {result['split']}: new queries vs old gallery (R@1)"))
        figs.append(_sweep_plot(result))
    except Exception:  # pragma: no cover - plotting must never lose the numbers
        pass
    html = out_json.with_suffix(".html")
    write_html(html, "nobackfill: XBT benchmark", [("Tables", markdown_html(text))], [f for f in figs if f is not None])
    return {"json": out_json, "md": md, "html": html}


def _sweep_plot(result: dict):
    sw = result.get("sweep", {})
    if not sw:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({int(k.split("@")[1]) for k in sw})
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for m, style in (("xbt", "-o"), ("direct_base", "--s")):
        for d in ("t2i", "i2t"):
            xs = [n for n in budgets if f"{m}@{n}" in sw]
            ax.plot(xs, [100 * sw[f"{m}@{n}"][d]["R@1"] for n in xs], style, label=f"{LABELS.get(m, m)} {d}")
    for d, c in (("t2i", "gray"), ("i2t", "black")):
        ax.axhline(100 * result["rows"]["old_old"][d]["R@1"], color=c, lw=0.8, ls=":", label=f"old/old {d}")
    ax.set_xscale("log")
    ax.set_xlabel("image-text pairs")
    ax.set_ylabel("R@1 (%)")
    ax.set_title("pair budget sweep")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


#: ``bench xbt``'s report as the command shows it: :func:`~nobackfill.bench.xbt.run_xbt_bench` has
#: already written the JSON, the tables (``.md``) and the page (``.html``), as its jobs write under it
REPORT = Report(lambda result, _json_path: format_xbt_tables(result), (".md", ".html"))
