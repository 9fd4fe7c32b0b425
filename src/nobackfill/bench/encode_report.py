"""``bench encode``'s report: the Markdown table (ours vs plain transformers per model and input)
and the JSON with the table beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from .._atomic import atomic_write_text

from .runner import Report


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def format_encode_table(result: Mapping) -> str:
    """A Markdown table: one row per (model, modality), ours vs plain transformers."""
    lines = [
        f"Encoding throughput on {result.get('device', 'cpu')}, {result.get('threads')} thread(s), "
        f"batch {result.get('batch_size')}, median of {result.get('repeats', 3)} runs "
        f"({result.get('n_images')} images, {result.get('n_texts')} texts)",
        "",
        "| model | input | ours /s | plain transformers /s | speed-up | max abs diff |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, r in result.get("models", {}).items():
        for kind, key in (("images", "images_per_s"), ("texts", "texts_per_s")):
            o, p = r["ours"][key], r["plain_transformers"][key]
            lines.append(f"| {name} | {kind} | {o:,.1f} | {p:,.1f} | {_ratio(o, p)} | "
                         f"{r[f'max_abs_diff_{kind}']:.2e} |")
    m = result.get("minilm")
    if m:
        o, p = m["ours"]["texts_per_s"], m["plain_transformers"]["texts_per_s"]
        lines.append(f"| {m.get('name', 'minilm')} | texts | {o:,.1f} | {p:,.1f} | {_ratio(o, p)} | "
                     f"{m['max_abs_diff_texts']:.2e} |")
    notes = [f"- {name}: pixel max abs diff vs {r.get('image_processor', 'CLIPImageProcessor')} = "
             f"{r['max_abs_diff_pixels']:.2e}" for name, r in result.get("models", {}).items()
             if "max_abs_diff_pixels" in r]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def write_report(result: Mapping, out_dir: str | Path, name: str = "encode") -> dict[str, Path]:
    """Write ``NAME.json`` and ``NAME.md`` (the table) into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md"}
    for key, text in (("json", json.dumps(result, indent=2, default=str) + "\n"),
                      ("md", format_encode_table(result))):
        atomic_write_text(paths[key], text)
    return paths


def _write(result: dict, json_path: Path) -> str:
    write_report(result, json_path.parent, json_path.stem)
    return format_encode_table(result)


#: the JSON at ``--out`` and its table beside it (``.md``), shown
REPORT = Report(_write)

__all__ = ["REPORT", "format_encode_table", "write_report"]
