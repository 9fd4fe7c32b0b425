"""The faults of ``nobackfill bench backfill-engine``'s fault run and of the ray engine's tests: a
:class:`FaultInjector` that SIGKILLs embedding actors and removes nodes of a
``ray.cluster_utils.Cluster``, and :class:`Delayed`, a slower stand-in of a model."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable

__all__ = ["Delayed", "FaultInjector"]


class FaultInjector:
    """``on_batch`` of :func:`~nobackfill.lifecycle.cluster.ray_backfill.run_ray_worker` on a
    ``ray.cluster_utils.Cluster``: every ``remove_every``-th committed batch it removes a non-head
    node (a fresh one with ``node`` arguments joins) until ``removals`` were removed; at the other
    batches it SIGKILLs a live embedding actor (the last seen to embed) until ``kills`` were killed;
    with ``period_s``, used as a context manager, a thread kills one every ``period_s`` seconds
    instead. ``done``: what it did."""

    def __init__(self, cluster: Any, node: dict[str, Any], kills: int, removals: int, remove_every: int = 5,
                 period_s: float = 0.0) -> None:
        self.cluster, self.node, self.kills, self.removals = cluster, node, kills, removals
        self.remove_every, self.period_s = remove_every, period_s
        self.done = {"actor_kills": 0, "node_removals": 0, "batches": 0}
        self._seen: list[int] = []

    def __call__(self, info: dict[str, Any]) -> None:
        self.done["batches"] += 1
        pid = int(info["embedded_by"])
        if pid != os.getpid() and pid not in self._seen:
            self._seen.append(pid)
        if self.done["node_removals"] < self.removals and self.done["batches"] % self.remove_every == 0:
            workers = [n for n in self.cluster.list_all_nodes() if n is not self.cluster.head_node]
            self.cluster.remove_node(workers[-1], allow_graceful=False)
            self.cluster.add_node(**self.node)
            self.done["node_removals"] += 1
            return
        if not self.period_s:
            self._kill(self._seen)

    def _kill(self, pids: list[int]) -> bool:
        while self.done["actor_kills"] < self.kills and pids:
            victim = pids.pop()
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.done["actor_kills"] += 1
            return True
        return False

    def embedders(self) -> list[int]:
        """The live embedding actors of this cluster (the raylets' children titled ``..._Embed...``)."""
        import psutil

        out = []
        for node in self.cluster.list_all_nodes():
            for info in node.all_processes.get("raylet", []):
                with contextlib.suppress(psutil.Error):
                    for p in psutil.Process(info.process.pid).children(recursive=True):
                        with contextlib.suppress(psutil.Error):
                            if "_Embed" in " ".join(p.cmdline()):
                                out.append(p.pid)
        return out

    def __enter__(self) -> "FaultInjector":
        """With ``period_s``: kill a live embedding actor every ``period_s`` seconds while the block
        runs (found among the cluster's processes, not from committed batches)."""
        if self.period_s:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._killer, name="fault-injector", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.period_s:
            self._stop.set()
            self._thread.join()

    def _killer(self) -> None:
        while not self._stop.wait(self.period_s) and self.done["actor_kills"] < self.kills:
            self._kill(self.embedders())


class Delayed:
    """``load()`` of an actor whose model takes ``delay`` seconds more per call (the fault run's
    stand-in for a slower model: its actors are still embedding when batches commit, so the kills
    land on working actors); the vectors are the model's own."""

    def __init__(self, load: Callable[[], Any], delay: float) -> None:
        self.load, self.delay = load, delay

    def __call__(self) -> "Delayed._Model":
        return Delayed._Model(self.load(), self.delay)

    class _Model:
        def __init__(self, encoder: Any, delay: float) -> None:
            self.encoder, self.delay = encoder, delay

        def encode_images(self, images: Any, **kw: Any) -> Any:
            time.sleep(self.delay)
            return self.encoder.encode_images(images, **kw)

        def encode_texts(self, texts: Any, **kw: Any) -> Any:
            time.sleep(self.delay)
            return self.encoder.encode_texts(texts, **kw)
