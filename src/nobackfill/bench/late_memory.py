"""Peak memory and time of naive against streamed CMLI (``bench late``'s memory table), each
measurement in a fresh process so that its peak RSS is its own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Callable

import numpy as np

from ..memory import peak_rss_mb, reset_peak_rss, rss_mb


def memory_worker(impl: str, batch: int, n: int, m: int, d: int, chunk: int, repeats: int) -> dict:
    """Run in a fresh process: peak RSS rise and median time of one ``B x B`` CMLI call."""
    import torch

    from ..late.cmli import cmli_scores, cmli_scores_naive

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(batch, n, d, generator=gen), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(batch, m, d, generator=gen), dim=-1)
    img_mask = torch.ones(batch, n, dtype=torch.bool)
    txt_mask = torch.arange(m)[None, :] < torch.randint(m // 2, m + 1, (batch, 1), generator=gen)

    def call(k: int):
        with torch.no_grad():
            if impl == "naive":
                return cmli_scores_naive(img[:k], img_mask[:k], txt[:k], txt_mask[:k])
            return cmli_scores(img[:k], img_mask[:k], txt[:k], txt_mask[:k], image_chunk=chunk, text_chunk=chunk)

    call(4)  # warm-up: kernels, allocator
    reset_peak_rss()  # the high-water mark back to the current RSS
    base = rss_mb()
    out = call(batch)
    peak = peak_rss_mb()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call(batch)
        times.append(time.perf_counter() - t0)
    return {"impl": impl, "batch": batch, "peak_mb": round(peak - base, 2),
            "seconds": float(np.median(times)), "checksum": float(out.i2t.sum() + out.t2i.sum())}


def measure_memory(cfg, log: Callable[[str], None] = print) -> list[dict]:
    """Naive vs streamed CMLI at each batch size, each measurement in a fresh subprocess."""
    n, m, d = cfg.memory_shape
    rows = []
    for b in cfg.memory_batches:
        res = {}
        for impl in ("naive", "stream"):
            code = ("import json,sys; from nobackfill.bench.late_memory import memory_worker; "
                    f"print(json.dumps(memory_worker({impl!r}, {b}, {n}, {m}, {d}, {cfg.memory_chunk}, "
                    f"{cfg.memory_repeats})))")
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
            if p.returncode != 0:
                raise RuntimeError(f"memory worker ({impl}, batch {b}) failed:\n{p.stderr[-2000:]}")
            res[impl] = json.loads(p.stdout.strip().splitlines()[-1])
        if not math.isclose(res["naive"]["checksum"], res["stream"]["checksum"], rel_tol=1e-4, abs_tol=1e-2):
            raise RuntimeError(f"naive and streamed CMLI disagree at batch {b}: {res}")
        row = {"batch": b, "naive_mb": res["naive"]["peak_mb"], "stream_mb": res["stream"]["peak_mb"],
               "naive_s": round(res["naive"]["seconds"], 4), "stream_s": round(res["stream"]["seconds"], 4)}
        row["memory_ratio"] = round(row["naive_mb"] / max(row["stream_mb"], 1e-3), 1)
        row["time_ratio"] = round(row["stream_s"] / max(row["naive_s"], 1e-9), 2)
        log(f"memory batch {b}: naive {row['naive_mb']} MB {row['naive_s']} s, stream {row['stream_mb']} MB "
            f"{row['stream_s']} s")
        rows.append(row)
    return rows
