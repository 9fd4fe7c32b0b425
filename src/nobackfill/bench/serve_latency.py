"""What a search costs through the service against what the same parts cost alone, for ``nobackfill
bench serve``.

* :class:`ServerProcess`: ``nobackfill serve`` (or any command serving ``/healthz``) in its own
  process on 127.0.0.1.
* The floor (``python -m nobackfill.bench.serve_latency MODEL VECTORS PORT``): the same encoder (the
  model pool's: ONNX Runtime where exported) and an exact faiss index of the same vectors behind one
  minimal FastAPI route, served by uvicorn in its own process as ``nobackfill serve`` is: what our
  stack costs without nobackfill's layers (auth, plan, routes, snapshots, merging, metrics).
* :func:`search_load`: ``concurrency`` asyncio httpx clients sending text searches only, bounded by a
  request count and a time cap; p50 / p99 and requests/s.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel

__all__ = ["ServerProcess", "floor_app", "search_load"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server in a subprocess on 127.0.0.1: ``nobackfill serve COLLECTION`` by default, or
    ``command`` (given the port as its last argument)."""

    def __init__(self, collection: Path | None = None, keys: Path | None = None, models_root: Path | None = None,
                 *, command: Sequence[str] | None = None, options: Sequence[str] = ()) -> None:
        self.collection, self.keys, self.models_root = collection, keys, models_root
        self.options = list(options)  # more options of ``nobackfill serve``
        self.command = list(command) if command is not None else None
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180) -> float:
        import httpx

        t0 = time.time()
        cmd = [*self.command, str(self.port)] if self.command is not None else \
            [sys.executable, "-m", "nobackfill.cli", "serve", str(self.collection), "--port", str(self.port),
             "--keys", str(self.keys), "--models-root", str(self.models_root), *self.options]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return time.time() - t0
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {timeout_s:.0f}s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


class FloorQuery(BaseModel):
    """The floor's request body."""

    text: str
    k: int = 10


def floor_app(model: str, vectors: np.ndarray, threads: int = 1) -> Any:
    """One FastAPI route: the text embedded by ``model`` (through the model pool, as the service
    does, with as many torch threads as the service's query encoding: ``threads``), an exact
    inner-product faiss search of ``vectors``, the top k rows and scores as JSON."""
    import faiss
    import torch
    from fastapi import FastAPI
    import orjson
    from fastapi.responses import Response

    from ..search import ModelPool

    encoder = ModelPool().get(model)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, np.float32))
    app = FastAPI()

    @app.get("/healthz")
    def health() -> dict:
        return {"ok": True}

    @app.post("/v1/search")
    def search(q: FloorQuery) -> Response:
        torch.set_num_threads(threads)  # per calling thread, as the service's batcher sets it
        scores, rows = index.search(encoder.encode_texts([q.text]), q.k)
        hits = [{"row": int(r), "score": float(s)} for r, s in zip(rows[0], scores[0])]
        return Response(orjson.dumps({"hits": hits}), media_type="application/json")  # serialised once

    return app


async def _search_load(url: str, texts: Sequence[str], headers: dict, concurrency: int, requests: int,
                       time_cap_s: float) -> dict[str, Any]:
    import httpx

    lat: list[float] = []
    errors: list[str] = []
    sent = {"n": 0}
    deadline = time.time() + time_cap_s

    async def worker(i: int, http: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(i)
        while sent["n"] < requests and time.time() < deadline:
            sent["n"] += 1
            t0 = time.perf_counter()
            try:
                r = await http.post("/v1/search", json={"text": texts[int(rng.integers(len(texts)))], "k": 10},
                                    headers=headers)
            except httpx.HTTPError as e:
                errors.append(f"{type(e).__name__}: {e}")
                continue
            if r.status_code != 200:
                errors.append(f"{r.status_code} {r.text[:100]}")
                continue
            lat.append(1000 * (time.perf_counter() - t0))

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=concurrency + 2)) as http:
        for t in texts[:20]:  # warm: models loaded, first requests answered
            await http.post("/v1/search", json={"text": t, "k": 10}, headers=headers)
        t0 = time.time()
        await asyncio.gather(*(worker(i, http) for i in range(concurrency)))
        wall = time.time() - t0
    pct = lambda q: round(float(np.percentile(lat, q)), 2) if lat else None  # noqa: E731
    return {"concurrency": concurrency, "requests": len(lat) + len(errors), "errors": len(errors),
            "p50_ms": pct(50), "p99_ms": pct(99), "rps": round(len(lat) / wall, 1) if wall > 0 else None}


def search_load(url: str, texts: Sequence[str], *, key: str | None = None, concurrency: int = 1, requests: int = 300,
                time_cap_s: float = 120.0) -> dict[str, Any]:
    """Text searches only, ``concurrency`` at a time: latency percentiles and requests/s. The texts
    are distinct queries in random order (a repeated one may be answered from the query cache, as it
    would be in service)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return asyncio.run(_search_load(url, texts, headers, concurrency, requests, time_cap_s))


def _main(argv: Sequence[str]) -> None:
    import uvicorn

    model, vectors, port = argv
    uvicorn.run(floor_app(model, np.load(vectors)), host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    _main(sys.argv[1:])
