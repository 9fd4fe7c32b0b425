"""``nobackfill.Client``: one client of a collection, in process or over HTTP, with the same methods
and return types; the command line and the service are thin shells over it (:mod:`.base`). Its
refusals are one hierarchy (:mod:`.errors`): a :class:`ClientError` subclass per kind, each a
``ValueError``.

May import: ``adopt``, ``catalog``, ``collection``, ``data``, ``encoders``, ``evaluate``, ``gallery``, ``lifecycle``,
``progress``, ``search``.
"""

from .base import Client, choose_implementation_with
from .errors import (AlreadyExists, ClientError, Conflict, Forbidden, InvalidRequest, NotAServer, NotFound, ServerError,
                     TooLarge, Unreachable)
from .types import AddResult, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult

__all__ = ["AddResult", "AlreadyExists", "BackfillRefused", "Client", "ClientError", "Conflict", "Forbidden",
           "ImportResult", "InvalidRequest", "ItemInfo", "NotAServer", "NotFound", "SearchHit", "SearchResults", "ServerError",
           "TooLarge", "Unreachable", "UpgradeResult"]


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


def __getattr__(name: str):
    """``BackfillRefused`` (:func:`~nobackfill.client.errors.backfill_refused`), made on first use."""
    if name == "BackfillRefused":
        from .errors import backfill_refused

        return backfill_refused()
    raise AttributeError(name)
