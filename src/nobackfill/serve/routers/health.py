"""What needs no key: liveness (``/healthz``), Prometheus metrics (``/metrics``), and the web page
(``/``, its icon; its files under ``/static``, mounted by :func:`~nobackfill.serve.app.create_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, PlainTextResponse, Response

from ..deps import get_service
from ..schema import Health
from ..service import Service

__all__ = ["STATIC", "router"]

#: the web page's files
STATIC = Path(__file__).parents[1] / "static"

router = APIRouter()


@router.get("/healthz", summary="Liveness and the collection's generation", response_model=Health)
async def healthz(svc: Service = Depends(get_service)) -> Any:
    return {"ok": True, "generation": svc.collection.generation, "models": len(svc.pool.loaded())}


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(svc: Service = Depends(get_service)) -> Any:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    await run_in_threadpool(svc.status)  # refresh the gauges
    return Response(generate_latest(svc.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def page() -> Any:
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/favicon.ico", include_in_schema=False)
@router.get("/favicon.svg", include_in_schema=False)
async def favicon() -> Any:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})
