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
        lines += ["| N | rows/s | import s | CPU s (import + worker) | peak RSS MB | vectors MB | RSS - vectors MB "
                  "| RSS before MB | disk MB | Python loop s |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in result["throughput"]:
            cpu = f"{r['cpu_s']} + {r['worker_cpu_s']}" if "cpu_s" in r else ""
            lines.append(f"| {r['n']:,} | {r['rows_per_s']:,.0f} | {r['import_s']} | {cpu} | {r['peak_rss_mb']} | "
                         f"{r['vector_mb']} | {r['rss_over_vectors_mb']} | {r['base_rss_mb']} | {r['disk_mb']} | "
                         f"{r.get('python_loop_s', '')} |")
        lines += ["", "A fresh process opens and imports an .npy + parquet table, written and synced to disk "
                  "before (trusted: no model check; "
                  "Flat backend: no index built). Peak RSS is the whole process, vectors included, plus the "
                  "peak of the worker process that commits the catalog's rows when one does (from 200,000 "
                  "rows): the .npy is memory-mapped and each batch's pages are released once read, so the "
                  "vectors are never resident all at once (RSS - vectors < 0 when the processes hold less "
                  "than the vector file). CPU s: the import's threads and its worker's. Python loop s: 10M "
                  "additions in a Python loop just before the import, in the same process: how fast this shared "
                  "machine ran plain Python at that moment (the import also moves with its disk and memory, "
                  "which this does not show).", ""]
        lines += _commands(result["throughput"])
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
    lines += _milvus(result.get("milvus_in_place"))
    return "\n".join(lines) + "\n"


def _commands(rows: list[dict[str, Any]]) -> list[str]:
    """The commands end to end: ``collection import`` until it returns, ``collection index`` apart."""
    rows = [r for r in rows if "command_import_s" in r]
    if not rows:
        return []
    lines = ["| N | `collection import` s | its peak RSS MB | graph index missing after it | `collection index` s "
             "| its peak RSS MB | index MB | vectors MB | graph in use after |", "|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['command_import_s']} | {r['command_import_peak_rss_mb']} | "
                     f"{r['graph_missing_after_import']} | {r['index_build_s']} | {r['index_build_peak_rss_mb']} | "
                     f"{r['index_mb']} | {r['vector_mb']} | {r['graph_in_use_after_index']} |")
    return lines + ["", f"Each command a fresh process (`python -m nobackfill.cli`, model {rows[0]['model']} loaded "
                        "by the import, trusted), wall seconds until it returns and peak RSS by "
                        f"{rows[0]['rss_measured_by']} (the process or its largest child). The import returns "
                        "when the rows are in: the collection is searchable then (exactly, while the graph index "
                        "is missing); `collection index` (or `nobackfill serve`, in the background) builds the "
                        "graph later. Index MB: the graph's file on disk.", ""]


def _mix(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "-"


def _milvus(m: dict[str, Any] | None) -> list[str]:
    """The user's Milvus collection through adopt, upgrade, backfill and retire."""
    if not m:  # not run (--set parts=...)
        return []
    if "rows_before" not in m:
        return [f"Milvus in place: {m}"]
    lines = ["| step | search p50 ms | p50 ms, query embedded | R@10 | routes of the hits | "
             "user's collection unchanged |", "|---|---:|---:|---:|---|---|"]
    checks = m.get("checksum_equal_after", {})
    for key, step, check in (("search_adopted", "adopted (world-old, their HNSW index)", "after_adopt"),
                             ("search_upgraded", "upgraded to world-new (bridge)", "after_upgrade"),
                             ("search_backfilled", "backfilled", "after_backfill"),
                             ("search_retired", "adopted space retired", "after_retire")):
        x = m[key]
        lines.append(f"| {step} | {x['p50_ms']} | {x.get('p50_embedded_ms')} | {x['r_at_10']} | {_mix(x['routes'])} "
                     f"| {checks.get(check)} |")
    mc = m.get("model_check", {})
    steps = ", ".join(f"{k} {v}s" for k, v in m.get("steps_s", {}).items())
    lines += ["", f"Milvus in place ({m['storage']}): the user's collection of {m['items']} world test images "
              f"(pk INT64, embedding, image_path; {m['index']}), adopted {m['adopted']} (model check accepted "
              f"{mc.get('accepted')}: median cosine {mc.get('median_cosine', float('nan')):.4f} over {mc.get('n')} "
              f"items); rows {m['rows_before']} before, {m['rows_after']} after; checksum of "
              f"their vectors equal: {m['checksum_equal']}; backfilled: {m['backfilled']}; searches ok: "
              f"{m['searches_ok']} ({m['queries']} caption queries per step, k = 10; p50 end to end, the query "
              f"embedded on CPU, and with the query vectors embedded beforehand); {steps}; {m['seconds']}s in all."]
    if m["storage"] == "milvus-server":
        lines += ["", f"Each step opens the collection anew: searches of the adopted collection run at Strong "
                  f"consistency for {m.get('strong_window_s')} s after a process discovers its rows (a wait for "
                  "the server's time tick)."]
    return lines


__all__ = ["format_markdown"]
