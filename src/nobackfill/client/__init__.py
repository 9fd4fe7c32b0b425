"""``nobackfill.Client``: one client of a collection, in process or over HTTP, with the same methods
and return types; the command line and the service are thin shells over it (:mod:`.base`).

May import: ``adopt``, ``collection``, ``data``, ``evaluate``, ``gallery``, ``lifecycle``, ``search``.
"""

from .base import Client, choose_implementation_with
from .types import AddResult, ClientError, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult


def _implementation(target: str) -> type[Client]:
    """The class that serves ``target``: an ``http(s)://`` URL over HTTP (:mod:`.remote`), anything
    else in process (:mod:`.local`); imported on first use, so ``import nobackfill`` loads neither
    httpx nor the search stack."""
    if target.startswith(("http://", "https://")):
        from .remote import RemoteClient
        return RemoteClient
    from .local import LocalClient
    return LocalClient


choose_implementation_with(_implementation)

__all__ = ["AddResult", "Client", "ClientError", "ImportResult", "ItemInfo", "SearchHit", "SearchResults",
           "UpgradeResult"]
