"""The markdown tables of ``bench import`` (:mod:`nobackfill.bench.importing`)."""

from __future__ import annotations

from typing import Any


def format_markdown(result: dict[str, Any]) -> str:
    """Tables: identical hits, import throughput, model-check trials per case, Milvus."""
    lines: list[str] = []
    ident = result.get("identical")
    if ident:
        lines += ["| direction | identical | queries | equal | ties reordered | max score diff |",
                  "|---|---|---:|---:|---:|---:|"]
        for d in ("t2i", "i2t", "t2t"):
            x = ident["details"][d]
            lines.append(f"| {d} | {ident[d]} | {x['queries']} | {x['equal']} | {x['ties_reordered']} | "
                         f"{x['max_score_diff']:.2e} |")
        lines += ["", f"Import vs `add` on the same data (tolerance {ident['tolerance']:g}); world: "
                  f"{ident['details']['world']['items_imported']} items, Multi30K: "
                  f"{ident['details']['text']['items_imported']} items.", ""]
    if result.get("throughput"):
        lines += ["| N | rows/s | import s | peak RSS MB | vectors MB | RSS - vectors MB | RSS before MB | disk MB |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in result["throughput"]:
            lines.append(f"| {r['n']:,} | {r['rows_per_s']:,.0f} | {r['import_s']} | {r['peak_rss_mb']} | "
                         f"{r['vector_mb']} | {r['rss_over_vectors_mb']} | {r['base_rss_mb']} | {r['disk_mb']} |")
        lines += ["", "A fresh process opens and imports an .npy + parquet table (trusted: no model check; "
                  "Flat backend: no index built).", ""]
    mc = result.get("model_check")
    if mc:
        lines += ["| declared | case | trials | accepted | refused (by width) | median cosine |",
                  "|---|---|---:|---:|---:|---|"]
        for side in ("right", "wrong"):
            for name, c in mc[side]["by_case"].items():
                if "skipped" in c:
                    lines.append(f"| {side} | {name} | skipped: {c['skipped']} | | | |")
                    continue
                med = c.get("median_cosine")
                span = f"{med['min']} .. {med['max']}" if med else "-"
                lines.append(f"| {side} | {name} | {c['trials']} | {c['accepted']} | {c['refused']} "
                             f"({c['refused_by_width']}) | {span} |")
        lines += ["", f"False refusals: {mc['right']['refused']} of {mc['right']['trials']}; false accepts: "
                  f"{mc['wrong']['accepted']} of {mc['wrong']['trials']} ({mc['samples']} samples a check, "
                  f"threshold {mc['threshold']}).", ""]
    lines.append(f"Milvus in place: {result.get('milvus_in_place')}")
    return "\n".join(lines) + "\n"


__all__ = ["format_markdown"]
