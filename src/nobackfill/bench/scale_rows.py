"""The rows of ``bench scale`` (see :mod:`nobackfill.bench.scale`), each meant to run in a fresh
process: the writer (create + add + build the index), the reader (open, search, filtered search,
search during a backfill) and the backfill worker it starts."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..memory import peak_rss_mb, rss_mb

K = 10


def lookup_encoder(x: np.ndarray, q: np.ndarray, space_id: str):
    """A stand-in text model: ``g<i>`` -> gallery row i, ``q<j>`` -> query j."""
    from ..encoders.base import DualEncoder

    class Lookup(DualEncoder):
        kind = "lookup"
        modalities = ("text",)

        @property
        def embed_dim(self) -> int:
            return int(x.shape[1])

        @property
        def space_id(self) -> str:
            return space_id

        def encode_texts(self, texts, batch_size=256, progress=False):
            if len(texts) == 1 and texts[0][0] == "q":  # one query: a view of its row, no copy
                j = int(texts[0][1:])
                return q[j:j + 1]
            if all(t[0] == "g" for t in texts):  # gallery rows: one read of the (memory-mapped) vectors
                return np.asarray(x[[int(t[1:]) for t in texts]], np.float32)
            return np.stack([x[int(t[1:])] if t[0] == "g" else q[int(t[1:])] for t in texts]).astype(np.float32)

        def encode_images(self, images, batch_size=128, progress=False):
            raise NotImplementedError("a lookup encoder embeds texts only")

        def save(self, directory):
            raise NotImplementedError("a lookup encoder is not saved")

    return Lookup()


def bridge_dir(x_file: str, path: str) -> Path:
    """Where a row's upgrade is written: beside the vectors in the work directory (never derived
    from the collection's location, which may be a URI)."""
    import hashlib

    return Path(x_file).parent / f"bridge-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pct(lat: list[float], p: float) -> float:
    return round(float(np.percentile(lat, p)), 3)


# ----------------------------------------------------------------------------- rows (own processes)
def write_collection(x_file: str, q_file: str, path: str, index: str, model: str, space_id: str,
                     chunk: int) -> dict[str, Any]:
    """Create the collection and add every row of ``x_file`` (a fresh process) as precomputed
    vectors (:func:`~nobackfill.adopt.importing.add_vectors`, what ``collection import`` runs);
    each item's source is ``g<row>``, which the lookup model embeds again for the backfill."""
    from ..collection.collection import Collection
    from ..adopt.importing import add_vectors

    x = np.load(x_file, mmap_mode="r")
    shutil.rmtree(path, ignore_errors=True)
    c = Collection.create(path, space_id=space_id, dim=int(x.shape[1]), model=model, modalities=["text"],
                          backend=index)
    t0 = time.perf_counter()
    for s in range(0, len(x), chunk):
        rows = range(s, min(len(x), s + chunk))
        add_vectors(c, [f"i{i}" for i in rows], x[s:s + len(rows)], modality="text",
                    sources=[{"text": f"g{i}"} for i in rows], metadata=[{"group": i % 10} for i in rows])
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = c.gallery(space_id)
    out: dict[str, Any] = {}
    if hasattr(g, "build_index"):
        g.build_index()  # readers open a cached index
    else:  # Milvus: sealed and indexed before readers come
        g.flush()
        g.wait_indexed()
    out["index_build_s"] = round(time.perf_counter() - t0, 2)
    if hasattr(g, "client"):  # Milvus: pymilvus' own insert of the same vectors, into a scratch collection
        out["raw_insert_per_s"] = round(len(x) / raw_milvus_insert(g.client, x, g.name + "_raw"), 1)
    return {"add_per_s": round(len(x) / add_s, 1), "add_s": round(add_s, 2), **out}


