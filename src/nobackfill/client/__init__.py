"""``nobackfill.Client``: one client of a collection, in process or over HTTP, with the same methods
and return types; the command line and the service are thin shells over it (:mod:`.base`).

May import: ``adopt``, ``collection``, ``data``, ``evaluate``, ``gallery``, ``lifecycle``, ``search``.
"""

from .base import Client
from .types import AddResult, ClientError, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult

__all__ = ["AddResult", "Client", "ClientError", "ImportResult", "ItemInfo", "SearchHit", "SearchResults",
           "UpgradeResult"]
