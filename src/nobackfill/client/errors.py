"""What a :class:`~nobackfill.client.Client` raises when a call is refused: one hierarchy, the same in
process and over HTTP. Every class is a :class:`ClientError` (a ``ValueError``) carrying the HTTP
status it maps to; the kinds a caller may want to tell apart have a class each, which is also the
built-in exception the in-process library raised before (``except FileNotFoundError`` around a
missing model, ``except FileExistsError`` around ``create``, ``except BackfillError`` around
``retire`` keep working, over HTTP too):

============================  ======  =============================================================
class                         status  also a
============================  ======  =============================================================
:class:`InvalidRequest`       422     (400, 405, 415: the request itself)
:class:`Forbidden`            403     ``PermissionError`` (401: no or an unknown key)
:class:`NotFound`             404     ``FileNotFoundError`` (an item, a space, a file, a model)
:class:`AlreadyExists`        409     ``FileExistsError`` (``create`` over a collection)
:class:`Conflict`             409     refused by the collection's state (an upgrade during a backfill...)
``BackfillRefused``           409     a :class:`Conflict` and ``nobackfill.lifecycle.BackfillError``
:class:`TooLarge`             413     a body, an image or its pixels over the server's limits
:class:`ServerError`          500     an error of the server itself
:class:`Unreachable`          0       ``ConnectionError``: no answer from the server at all
============================  ======  =============================================================
"""

from __future__ import annotations

from typing import Any

__all__ = ["API_HEADER", "API_KEY_VARIABLE", "AlreadyExists", "BackfillRefused", "ClientError", "Conflict",
           "Forbidden", "InvalidRequest", "NotAServer", "NotFound", "ServerError", "TooLarge", "Unreachable",
           "as_client_error", "backfill_refused", "error_for", "key_hint"]

#: where a client over HTTP (and the command line) finds its API key when none is given
API_KEY_VARIABLE = "NOBACKFILL_API_KEY"


class ClientError(ValueError):
    """A call the collection refused: ``status`` (the HTTP status it maps to: 404 not found, 409
    conflict, 422 invalid, ...; 0: no answer), ``detail`` (what went wrong, naming the field or the
    file) and ``field`` (the argument to blame, or None). The same in process and over HTTP; a
    ValueError, as an invalid argument in process is, so ``except ValueError`` catches a refusal
    either way. Its subclasses name the kind (:mod:`nobackfill.client.errors`). ``hint`` is added
    to the message only (what a Python caller can do about it), not to ``detail``."""

    def __init__(self, status: int, detail: str, field: str | None = None, *, hint: str = "") -> None:
        super().__init__((f"{status}: {detail}" if status else detail) + hint)
        self.status, self.detail, self.field = status, detail, field


class InvalidRequest(ClientError):
    """An invalid argument or request (422; 400, 405 and 415 over HTTP)."""


class Forbidden(ClientError, PermissionError):
    """The key may not do this (403), or there is no known key (401)."""


class NotFound(ClientError, FileNotFoundError):
    """No such item, space, file or model (404)."""


class AlreadyExists(ClientError, FileExistsError):
    """There is a collection there already (409)."""


class Conflict(ClientError):
    """Refused by the collection's state (409): an upgrade during a backfill, an id given twice with
    other content, a model check that failed, a pinned route that cannot serve..."""


class TooLarge(ClientError):
    """A body, an image or its pixels over the server's limits (413)."""


class ServerError(ClientError):
    """An error of the server itself (500 and above)."""


class Unreachable(ClientError, ConnectionError):
    """The server did not answer at all (status 0): the message names its URL and why."""


class NotAServer(Unreachable):
    """Something answered at the URL, but not a nobackfill server (no ``X-Nobackfill-API`` header on
    its answer: a web server, another API, a redirect); ``status``: the HTTP status it gave."""


#: the header every answer of ``nobackfill serve`` carries (how a client knows it reached one)
API_HEADER = "x-nobackfill-api"


