"""Human-readable outputs shared by the demo and the benchmarks: text tables, and a
self-contained HTML report with embedded PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import base64
import html
import io
import math
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._atomic import atomic_write_text

RECALL_COLUMNS = [("t2i", "R@1"), ("t2i", "R@5"), ("t2i", "R@10"), ("i2t", "R@1"), ("i2t", "R@5"), ("i2t", "R@10")]


def recall_table_rows(rows: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    header = ["row"] + [f"{d} {k}" for d, k in RECALL_COLUMNS]
    body = []
    for name, r in rows.items():
        body.append([name] + [f"{100 * r[d][k]:.1f}" if r.get(d) else "-" for d, k in RECALL_COLUMNS])
    return header, body


def text_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in body])


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table: the first column left-aligned, the others right-aligned."""
    rows = [list(map(str, header)), [":---"] + ["---:"] * (len(header) - 1)] + [list(map(str, r)) for r in body]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def html_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A table in a box that scrolls on its own when it is wider than the page (never the page)."""
    return _html_table([html.escape(str(h)) for h in header], [[html.escape(str(c)) for c in row] for row in body])


def _html_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{h}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return f'<div class="table"><table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table></div>'


_BOLD = re.compile(r"\*\*(.+?)\*\*")


def _inline(text: str) -> str:
    """Escaped text with Markdown's ``**bold**`` and ``code`` spans."""
    out = _BOLD.sub(r"<b>\1</b>", html.escape(text))
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_html(markdown: str) -> str:
    """The Markdown our reports write (paragraphs, ``#`` headings, ``**bold**``, ``code`` and pipe
    tables) as HTML: tables as HTML tables (as :func:`html_table` makes them), never as raw text in
    a ``<pre>`` block that runs off the page."""
    parts: list[str] = []
    block: list[str] = []

    def flush() -> None:
        if not block:
            return
        if block[0].lstrip().startswith("|"):
            rows = [_cells(x) for x in block if not re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", x)]
            parts.append(_html_table([_inline(c) for c in rows[0]], [[_inline(c) for c in r] for r in rows[1:]]))
        elif block[0].startswith("#"):
            level = min(6, 2 + len(block[0]) - len(block[0].lstrip("#")))
            parts.append(f"<h{level}>{_inline(block[0].lstrip('#').strip())}</h{level}>")
            block[:] = block[1:]
            flush()
            return
        else:
            parts.append("<p>" + _inline(" ".join(x.strip() for x in block)) + "</p>")
        block.clear()

    for line in markdown.splitlines():
        if not line.strip() or (block and line.lstrip().startswith("|") != block[-1].lstrip().startswith("|")):
            flush()
        if line.strip():
            block.append(line)
    flush()
    return "".join(parts)


def figure_png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def figure_html(fig) -> str:
    """A matplotlib figure as an ``<img>`` with the PNG inline (scaled to the page by its CSS)."""
    return f'<img src="data:image/png;base64,{figure_png(fig)}"/>'


def recall_bar_plot(rows: dict[str, dict], title: str, k: str = "R@1"):
    """Grouped bars of t2i / i2t ``k`` per row; returns a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(names)), 3.4))
    width = 0.38
    for j, d in enumerate(("t2i", "i2t")):
        vals = [100 * rows[n][d][k] if rows[n].get(d) else 0 for n in names]
        bars = ax.bar([i + (j - 0.5) * width for i in range(len(names))], vals, width, label=f"{d} {k}")
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel(f"{k} (%)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


#: the report pages' style: nothing wider than the window (plots scale down, long lines and words
#: wrap, a wide table scrolls inside its own box), so the page never scrolls sideways, at 1280 px
#: or on a 390 px phone
PAGE_CSS = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;overflow-wrap:anywhere}"
            "img{max-width:100%;height:auto;display:block}"
            "pre{white-space:pre-wrap;overflow-wrap:anywhere}"
            ".table{overflow-x:auto;max-width:100%;margin:0.5em 0}"
            "table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right;overflow-wrap:normal}"
            "td:first-child,th:first-child{text-align:left}")


def write_html(path: str | Path, title: str, sections: Sequence[tuple[str, str]], figures: Sequence = ()) -> Path:
    """Write a standalone HTML page (sections are ``(heading, html)``), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imgs = "".join(figure_html(f) for f in figures)
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{PAGE_CSS}</style></head><body><h1>{html.escape(title)}</h1>{imgs}{body}</body></html>")
    atomic_write_text(path, page)
    return path


def json_finite(obj: Any) -> Any:
    """``obj`` with every float that is not finite (NaN: an undefined metric, such as AC of one
    model) as None, so the JSON written is strict (``null``) and any parser reads it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_finite(v) for v in obj]
    if hasattr(obj, "dtype") and getattr(obj, "ndim", None) == 0:  # a numpy scalar
        return json_finite(obj.item())
    return obj


def write_json_and_markdown(result: dict, json_path: str | Path, markdown: str) -> str:
    """Write ``result`` as JSON (atomically) and ``markdown`` beside it (``.md``); returns the markdown."""
    import json

    p = Path(json_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, json.dumps(json_finite(result), indent=2, default=float, allow_nan=False))
    p.with_suffix(".md").write_text(markdown)
    return markdown


def mean_over_seeds(per_seed: list[dict]) -> dict:
    """Mean (and std of R@1 per direction) of every numeric leaf of per-seed result rows; non-numeric
    leaves from the first seed."""
    def walk(items):
        first = items[0]
        if isinstance(first, dict):
            return {k: walk([it[k] for it in items if isinstance(it, dict) and k in it]) for k in first}
        if isinstance(first, bool):
            return first if len(set(items)) == 1 else float(np.mean(items))
        if isinstance(first, (int, float)) and first is not None:
            vals = [float(x) for x in items]
            return float(np.mean(vals))
        return first

    out = walk(per_seed)
    if len(per_seed) > 1:
        out["std"] = {f"{d}_R@1": float(np.std([r[d]["R@1"] for r in per_seed])) for d in ("t2i", "i2t")
                      if all(d in r for r in per_seed)}
    out["n_seeds"] = len(per_seed)
    return out
