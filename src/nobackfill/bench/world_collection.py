"""The world collections the system benches share (``bench routes``, ``backfill``, ``serve``): the
test split as items and queries with their relevant ids, a collection embedded by one model, and
one embedded by ``world-old`` and live-upgraded to ``world-new`` with the shipped XBT upgrade
(the measuring itself is :mod:`nobackfill.lifecycle.measure`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..collection.collection import Collection
from ..lifecycle.measure import QuerySet as WorldEval
from ..lifecycle.measure import embedded_collection, fresh_dir, hit_ranks, upgraded_collection
from ..lifecycle.measure import split_queries as world_eval
from ..search import ModelPool
from ..search.models import model_ref


def upgraded_world_collection(cfg: Any, pool: ModelPool, ev: WorldEval, path: Path,
                              log: Callable[[str], None]) -> tuple[Collection, Any, float]:
    """A collection of ``ev``'s items embedded by world-old, upgraded to world-new with the shipped
    upgrade ``cfg.upgrade`` and calibrated on ``cfg.calib_images`` val images (``cfg``: a
    routes, backfill or serve bench config); returns it, its plan and the upgrade's seconds."""
    return upgraded_collection(ev, path, pool, old_ref=model_ref(cfg.models / "world-old"),
                               new_ref=model_ref(cfg.models / "world-new"), upgrade=cfg.upgrade,
                               calibration=cfg.world, calib_images=cfg.calib_images, log=log)


__all__ = ["WorldEval", "embedded_collection", "fresh_dir", "hit_ranks", "upgraded_world_collection", "world_eval"]
