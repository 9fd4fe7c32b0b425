"""Every failure as one JSON body ``{"detail", "field"}`` (:class:`~nobackfill.serve.schema.ErrorBody`):
:class:`ApiError` (what a client caused), the exception handlers that turn it, FastAPI's validation
errors and Starlette's HTTP errors into that body, and :class:`FastJSON`, the response class every
JSON reply (errors included) is rendered by.

Messages name files as :mod:`~nobackfill.serve.paths` shows them (never a path on the server),
except for a 404 / 405, which name the client's own request path.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .schema import ID_PATTERN, NONBLANK, REL_PATH, SEGMENT

__all__ = ["ApiError", "FastJSON", "allowed_methods", "error_response", "install_handlers", "loc",
           "validation_error"]

log = logging.getLogger("nobackfill.serve")


class ApiError(Exception):
    """An error a client caused: ``status`` and a message naming the field or the problem."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


class FastJSON(JSONResponse):
    """A JSON response serialised by orjson (several times faster than json for hit lists); what
    orjson refuses (integers past 64 bits, very deep nesting) goes through the json module."""

    def render(self, content: Any) -> bytes:
        import orjson

        try:
            return orjson.dumps(content)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            return json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")


def error_response(status: int, detail: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    """The one error body (:class:`~nobackfill.serve.schema.ErrorBody`): ``field`` always present."""
    return FastJSON({"detail": detail, "field": field}, status_code=status, headers=headers)


def loc(parts: Any) -> str:
    """``("items", 0, "text")`` -> ``items[0].text``."""
    out = ""
    for x in parts:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def validation_error(errs: list[dict]) -> ApiError:
    """The first of pydantic's errors as one message that names the field (``items[0].text``)."""
    first = errs[0] if errs else {}
    parts = list(first.get("loc", ()))
    if parts and parts[0] in ("body", "query", "path", "header"):  # where it was; a body's own field may be
        parts = parts[1:]  # named path (trial K: an import's absolute path was blamed on "body")
    field = loc(parts) or "body"
    kind, ctx, value = first.get("type", ""), first.get("ctx") or {}, first.get("input")
    msg = first.get("msg", "invalid")
    if kind == "json_invalid":
        return ApiError(400, f"malformed JSON: {ctx.get('error', msg)}", "body")
    if kind == "string_pattern_mismatch":
        pattern = ctx.get("pattern")
        if pattern == NONBLANK:
            msg = "empty (only white space)"
        elif pattern == ID_PATTERN:
            msg = "not a valid id (no '/', '\\\\' or control characters; not starting with '.', '[' or a space)"
        elif pattern in (REL_PATH, SEGMENT):
            if isinstance(value, str) and value.startswith("/"):  # (not echoed: the path is the server's)
                return ApiError(400, f"{field}: an absolute path; name it relative to the server's root (its "
                                     f"--models-root, --upgrades-root or --data-root)", field)
            if isinstance(value, str) and ".." in value.replace("\\", "/").split("/"):
                return ApiError(400, f"{field}: {value!r} lies outside the allowed root", field)
            msg = "a path relative to the root: segments of letters, digits, '_', '-', '+', '.', none starting with '.'"
    elif kind == "string_too_long":
        msg = f"{len(value) if isinstance(value, str) else '?'} characters, the limit is {ctx.get('max_length')}"
    elif kind == "too_long":
        n = len(value) if isinstance(value, (list, tuple)) else "?"
        msg = f"{n} items, the limit is {ctx.get('max_length')} per request"
    elif kind in ("too_short", "string_too_short"):
        msg = "empty"
    elif kind in ("less_than_equal", "greater_than_equal", "greater_than", "less_than"):
        msg = f"{msg}, got {value!r}"
    elif kind == "extra_forbidden":
        msg = "unknown field"
    elif kind == "missing":
        msg = "required"
    return ApiError(422, f"{field}: {msg}", field)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this path (for ``Allow``), the routes of the included
    routers too (a FastAPI that keeps an included router as one route lists them by
    ``iter_route_contexts``; an older one copies them into the app's routes)."""
    from starlette.routing import Match

    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before nested routers
        def iter_route_contexts(routes):
            return routes

    methods: set[str] = set()
    for route in iter_route_contexts(request.scope["app"].router.routes):
        allowed = getattr(route, "methods", None)  # a Mount takes every method of its own app
        if allowed and route.matches(request.scope)[0] != Match.NONE:
            methods |= set(allowed)
    order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    return sorted(methods, key=lambda m: (order.index(m) if m in order else len(order), m))


def _public(request: Request, text: str) -> str:
    """``text`` with the server's paths shown as the service shows them."""
    return request.app.state.service.paths.text(text)


# ----------------------------------------------------------------------------- the handlers
def _shown(request: Request, status: int, detail: str) -> str:
    """``detail`` as the request's key may read it: a 503 (a storage that did not answer) names the
    catalog's or Milvus' host, port, database and user for an admin key only; a read key is told it
    did not answer (trial AH: serve.md says responses name no storage URI). The log has it whole."""
    if status == 503:
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        if request.app.state.service.settings.keys.role_of(token) != "admin":
            log.warning("storage unreachable (said to a client without its address): %s", detail)
            return ("the collection's storage (its catalog database or vector server) does not answer: retry later "
                    "(an admin key's answer, and the server's log, name it)")
    return _public(request, detail)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, _shown(request, exc.status, exc.detail), exc.field)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    err = validation_error(exc.errors())
    return error_response(err.status, _public(request, err.detail), err.field)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    headers = dict(exc.headers or {})
    field = getattr(exc, "field", None)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404:
        detail, field = f"not found: {request.method} {request.url.path}", "path"
    elif exc.status_code == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        detail, field = f"{request.method} is not allowed here (allowed: {', '.join(allowed)})", "method"
    elif exc.status_code == 400 and field is None:
        field = "body"  # a multipart body that does not parse
        detail = f"malformed body: {detail}"
    if exc.status_code not in (404, 405):  # those name the client's own path
        detail = _public(request, detail)
    return error_response(exc.status_code, detail, field, headers=headers)


def library_error(e: BaseException, field: str | None = None) -> ApiError | None:
    """The API error a library exception means (:func:`~nobackfill.client.errors.as_client_error`;
    None: none, a 500): a catalog or a Milvus server that does not answer is 503, naming it."""
    from ..client.errors import Unreachable, as_client_error

    err = as_client_error(e, field)
    if err is None:
        return None
    return ApiError(503 if isinstance(err, Unreachable) or not err.status else err.status, err.detail,
                    err.field or field)


async def unreachable(request: Request, exc: ConnectionError) -> JSONResponse:
    """A catalog or Milvus server that did not answer, wherever a route met it: 503, naming it."""
    err = library_error(exc) or ApiError(503, str(exc), None)
    return error_response(err.status, _shown(request, err.status, err.detail), err.field)


async def server_error(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__})", None)


def install_handlers(app: FastAPI) -> None:
    """Every error of ``app`` as one :class:`~nobackfill.serve.schema.ErrorBody`."""
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ConnectionError, unreachable)
    app.add_exception_handler(Exception, server_error)