def raw_milvus_insert(client: Any, x: np.ndarray, name: str, batch: int = 20_000) -> float:
    """Seconds pymilvus takes to insert the rows of ``x`` (string keys ``i<row>``) into a new
    collection ``name`` of the same key and vector fields (``MilvusClient.insert``, ``batch`` rows a
    call, as its users write it); the collection is dropped afterwards."""
    from pymilvus import DataType

    if client.has_collection(name):
        client.drop_collection(name)
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=int(x.shape[1]))
    client.create_collection(name, schema=schema)
    try:
        t0 = time.perf_counter()
        for s in range(0, len(x), batch):
            part = np.asarray(x[s:s + batch], np.float32)
            client.insert(name, [{"key": f"i{s + i}", "vec": v} for i, v in enumerate(part.tolist())])
        return time.perf_counter() - t0
    finally:
        client.drop_collection(name)


def _backfill_worker(x_file: str, q_file: str, path: str, space_id: str, rate: int, limit: int) -> None:
    """Backfill into the lookup space ``space_id`` at ``rate`` items/s, one batch a second."""
    from ..collection.collection import Collection
    from ..lifecycle.backfill import run_backfill

    x = np.load(x_file, mmap_mode="r")
    q = np.load(q_file)
    c = Collection.open(path)
    run_backfill(c, lookup_encoder(x, q, space_id), order="sequential", batch_size=rate, rate=rate, limit=limit)


def _paired_latencies(ours: Callable[[int], Any], raw: Callable[[int], Any], n: int,
                      passes: int = 2) -> tuple[list[float], list[float]]:
    """Milliseconds per query of ``ours`` and of ``raw`` over the same ``n`` queries, measured in the
    same cache state: one unmeasured pass first (every query's part of the index touched once),
    then ``passes`` rounds of a pass of each, alternating, so neither is measured on caches the
    other warmed for it."""
    for j in range(n):
        raw(j)
    lat: list[float] = []
    raw_lat: list[float] = []
    for _ in range(passes):
        for fn, out in ((ours, lat), (raw, raw_lat)):
            for j in range(n):
                t1 = time.perf_counter()
                fn(j)
                out.append(1000 * (time.perf_counter() - t1))
    return lat, raw_lat


