"""The world collections the system benches share (``bench routes``, ``backfill``, ``serve``): the
test split as items and queries with their relevant ids, a collection embedded by one model, and
one embedded by ``world-old`` and live-upgraded to ``world-new`` with the shipped XBT upgrade
(the measuring itself is :mod:`nobackfill.lifecycle.measuring.measure`'s)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .host import shipped_path
from ..collection.collection import Collection
from ..lifecycle.measuring.measure import QuerySet as WorldEval
from ..lifecycle.measuring.measure import embedded_collection, fresh_dir, hit_ranks, upgraded_collection
from ..lifecycle.measuring.measure import split_queries as world_eval
from ..search import ModelPool
from ..search.models import model_ref


@dataclass
class UpgradeInputs:
    """Where the shipped models, data and upgrades of the two upgrades the system benches measure
    are: world-old -> world-new (world), and m30k-old-text -> MiniLM (Multi30K, ``multi30k``: default
    the shared copy; ``eval_dir``: another split)."""

    models: Path = Path("models")
    world: Path = Path("data/world")
    upgrade: Path = Path("upgrades/world-old-to-new")
    text_old: Path = Path("models/m30k-old-text")
    text_new: str = "minilm"
    text_upgrade: Path = Path("upgrades/m30k-old-text-to-minilm")
    multi30k: Path | None = None
    eval_dir: Path | None = None


def upgraded_world_collection(cfg: Any, pool: ModelPool, ev: WorldEval, path: Path,
                              log: Callable[[str], None]) -> tuple[Collection, Any, float]:
    """A collection of ``ev``'s items embedded by world-old, upgraded to world-new with the shipped
    upgrade ``cfg.upgrade`` and calibrated on ``cfg.calib_images`` val images (``cfg``: a
    routes, backfill or serve bench config); returns it, its plan and the upgrade's seconds."""
    return upgraded_collection(ev, path, pool, old_ref=model_ref(cfg.models / "world-old"),
                               new_ref=model_ref(cfg.models / "world-new"), upgrade=shipped_path(cfg.upgrade),
                               calibration=cfg.world, calib_images=cfg.calib_images, log=log)


__all__ = ["UpgradeInputs", "WorldEval", "embedded_collection", "fresh_dir", "hit_ranks", "upgraded_world_collection", "world_eval"]
