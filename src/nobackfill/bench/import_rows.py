"""The throughput rows of ``bench import`` (:mod:`nobackfill.bench.importing`): N random unit
vectors in an ``.npy`` with a parquet table, opened and imported (trusted, backend ``Flat``) in a
fresh process; then, with a model of their width under ``models``, the ``collection import`` and
``collection index`` commands on the same rows (:mod:`.import_cli`)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .import_cli import command_rows, model_of_width
from .import_data import unit_rows
from .scale import _in_process

if TYPE_CHECKING:
    from .import_config import ImportBenchConfig

#: the space of the throughput rows' stand-in model
THROUGHPUT_SPACE = "bench-import-128d"


def _standin_encoder(dim: int, space_id: str) -> Any:
    """A model stand-in of width ``dim`` in ``space_id`` (a trusted import embeds nothing)."""
    from ..encoders.base import DualEncoder

    class StandIn(DualEncoder):
        kind = "stand-in"
        modalities = ("image", "text")
        name = "bench-import stand-in"

        @property
        def embed_dim(self) -> int:
            return int(dim)

        @property
        def space_id(self) -> str:
            return space_id

        def encode_texts(self, texts, batch_size=256, progress=False):
            raise NotImplementedError("the stand-in embeds nothing (the import trusts the vectors)")

        def encode_images(self, images, batch_size=128, progress=False):
            raise NotImplementedError("the stand-in embeds nothing (the import trusts the vectors)")

        def save(self, directory):
            raise NotImplementedError("the stand-in is not saved")

    return StandIn()


def write_rows(folder: Path, n: int, dim: int, seed: int, chunk: int = 65536) -> tuple[Path, Path]:
    """``n`` random unit float32 vectors (``emb.npy``, written chunk by chunk) and their parquet
    table ``meta.parquet``: ``id``, ``image_path`` (a missing file on even rows, a url on odd rows)
    and ``group`` (metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    npy, table = folder / "emb.npy", folder / "meta.parquet"
    out = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float32, shape=(n, dim))
    rng = np.random.default_rng(seed)
    schema = pa.schema([("id", pa.string()), ("image_path", pa.string()), ("group", pa.int64())])
    with pq.ParquetWriter(str(table), schema) as writer:
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            out[s:s + m] = unit_rows(rng.standard_normal((m, dim), dtype=np.float32))
            rows = range(s, s + m)
            writer.write_table(pa.table({
                "id": [f"r{i:08d}" for i in rows],
                "image_path": [f"images/{i:08d}.jpg" if i % 2 == 0 else f"https://example.com/img/{i}.jpg"
                               for i in rows],
                "group": [i % 10 for i in rows]}, schema=schema))
    out.flush()
    del out
    return npy, table


def python_loop_s(n: int = 10_000_000) -> float:
    """Seconds of ``n`` additions in a Python loop: how fast this machine runs Python at this
    moment (a shared VM's speed moves by up to 2x from minute to minute), so that rows/s of runs at
    different moments can be told apart."""
    t0 = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return round(time.perf_counter() - t0, 3)


