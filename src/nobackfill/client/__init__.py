"""``nobackfill.Client``: one client of a collection, in process or over HTTP, with the same methods
and return types; the command line and the service are thin shells over it (:mod:`.base`)."""

from .base import Client
from .errors import (AlreadyExists, ClientError, Conflict, Forbidden, InvalidRequest, NotFound, ServerError, TooLarge,
                     Unreachable)
from .types import AddResult, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult

__all__ = ["AddResult", "AlreadyExists", "BackfillRefused", "Client", "ClientError", "Conflict", "Forbidden",
           "ImportResult", "InvalidRequest", "ItemInfo", "NotFound", "SearchHit", "SearchResults", "ServerError",
           "TooLarge", "Unreachable", "UpgradeResult"]


def __getattr__(name: str):
    """``BackfillRefused`` (:func:`~nobackfill.client.errors.backfill_refused`), made on first use."""
    if name == "BackfillRefused":
        from .errors import backfill_refused

        return backfill_refused()
    raise AttributeError(name)
