"""The settings of ``bench import`` (:mod:`nobackfill.bench.importing`), apart so that its helper
modules (data, checks, rows, Milvus) import them without importing the bench."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ImportBenchConfig:
    """Where the models and data are, and how much of each part runs."""

    #: a world root or split folder (its test split is used); None: a world generated in ``work``
    world: Path | None = None
    #: test images of the generated world
    world_test: int = 1000
    #: the first ``test_images`` images of the test split (None: all)
    test_images: int | None = None
    models: Path = Path("models")
    #: the Multi30K root (None: the shared copy)
    multi30k: Path | None = None
    #: Multi30K val images whose five captions are used (None: all)
    text_limit: int | None = None
    #: captions embedded by MiniLM for the wrong-model case (None: all of them)
    minilm_captions: int | None = None
    minilm: str = "minilm"
    sizes: tuple[int, ...] = (100_000, 1_000_000)
    dim: int = 128
    batch_rows: int = 16384
    trials: int = 50
    samples: int = 64
    threshold: float = 0.99
    work: Path = Path("runs/bench/import-work")
    parts: tuple[str, ...] = ("identical", "throughput", "model_check", "milvus_in_place")
    seed: int = 0
    #: throughput: also run ``collection import`` and then ``collection index`` on the same rows
    #: (with the model under ``models`` whose vectors are ``dim``-d; skipped when there is none)
    commands: bool = True
    #: milvus_in_place: the shipped world-old -> world-new upgrade (None: ``upgrades/world-old-to-new``
    #: beside ``models``), text queries per search pass
    upgrade: Path | None = None
    milvus_queries: int = 20
    #: milvus_in_place on a Milvus server (``HOST:PORT``; None: milvus-lite in ``work``) with the
    #: PostgreSQL catalog ``catalog`` (None: one started in ``work``); ``shared``: start both on
    #: 127.0.0.1 in ``work`` and stop them after (run it under ``scripts/isolated.sh``)
    milvus_uri: str | None = None
    catalog: str | None = None
    shared: bool = False

    @classmethod
    def quick(cls, **kw: Any) -> "ImportBenchConfig":
        """100k rows only, a 300-image world, 1,000 MiniLM captions, 20 trials per case."""
        return cls(**{"sizes": (100_000,), "world_test": 300, "test_images": 300, "minilm_captions": 1000,
                      "trials": 20, **kw})


__all__ = ["ImportBenchConfig"]
