"""``nobackfill bench scale``: a collection of N items as a user runs it, beside the raw index.

Data: clustered unit vectors (``dim`` 128 like the world models; ``clusters`` Gaussian clusters,
per-dimension sigma ``noise``), queries drawn from the same clusters and held out. Items are
captions ``g<i>`` whose vectors a lookup encoder returns (precomputed vectors, as ``bench store``
does), each with metadata ``{"group": i % 10}``. The collection records ``model`` (world-new by
default), so ``nobackfill collection search`` in a cold process loads a real model.

Each (N, index) row: ``add_per_s`` (items/s through :func:`~nobackfill.adopt.importing.add_vectors`, in
chunks), then in a fresh process ``open_s`` (:meth:`Collection.open`), ``open_first_search_s``
(open + a :class:`~nobackfill.search.Searcher` + its first search, the index cached on disk),
``p50_ms`` / ``p99_ms`` (one query, k = 10, through the Searcher) and ``raw_p50_ms`` (the same
queries on the faiss index itself; on a Milvus server pymilvus' own ``MilvusClient.search`` of the
same collection, Bounded; both measured in the same cache state: one unmeasured pass,
then two alternating passes of each), ``filtered_p50_ms`` (``filter={"group": 3}``),
``index_build_s`` (the writer builds and caches the index after adding),
``rss_extra_mb`` (that process's resident memory beyond its imports, the vectors and the index),
``disk_ratio`` (collection bytes / vector bytes), on a Milvus server ``raw_insert_per_s`` (pymilvus'
own ``MilvusClient.insert`` of the same vectors into a scratch collection, 20k rows a call); then the collection is upgraded to a second
lookup space (identity bridge, nothing re-embedded) and a backfill worker in another process
commits one batch a second while the reader measures ``p50_upgraded_idle_ms`` (before: one space
serves every item), ``p50_during_backfill_ms`` and ``p50_backfilled_idle_ms`` (after the worker
stopped: the same two spaces searched, nothing committing), with ``searches_during_backfill`` (the
window's search count). ``cli_status_s`` / ``cli_search_s``: wall time of
``nobackfill collection status`` / ``search`` in a cold process, before the upgrade (the search: the
median of three, taking turns with ``model_only_s``, a cold process that only loads the collection's
model and embeds the same query, the floor of any cold search).

Peers (``chroma``, ``lancedb``), where installed (optional, never dependencies): add, reopen, p50
and RSS on the same vectors, each in its own process.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .scale_peers import PEERS
from .scale_rows import K, bridge_dir, dir_bytes, read_collection, write_collection


@dataclass
class ScaleBenchConfig:
    sizes: tuple[int, ...] = (100_000, 1_000_000)
    indexes: tuple[str, ...] = ("Flat", "HNSW32")
    dim: int = 128
    clusters: int = 2048
    noise: float = 0.05
    n_queries: int = 300
    filtered_queries: int = 30
    add_chunk: int = 50_000
    backfill_rate: int = 2_000  # items a second: one committed batch a second
    backfill_seconds: float = 8.0
    model: Path = Path("models/world-new")
    cli: bool = True
    peers: tuple[str, ...] = ("chroma", "lancedb")
    work: Path = Path("runs/bench/scale-work")
    #: also a row at the smallest N with a PostgreSQL catalog and a Milvus server (both started here,
    #: on 127.0.0.1; run it in a loopback-only namespace: ``scripts/isolated.sh``)
    shared: bool = False
    seed: int = 0

    @classmethod
    def quick(cls, **kw: Any) -> "ScaleBenchConfig":
        """N = 100k only."""
        return cls(**{"sizes": (100_000,), **kw})


# ----------------------------------------------------------------------------- data
def make_vectors(n: int, dim: int, clusters: int, noise: float, seed: int, chunk: int = 100_000) -> np.ndarray:
    """``n`` unit vectors around ``clusters`` random unit centres (the same centres for any ``n``
    at one ``seed``; rows generated in chunks, so memory stays at the output)."""
    centres = np.random.default_rng(seed).standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.empty((n, dim), np.float32)
    rng = np.random.default_rng(seed + 1 + n)
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        x = centres[rng.integers(0, clusters, m)] + noise * rng.standard_normal((m, dim)).astype(np.float32)
        out[s:s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _call_and_send(conn: Any, fn: Callable[..., Any], args: tuple) -> None:  # runs in the child
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as e:  # noqa: BLE001 - handed to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _in_process(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh (non-daemonic: it may start a worker of its own) process."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_call_and_send, args=(child, fn, args))
    p.start()
    child.close()
    try:
        status, value = parent.recv()
    except EOFError:
        status, value = "error", f"the process exited with code {p.join() or p.exitcode}"
    p.join()
    if status != "ok":
        raise RuntimeError(f"{fn.__name__}: {value}")
    return value


def _wall_seconds(cmd: list[str], what: str) -> float:
    """Wall seconds of ``cmd`` in a cold process (a RuntimeError naming ``what`` if it fails)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed ({r.returncode}): {(r.stderr or r.stdout)[-300:]}")
    return round(time.perf_counter() - t0, 3)


