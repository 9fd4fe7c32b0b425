"""The settings of ``bench store`` (:mod:`nobackfill.bench.store`), apart so that its data module
(:mod:`.store_data`) imports them without importing the bench."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class StoreBenchConfig:
    n: int = 1_000_000
    datasets: tuple[str, ...] = ("minilm", "world", "random")
    backends: tuple[str, ...] = ("faiss:Flat", "faiss:HNSW32", "faiss:IVF1024,PQ64", "milvus-lite:FLAT",
                                 "milvus-server:HNSW32")
    real_minilm: int = 145_000  # real caption embeddings before tiling (quick: 20k)
    n_val_queries: int = 200
    n_test_queries: int = 500
    batch1_queries: int = 200
    merged_n: int = 100_000
    models: Path = Path("models")
    world: Path = Path("data/world")
    multi30k: Path | None = None
    cache_dir: Path = Path("runs/cache")
    work: Path = Path("runs/bench/store-work")
    seed: int = 0

    @classmethod
    def quick(cls, **kw: Any) -> "StoreBenchConfig":
        """N = 100k, 20k real MiniLM captions, 256 IVF lists."""
        return cls(**{"n": 100_000, "real_minilm": 20_000, "merged_n": 20_000,
                      "backends": ("faiss:Flat", "faiss:HNSW32", "faiss:IVF256,PQ64", "milvus-lite:FLAT",
                                   "milvus-server:HNSW32"), **kw})


__all__ = ["StoreBenchConfig"]
