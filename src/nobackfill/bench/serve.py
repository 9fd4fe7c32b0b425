"""``nobackfill bench serve``: the service under load, under SIGKILL and under bad input.

A world collection (test split, English captions) embedded by ``world-old`` and upgraded to
``world-new`` with the shipped XBT upgrade (routes calibrated on 300 val images) is served by
``nobackfill serve`` on 127.0.0.1 (a free port, its own process).

* Load: ``concurrency`` asyncio httpx clients send ``requests`` searches (text, and an image one in
  five) while a backfill runs in the server and another client adds captions; bounded by the request
  count and a time cap. Latency per request (p50 / p95 / p99, text queries apart), throughput, errors.
* Faults: ``trials`` times, the server is SIGKILLed while a client adds items (or while the backfill
  runs), restarted and checked: every acknowledged item is there, no vector key is stored twice, the
  collection verifies, and a restarted backfill goes on.
* Bad input: every class of :func:`.serve_inputs.bad_input_cases` against the live server: a 4xx whose message
  names the problem, and the collection unchanged.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .serve_inputs import ADMIN_KEY, READ_KEY, run_bad_inputs
from .serve_encoders import format_markdown as encoders_markdown
from .serve_latency import ServerProcess, search_load
from .serve_rows import encoder_rows, idle_against_floor, latency_markdown


@dataclass
class ServeBenchConfig:
    models: Path = Path("models")
    world: Path = Path("data/world")
    upgrade: Path = Path("upgrades/world-old-to-new")
    work: Path = Path("runs/bench/serve-work")
    requests: int = 2400
    concurrency: int = 8
    time_cap_s: float = 600.0
    trials: int = 24
    backfill_rate: float = 15.0  # items/s, so the backfill lasts the whole load test
    calib_images: int = 300
    latency_requests: int = 400  # search-only runs at concurrency 1 (x3 at concurrency 8)
    encoders: bool = True  # the query text tower on torch vs ONNX Runtime, and int8's R@1
    multi30k: Path | None = None  # for int8's R@1 on Multi30K val (default: the shared copy)

    @classmethod
    def quick(cls, **kw: Any) -> "ServeBenchConfig":
        return cls(**{"requests": 2000, "trials": 20, **kw})


# ----------------------------------------------------------------------------- load
async def _load(url: str, texts: list[str], images: list[bytes], cfg: ServeBenchConfig) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {READ_KEY}"}
    lat: dict[str, list[float]] = {"text": [], "image": []}
    errors: list[str] = []
    counter = {"n": 0}
    deadline = time.time() + cfg.time_cap_s

    async def worker(i: int, http: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(i)
        while counter["n"] < cfg.requests and time.time() < deadline:
            counter["n"] += 1
            kind = "image" if rng.random() < 0.2 else "text"
            t0 = time.perf_counter()
            try:
                if kind == "text":
                    r = await http.post("/v1/search", json={"text": texts[int(rng.integers(len(texts)))], "k": 10},
                                        headers=headers)
                else:
                    r = await http.post("/v1/search", files={"image": ("q.png", images[int(rng.integers(len(images)))])},
                                        data={"k": "10"}, headers=headers)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:100]}")
                    continue
            except httpx.HTTPError as e:
                errors.append(f"{type(e).__name__}: {e}")
                continue
            lat[kind].append(1000 * (time.perf_counter() - t0))

    async def adder(http: httpx.AsyncClient) -> None:
        j = 0
        while counter["n"] < cfg.requests and time.time() < deadline:
            r = await http.post("/v1/items", json={"items": [{"text": f"a caption added under load {j} {k}"}
                                                             for k in range(4)]},
                                headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            if r.status_code != 200:
                errors.append(f"add {r.status_code} {r.text[:100]}")
            j += 1
            await asyncio.sleep(0.5)

    limits = httpx.Limits(max_connections=cfg.concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        t0 = time.time()
        await asyncio.gather(adder(http), *(worker(i, http) for i in range(cfg.concurrency)))
        wall = time.time() - t0
    every = lat["text"] + lat["image"]
    pct = lambda xs, q: round(float(np.percentile(xs, q)), 2) if xs else None  # noqa: E731
    return {"requests": len(every) + len(errors), "errors": len(errors), "error_samples": errors[:5],
            "concurrency": cfg.concurrency, "p50_ms": pct(every, 50), "p95_ms": pct(every, 95), "p99_ms": pct(every, 99),
            "text_p50_ms": pct(lat["text"], 50), "text_p99_ms": pct(lat["text"], 99),
            "image_p50_ms": pct(lat["image"], 50), "rps": round(len(every) / wall, 1), "seconds": round(wall, 1)}


# ----------------------------------------------------------------------------- faults
def run_faults(server: ServerProcess, collection: Path, trials: int, log: Callable[[str], None]) -> dict[str, Any]:
    """SIGKILL during ingest (even trials) and during the backfill (odd trials); restart; check."""
    import threading

    from ..client import Client, ClientError
    from ..collection.collection import Collection
    from ..lifecycle.backfill import backfill_status

    rng = np.random.default_rng(0)
    out = {"trials": 0, "acknowledged_lost": 0, "duplicated": 0, "backfill_resumed": 0, "verify_failures": 0,
           "restart_s": []}
    acked: list[str] = []
    for t in range(trials):
        admin = Client(server.url, ADMIN_KEY, timeout=30)
        stop = threading.Event()
        during = "ingest" if t % 2 == 0 else "backfill"

        def ingest() -> None:
            i = 0
            while not stop.is_set():
                try:
                    acked.extend(admin.add(texts=[{"text": f"fault trial {t} caption {i} {j}", "id": f"f{t}-{i}-{j}"}
                                                  for j in range(4)]).ids)
                except Exception:  # the server was killed mid-request: not acknowledged
                    return
                i += 1

        if during == "ingest":
            th = threading.Thread(target=ingest, daemon=True)
            th.start()
        else:
            try:  # the last trial paused it: resume (a plain start refuses a paused backfill)
                admin.backfill_resume(order="random", rate=200)
            except ClientError:
                pass
        time.sleep(float(rng.uniform(0.3, 1.5)))
        before_kill = backfill_status(Collection.open(collection))["done"]
        server.kill()
        stop.set()
        if during == "ingest":
            th.join(timeout=30)
        out["restart_s"].append(round(server.start(), 1))
        c = Collection.open(collection)
        if c.verify():
            out["verify_failures"] += 1
        live = c.items()
        out["acknowledged_lost"] += sum(1 for i in acked if i not in live)
        for sid in c.space_ids():
            g = c.gallery(sid)
            for m in ("image", "text"):
                keys = g.ids(m)
                out["duplicated"] += len(keys) - len(set(keys))
        if during == "backfill":
            admin = Client(server.url, ADMIN_KEY, timeout=30)
            admin.backfill_resume(order="random", rate=200)
            time.sleep(1.5)
            admin.backfill_pause()
            after = backfill_status(Collection.open(collection))
            out["backfill_resumed"] += after["done"] > before_kill or after["done"] == after["total"]
        out["trials"] += 1
        log(f"  fault trial {t + 1}/{trials} ({during}): {len(acked)} acknowledged so far, lost "
            f"{out['acknowledged_lost']}, duplicated {out['duplicated']}")
    out["backfill_trials"] = trials // 2
    return out


# ----------------------------------------------------------------------------- the bench
def run_serve_bench(cfg: ServeBenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    from ..client import Client
    from ..evaluate import resolve_data
    from ..search import ModelPool
    from .world_collection import upgraded_world_collection, world_eval

    say = log or (lambda _m: None)
    t_all = time.time()
    shutil.rmtree(cfg.work, ignore_errors=True)
    cfg.work.mkdir(parents=True)
    ev = world_eval(resolve_data(cfg.world, "test"))
    keys = cfg.work / "keys.toml"
    keys.write_text(f'read = ["{READ_KEY}"]\nadmin = ["{ADMIN_KEY}"]\n')
    texts = [t.payload for t in ev.texts]
    latency = idle_against_floor(cfg, ev, texts, keys, say)
    encoders = encoder_rows(cfg, texts, say) if cfg.encoders else None
    c, _, _ = upgraded_world_collection(cfg, ModelPool(), ev, cfg.work / "photos", say)
    server = ServerProcess(c.path, keys, Path.cwd())  # the project: models/, upgrades/, docs/ lie under it
    startup = server.start()
    say(f"server on {server.url} (started in {startup:.1f}s)")
    try:
        images = [Path(im.payload).read_bytes() for im in ev.images[:100]]
        admin = Client(server.url, ADMIN_KEY)
        latency["upgraded_idle_c1"] = search_load(server.url, texts, key=READ_KEY, requests=cfg.latency_requests)
        admin.backfill_start(order="uncertainty", rate=cfg.backfill_rate)
        latency["during_backfill_c1"] = search_load(server.url, texts, key=READ_KEY, requests=cfg.latency_requests)
        say(f"  search-only c1: upgraded idle p50 {latency['upgraded_idle_c1']['p50_ms']} ms, during the backfill "
            f"{latency['during_backfill_c1']['p50_ms']} ms")
        before = admin.status()["backfill"]
        say(f"load: {cfg.requests} searches at concurrency {cfg.concurrency} during the backfill ...")
        load = asyncio.run(_load(server.url, texts, images, cfg))
        after = admin.status()["backfill"]
        load["during_backfill"] = before["done"] < after["done"] < after["total"]  # ran from start to end
        load["backfill_progress"] = {"before": before["done"], "after": after["done"], "total": after["total"]}
        say(f"  {load['requests']} requests, {load['errors']} errors, p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms, "
            f"text p50 {load['text_p50_ms']} ms, {load['rps']} req/s; backfill {before['done']} -> {after['done']}")
        admin.backfill_pause()
        say("bad inputs ...")
        bad = run_bad_inputs(server.url, c.path, admin.status()["limits"])
        say(f"  {bad['tried']} classes: {bad['clear_4xx']} clear 4xx, {bad['store_unchanged']} left the store unchanged")
        say(f"faults: {cfg.trials} SIGKILL trials ...")
        faults = run_faults(server, c.path, cfg.trials, say)
    finally:
        server.stop()
    return {"load": load, "latency": latency, "encoders": encoders, "faults": faults, "bad_inputs": bad,
            "startup_s": round(startup, 1),
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
            "machine": {"cpus": os.cpu_count()}, "seconds": round(time.time() - t_all, 1)}


def format_markdown(result: dict[str, Any]) -> str:
    ld, f, b = result["load"], result["faults"], result["bad_inputs"]
    head = latency_markdown(result["latency"]) if result.get("latency") else ""
    head += encoders_markdown(result["encoders"]) + "\n" if result.get("encoders") else ""
    lines = ["| load | requests | errors | concurrency | p50 ms | p95 ms | p99 ms | text p50 ms | image p50 ms | req/s | "
             "during backfill |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
             f"| mixed searches + adds | {ld['requests']} | {ld['errors']} | {ld['concurrency']} | {ld['p50_ms']} | "
             f"{ld['p95_ms']} | {ld['p99_ms']} | {ld['text_p50_ms']} | {ld['image_p50_ms']} | {ld['rps']} | "
             f"{'yes' if ld['during_backfill'] else 'no'} |", "",
             "| faults | SIGKILL trials | acknowledged writes lost | duplicated | backfill resumed | verify failures |",
             "|---|---:|---:|---:|---:|---:|",
             f"| ingest + backfill | {f['trials']} | {f['acknowledged_lost']} | {f['duplicated']} | "
             f"{f['backfill_resumed']} / {f['backfill_trials']} | {f['verify_failures']} |", "",
             "| bad inputs | classes tried | clear 4xx | store unchanged |", "|---|---:|---:|---:|",
             f"| every class | {b['tried']} | {b['clear_4xx']} | {b['store_unchanged']} |", ""]
    return head + "\n".join(lines) + "\n"


__all__ = ["ServeBenchConfig", "format_markdown", "run_serve_bench"]