def _cli_seconds(args: list[str]) -> float:
    """Wall seconds of ``nobackfill ARGS`` in a cold process."""
    exe = Path(sys.executable).with_name("nobackfill")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nobackfill.cli"]
    return _wall_seconds(cmd + args, f"nobackfill {' '.join(args)}")


#: the query of the cold ``collection search``
QUERY = "a red circle"
_MODEL_ONLY = ("import sys\nfrom nobackfill.search.models import ModelPool\n"
               "ModelPool().get(sys.argv[1]).encode_texts([sys.argv[2]])\n")


def _model_only_seconds(model: str) -> float:
    """Wall seconds of a cold process that only loads ``model`` and embeds :data:`QUERY`."""
    return _wall_seconds([sys.executable, "-c", _MODEL_ONLY, model, QUERY], f"loading {model}")


# ----------------------------------------------------------------------------- the bench
def run_scale_bench(cfg: ScaleBenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every (N, index) row, then the peers at the smallest N."""
    import importlib.util

    from ..search import ModelPool
    from ..search.models import model_ref

    say = log or (lambda _m: None)
    t_all = time.time()
    cfg.work.mkdir(parents=True, exist_ok=True)
    model = model_ref(cfg.model)
    space_id = ModelPool().get(model).space_id  # the collection is in the real model's space
    rows, peers = [], []
    for n in cfg.sizes:
        x = make_vectors(n, cfg.dim, cfg.clusters, cfg.noise, cfg.seed)
        q = make_vectors(cfg.n_queries, cfg.dim, cfg.clusters, cfg.noise, cfg.seed + 7)
        x_file, q_file = str(cfg.work / f"x-{n}.npy"), str(cfg.work / f"q-{n}.npy")
        np.save(x_file, x)
        np.save(q_file, q)
        del x
        for index in cfg.indexes:
            path = str(cfg.work / f"coll-{n}-{index}")
            row: dict[str, Any] = {"n": n, "catalog": "sqlite", "vectors": f"faiss:{index}"}
            rows.append(_measure(cfg, row, x_file, q_file, path, index, model, space_id, say))
        if cfg.shared and n == min(cfg.sizes):
            with _servers(cfg, say) as (pg_url, milvus_addr):
                name = f"scale{n}"
                path = f"milvus://{milvus_addr}#{name}?catalog={pg_url}#{name}"
                row = {"n": n, "catalog": "postgresql", "vectors": "milvus-server:HNSW32"}
                rows.append(_measure(cfg, row, x_file, q_file, path, "HNSW32", model, space_id, say))
        if n == min(cfg.sizes):
            for name in cfg.peers:
                module, fn = PEERS[name]
                if importlib.util.find_spec(module) is None:
                    say(f"  peer {name}: not installed (optional: pip install {module})")
                    peers.append({"name": name, "n": n, "skipped": f"{module} not installed"})
                    continue
                try:
                    peers.append(_in_process(fn, x_file, q_file, str(cfg.work / f"peer-{name}")))
                except Exception as e:  # a peer that fails is reported, not fatal
                    peers.append({"name": name, "n": n, "error": f"{type(e).__name__}: {e}"})
                say(f"  peer {name}: {peers[-1]}")
        for f in (x_file, q_file):
            Path(f).unlink(missing_ok=True)
    return {"rows": rows, "peers": peers, "config": {k: str(v) if isinstance(v, Path) else v
                                                     for k, v in asdict(cfg).items()},
            "machine": {"cpus": os.cpu_count()}, "seconds": round(time.time() - t_all, 1)}


def _measure(cfg: ScaleBenchConfig, row: dict[str, Any], x_file: str, q_file: str, path: str, index: str, model: str,
             space_id: str, say: Callable[[str], None]) -> dict[str, Any]:
    """One row: the writer, the cold CLI commands and the reader, each in a fresh process."""
    n = row["n"]
    say(f"N={n} {row['catalog']} + {row['vectors']}: adding ...")
    row.update(_in_process(write_collection, x_file, q_file, path, index, model, space_id, cfg.add_chunk))
    local = "://" not in path
    row["disk_ratio"] = round(dir_bytes(Path(path)) / (n * cfg.dim * 4), 2) if local else None
    if cfg.cli:
        row["cli_status_s"] = _cli_seconds(["collection", "status", path])
        searches, floors = [], []
        for _ in range(3):  # in turns: the machine's speed moves between runs
            searches.append(_cli_seconds(["collection", "search", path, "--text", QUERY, "--k", str(K)]))
            floors.append(_model_only_seconds(model))
        row["cli_search_s"], row["model_only_s"] = float(np.median(searches)), float(np.median(floors))
    say(f"  add {row['add_per_s']:.0f}/s; CLI status {row.get('cli_status_s')} s, search "
        f"{row.get('cli_search_s')} s (model only {row.get('model_only_s')} s); reading ...")
    row.update(_in_process(read_collection, x_file, q_file, path, model, space_id, cfg.backfill_rate,
                           cfg.backfill_seconds, cfg.filtered_queries))
    say(f"  open {row['open_s']} s, open+first search {row['open_first_search_s']} s, p50 {row['p50_ms']} ms "
        f"(raw {row['raw_p50_ms']} ms), filtered {row['filtered_p50_ms']} ms, during backfill "
        f"{row['p50_during_backfill_ms']} ms (idle after upgrade {row['p50_upgraded_idle_ms']} ms, after the "
        f"backfill {row['p50_backfilled_idle_ms']} ms), "
        f"RSS extra {row['rss_extra_mb']} MB, disk x{row['disk_ratio']}")
    shutil.rmtree(bridge_dir(x_file, path), ignore_errors=True)
    if local:
        shutil.rmtree(path, ignore_errors=True)
    return row


@contextlib.contextmanager
def _servers(cfg: ScaleBenchConfig, say: Callable[[str], None]) -> Iterator[tuple[str, str]]:
    """A PostgreSQL and a Milvus server in ``cfg.work`` for the shared row (stopped afterwards)."""
    from ..testing.milvus_server import start_server
    from ..testing.postgres_server import start_postgres

    base = cfg.work / f"servers-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    say("starting PostgreSQL and a Milvus server on 127.0.0.1 ...")
    pg = start_postgres(base / "pg")
    try:
        milvus = start_server(base / "milvus")
        try:
            yield pg.url, milvus.address
        finally:
            milvus.stop()
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def format_markdown(result: dict[str, Any]) -> str:
    cols = ["n", "catalog", "vectors", "add_per_s", "raw_insert_per_s", "open_s", "open_first_search_s", "rss_extra_mb", "disk_ratio",
            "p50_ms", "p99_ms", "raw_p50_ms", "p50_upgraded_idle_ms", "p50_during_backfill_ms",
            "p50_backfilled_idle_ms", "searches_during_backfill", "filtered_p50_ms", "cli_status_s", "cli_search_s", "model_only_s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for r in result["rows"]:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in cols) + " |")
    if result.get("peers"):
        lines += ["", "| peer | N | add/s | open s | p50 ms | RSS extra MB |", "|---|---:|---:|---:|---:|---:|"]
        for p in result["peers"]:
            if "add_per_s" in p:
                lines.append(f"| {p['name']} | {p['n']} | {p['add_per_s']} | {p['open_s']} | {p['p50_ms']} | "
                             f"{p['rss_extra_mb']} |")
            else:
                lines.append(f"| {p['name']} | {p['n']} | {p.get('skipped') or p.get('error')} | | | |")
    return "\n".join(lines) + "\n"


__all__ = ["ScaleBenchConfig", "format_markdown", "make_vectors", "run_scale_bench"]