def throughput_row(npy: str, table: str, path: str, dim: int, space_id: str, batch_rows: int) -> dict[str, Any]:
    """Open and import the rows (runs in a fresh process: its memory is the import's)."""
    import resource

    from ..adopt.importing import import_source
    from ..adopt.sources import open_source
    from ..memory import peak_rss_mb, rss_mb

    loop_s = python_loop_s()
    enc = _standin_encoder(dim, space_id)
    base = rss_mb()

    def cpu(who: int) -> float:
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    cpu0, children0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    src = open_source(f"npy:{npy}", table=table, id_column="id", source_column="image_path", modality="image",
                      batch_rows=batch_rows, expect_dim=dim)
    open_s = time.perf_counter() - t0
    rep = import_source(path, src, enc, model="bench-import-stand-in", trust_model=True, backend="Flat",
                        progress=False)
    seconds = time.perf_counter() - t0
    # CPU seconds of the import's threads and of its catalog worker (a child process, waited for):
    # near the wall time each, the two cores are both busy
    cpu_s, worker_cpu_s = cpu(resource.RUSAGE_SELF) - cpu0, cpu(resource.RUSAGE_CHILDREN) - children0
    # the import's peak and its catalog worker's (when it committed in one), added: an upper bound
    # of what the two held at once
    return {"items": rep.items, "added": rep.added, "seconds": round(seconds, 3), "open_s": round(open_s, 3),
            "base_rss_mb": round(base, 1), "peak_rss_mb": round(peak_rss_mb() + rep.commit_worker_peak_rss_mb, 1),
            "worker_peak_rss_mb": rep.commit_worker_peak_rss_mb, "python_loop_s": loop_s,
            "cpu_s": round(cpu_s, 2), "worker_cpu_s": round(worker_cpu_s, 2),
            "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def run_throughput(cfg: "ImportBenchConfig", say: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per N: rows/s and peak RSS of a fresh process importing N rows."""
    rows = []
    for n in cfg.sizes:
        folder = cfg.work / f"rows-{n}"
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.time()
        npy, table = write_rows(folder, n, cfg.dim, cfg.seed + n)
        os.sync()  # the rows on disk before the import starts: their write-back is not the import's
        say(f"throughput N={n}: rows written in {time.time() - t0:.1f}s; importing in a fresh process ...")
        coll = folder / "collection"
        r = _in_process(throughput_row, str(npy), str(table), str(coll), cfg.dim, THROUGHPUT_SPACE, cfg.batch_rows)
        vector_mb = n * cfg.dim * 4 / 2**20
        row = {"n": n, "rows_per_s": round(n / r["seconds"], 1), "import_s": r["seconds"], "open_s": r["open_s"],
               "peak_rss_mb": r["peak_rss_mb"], "vector_mb": round(vector_mb, 1),
               "rss_over_vectors_mb": round(r["peak_rss_mb"] - vector_mb, 1), "base_rss_mb": r["base_rss_mb"],
               "ru_maxrss_mb": r["ru_maxrss_mb"], "worker_peak_rss_mb": r["worker_peak_rss_mb"], "items": r["items"],
               "disk_mb": round(_dir_mb(coll), 1), "python_loop_s": r["python_loop_s"], "cpu_s": r["cpu_s"],
               "worker_cpu_s": r["worker_cpu_s"]}
        if r["items"] != n or r["added"] != n:
            raise RuntimeError(f"the import of {n} rows read {r['items']} and added {r['added']}")
        model = model_of_width(cfg.models, cfg.dim) if cfg.commands else None
        if model is not None:  # the commands a user runs, end to end: import, then the graph index apart
            say(f"  `collection import` (model {model.name}), then `collection index`, each a fresh process ...")
            row.update(command_rows(npy, table, folder / "command-collection", model))
            say(f"  import command {row['command_import_s']} s (peak RSS {row['command_import_peak_rss_mb']} MB, "
                f"graph missing after it: {row['graph_missing_after_import']}); index build "
                f"{row['index_build_s']} s (peak RSS {row['index_build_peak_rss_mb']} MB, index {row['index_mb']} MB)")
        say(f"  {row['rows_per_s']:.0f} rows/s ({row['import_s']} s; CPU: import {row['cpu_s']} s, worker "
            f"{row['worker_cpu_s']} s; Python loop {row['python_loop_s']} s), "
            f"peak RSS {row['peak_rss_mb']} MB "
            f"(vectors {row['vector_mb']} MB: +{row['rss_over_vectors_mb']} MB; {row['base_rss_mb']} MB before)")
        rows.append(row)
        shutil.rmtree(folder, ignore_errors=True)
    return rows


__all__ = ["THROUGHPUT_SPACE", "run_throughput", "throughput_row", "write_rows"]
