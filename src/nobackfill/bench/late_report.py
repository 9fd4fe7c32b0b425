"""Tables of ``bench late`` (markdown) and its outputs."""

from __future__ import annotations

import json
from pathlib import Path

from .runner import Report

KS = (1, 5, 10)

def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _recall_rows(sec: dict) -> list[list[str]]:
    rows = []
    for name, m in sec.items():
        rows.append([name] + [f"{100 * m[d][f'R@{k}']:.1f}" for d in ("t2i", "i2t") for k in KS])
    return rows


def format_markdown(result: dict) -> str:
    head = ["row"] + [f"{d} R@{k}" for d in ("t2i", "i2t") for k in KS]
    parts = ["# bench late (CMLI, the Target-CMLI paper)", "", "## Retrieval, world test split (en)", "",
             _md_table(head, _recall_rows(result["retrieval"])), "",
             "## Attribute-swap hard negatives (test)", "", _md_table(head, _recall_rows(result["hard_negatives"])), "",
             f"Re-ranking score and weight per direction (chosen on val): {json.dumps(result['rerank_choice'])}", "",
             f"## R@1 gain of CMLI re-ranking (points; mean of {result['seeds']['n_seeds']} training seed(s))", "",
             _md_table(["set", "gain", "t2i", "i2t"],
                       [[t, k, f"{v['t2i']:+.1f}", f"{v['i2t']:+.1f}"] for t, ks in result["rerank_gain"].items()
                        for k, v in ks.items()]), "",
             "Per seed: " + "; ".join(
                 f"seed {sd}: hard negatives within {v['hard_negatives']['within_cmli_model']['t2i']:+.1f} / "
                 f"{v['hard_negatives']['within_cmli_model']['i2t']:+.1f}, over global model "
                 f"{v['hard_negatives']['over_global_model']['t2i']:+.1f} / "
                 f"{v['hard_negatives']['over_global_model']['i2t']:+.1f}"
                 for sd, v in result["seeds"]["per_seed"].items()), "",
             "## Target-CMLI distillation (test)", ""]
    kd_rows = []
    for name, m in result["kd"].items():
        if name == "empty_routing" or m is None:
            continue
        for split in ("test", "hard_negatives"):
            kd_rows.append([f"{name} ({split})"] + [f"{100 * m[split][d][f'R@{k}']:.1f}" for d in ("t2i", "i2t")
                                                   for k in KS])
    parts += [_md_table(head, kd_rows), ""]
    routing = result["kd"].get("empty_routing")
    if routing:
        words = ", ".join(f"{w['word']} {100 * w['empty_share']:.0f}%" for w in routing["words"][:10])
        parts += [f"Empty target: {100 * routing['share']:.1f}% of {routing['n_tokens']} text tokens; "
                  f"most excused words: {words}", ""]
    parts += ["## Memory: naive vs streamed CMLI (B x B batch, no grad, 1 thread)", "",
              _md_table(["batch", "naive MB", "stream MB", "naive s", "stream s", "memory ratio", "time ratio"],
                        [[str(r["batch"]), f"{r['naive_mb']:.1f}", f"{r['stream_mb']:.1f}", f"{r['naive_s']:.3f}",
                          f"{r['stream_s']:.3f}", f"{r['memory_ratio']}x", f"{r['time_ratio']}x"]
                         for r in result["memory"]]), "",
              f"Peak memory: {result['notes']['memory']}.", ""]
    return "\n".join(parts)


def write_outputs(result: dict, json_path: str | Path) -> str:
    """Write the JSON and the markdown table beside it (``.md``); returns the markdown."""
    from ..report import write_json_and_markdown

    return write_json_and_markdown(result, json_path, format_markdown(result))


#: how ``bench late`` reports: the JSON and its markdown tables beside it (``.md``, shown)
REPORT = Report(write_outputs)
