"""``bench store``'s merged search: the :class:`~nobackfill.search.Searcher` over N items split
between two spaces (an identity bridge joins them) against the same N in one space."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .store_data import K


def merged_search(x: np.ndarray, q: np.ndarray, work: Path, n_queries: int = 200) -> dict[str, Any]:
    """Per-query p50 of the Searcher over ``x`` in one space vs split between two spaces."""
    from ..compat.bridges import ProcrustesBridge
    from ..compat.upgrade import save_vector_upgrade
    from ..encoders.base import DualEncoder
    from ..collection.collection import Collection
    from ..collection.ingest import add_items, text_item
    from ..search import ModelPool, Searcher
    from ..lifecycle.plan_changes import upgrade_collection

    class Lookup(DualEncoder):
        """Texts ``g<i>`` / ``q<j>`` -> the precomputed rows (a stand-in model)."""

        kind = "lookup"
        modalities = ("text",)

        def __init__(self, tag: str) -> None:
            self.tag = tag

        @property
        def embed_dim(self) -> int:
            return x.shape[1]

        @property
        def space_id(self) -> str:
            return f"lookup-{self.tag}"

        def encode_texts(self, texts, batch_size=256, progress=False):
            return np.stack([x[int(t[1:])] if t[0] == "g" else q[int(t[1:])] for t in texts]).astype(np.float32)

        def encode_images(self, images, batch_size=128, progress=False):
            raise NotImplementedError

        def save(self, directory):
            raise NotImplementedError

    a, b = Lookup("a"), Lookup("b")
    pool = ModelPool()
    pool.put("/lookup/a", a)
    pool.put("/lookup/b", b)
    items = [text_item(f"g{i}", id=f"i{i}") for i in range(len(x))]
    shutil.rmtree(work, ignore_errors=True)
    one = Collection.create(work / "one", space_id=b.space_id, dim=b.embed_dim, model="/lookup/b", modalities=["text"])
    add_items(one, b, items, chunk_size=20_000, progress=False)
    two = Collection.create(work / "two", space_id=a.space_id, dim=a.embed_dim, model="/lookup/a", modalities=["text"])
    add_items(two, a, items[: len(items) // 2], chunk_size=20_000, progress=False)
    up = save_vector_upgrade(work / "bridge", ProcrustesBridge(np.eye(x.shape[1], dtype=np.float32), b.space_id,
                                                               a.space_id),
                             {"space_id": b.space_id, "name": "b", "embed_dim": x.shape[1]},
                             {"space_id": a.space_id, "name": "a", "embed_dim": x.shape[1]})
    upgrade_collection(two, "/lookup/b", bridges=[up], pool=pool)
    add_items(two, b, items[len(items) // 2:], chunk_size=20_000, progress=False)
    out = {}
    for name, c in (("one_space", one), ("two_spaces", two)):
        s = Searcher(c, pool=pool)
        s.search(text="q0", k=K)  # warm: indexes, snapshot
        lat = []
        for j in range(n_queries):
            t0 = time.perf_counter()
            s.search(text=f"q{j % len(q)}", k=K)
            lat.append(1000 * (time.perf_counter() - t0))
        out[name] = {"p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3)}
    out["n"] = len(x)
    out["ratio_p50"] = round(out["two_spaces"]["p50_ms"] / out["one_space"]["p50_ms"], 2)
    return out
