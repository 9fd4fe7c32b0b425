"""``nobackfill bench backfill-engine``: the backfill's engines on the same world items (CPU).

A collection of N world train items (images and their captions, every language; the world is
generated into the work folder) embedded by ``world-old`` and upgraded to ``world-new`` with the
shipped upgrade is copied once per run and backfilled (order sequential) by:

* ``local``: one lease worker in this process (``collection backfill``'s default);
* ``ray``: a Ray Data pipeline on a one-node Ray (``num_cpus`` = this machine's cores), ``actors``
  embedding actors of one CPU each;
* ``ray_2_nodes``: the same on a two-node ``ray.cluster_utils.Cluster`` on this machine, one CPU
  per node (two nodes on one machine: the same cores, split).

Items/s counts from the call to its return (Ray's actor start-up and model loading included; Ray's
own start is reported apart). Ray's overhead per batch: ``(ray s - local s) / batches``. Peak RSS:
the driver (sampled during the Ray runs) and the largest embedding / commit actor.

The fault run: on the two-node cluster (each model call ``fault_delay_s`` slower, so that the
actors are still embedding while batches commit), embedding actors SIGKILLed (``kills``), the worker node
removed (a fresh one joins; ``removals``) and commits crashed right after their catalog
transaction (the fail-point, ``crashes``); then ``lost`` (items the current space does not serve),
``twice`` (vectors stored beyond one per item) and whether every vector equals the local run's.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .host import shipped_path
from ..collection.collection import Collection
from ..collection.ingest import folder_items
from ..lifecycle.backfill import run_backfill, start_backfill
from ..lifecycle.backfill_commit import FAILPOINT_ENV
from ..lifecycle.cluster.ray_backfill import PoolLoader, RayOptions, import_ray, run_ray_worker
from ..lifecycle.measuring.measure import embedded_collection
from ..lifecycle.plan_changes import upgrade_collection
from ..search import ModelPool
from ..search.models import model_ref
from .backfill import _take
from .backfill_engine_report import REPORT, format_markdown
from .backfill_faults import Delayed, FaultInjector

__all__ = ["REPORT", "BackfillEngineConfig", "Delayed", "FaultInjector", "current_vectors", "format_markdown",
           "run_backfill_engine_bench"]

_POOL = ModelPool()  # the driver's models (the actors load their own)


@dataclass
class BackfillEngineConfig:
    models: Path = Path("models")
    upgrade: Path = Path("upgrades/world-old-to-new")
    work: Path = Path("runs/bench/backfill-engine-work")
    items: int = 20000
    batch_size: int = 256
    actors: int = 2
    fault_batch: int = 32
    kills: int = 10
    removals: int = 2
    remove_every: int = 20  # fault run: a node removed every 20 batches (actor kills between)
    fault_delay_s: float = 0.2  # fault run: seconds added to each model call (kills land on working actors)
    crashes: int = 2
    seed: int = 0

    @classmethod
    def quick(cls, **kw: Any) -> "BackfillEngineConfig":
        """6000 items (full: 20000)."""
        return cls(**{"items": 6000, **kw})


def current_vectors(c: Collection) -> tuple[dict[str, np.ndarray], int]:
    """Item id -> its vector in the current space, and how many vectors the space stores beyond
    one per live item version (0 when nothing was committed twice)."""
    c.refresh()
    g = c.gallery(c.current_space)
    g.refresh()
    out, extra = {}, 0
    items = list(c.items().values())
    for m in ("image", "text"):
        mine = [it for it in items if it.modality == m]
        pos = g.positions(m, [it.key for it in mine])
        extra += g.count(m) - len(set(pos.values()))
        if pos:
            vecs = np.asarray(g.vectors(m))
            out.update({it.id: vecs[pos[it.key]] for it in mine if it.key in pos})
    return out, extra


def _world_items(cfg: BackfillEngineConfig, log: Callable[[str], None]) -> list[Any]:
    """``cfg.items`` world train items (generated into the work folder once)."""
    from ..data.world import WorldSpec, generate_world

    root = cfg.work / "world"
    spec = WorldSpec(seed=cfg.seed, n_val=0, n_test=0)
    per_image = 1 + spec.captions_per_image * len(spec.langs)
    spec.n_train = math.ceil(cfg.items / per_image) + 1
    if not (root / "world.json").exists() or json.loads((root / "world.json").read_text()).get("n_train") != spec.n_train:
        shutil.rmtree(root, ignore_errors=True)
        log(f"  generating a world of {spec.n_train} images ({per_image} items each) ...")
        generate_world(root, spec, progress=False)
    return _take(folder_items(root / "train", uncaptioned=False).items, cfg.items)


def _copy(base: Path, to: Path) -> Collection:
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(base, to)
    return Collection.open(to)


def _ray_run(base: Path, to: Path, cfg: BackfillEngineConfig, loader: Any, new_ref: str,
             on_batch: Callable[[dict[str, Any]], None] | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """One Ray backfill of a copy of ``base``: seconds, items/s, batches, peak RSS."""
    import psutil

    c = _copy(base, to)
    start_backfill(c, _POOL.get(new_ref, c.current_space), order="sequential")
    me = psutil.Process()
    peak = {"driver": me.memory_info().rss / 2 ** 20, "actors": 0.0, "commit": 0.0, "batches": 0, "first": 0.0}

    def seen(info: dict[str, Any]) -> None:
        if not peak["batches"]:
            peak["first"] = time.time()
        peak["driver"] = max(peak["driver"], me.memory_info().rss / 2 ** 20)
        peak["actors"] = max(peak["actors"], float(info["rss_mb"]))
        peak["commit"] = max(peak["commit"], float(info["commit_rss_mb"]))
        peak["batches"] += 1
        if on_batch is not None:
            on_batch(info)

    t0 = time.time()
    rep = run_ray_worker(c, loader, uri=str(to), options=RayOptions(actors=cfg.actors), on_batch=seen,
                         batch_size=batch_size or cfg.batch_size, lease_s=120.0)
    end = time.time()
    s = end - t0
    return {"collection": c, "seconds": round(s, 2), "items_per_s": round(rep.embedded / s, 1), "stopped": rep.stopped,
            "first_batch_s": round(peak["first"] - t0, 2),
            "embedded": rep.embedded, "batches": peak["batches"], "driver_rss_mb": round(peak["driver"], 1),
            "actor_rss_mb": round(peak["actors"], 1), "commit_rss_mb": round(peak["commit"], 1)}


def run_backfill_engine_bench(cfg: BackfillEngineConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Local vs Ray (one node, two nodes) items/s, Ray's overhead per batch, peak RSS, the fault run."""
    say = log or (lambda _m: None)
    ray = import_ray()
    from ray.cluster_utils import Cluster

    t_all, load_before = time.time(), os.getloadavg()
    cfg.work.mkdir(parents=True, exist_ok=True)
    items = _world_items(cfg, say)
    old_ref, new_ref = model_ref(cfg.models / "world-old"), model_ref(cfg.models / "world-new")
    base = cfg.work / "base"
    c = embedded_collection(base, _POOL, old_ref, items, say)
    upgrade_collection(c, new_ref, bridges=[shipped_path(cfg.upgrade)], pool=_POOL)
    loader = PoolLoader(new_ref, c.current_space)
    n = len(items)

    local = _copy(base, cfg.work / "local")
    t0 = time.time()
    st = run_backfill(local, _POOL.get(new_ref), order="sequential", batch_size=cfg.batch_size)
    local_s = time.time() - t0
    local_row = {"seconds": round(local_s, 2), "items_per_s": round(st["embedded"] / local_s, 1)}
    say(f"  local: {n} items in {local_s:.1f}s ({local_row['items_per_s']} items/s)")
    want, _ = current_vectors(local)

    src = str(Path(__file__).resolve().parents[2])
    tokens = cfg.work / "crash"
    for i in range(cfg.crashes):
        Path(f"{tokens}.{i}").touch()  # the fail-point disarmed until the fault run
    env = {"env_vars": {"PYTHONPATH": src, FAILPOINT_ENV: f"{tokens}:{cfg.crashes}", "RAY_AUTH_MODE": "disabled"}}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cores = os.cpu_count() or 2
    t0 = time.time()
    ray.init(num_cpus=cores, object_store_memory=256 * 2 ** 20, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env=env)
    ray_start_s = time.time() - t0
    try:
        one = _ray_run(base, cfg.work / "ray1", cfg, loader, new_ref)
    finally:
        ray.shutdown()
    say(f"  ray, 1 node ({cores} CPUs): {one['items_per_s']} items/s ({one['seconds']}s; Ray started in "
        f"{ray_start_s:.1f}s)")
    node = {"num_cpus": 1, "object_store_memory": 128 * 2 ** 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False, runtime_env=env)
        cluster.wait_for_nodes()
        two = _ray_run(base, cfg.work / "ray2", cfg, loader, new_ref)
        say(f"  ray, 2 nodes (1 CPU each): {two['items_per_s']} items/s ({two['seconds']}s)")
        for i in range(cfg.crashes):
            Path(f"{tokens}.{i}").unlink()  # armed
        faults = FaultInjector(cluster, node, cfg.kills, cfg.removals, remove_every=cfg.remove_every)
        run = _ray_run(base, cfg.work / "faults", cfg, Delayed(loader, cfg.fault_delay_s), new_ref, on_batch=faults,
                       batch_size=cfg.fault_batch)
    finally:
        ray.shutdown()
        cluster.shutdown()
    got, twice = current_vectors(run["collection"])
    crashed = sum(Path(f"{tokens}.{i}").exists() for i in range(cfg.crashes))
    lost = sum(1 for i in want if i not in got)
    same = got.keys() == want.keys() and all(np.array_equal(got[i], want[i]) for i in want)
    say(f"  faults: {faults.done['actor_kills']} actor kills, {faults.done['node_removals']} node removals, "
        f"{crashed} crashed commits: {len(got)} committed, {lost} lost, {twice} twice, vectors identical: {same}")
    batches = max(one["batches"], 1)
    return {
        "items": n, "batch_size": cfg.batch_size, "actors": cfg.actors, "cores": cores,
        "throughput": {"local_items_per_s": local_row["items_per_s"], "ray_items_per_s": one["items_per_s"],
                       "ray_over_local": round(one["items_per_s"] / local_row["items_per_s"], 3),
                       "ray_2_nodes_items_per_s": two["items_per_s"],
                       "local_s": local_row["seconds"], "ray_s": one["seconds"], "ray_2_nodes_s": two["seconds"],
                       "ray_start_s": round(ray_start_s, 2), "ray_first_batch_s": one["first_batch_s"],
                       "ray_overhead_per_batch_ms": round(1000 * (one["seconds"] - local_row["seconds"]) / batches, 1),
                       "batches": batches},
        "faults": {"actor_kills": faults.done["actor_kills"], "node_removals": faults.done["node_removals"],
                   "crashed_commits": crashed, "committed": len(got), "lost": lost, "twice": twice,
                   "vectors_identical": bool(same), "batch_size": cfg.fault_batch, "seconds": run["seconds"],
                   "model_delay_s": cfg.fault_delay_s,
                   "stopped": run["stopped"]},
        "rss_mb": {"driver": max(one["driver_rss_mb"], two["driver_rss_mb"]),
                   "actors": max(one["actor_rss_mb"], two["actor_rss_mb"]),
                   "commit_actor": max(one["commit_rss_mb"], two["commit_rss_mb"]),
                   "local_process_peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)},
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "seconds": round(time.time() - t_all, 1),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
    }
