"""The table and plot of ``bench fitted-bridge``: per part and direction, R@1 along the pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runner import Report


def _f(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f}"


def _curves(result: dict[str, Any]):
    for part in [k for k in result if k in ("world", "text") or k.startswith("text_")]:
        for d, rows in (result.get(part) or {}).items():
            if isinstance(rows, list) and rows:
                yield part, d, rows


def _chosen(r: dict[str, Any]) -> str:
    members = r.get("members") or []
    return f"{r['chosen']} of {' + '.join(members)}" if len(members) > 1 else str(r["chosen"])


def format_markdown(result: dict[str, Any]) -> str:
    lines = []
    for part, d, rows in _curves(result):
        fams = sorted({k for r in rows for k in r["families"]})
        lines.append(f"**{part} {d}** (R@1 %; the label-free choice, its held-out agreement, the served route)")
        lines.append("")
        lines.append("| pairs | fraction | chosen (held-out) | served route | served | bridge | fused | old/old | "
                     "shipped | with shipped: served | new/new | best candidate | gap | best single family |")
        lines.append("|---:|---:|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---|")
        for r in rows:
            ws = r.get("with_shipped") or {}
            w = f" w={r['w']}" if r.get("w") is not None else ""
            lines.append(
                f"| {r['pairs']:,} | {100 * r['fraction']:.2f}% | {_chosen(r)} ({_f((r['heldout'] or {}).get('r1'))}) | "
                f"{r['served_route']}{w} | {_f(r['served_r1'])} | {_f(r['bridge_r1'])} | {_f(r['fused_r1'])} | "
                f"{_f(r['old_old_r1'])} | {_f(r.get('shipped_r1'))} | "
                f"{(ws.get('served_route', '-') + ' ' + _f(ws.get('served_r1'))) if ws else '-'} | "
                f"{_f(r['new_new_r1'])} | {r['best_family']} {_f(r['best_family_r1'])} | {_f(r['choice_gap'])} | "
                f"{r.get('best_single') or '-'} {_f(r.get('best_single_r1'))} |")
        lines.append("")
        lines.append("| pairs | " + " | ".join(fams) + " |")
        lines.append("|---:|" + "---:|" * len(fams))
        for r in rows:
            lines.append(f"| {r['pairs']:,} | " + " | ".join(
                f"{_f(r['families'][k]['r1'])} ({_f(r['families'][k]['heldout'])}"
                f"{' / ' + _f(r['families'][k]['overlap10']) if 'overlap10' in r['families'][k] else ''})"
                if k in r["families"] else "-"
                for k in fams) + " |")
        lines.append("")
        lines.append("Per candidate: test R@1 (held-out agreement R@1 / overlap@10; the choice maximises their sum), "
                     "fitted on the pairs outside the held-out fifth; `ensemble`: the mean of the best-scored "
                     "candidates (listed in the chosen column).")
        lines.append("")
    over = result.get("query_overhead_us") or {}
    if over:
        lines.append("Query overhead (one query, us): " + ", ".join(f"{k} {v}" for k, v in over.items()))
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = list(_curves(result))
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4), squeeze=False)
    for ax, (part, d, rows) in zip(axes[0], curves):
        x = [r["pairs"] for r in rows]
        ax.plot(x, [r["served_r1"] for r in rows], "o-", label="served (label-free)")
        ax.plot(x, [r["best_family_r1"] for r in rows], ".--", label="best candidate")
        if rows[0].get("best_single_r1") is not None:
            ax.plot(x, [r["best_single_r1"] for r in rows], "x:", label="best single family")
        ax.axhline(rows[0]["old_old_r1"], color="grey", ls=":", label="old/old")
        if rows[0].get("shipped_r1") is not None:
            ax.axhline(rows[0]["shipped_r1"], color="tab:red", ls="-.", label="shipped XBT")
        ax.axhline(rows[0]["new_new_r1"], color="black", ls="--", lw=0.8, label="new/new")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:,}" for v in x], fontsize=7)
        ax.set_title(f"{part} {d}")
        ax.set_xlabel("backfilled scenes (an image and its captions)" if part == "world" else "backfilled images (both captions each)")
        ax.set_ylabel("R@1")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(result: dict[str, Any], path: Path) -> str:
    from ..report import write_json_and_markdown

    text = format_markdown(result)
    write_json_and_markdown(result, path, text)
    plot(result, Path(path).with_suffix(".png"))
    return text


REPORT = Report(_write, (".md", ".png"))

__all__ = ["REPORT", "format_markdown", "plot"]
