"""The HTTP service over one live-upgrading collection (FastAPI): search, items, status, upgrades,
the backfill, health and Prometheus metrics, and a web page.

Every search takes one snapshot of the collection (:class:`~nobackfill.search.Searcher`); models stay
warm for the life of the process; writes go through the collection's commits (durable once
acknowledged). A backfill runs as a thread of the server or as a separate ``collection backfill``
process on the same collection. Keys and roles: :class:`~nobackfill.serve.settings.KeyRing`.

The OpenAPI schema is the truth (:mod:`~nobackfill.serve.schema`): request bodies are validated by
the models it publishes, every 2xx body has a response model, every error is one
``{"detail", "field"}`` with a status the operation documents, and a failed request changes
nothing stored. Responses name files relative to the collection or a root the server was started
with (:mod:`~nobackfill.serve.paths`), never by their path on the server.

The layout: :mod:`~nobackfill.serve.routers` (the operations), :mod:`~nobackfill.serve.deps` (their
dependencies: the service, the key's role), :mod:`~nobackfill.serve.service` (what the app holds),
:mod:`~nobackfill.serve.bodies` (reading request bodies, the body limit) and
:mod:`~nobackfill.serve.errors` (every failure as one error body); this module puts them together.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles

from .api_docs import install_api_docs
from .bodies import LimitsAndMetrics
from .errors import ApiError, FastJSON, install_handlers
from .routers import ROUTERS
from .routers.health import STATIC
from .schema import RequestModels, any_request_errors, finish_openapi
from .service import Service
from .settings import ServeSettings

__all__ = ["ApiError", "Service", "create_app"]


def create_app(settings: ServeSettings, pool: Any = None) -> FastAPI:
    """The FastAPI application over ``settings.collection`` (see the module doc); ``pool``: a
    :class:`~nobackfill.search.ModelPool` to use (tests hand in stand-in models)."""
    svc = Service(settings, pool)
    if settings.warm:
        svc.client.warm()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(svc.close)  # a running backfill stops where it stands, said as such

    app = FastAPI(title="nobackfill", version="1",
                  description="Cross-modal search over a collection whose model upgrades without a re-index. "
                              "Every error is one JSON object {detail, field} (schema Error).",
                  default_response_class=FastJSON, generate_unique_id_function=lambda route: route.name,
                  responses=any_request_errors(), docs_url=None, redoc_url=None, lifespan=lifespan)
    app.router.redirect_slashes = False  # /v1/items/ is no item, not a redirect to another route
    app.state.service = svc
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    install_api_docs(app)  # /docs and /redoc with their assets from the package, not a CDN
    app.add_middleware(LimitsAndMetrics, max_body=settings.limits.max_body_bytes, service=svc)
    install_handlers(app)
    _publish_openapi(app, svc.models)
    return app


def _publish_openapi(app: FastAPI, models: RequestModels) -> None:
    """``app.openapi()``: FastAPI's document of the routers, finished with this app's request models
    (:func:`~nobackfill.serve.schema.finish_openapi`), built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            app.openapi_schema = finish_openapi(doc, models)
        return app.openapi_schema

    app.openapi = openapi
