"""Search over collections: the :class:`Searcher`, routes between embedding spaces, merging ranked
lists from several spaces, calibration, and changes to a collection's serving plan.

* :class:`Searcher` - ``search(text=... | image=..., k, filter)`` over all spaces of a collection.
* :mod:`.routes` - ``native``, ``old-model``, ``bridge``, ``fused`` and the shared query pipeline.
* :mod:`.merge` - raw, calibrated and rank merges of per-space lists.
* :mod:`.calibrate` - routes, fused weights, score maps and the merge chosen on a calibration split.
* :mod:`.plan` - ``upgrade_collection``, ``calibrate_collection``, ``pin_route``.
"""

from .merge import DEFAULT_MERGE, MERGES
from .models import ModelPool
from .routes import BRIDGE, FUSED, NATIVE, OLD_MODEL, ROUTES, QuerySide, RoutePlanner
from .searcher import Hit, SearchResponse, Searcher

__all__ = ["BRIDGE", "DEFAULT_MERGE", "FUSED", "MERGES", "NATIVE", "OLD_MODEL", "ROUTES", "Hit", "ModelPool",
           "QuerySide", "RoutePlanner", "SearchResponse", "Searcher"]
