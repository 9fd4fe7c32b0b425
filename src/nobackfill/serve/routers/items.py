"""``/v1/items``: add captions (a JSON body) or images (a multipart body) on one path, get one item,
its thumbnail, delete it. A failed add changes nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from ..bodies import content_type, decode_image, form, json_body, keep_upload, part_id, part_metadata, thumbnail_png
from ..deps import admin, get_limits, get_service, reader
from ..errors import ApiError
from ..schema import AddResult, Deleted, ItemOut, errors, item_links, json_or_form
from ..service import Service
from ..settings import Limits

__all__ = ["router"]

router = APIRouter(prefix="/v1/items")


@router.post("", summary="Add texts (JSON) or images (multipart: file parts 'images', ids in X-Item-Id, metadata "
                          "in X-Item-Metadata)",
             response_model=AddResult, openapi_extra=json_or_form("AddTexts", "AddImages"),
             responses={200: {"links": item_links("$response.body#/ids/0")},
                        **errors(400, 401, 403, 409, 413, 415, 422)})
async def add(request: Request, _r: str = Depends(admin), svc: Service = Depends(get_service),
              lim: Limits = Depends(get_limits)) -> Any:
    if content_type(request, multipart=True) == "multipart":
        parts = await form(request, files={"images": (1, lim.max_batch)}, fields={})
        files = parts.getlist("images")
        try:
            ids = [part_id(f, i) for i, f in enumerate(files)]
            metas = [part_metadata(f, i) for i, f in enumerate(files)]
            uploads = [(await f.read(), f.filename or "") for f in files]
        finally:
            await parts.close()
        return await run_in_threadpool(_add_images, svc, lim, uploads, ids, metas)
    req = await json_body(request, svc.models.add_texts)
    texts = [{**(it.model_extra or {}), "text": it.text, "id": it.id} for it in req.items]
    return await run_in_threadpool(_add_items, svc, texts)


def _add_images(svc: Service, lim: Limits, uploads: list[tuple[bytes, str]], ids: list[str | None],
                metas: list[dict[str, Any]]) -> dict[str, Any]:
    """Every image decoded before any is kept; the files this request stored are removed again
    if its commit does not happen (a failed request changes nothing stored). An image's metadata is
    its part's, with the server's ``path`` (the kept file) and ``filename`` where it has none."""
    for i, (data, _name) in enumerate(uploads):
        decode_image(data, lim, f"images[{i}]")
    with svc.upload_lock:  # no other request sees (or removes) a file between its write and commit
        created: list[Path] = []
        try:
            images = []
            for (data, name), own, meta in zip(uploads, ids, metas):
                path, digest, new = keep_upload(svc.uploads, data)
                if new:
                    created.append(path)
                images.append({"filename": name, **meta, "path": path, "id": own, "sha256": digest})
            return _add_items(svc, images=images)
        except BaseException:
            for path in created:
                path.unlink(missing_ok=True)
            raise


def _add_items(svc: Service, texts: list | None = None, images: list | None = None) -> dict[str, Any]:
    field = "images" if images is not None else "items"
    try:
        rep = svc.call(svc.client.add, texts=texts, images=images, wait=True,
                       chunk_size=max(1, len(texts or images)), field=field)
    except ApiError as e:  # the client's texts[n] is this body's items[n] (trial K: a field that is not there)
        if texts is not None and (e.field or "").startswith("texts["):
            e.field = "items" + e.field[len("texts"):]
            e.detail = e.detail.replace("texts[", "items[", 1) if e.detail.startswith("texts[") else e.detail
        raise
    return rep.to_dict()


@router.get("/{item_id}", summary="One item: modality, metadata, the space that serves it",
            response_model=ItemOut, responses=errors(401, 404))
async def get_item(item_id: str, _r: str = Depends(reader), svc: Service = Depends(get_service)) -> Any:
    item = svc.call(svc.client.get, item_id, field="id")
    return {**item.to_dict(), "metadata": svc.paths.metadata(item.metadata, item.modality)}


@router.get("/{item_id}/thumbnail", summary="A small PNG of an image item", response_class=Response,
            responses={200: {"description": "A PNG at most `size` pixels on its longer side.",
                             "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}}},
                       **errors(401, 404, 422)})
async def thumbnail(item_id: str, size: int = Query(160, ge=16, le=512, description="Longer side, pixels (16 to 512)."),
                    _r: str = Depends(reader), svc: Service = Depends(get_service)) -> Any:
    item = svc.collection.lookup(item_id)
    if item is None:
        raise ApiError(404, f"no item with id {item_id!r}", "id")
    if item.modality != "image":
        raise ApiError(404, f"item {item_id!r} is a text: it has no thumbnail", "id")
    return Response(content=await run_in_threadpool(thumbnail_png, Path(item.payload), size), media_type="image/png",
                    headers={"Cache-Control": "max-age=3600"})


@router.delete("/{item_id}", summary="Delete an item (never returned again)", response_model=Deleted,
               responses=errors(401, 403, 404))
async def delete(item_id: str, _r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    await run_in_threadpool(svc.call, svc.client.delete, item_id, field="id")
    return {"deleted": item_id}