def read_collection(x_file: str, q_file: str, path: str, model: str, space_id: str, rate: int,
                    seconds: float, filtered_queries: int = 100) -> dict[str, Any]:
    """Open, search (Searcher and raw index), filtered search, then search during a backfill (a
    fresh process: ``open_s`` and memory are a reader's)."""
    import faiss  # imported before the memory baseline is read

    from ..compat.bridges import ProcrustesBridge
    from ..compat.upgrade import save_vector_upgrade
    from ..collection.collection import Collection
    from ..search import ModelPool, Searcher
    from ..lifecycle.plan_changes import upgrade_collection

    x = np.load(x_file, mmap_mode="r")
    q = np.load(q_file)
    base_mb = rss_mb()
    t0 = time.perf_counter()
    c = Collection.open(path)
    open_s = time.perf_counter() - t0
    pool = ModelPool()
    pool.put(model, lookup_encoder(x, q, space_id))
    s = Searcher(c, pool=pool)
    s.search(text="q0", k=K)
    first_s = time.perf_counter() - t0
    g = c.gallery(space_id)
    local = hasattr(g, "_index")
    if local:
        with g._lock:
            raw = g._index("text")._index
        raw_search = lambda v: raw.search(v, K)  # noqa: E731 - the faiss index itself
    else:  # pymilvus' own search of the same collection (Bounded: no wait for the server's time tick)
        params = {"metric_type": g.metric, "params": dict(g._search_params)}
        raw_search = lambda v: g.client.search(g.name, data=v.tolist(), limit=K, anns_field="vec",  # noqa: E731
                                               search_params=params, partition_names=["text"],
                                               output_fields=["key"], consistency_level="Bounded")
    # six rounds on a local index (a second in all): the machine's speed moves between rounds, and
    # more of them average it out of the ratio; two on a server, where a search takes milliseconds
    lat, raw_lat = _paired_latencies(lambda j: s.search(text=f"q{j}", k=K), lambda j: raw_search(q[j:j + 1]), len(q),
                                     passes=6 if local else 2)
    flt = []
    for j in range(min(len(q), filtered_queries)):  # the filter runs in the catalog's database
        t1 = time.perf_counter()
        s.search(text=f"q{j}", k=K, filter={"group": 3})
        flt.append(1000 * (time.perf_counter() - t1))
    rss_now = rss_mb()
    index_mb = len(faiss.serialize_index(raw)) / 2**20 if local else 0.0
    vector_mb = x.nbytes / 2**20 if local else 0.0  # Milvus holds them in its own process
    # the index holds the vectors (Flat, HNSW...): a reader keeps no other copy of them (the stored
    # chunks are read only to build an index that is not cached)
    extra = rss_now - base_mb - index_mb
    row = {"open_s": round(open_s, 3), "open_first_search_s": round(first_s, 3), "p50_ms": pct(lat, 50),
           "p99_ms": pct(lat, 99), "raw_p50_ms": pct(raw_lat, 50), "filtered_p50_ms": pct(flt, 50),
           "rss_extra_mb": round(extra, 1), "index_mb": round(index_mb, 1), "vector_mb": round(vector_mb, 1)}
    # the upgrade to a second lookup space (identity bridge: nothing re-embedded), then a backfill
    new_sid = space_id + "-b"
    new_model = model + "#b"
    pool.put(new_model, lookup_encoder(x, q, new_sid))
    dim = int(x.shape[1])
    up = save_vector_upgrade(bridge_dir(x_file, path),
                             ProcrustesBridge(np.eye(dim, dtype=np.float32), new_sid, space_id),
                             {"space_id": new_sid, "name": "b", "embed_dim": dim},
                             {"space_id": space_id, "name": "a", "embed_dim": dim})
    upgrade_collection(c, new_model, bridges=[up], pool=pool)
    s = Searcher(c, pool=pool)
    s.search(text="q0", k=K)
    idle = []
    for j in range(len(q)):
        t1 = time.perf_counter()
        s.search(text=f"q{j}", k=K)
        idle.append(1000 * (time.perf_counter() - t1))
    ctx = mp.get_context("spawn")
    limit = int(rate * seconds)
    worker = ctx.Process(target=_backfill_worker, args=(x_file, q_file, path, new_sid, rate, limit))
    worker.start()
    def backfilled() -> int:  # rows the worker has committed to the new space so far (the catalog's count)
        return c.snapshot().views("text")[new_sid].count

    t_wait = time.perf_counter() + 600.0  # the worker opens the collection first (seconds at 1M)
    while worker.is_alive() and backfilled() == 0 and time.perf_counter() < t_wait:
        s.search(text="q0", k=K)  # the reader goes on meanwhile; measured from the first commit on
    during, seen = [], set()
    j = 0
    while worker.is_alive() and backfilled() < limit:
        t1 = time.perf_counter()
        s.search(text=f"q{j % len(q)}", k=K)
        during.append(1000 * (time.perf_counter() - t1))
        seen.add(backfilled())
        j += 1
    worker.join(timeout=120)
    if worker.is_alive():
        worker.terminate()
    after = []  # the same two spaces, nothing committing: what the backfill's commits add to a search
    for j in range(2 * len(q)):
        t1 = time.perf_counter()
        s.search(text=f"q{j % len(q)}", k=K)
        after.append(1000 * (time.perf_counter() - t1))
    row.update({"p50_upgraded_idle_ms": pct(idle, 50),
                "p50_during_backfill_ms": pct(during, 50) if during else None,
                "p50_backfilled_idle_ms": pct(after, 50),
                "searches_during_backfill": len(during), "backfill_commits_seen": len(seen),
                "backfilled_rows": backfilled(), "reader_peak_rss_mb": round(peak_rss_mb(), 1)})
    return row
