"""Query encoding with an upgrade's adapters merged into the weights (what the Searcher serves)
against the switchable, unmerged upgrade: equal outputs, and the time of one text query (1 thread).

    python scripts/merged_speedup.py [--out benchmarks/results/merged.json]

Writes JSON and a markdown table beside it (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def _time_query(enc, query: list[str], n: int) -> float:
    enc.encode_texts(query)  # warm-up
    t0 = time.perf_counter()
    for _ in range(n):
        enc.encode_texts(query)
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    from nobackfill.compat.upgrade import load_upgrade
    from nobackfill.encoders import load_encoder
    from nobackfill.encoders.minilm import MiniLMTextEncoder
    from nobackfill.evaluate import load_eval_data
    from nobackfill.report import write_json_and_markdown

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/merged.json"))
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_eval_data("data/world", "val", langs=["en"], limit=200)
    query = ds.captions[:1]
    cases = {"world XBT upgrade (world-old-to-new)": load_upgrade("upgrades/world-old-to-new").apply(
                 load_encoder("models/world-new")),
             "text XBT upgrade (m30k-old-text-to-minilm)": load_upgrade("upgrades/m30k-old-text-to-minilm").apply(
                 MiniLMTextEncoder.pretrained())}
    rows = {}
    for name, up in cases.items():
        merged = up.merged()
        diff = float(np.abs(up.encode_texts(ds.captions) - merged.encode_texts(ds.captions)).max())
        if "image" in up.modalities:
            imgs = ds.image_paths()
            diff = max(diff, float(np.abs(up.encode_images(imgs) - merged.encode_images(imgs)).max()))
        un_ms, m_ms = _time_query(up, query, args.repeats), _time_query(merged, query, args.repeats)
        rows[name] = {"unmerged_ms": round(un_ms, 3), "merged_ms": round(m_ms, 3), "speedup": round(un_ms / m_ms, 2),
                      "max_abs_diff": diff}
    result = {"rows": rows, "threads": 1, "repeats": args.repeats, "query": query[0], "n_compared": len(ds.captions)}
    lines = ["| upgrade | unmerged ms / text query | merged ms | speed-up | max abs difference |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {r['unmerged_ms']} | {r['merged_ms']} | {r['speedup']}x | {r['max_abs_diff']:.1e} |"
              for k, r in rows.items()]
    print(write_json_and_markdown(result, args.out, "\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()
