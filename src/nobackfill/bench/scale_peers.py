"""The peers of ``bench scale`` where installed (optional, never dependencies): Chroma and LanceDB
on the same vectors, each in its own process: add, reopen + first query, p50, RSS."""

from __future__ import annotations

import shutil
import time
from typing import Any

import numpy as np

from ..memory import rss_mb
from .scale_rows import K, pct

def chroma_row(x_file: str, q_file: str, path: str) -> dict[str, Any]:
    """Chroma (SQLite + HNSW segments) on the same vectors: add, reopen, p50, RSS."""
    import chromadb

    x = np.load(x_file, mmap_mode="r")
    q = np.load(q_file)
    shutil.rmtree(path, ignore_errors=True)
    base = rss_mb()
    client = chromadb.PersistentClient(path=path)
    col = client.create_collection("bench", metadata={"hnsw:space": "ip"})
    t0 = time.perf_counter()
    step = 5_000
    for s in range(0, len(x), step):
        col.add(ids=[f"i{i}" for i in range(s, min(len(x), s + step))], embeddings=np.asarray(x[s:s + step]))
    add_s = time.perf_counter() - t0
    del client, col
    t0 = time.perf_counter()
    col = chromadb.PersistentClient(path=path).get_collection("bench")
    col.query(query_embeddings=q[:1], n_results=K)
    open_s = time.perf_counter() - t0
    lat = []
    for j in range(len(q)):
        t1 = time.perf_counter()
        col.query(query_embeddings=q[j:j + 1], n_results=K)
        lat.append(1000 * (time.perf_counter() - t1))
    return {"name": "chroma", "n": len(x), "add_per_s": round(len(x) / add_s, 1), "open_s": round(open_s, 3),
            "p50_ms": pct(lat, 50), "rss_extra_mb": round(rss_mb() - base - x.nbytes / 2**20, 1)}


def lancedb_row(x_file: str, q_file: str, path: str) -> dict[str, Any]:
    """LanceDB (one table, its default search: no ANN index is built) on the same vectors: add,
    reopen, p50, RSS."""
    import lancedb
    import pyarrow as pa

    x = np.load(x_file, mmap_mode="r")
    q = np.load(q_file)
    shutil.rmtree(path, ignore_errors=True)
    base = rss_mb()
    db = lancedb.connect(path)
    dim = int(x.shape[1])
    t0 = time.perf_counter()
    table = None
    step = 50_000
    for s in range(0, len(x), step):
        rows = np.asarray(x[s:s + step])
        data = pa.table({"id": [f"i{i}" for i in range(s, s + len(rows))],
                         "vector": pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), dim)})
        table = db.create_table("bench", data) if table is None else table
        if s:
            table.add(data)
    add_s = time.perf_counter() - t0
    del db, table
    t0 = time.perf_counter()
    table = lancedb.connect(path).open_table("bench")
    table.search(q[0]).limit(K).to_list()
    open_s = time.perf_counter() - t0
    lat = []
    for j in range(len(q)):
        t1 = time.perf_counter()
        table.search(q[j]).limit(K).to_list()
        lat.append(1000 * (time.perf_counter() - t1))
    return {"name": "lancedb", "n": len(x), "add_per_s": round(len(x) / add_s, 1), "open_s": round(open_s, 3),
            "p50_ms": pct(lat, 50), "rss_extra_mb": round(rss_mb() - base - x.nbytes / 2**20, 1)}


PEERS = {"chroma": ("chromadb", chroma_row), "lancedb": ("lancedb", lancedb_row)}
