"""Search over collections: the :class:`Searcher`, routes between embedding spaces, merging ranked
lists from several spaces and the pool of loaded models (plan changes, calibration, the backfill and
``verify`` live in :mod:`nobackfill.lifecycle`).

* :class:`Searcher` - ``search(text=... | image=..., k, filter)`` over all spaces of a collection.
* :mod:`.routes` - ``native``, ``old-model``, ``bridge``, ``fused`` and the shared query pipeline.
* :mod:`.merge` - raw, calibrated and rank merges of per-space lists.
* :mod:`.models` - :class:`ModelPool`, the encoders loaded once per process.

May import: ``catalog``, ``collection``, ``compat``, ``encoders``, ``evaluate``, ``gallery``, ``late``,
``metrics``, ``reco``.
"""

from .merge import DEFAULT_MERGE, MERGES
from .models import ModelPool
from .routes import BRIDGE, FUSED, NATIVE, OLD_MODEL, ROUTES, QuerySide, RoutePlanner
from .searcher import Hit, SearchResponse, Searcher

__all__ = ["BRIDGE", "DEFAULT_MERGE", "FUSED", "MERGES", "NATIVE", "OLD_MODEL", "ROUTES", "Hit", "ModelPool",
           "QuerySide", "RoutePlanner", "SearchResponse", "Searcher"]
