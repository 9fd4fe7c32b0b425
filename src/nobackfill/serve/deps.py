"""The routers' dependencies: the app's :class:`~nobackfill.serve.service.Service`, its settings and
limits, and the key a request carries (``Authorization: Bearer KEY``) as a role: :func:`reader` (any
key), :func:`admin` (an admin key), :func:`admin_json` (an admin key and a JSON body).

All are ``async``: FastAPI runs a plain function dependency in the thread pool, a hop these need not
make.
"""

from __future__ import annotations

from typing import Optional

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .bodies import content_type
from .errors import ApiError
from .service import Service
from .settings import Limits, ServeSettings

__all__ = ["admin", "admin_json", "bearer", "get_limits", "get_service", "get_settings", "reader", "role"]

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer KEY`.")


async def get_service(request: Request) -> Service:
    """The service of the app that took the request (``app.state.service``)."""
    return request.app.state.service


async def get_settings(svc: Service = Depends(get_service)) -> ServeSettings:
    return svc.settings


async def get_limits(settings: ServeSettings = Depends(get_settings)) -> Limits:
    return settings.limits


async def role(cred: Optional[HTTPAuthorizationCredentials] = Depends(bearer),
               settings: ServeSettings = Depends(get_settings)) -> str:
    """The role of the request's key; 401 without a known one."""
    r = settings.keys.role_of(cred.credentials.strip() if cred else None)
    if r is None:
        raise ApiError(401, "missing or unknown API key (send Authorization: Bearer KEY)", "authorization")
    return r


async def reader(r: str = Depends(role)) -> str:
    """Any key (read or admin)."""
    return r


async def admin(r: str = Depends(role)) -> str:
    """An admin key; 403 for a read key."""
    if r != "admin":
        raise ApiError(403, "this needs an admin key", "authorization")
    return r


async def admin_json(request: Request, _r: str = Depends(admin)) -> None:
    """An admin key, then 415 for a body that is not JSON (a route-level dependency: it runs
    before the body is validated)."""
    content_type(request, multipart=False)
