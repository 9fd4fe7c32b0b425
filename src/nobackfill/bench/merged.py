"""``nobackfill bench merged``: query encoding with an upgrade's adapters merged into the weights
(what the Searcher serves) against the switchable, unmerged upgrade: equal outputs (max abs
difference over the compared captions and, for image upgrades, images) and the time of one text
query (1 thread)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class MergedBenchConfig:
    """Where the models, upgrades and world are, how many val captions (and their images) are
    compared, and how many timed queries per encoder."""

    world: Path = Path("data/world")
    models: Path = Path("models")
    upgrades: Path = Path("upgrades")
    n_compared: int = 200
    repeats: int = 200


def _time_query(enc, query: list[str], n: int) -> float:
    enc.encode_texts(query)  # warm-up
    t0 = time.perf_counter()
    for _ in range(n):
        enc.encode_texts(query)
    return (time.perf_counter() - t0) / n * 1000


def run_merged_bench(cfg: MergedBenchConfig) -> dict:
    """Per shipped upgrade (world XBT, text XBT): unmerged and merged ms per text query, the speed-up
    and the largest output difference."""
    import torch

    from ..compat.upgrade import load_upgrade
    from ..encoders import load_encoder
    from ..encoders.minilm import MiniLMTextEncoder
    from ..evaluate import load_eval_data

    torch.set_num_threads(1)
    ds = load_eval_data(cfg.world, "val", langs=["en"], limit=cfg.n_compared)
    query = ds.captions[:1]
    cases = {"world XBT upgrade (world-old-to-new)": load_upgrade(cfg.upgrades / "world-old-to-new").apply(
                 load_encoder(cfg.models / "world-new")),
             "text XBT upgrade (m30k-old-text-to-minilm)": load_upgrade(cfg.upgrades / "m30k-old-text-to-minilm").apply(
                 MiniLMTextEncoder.pretrained())}
    rows = {}
    for name, up in cases.items():
        merged = up.merged()
        diff = float(np.abs(up.encode_texts(ds.captions) - merged.encode_texts(ds.captions)).max())
        if "image" in up.modalities:
            imgs = ds.image_paths()
            diff = max(diff, float(np.abs(up.encode_images(imgs) - merged.encode_images(imgs)).max()))
        un_ms, m_ms = _time_query(up, query, cfg.repeats), _time_query(merged, query, cfg.repeats)
        rows[name] = {"unmerged_ms": round(un_ms, 3), "merged_ms": round(m_ms, 3), "speedup": round(un_ms / m_ms, 2),
                      "max_abs_diff": diff}
    return {"rows": rows, "threads": 1, "repeats": cfg.repeats, "query": query[0], "n_compared": len(ds.captions)}


def format_markdown(result: dict) -> str:
    lines = ["| upgrade | unmerged ms / text query | merged ms | speed-up | max abs difference |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {r['unmerged_ms']} | {r['merged_ms']} | {r['speedup']}x | {r['max_abs_diff']:.1e} |"
              for k, r in result["rows"].items()]
    return "\n".join(lines) + "\n"


__all__ = ["MergedBenchConfig", "format_markdown", "run_merged_bench"]
