"""``POST /v1/search``: by text (a JSON body) or by an image (a multipart body) on one path."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ..bodies import content_type, decode_image, form, form_filter, form_int, json_body
from ..deps import get_limits, get_service, reader
from ..errors import ApiError, FastJSON, library_error
from ..schema import SearchResults, errors, json_or_form
from ..service import Service
from ...search.filters import check_filter
from ...search.searcher import hit_json
from ..settings import Limits

__all__ = ["router"]

router = APIRouter(prefix="/v1")


@router.post("/search", summary="Search by text (JSON) or by an image (multipart)", response_model=SearchResults,
             openapi_extra=json_or_form("SearchRequest", "SearchByImage"), responses=errors(400, 401, 413, 415, 422))
async def search(request: Request, _r: str = Depends(reader), svc: Service = Depends(get_service),
                 lim: Limits = Depends(get_limits)) -> Any:
    if content_type(request, multipart=True) == "multipart":
        parts = await form(request, files={"image": (1, 1)}, fields={"k": 1, "target": 1, "filter": 1})
        try:
            data = await parts["image"].read()
        finally:
            await parts.close()
        k = form_int(parts.get("k", "10"), "k", 1, lim.max_k)
        target = parts.get("target")
        if target not in (None, "image", "text"):
            raise ApiError(422, f"target: must be 'image' or 'text', got {target!r}", "target")
        flt = _filter(form_filter(parts.get("filter")))
        img = await run_in_threadpool(decode_image, data, lim, "image")
        return await _search(svc, None, img, k, target, flt, None)
    req = await json_body(request, svc.models.search)
    return await _search(svc, req.text, None, req.k, req.target, _filter(req.filter), req.merge)


def _filter(flt: dict | None) -> dict | None:
    """The filter as the search runs it, or a 422 naming it: flat over HTTP, as the schema says (dotted
    keys reach nested metadata; the clients send nested objects that way)."""
    try:
        return check_filter(flt, nested=False)
    except ValueError as e:
        raise ApiError(422, str(e), "filter") from None


async def _search(svc: Service, text: str | None, image: Any, k: int, target: str | None, flt: dict | None,
                  merge: str | None) -> Response:
    """One search through the batcher (awaited: the batcher's thread is the only hop), counted in the
    metrics; the hits with public metadata."""
    t0 = time.perf_counter()
    try:
        r = await asyncio.wrap_future(svc.batcher.submit(text=text, image=image, k=k, target=target, filter=flt,
                                                          merge=merge))
    except Exception as e:  # an invalid query 422; a storage that does not answer 503
        err = library_error(e, "text" if text is not None else "image")
        if err is None:
            raise
        if err.status == 503:  # the next search reconnects (not after gRPC's back-off)
            svc.client.forget_storage()
        raise err from None
    spent = time.perf_counter() - t0
    for h in r.hits:
        svc.m_hits.labels(h.space, h.route).inc()
    for space in {h.space for h in r.hits} or {"none"}:
        svc.m_space.labels(space).observe(spent)
    public = svc.paths.metadata
    hits = [hit_json(h.rank, h.score, h.id, h.space, h.route, public(h.metadata, r.modality)) for h in r.hits]
    return FastJSON({"query": r.query, "modality": r.modality, "hits": hits})
