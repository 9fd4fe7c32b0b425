"""Tables of ``bench reco`` (markdown)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from .._atomic import atomic_write_text

from .runner import Report


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def format_reco_tables(result: dict) -> str:
    """Markdown tables: zero-shot per label set, premise, retrieval, k sweep, latency, memory and checks."""
    R, ls, zb = result["retrieval"], result["label_set"], result["zero_shot_by_label_set"]
    rows = list(result["zero_shot"])
    sets = list(zb)
    lines = [f"Frozen encoder `{result['model']}`; main label set `{ls['name']}` ({ls['classes']} classes, "
             f"{ls['prompts_per_class']} prompt(s) per class, e.g. \"{ls['example_prompts'][0]}\"); RECO rows at k = "
             f"{ls['k']}{' (chosen on val)' if ls['k_chosen_on_val'] else ''}; test split ({result['eval']['images']} "
             f"images, {result['eval']['captions']} captions); tuned on {result['eval']['tuned_on']}.", "",
             "| zero-shot (all / single object) | " + " | ".join(sets) + " |",
             "|---" * (len(sets) + 1) + "|"]
    lines += [f"| {r} | " + " | ".join(f"{_pct(zb[n][r]['all'])} / {_pct(zb[n][r]['single_object'])}" for n in sets)
              + " |" for r in rows] + [""]
    for n, za in result["zero_shot_attributes"].items():
        attrs = list(next(iter(za.values()))["all"])
        unseen = any("colour_unseen_in_training" in r for r in za.values())
        lines += [f"| `{n}`: right attribute of the predicted class | " + " | ".join(attrs) + " | "
                  + " | ".join(f"{a} (single)" for a in attrs) + (" | colour never seen by the base |" if unseen else " |"),
                  "|---" * (2 * len(attrs) + 1 + unseen) + "|"]
        for r, x in za.items():
            lines.append(f"| {r} | " + " | ".join(_pct(x[m][a]) for m in ("all", "single_object") for a in attrs)
                         + (f" | {_pct(x.get('colour_unseen_in_training'))} |" if unseen else " |"))
        lines.append("")
    pr = result.get("premise")
    if pr:
        cols_p = list(pr["linear_probe"])[:-1] if "fine_trained_on_single_object" in pr["linear_probe"] else list(pr["linear_probe"])
        lines += [f"RECO premise on {pr['split']} (no training; k={pr['k']} neighbours; `fine` = a class of "
                  f"`{pr['label_set']}`): is the attribute encoded by the frozen image tower (probe, neighbours) "
                  "but named badly by the base (zero-shot)?", "",
                  "| premise | " + " | ".join(cols_p) + " |", "|---" * (len(cols_p) + 1) + "|"]
        for title, get in (("chance", lambda a: pr["chance"][a]),
                           ("linear probe of the image embedding (all)", lambda a: pr["linear_probe"][a]["all"]),
                           ("linear probe (single object)", lambda a: pr["linear_probe"][a]["single_object"]),
                           ("image -> memory images share it (all)", lambda a: pr["image_neighbours"][a]["all"]),
                           ("image -> memory images share it (single)", lambda a: pr["image_neighbours"][a]["single_object"]),
                           ("kNN vote (all)", lambda a: pr["knn_vote"][a]["all"]),
                           ("prompt -> memory texts share it", lambda a: pr["prompt_neighbours"].get(a)),
                           ("base zero-shot names it", lambda a: pr["base_zero_shot"].get(a))):
            lines.append(f"| {title} | " + " | ".join(_pct(get(a)) for a in cols_p) + " |")
        lines.append("")
    cols = [("t2i", "R@1"), ("t2i", "R@5"), ("t2i", "R@10"), ("i2t", "R@1"), ("i2t", "R@5"), ("i2t", "R@10")]
    lines += ["| retrieval | " + " | ".join(f"{d} {k}" for d, k in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(_pct(r[d][k]) for d, k in cols) + " |" for n, r in R.items()] + [""]
    lines += ["| k | " + " | ".join(f"zero-shot {n}" for n in sets) + " | t2i R@1 (queries only) | i2t R@1 (queries only) "
              "| t2i R@1 (both) | val score |", "|---" * (len(sets) + 5) + "|"]
    for k, r in result["k_sweep"].items():
        q, b = r["retrieval"]["queries_only"], r["retrieval"]["both"]
        lines.append(f"| {k} | " + " | ".join(_pct(r["zero_shot_by_label_set"][n]) for n in sets)
                     + f" | {_pct(q['t2i']['R@1'])} | {_pct(q['i2t']['R@1'])} | {_pct(b['t2i']['R@1'])} | "
                     f"{r['val']['score']:.3f} |")
    lines += ["", "| extra latency per query (ms) | kNN | fusion | total |", "|---|---|---|---|"]
    for mod, lat in result["latency_ms_per_query"].items():
        lines.append(f"| {mod}, one at a time | {lat['single_knn_ms']} | {lat['single_fusion_ms']} | {lat['single_total_ms']} |")
        lines.append(f"| {mod}, batched | {lat['batched_knn_ms']} | {lat['batched_fusion_ms']} | {lat['batched_total_ms']} |")
    m, cal = result["memory"], result["near_duplicate_calibration"]
    lines += ["", f"Memory: {m['kept_images']} images / {m['kept_texts']} texts kept of {m['source_images']} / "
              f"{m['source_texts']}; removed {m['test_items']} test items and {m['near_duplicates']} near-duplicates "
              f"({m['dedup']} cosine > {m['threshold']}).",
              f"Near-duplicate calibration at {cal['threshold']}: pixels catch {_pct(cal['pixels']['copies_caught'])}% of "
              f"re-rendered copies and would remove {cal['pixels']['memory_removed']} memory images; the encoder "
              f"embedding catches {_pct(cal['embedding']['copies_caught'])}% and would remove "
              f"{cal['embedding']['memory_removed']}.",
              f"Unchanged by RECO: encoder weights {result['unchanged']['encoder_weights']}, memory gallery files "
              f"{result['unchanged']['memory_gallery']}.", "",
              "Summary: " + json.dumps(result["summary"])]
    return "\n".join(lines)


def write_reco_report(result: dict, out_json: str | Path) -> str:
    """Write ``out_json`` and its tables beside it (``.md``); returns the tables (what the command shows)."""
    out_json = Path(out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_json, json.dumps(result, indent=2, default=str))
    tables = format_reco_tables(result)
    out_json.with_suffix(".md").write_text("# RECO benchmark\n\n" + tables + "\n")
    return tables


#: how ``bench reco`` reports: the JSON and its tables beside it (``.md``)
REPORT = Report(write_reco_report)
