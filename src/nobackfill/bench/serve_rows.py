"""The rows ``nobackfill bench serve`` measures beside its load test: the service idle against the
floor (:mod:`.serve_latency`) on a plain world-old collection of the test split, and the query
encoder on torch against ONNX Runtime (:mod:`.serve_encoders`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .serve_inputs import READ_KEY
from .serve_latency import ServerProcess, search_load


#: turns of each load against the service and the floor, taken alternately
ROUNDS = 3


def _median_run(runs: list[dict]) -> dict:
    """One row from several turns of the same load: the median p50 / p99 / req/s, the summed counts."""
    med = lambda key: round(float(np.median([r[key] for r in runs if r[key] is not None])), 2)  # noqa: E731
    return {"concurrency": runs[0]["concurrency"], "requests": sum(r["requests"] for r in runs),
            "errors": sum(r["errors"] for r in runs), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "rps": med("rps"), "turns": len(runs)}


def idle_against_floor(cfg: Any, ev: Any, texts: Sequence[str], keys: Path, say: Callable[[str], None]) -> dict:
    """Text searches only, at concurrency 1 and 8, against ``nobackfill serve`` of a world-old
    collection of ``ev``'s items (idle: one space, nothing committing; no query cache) and against the
    floor: the same encoder and an exact faiss index of the same image vectors behind one FastAPI route."""
    from ..search import ModelPool
    from ..search.models import model_ref
    from .world_collection import embedded_collection

    ref = model_ref(cfg.models / "world-old")
    plain = embedded_collection(cfg.work / "plain", ModelPool(), ref, ev.items, say)
    vectors = cfg.work / "plain-images.npy"
    np.save(vectors, plain.gallery(plain.current_space).vectors("image"))
    # the query cache off: the floor has none, and a repeated query would be answered without its parts
    servers = {"idle": ServerProcess(plain.path, keys, Path.cwd(), options=["--query-cache", "0"]),
               "floor": ServerProcess(command=[sys.executable, "-m", "nobackfill.bench.serve_latency", ref,
                                               str(vectors)])}
    runs: dict[str, list[dict]] = {}
    try:
        for server in servers.values():
            server.start()
        # both up at once, measured in turns (ours, the floor, ours, ...): a shared machine's slow
        # minute falls on both; each row is the median of its turns
        for _ in range(ROUNDS):
            for name, server in servers.items():
                key = READ_KEY if name == "idle" else None
                for c, n in ((1, cfg.latency_requests), (8, 3 * cfg.latency_requests)):
                    runs.setdefault(f"{name}_c{c}", []).append(
                        search_load(server.url, texts, key=key, concurrency=c, requests=max(1, n // ROUNDS)))
    finally:
        for server in servers.values():
            server.stop()
    out: dict[str, Any] = {k: _median_run(v) for k, v in runs.items()}
    for name in servers:
        say(f"  {name}: c1 p50 {out[f'{name}_c1']['p50_ms']} ms, c8 {out[f'{name}_c8']['rps']} req/s "
            f"(medians of {ROUNDS} turns)")
    out["c1_p50_over_floor"] = round(out["idle_c1"]["p50_ms"] / out["floor_c1"]["p50_ms"], 2)
    out["c8_rps_over_floor"] = round(out["idle_c8"]["rps"] / out["floor_c8"]["rps"], 2)
    return out


def encoder_rows(cfg: Any, texts: Sequence[str], say: Callable[[str], None]) -> dict[str, Any]:
    """The B/32-sized text tower on torch and ONNX Runtime, and int8's effect on R@1."""
    from ..data.multi30k import default_multi30k_dir
    from .serve_encoders import int8_recall, tower_speed

    work = cfg.work / "encoders"
    speed = tower_speed(cfg.models, texts, work)
    say(f"  text tower (B/32 shapes) batch 1: torch {speed['torch']['batch_1_ms_per_query']} ms, ONNX fp32 "
        f"{speed['onnx_fp32']['batch_1_ms_per_query']} ms, int8 {speed['onnx_int8']['batch_1_ms_per_query']} ms")
    recall = int8_recall(cfg.models, cfg.world, cfg.multi30k or default_multi30k_dir(), work)
    say(f"  int8 R@1 change: world t2i {recall['world_t2i']['int8_minus_torch']:+}, Multi30K val "
        f"{recall['multi30k_val_t2t']['int8_minus_torch']:+}")
    return {"speed": speed, "int8_recall": recall}


def latency_markdown(lat: dict[str, Any]) -> str:
    rows = [("idle_c1", "nobackfill serve, idle (world-old, one space, no query cache)"),
            ("idle_c8", "nobackfill serve, idle"),
            ("floor_c1", "floor: same encoder + faiss behind one FastAPI route"), ("floor_c8", "floor"),
            ("upgraded_idle_c1", "nobackfill serve, upgraded (two spaces), idle"),
            ("during_backfill_c1", "nobackfill serve, upgraded, during a backfill")]
    lines = ["| text searches only | concurrency | requests | errors | p50 ms | p99 ms | req/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, label in rows:
        if key in lat:
            r = lat[key]
            lines.append(f"| {label} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['p50_ms']} | "
                         f"{r['p99_ms']} | {r['rps']} |")
    lines.append(f"\nIdle p50 at concurrency 1: {lat['c1_p50_over_floor']}x the floor's; req/s at concurrency 8: "
                 f"{lat['c8_rps_over_floor']}x the floor's (the service and the floor up at once, measured in "
                 f"turns; each idle and floor row the median of {ROUNDS} turns).\n")
    return "\n".join(lines) + "\n"


__all__ = ["encoder_rows", "idle_against_floor", "latency_markdown"]