_BY_STATUS: dict[int, type[ClientError]] = {400: InvalidRequest, 401: Forbidden, 403: Forbidden, 404: NotFound,
                                            405: InvalidRequest, 409: Conflict, 413: TooLarge, 415: InvalidRequest,
                                            422: InvalidRequest}


def error_for(status: int, detail: str, field: str | None = None, *,
              conflict: type[ClientError] | None = None, hint: str = "") -> ClientError:
    """The error of an HTTP answer: the class of its status (``conflict``: the class of a 409)."""
    cls = (conflict or Conflict) if status == 409 else _BY_STATUS.get(status) or (
        ServerError if status >= 500 else InvalidRequest if 400 <= status < 500 else ClientError)
    return cls(status, detail, field, hint=hint)


def key_hint(status: int, *, sent: bool) -> str:
    """What a Python caller refused with a 401 / 403 can do: how to give the client its key
    (``sent``: whether the refused request carried one)."""
    if status == 403:
        return " (give the client an admin key: Client(url, api_key=...) or " + API_KEY_VARIABLE + ")"
    return (" (give the client a key: Client(url, api_key=...) or the environment variable " + API_KEY_VARIABLE + ")"
            if not sent else " (the key given, by api_key or " + API_KEY_VARIABLE + ", is not one the server knows)")


def as_client_error(e: BaseException, field: str | None = None) -> ClientError | None:
    """The :class:`ClientError` an exception of the library means (None: it is no refusal, let it
    propagate): a backfill refused, a collection already there, a file or item not found, a busy
    collection, an invalid argument. A ``skippable`` flag (a bad line ``--skip-bad`` may skip) is
    kept; a ``field`` the exception names is the error's field where ``field`` is not given."""
    from ..catalog.items import CollectionBusyError, ItemNotFoundError
    from ..catalog.schema import milvus_lost, milvus_lost_message
    from ..lifecycle.backfill_jobs import BackfillError

    if isinstance(e, ClientError):
        return e
    msg = str(e)
    field = field or getattr(e, "field", None)
    if isinstance(e, BackfillError):
        out: ClientError = backfill_refused()(409, msg, field or "backfill")
    elif isinstance(e, FileExistsError):
        out = AlreadyExists(409, msg, field)
    elif isinstance(e, (FileNotFoundError, ItemNotFoundError)):
        out = NotFound(404, msg, field)
    elif isinstance(e, CollectionBusyError):
        out = Conflict(409, msg, field)
    elif isinstance(e, ConnectionError):  # a catalog database or vector server that did not answer
        out = Unreachable(0, msg, field)
    elif milvus_lost(e):  # a Milvus server gone mid-call
        out = Unreachable(0, milvus_lost_message(e), field)
    elif isinstance(e, KeyError):
        out = InvalidRequest(422, str(e.args[0]) if e.args else msg, field)
    elif isinstance(e, ValueError):
        out = InvalidRequest(422, msg, field)
    else:
        return None
    if getattr(e, "skippable", False):
        out.skippable = True  # type: ignore[attr-defined]
    return out


def backfill_refused() -> type[ClientError]:
    """``BackfillRefused``, made on first use: a :class:`Conflict` that is also the library's
    ``BackfillError`` (the lifecycle package is imported only then, so the HTTP client stays light)."""
    cls = globals().get("BackfillRefused")
    if cls is None:
        from ..lifecycle.backfill_jobs import BackfillError

        cls = type("BackfillRefused", (Conflict, BackfillError),
                   {"__doc__": "A backfill refused (409): retiring the current space, pausing no backfill...",
                    "__module__": __name__})
        globals()["BackfillRefused"] = cls
    return cls


def __getattr__(name: str) -> Any:
    """``from nobackfill.client.errors import BackfillRefused`` (:func:`backfill_refused`)."""
    if name == "BackfillRefused":
        return backfill_refused()
    raise AttributeError(name)
