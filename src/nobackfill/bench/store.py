"""``nobackfill bench store``: vector storage backends at scale, through the collections' own stores.

Data (unit vectors; queries are held out of the gallery):

* ``minilm`` - real all-MiniLM-L6-v2 embeddings (384-d) of Multi30K task 2 train captions; beyond
  the real count, rows are copies with small Gaussian noise (sigma 0.01 per dimension, renormalised;
  cosine about 0.98 to their source). Queries: Multi30K val captions.
* ``world`` - ``world-new`` embeddings (128-d) of the world's train captions and images, tiled the
  same way. Queries: world test captions.
* ``random`` - uniform random unit vectors (128-d): the worst case for graph indexes, unlike real
  embeddings.

Backends: the local FAISS store (:class:`~nobackfill.gallery.gallery.Gallery` over faiss factory
strings: ``Flat``, ``HNSW32``, ``IVF<n>,PQ<m>``), milvus-lite and a real Milvus standalone server
(:class:`~nobackfill.milvus.MilvusSpaceStore`). Each (data, backend) runs in its own process
(peak RSS is that process's, the vectors it holds included). Per row: ingest rows/s, build seconds,
search p50 / p99 ms for one query, ms per batch of 64, recall@10 against exact search. Search
parameters (``efSearch``, ``nprobe``) are the smallest of a grid reaching recall@10 >= 0.95 on
VALIDATION queries; latency and recall are reported on the other (test) queries.

Merged: the :class:`~nobackfill.search.Searcher` over a collection holding N items split between
two spaces (an identity bridge joins them) against one holding them in one space: per-query p50.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..memory import peak_rss_mb

from .store_config import StoreBenchConfig
from .store_data import K, exact_top, make_data, recall_at
from .store_merged import merged_search

GRIDS = {"efSearch": (16, 32, 64, 128, 256, 512, 1024), "nprobe": (1, 2, 4, 8, 16, 32, 64, 128)}
TARGET_RECALL = 0.95


# ----------------------------------------------------------------------------- one row (own process)
def _open_store(backend: str, dim: int, work: Path, server: str | None):
    """(store, spec, search-parameter name or None) for ``backend`` = ``<kind>:<index>``."""
    kind, _, spec = backend.partition(":")
    if kind == "faiss":
        from ..gallery.gallery import Gallery

        shutil.rmtree(work, ignore_errors=True)
        g = Gallery.create(work, space_id="bench", dim=dim, model="bench", backend=spec)
        param = "efSearch" if spec.startswith("HNSW") else "nprobe" if spec.startswith("IVF") else None
        return g, spec, param
    from ..milvus import MilvusSpaceStore, _client

    if kind == "milvus-lite":
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        client = _client("milvus-lite", {"path": str(work / "m.db")})
    elif kind == "milvus-server":
        if not server:
            raise RuntimeError("no Milvus server")
        client = _client("milvus", {"uri": f"http://{server}", "db": "default"})
    else:
        raise ValueError(f"unknown backend {backend!r}")
    name = f"bench_{abs(hash((backend, dim, str(work)))) % 10**8}"
    if client.has_collection(name):
        client.drop_collection(name)
    milvus_spec = "flat" if spec.upper() == "FLAT" else spec
    store = MilvusSpaceStore.create(client, name, space_id="bench", dim=dim, model="bench", backend=milvus_spec)
    return store, spec, ("ef" if spec.upper().startswith("HNSW") else None)


def _set_param(store: Any, param: str, value: int) -> None:
    if hasattr(store, "_search_params"):  # Milvus
        store._search_params[param] = value
        return
    with store._lock:
        index, _ = store._index("image")
        if hasattr(index, "ef"):
            index.ef = value
        import faiss

        faiss.ParameterSpace().set_index_parameter(index._index, param, value)


def _search(store: Any, q: np.ndarray, k: int) -> np.ndarray:
    return store.search("image", q, k, space_id="bench").positions


def run_row(data_file: str, query_file: str, truth_file: str, backend: str, work: str, server: str | None,
            n_val: int, batch1: int) -> dict[str, Any]:
    """One (data, backend) row; meant to run in a fresh process (its peak RSS is the row's)."""
    x = np.load(data_file, mmap_mode="r")
    q = np.load(query_file)
    truth = np.load(truth_file)
    qv, qt, tv, tt = q[:n_val], q[n_val:], truth[:n_val], truth[n_val:]
    store, spec, param = _open_store(backend, x.shape[1], Path(work), server)
    n = len(x)
    t0 = time.perf_counter()
    for s in range(0, n, 50_000):
        store.add("image", [str(i) for i in range(s, min(n, s + 50_000))], np.asarray(x[s:s + 50_000]),
                  space_id="bench")
    ingest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if hasattr(store, "wait_indexed"):  # Milvus: seal the segments and wait for their index
        store.wait_indexed()
    _search(store, qt[:1], K)  # the first search builds (faiss: loads or builds the index)
    build_s = time.perf_counter() - t0
    if hasattr(store, "wait_indexed"):  # steady state: past the window of Strong searches after a write
        from ..milvus import FRESH_S

        time.sleep(max(0.0, FRESH_S - (time.perf_counter() - t0)))
    chosen = None
    if param:
        grid = GRIDS["efSearch" if param in ("efSearch", "ef") else "nprobe"]
        for v in grid:
            _set_param(store, param, v)
            chosen = v
            if recall_at(_search(store, qv, K), tv) >= TARGET_RECALL:
                break
    found = _search(store, qt, K)
    rec = recall_at(found, tt)
    lat = []
    for i in range(min(batch1, len(qt))):
        t0 = time.perf_counter()
        _search(store, qt[i:i + 1], K)
        lat.append(1000 * (time.perf_counter() - t0))
    b64 = []
    for s in range(0, min(len(qt), 640), 64):
        t0 = time.perf_counter()
        _search(store, qt[s:s + 64], K)
        b64.append(1000 * (time.perf_counter() - t0))
    return {"backend": backend.split(":")[0].replace("faiss", "faiss"), "index": spec,
            "search_param": {param: chosen} if param else {}, "n": n, "dim": int(x.shape[1]),
            "ingest_per_s": round(n / ingest_s, 1), "ingest_s": round(ingest_s, 2), "build_s": round(build_s, 3),
            "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "batch64_ms": round(float(np.median(b64)), 3), "recall@10": round(rec, 4),
            "rss_mb": round(peak_rss_mb(), 1)}


def _row_in_process(*args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(run_row, args)


# ----------------------------------------------------------------------------- the bench
def run_store_bench(cfg: StoreBenchConfig, log: Callable[[str], None] | None = None,
                    server: str | None = None) -> dict[str, Any]:
    """Every (data, backend) row and the merged-search comparison. ``server``: ``HOST:PORT`` of a
    running Milvus server for the ``milvus-server`` rows (started here when None and possible)."""
    say = log or (lambda _m: None)
    t_all = time.time()
    cfg.work.mkdir(parents=True, exist_ok=True)
    started = None
    if server is None and any(b.startswith("milvus-server") for b in cfg.backends):
        from ..testing.milvus_server import MilvusServerError, start_server

        try:
            started = start_server(cfg.work / f"milvus-server-{os.getpid()}")
            server = started.address
            say(f"Milvus server at {server}")
        except MilvusServerError as e:
            say(f"no Milvus server rows: {e}")
    rows, merged = [], {}
    try:
        for name in cfg.datasets:
            x, q = make_data(name, cfg, say)
            truth = exact_top(x, q)
            files = [str(cfg.work / f"{name}-{part}.npy") for part in ("x", "q", "truth")]
            for f, arr in zip(files, (x, q, truth)):
                np.save(f, arr)
            if name == "minilm":
                m = min(cfg.merged_n, len(x))
                merged = merged_search(x[:m], q, cfg.work / "merged")
                say(f"  merged search over {m} items: one space p50 {merged['one_space']['p50_ms']} ms, two spaces "
                    f"{merged['two_spaces']['p50_ms']} ms (x{merged['ratio_p50']})")
            del x
            for backend in cfg.backends:
                if backend.startswith("milvus-server") and not server:
                    continue
                say(f"  {name} x {backend} (N={cfg.n}) ...")
                try:
                    row = _row_in_process(*files, backend, str(cfg.work / f"store-{name}"), server, cfg.n_val_queries,
                                          cfg.batch1_queries)
                except Exception as e:  # a backend that fails is reported, not fatal
                    say(f"    failed: {type(e).__name__}: {e}")
                    rows.append({"backend": backend.split(":")[0], "index": backend.split(":", 1)[1], "data": name,
                                 "n": cfg.n, "error": f"{type(e).__name__}: {e}"})
                    continue
                row["data"] = name
                rows.append(row)
                say(f"    ingest {row['ingest_per_s']:.0f}/s, build {row['build_s']}s, p50 {row['p50_ms']} ms, p99 "
                    f"{row['p99_ms']} ms, batch64 {row['batch64_ms']} ms, recall@10 {row['recall@10']}, "
                    f"{row['rss_mb']} MB")
    finally:
        if started is not None:
            started.stop()
    return {"rows": rows, "merged": merged, "config": {k: str(v) if isinstance(v, Path) else v
                                                       for k, v in asdict(cfg).items()},
            "machine": {"cpus": os.cpu_count()}, "seconds": round(time.time() - t_all, 1)}


def format_markdown(result: dict[str, Any]) -> str:
    lines = ["| data | backend | index | params | N | dim | ingest rows/s | build s | p50 ms | p99 ms | batch64 ms | "
             "recall@10 | RSS MB |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['data']} | {r['backend']} | {r['index']} | | {r['n']} | | failed: {r['error'][:60]} "
                         "| | | | | | |")
            continue
        params = ",".join(f"{k}={v}" for k, v in r["search_param"].items())
        lines.append(f"| {r['data']} | {r['backend']} | {r['index']} | {params} | {r['n']} | {r['dim']} | "
                     f"{r['ingest_per_s']:.0f} | {r['build_s']} | {r['p50_ms']} | {r['p99_ms']} | {r['batch64_ms']} | "
                     f"{r['recall@10']} | {r['rss_mb']} |")
    m = result.get("merged") or {}
    if m:
        lines += ["", f"Searcher over {m['n']} MiniLM items: one space p50 {m['one_space']['p50_ms']} ms, split between "
                      f"two spaces p50 {m['two_spaces']['p50_ms']} ms (x{m['ratio_p50']})."]
    return "\n".join(lines) + "\n"


__all__ = ["StoreBenchConfig", "exact_top", "format_markdown", "make_data", "merged_search", "run_row",
           "run_store_bench"]
