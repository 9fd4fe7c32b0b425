"""The table of ``nobackfill bench backfill-engine`` (:mod:`.backfill_engine`): engines' items/s,
Ray's overhead, the fault run and peak memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runner import Report

__all__ = ["REPORT", "format_markdown", "write_report"]


def format_markdown(r: dict[str, Any]) -> str:
    """The throughput table, the fault run and the peak memory."""
    t, f, m = r["throughput"], r["faults"], r["rss_mb"]
    load = r.get("load_average", {})
    lines = [f"{r['items']} world items, batch {r['batch_size']}, {r['actors']} embedding actors, {r['cores']} cores "
             f"(CPU); load average (1, 5, 15 min) before {load.get('before')}, after {load.get('after')}", "", "| engine | items/s | seconds | vs local |", "|---|---:|---:|---:|",
             f"| local (one lease worker) | {t['local_items_per_s']} | {t['local_s']} | 1.00 |",
             f"| ray, 1 node | {t['ray_items_per_s']} | {t['ray_s']} | {t['ray_over_local']:.2f} |",
             f"| ray, 2 nodes (1 CPU each) | {t['ray_2_nodes_items_per_s']} | {t['ray_2_nodes_s']} | "
             f"{t['ray_2_nodes_items_per_s'] / t['local_items_per_s']:.2f} |", "",
             f"Ray's overhead per batch: {t['ray_overhead_per_batch_ms']} ms ({t['batches']} batches; Ray itself "
             f"started in {t['ray_start_s']} s, not counted)"
             + (": negative, the actors working in parallel gained more than Ray cost" if t["ray_overhead_per_batch_ms"] < 0
                else "") + f". The first batch committed {t['ray_first_batch_s']} s into the Ray run (the actors' "
             "start and model loading).", "",
             "| fault run | actor kills | node removals | crashed commits | committed | lost | twice | vectors = local |",
             "|---|---:|---:|---:|---:|---:|---:|---|",
             f"| 2 nodes, batch {f['batch_size']}, model +{f.get('model_delay_s', 0)} s/call | {f['actor_kills']} | {f['node_removals']} | {f['crashed_commits']} | "
             f"{f['committed']} | {f['lost']} | {f['twice']} | {'yes' if f['vectors_identical'] else 'NO'} |", "",
             f"Peak RSS: driver {m['driver']} MB, embedding actor {m['actors']} MB, commit actor {m['commit_actor']} MB.",
             ""]
    return "\n".join(lines)


def write_report(result: dict[str, Any], json_path: str | Path) -> str:
    from ..report import write_json_and_markdown

    md = format_markdown(result)
    write_json_and_markdown(result, json_path, md)
    return md


#: the JSON and its table (``.md``)
REPORT = Report(write_report, (".md",))
