"""World generation throughput: how long ``generate_world`` takes for N items (images + captions
in every language), written to a scratch folder that is deleted afterwards."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..data.world import WorldSpec, generate_world
from .runner import Report


@dataclass
class WorldBenchConfig:
    """``bench world``'s settings: train items to generate, worker processes, world seed."""

    n: int = 50000
    workers: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1 or self.workers < 1:
            raise ValueError("n and workers must be >= 1")


def run_world_bench(n_items: int = 50000, workers: int = 2, seed: int = 0,
                    scratch: str | Path | None = None) -> dict:
    """Generate ``n_items`` train items (no val/test) and report items/s."""
    spec = WorldSpec(seed=seed, n_train=n_items, n_val=0, n_test=0)
    root = Path(tempfile.mkdtemp(prefix="nobackfill-world-bench-", dir=scratch))
    try:
        t0 = time.perf_counter()
        generate_world(root / "world", spec, workers=workers, progress=False)
        seconds = time.perf_counter() - t0
        n_captions = sum(1 for _ in open(root / "world" / "train" / "captions.jsonl"))
        size_mb = sum(f.stat().st_size for f in (root / "world").rglob("*") if f.is_file()) / 2**20
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"n_items": n_items, "n_captions": n_captions, "languages": list(spec.langs), "workers": workers,
            "seconds": round(seconds, 2), "items_per_s": round(n_items / seconds, 1),
            "disk_mb": round(size_mb, 1), "spec": asdict(spec)}


def format_markdown(result: dict) -> str:
    """One table row: items, captions, languages, processes, seconds, items/s, disk."""
    r = result
    return ("| items | captions | languages | processes | seconds | items/s | disk MB |\n"
            "|---:|---:|---:|---:|---:|---:|---:|\n"
            f"| {r['n_items']:,} | {r['n_captions']:,} | {len(r['languages'])} | {r['workers']} | {r['seconds']} | "
            f"{r['items_per_s']:,} | {r['disk_mb']} |\n")


def write_report(result: dict, json_path: Path) -> str:
    """The JSON and its one-row table beside it (``.md``); returns a line saying what was generated."""
    from ..report import write_json_and_markdown

    r = result
    write_json_and_markdown(r, json_path, format_markdown(r))
    return (f"{r['n_items']} items ({r['n_captions']} captions, {len(r['languages'])} languages) "
            f"in {r['seconds']} s = {r['items_per_s']} items/s, {r['disk_mb']} MB")


REPORT = Report(write_report)
