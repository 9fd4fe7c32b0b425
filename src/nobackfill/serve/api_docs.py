"""The API's documentation pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served with their
scripts and styles from files installed with the package (the copy of Swagger UI and ReDoc that
the ``fastapi-offline`` package ships), never from a CDN: FastAPI's own pages load them from
``cdn.jsdelivr.net`` and stay blank on a machine without internet access."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "assets_dir", "install_api_docs"]

#: where the pages' scripts and styles are served
ASSETS_URL = "/docs-assets"


def assets_dir() -> Path:
    """The folder holding ``swagger-ui-bundle.js``, ``swagger-ui.css`` and ``redoc.standalone.js``."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install_api_docs(app: FastAPI) -> None:
    """``/docs``, its OAuth2 redirect page and ``/redoc`` on ``app`` (created with ``docs_url=None,
    redoc_url=None``), their assets under :data:`ASSETS_URL`."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    title, openapi_url, redirect_url = app.title, app.openapi_url, app.swagger_ui_oauth2_redirect_url

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}{openapi_url}", title=f"{title} - Swagger UI",
                                   oauth2_redirect_url=f"{root}{redirect_url}",
                                   swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}/favicon.svg")

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{openapi_url}", title=f"{title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}/favicon.svg", with_google_fonts=False)
