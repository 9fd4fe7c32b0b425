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
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Optional

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from .batching import SearchBatcher
from .paths import PublicPaths
from .schema import (AddResult, BackfillRequest, BackfillStatus, CalibrateRequest, Deleted, Health, ImportRequest,
                     ImportResult, ItemOut, RetireRequest, Retired, RouteRequest, Routes, VerifyReport, VerifyRequest,
                     SearchResults, Status, UpgradeRequest, UpgradeResult, errors, finish_openapi, form_encodings,
                     request_models)
from .settings import ServeSettings

log = logging.getLogger("nobackfill.serve")
STATIC = Path(__file__).with_name("static")


class ApiError(Exception):
    """An error a client caused: ``status`` and a message naming the field or the problem."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


class _TooLarge(StarletteHTTPException):
    """A body that grows past the limit while it is read (chunked, or longer than it said)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body exceeds the limit of {limit} bytes")
        self.field = "body"


# ----------------------------------------------------------------------------- the service state
class Service:
    """What the app holds for its life: the in-process client of the collection (warm models and
    searchers, the backfill thread), the path rules and the metrics."""

    def __init__(self, settings: ServeSettings, pool: Any = None) -> None:
        from ..client.local import LocalClient

        self.settings = settings
        self.client = LocalClient(settings.collection, pool=pool, limits=settings.limits)
        self.collection = self.client.collection
        self.pool = self.client.pool
        if settings.uploads is not None:
            self.uploads = Path(settings.uploads)
        elif isinstance(self.collection.path, Path):
            self.uploads = self.collection.path / "uploads"
        else:
            raise ValueError("a collection outside the file system needs --uploads DIR for uploaded images")
        self.upload_lock = threading.Lock()  # image adds: stored files and their commit, or neither
        local = self.collection.path if isinstance(self.collection.path, Path) else None
        self.paths = PublicPaths([(local, ""), (self.uploads, "uploads/"), (settings.data_root, ""),
                                  (settings.models_root, ""), (settings.upgrades_root, "")])
        self.batcher = SearchBatcher(self.client.searcher)
        self._metrics()

    def _metrics(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.m_requests = Counter("nobackfill_requests_total", "HTTP requests", ["endpoint", "method", "status"],
                                  registry=r)
        self.m_latency = Histogram("nobackfill_request_seconds", "HTTP request latency", ["endpoint"], registry=r,
                                   buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
        self.m_hits = Counter("nobackfill_search_hits_total", "Search hits returned, by space and route",
                              ["space", "route"], registry=r)
        self.m_space = Histogram("nobackfill_search_seconds", "Search latency by the spaces that answered",
                                 ["space"], registry=r, buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1))
        self.g_done = Gauge("nobackfill_backfill_done", "Items served by the current space", registry=r)
        self.g_total = Gauge("nobackfill_backfill_total", "Items the current model can embed", registry=r)
        self.g_items = Gauge("nobackfill_items", "Live items", ["modality"], registry=r)

    # ------------------------------------------------------------------ paths from requests
    def under(self, root: Path | None, rel: str, what: str, option: str, *, file: bool = False) -> Path:
        """``root / rel`` if it stays inside ``root`` (a path from a request is never used as is): a
        directory, or with ``file`` a file."""
        if root is None:
            raise ApiError(403, f"{what}: this server takes no such paths (start it with {option})", what)
        if not isinstance(rel, str) or not rel or "\x00" in rel:
            raise ApiError(422, f"{what}: a relative path is required", what)
        try:
            base = root.resolve()
            target = (base / rel).resolve()
            if base != target and base not in target.parents:
                raise ApiError(400, f"{what}: {rel!r} lies outside the allowed root ({option})", what)
            if not (target.is_file() if file else target.is_dir()):
                raise ApiError(404, f"{what}: {rel!r} is no {'file' if file else 'directory'} under {option}", what)
        except OSError as e:  # a name too long, a loop of links, no permission: nothing usable there
            raise ApiError(404, f"{what}: {rel!r} is not readable under {option} ({type(e).__name__})", what) from None
        return target

    def backfill_status(self) -> dict[str, Any]:
        """The backfill's status with this server's worker, no server path in it (every backfill
        reply is this)."""
        return self.paths.deep(self.client.backfill_status())

    def call(self, fn: Any, *args: Any, field: str | None = None, **kw: Any) -> Any:
        """``fn(*args, **kw)`` of the client, its refusals as API errors (ClientError: its status;
        ValueError / KeyError: 422 naming ``field``)."""
        from ..client import ClientError

        try:
            return fn(*args, **kw)
        except ClientError as e:
            raise ApiError(e.status, e.detail, e.field or field) from None
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise ApiError(422, str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e), field) from None


# ----------------------------------------------------------------------------- the app
def create_app(settings: ServeSettings, pool: Any = None) -> FastAPI:
    """The FastAPI application over ``settings.collection`` (see the module doc); ``pool``: a
    :class:`~nobackfill.search.ModelPool` to use (tests hand in stand-in models)."""
    svc = Service(settings, pool)
    if settings.warm:
        svc.client.warm()
    lim = settings.limits
    models = request_models(lim.max_k, lim.max_caption_chars, lim.max_batch, lim.max_image_bytes)
    app = FastAPI(title="nobackfill", version="1",
                  description="Cross-modal search over a collection whose model upgrades without a re-index. "
                              "Every error is one JSON object {detail, field} (schema Error).",
                  default_response_class=_FastJSON, generate_unique_id_function=lambda route: route.name)
    app.router.redirect_slashes = False  # /v1/items/ is no item, not a redirect to another route
    app.state.service = svc

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            app.openapi_schema = finish_openapi(doc, models)
        return app.openapi_schema

    app.openapi = openapi

    # ------------------------------------------------------------------ middleware / errors
    app.add_middleware(_LimitsAndMetrics, max_body=lim.max_body_bytes, service=svc)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError):
        return _error(exc.status, svc.paths.text(exc.detail), exc.field)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        err = _validation(exc.errors())
        return _error(err.status, svc.paths.text(err.detail), err.field)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = dict(exc.headers or {})
        field = getattr(exc, "field", None)
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            detail, field = f"not found: {request.method} {request.url.path}", "path"
        elif exc.status_code == 405:
            allowed = _allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            detail, field = f"{request.method} is not allowed here (allowed: {', '.join(allowed)})", "method"
        elif exc.status_code == 400 and field is None:
            field = "body"  # a multipart body that does not parse
            detail = f"malformed body: {detail}"
        if exc.status_code not in (404, 405):  # those name the client's own path
            detail = svc.paths.text(detail)
        return _error(exc.status_code, detail, field, headers=headers)

    @app.exception_handler(Exception)
    async def server_error(_request: Request, exc: Exception):
        log.error("unhandled error", exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__})", None)

    bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer KEY`.")

    async def role(cred: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> str:
        r = settings.keys.role_of(cred.credentials.strip() if cred else None)  # async: no thread-pool hop
        if r is None:
            raise ApiError(401, "missing or unknown API key (send Authorization: Bearer KEY)", "authorization")
        return r

    async def reader(r: str = Depends(role)) -> str:
        return r

    async def admin(r: str = Depends(role)) -> str:
        if r != "admin":
            raise ApiError(403, "this needs an admin key", "authorization")
        return r

    async def admin_json(request: Request, _r: str = Depends(admin)) -> None:
        """An admin key, then 415 for a body that is not JSON (a route-level dependency: it runs
        before the body is validated)."""
        _content_type(request, multipart=False)

    # ------------------------------------------------------------------ search
    def _search(text: str | None, image: Any, k: int, target: str | None, flt: dict | None,
                merge: str | None) -> Response:
        t0 = time.perf_counter()
        try:
            r = svc.batcher.search(text=text, image=image, k=k, target=target, filter=flt, merge=merge)
        except (ValueError, KeyError) as e:
            raise ApiError(422, str(e), "text" if text is not None else "image") from None
        spent = time.perf_counter() - t0
        for h in r.hits:
            svc.m_hits.labels(h.space, h.route).inc()
        for space in {h.space for h in r.hits} or {"none"}:
            svc.m_space.labels(space).observe(spent)
        public = svc.paths.metadata
        hits = [{**public(h.metadata), "rank": h.rank, "score": h.score, "id": h.id, "space": h.space, "route": h.route}
                for h in r.hits]  # the hit's own fields win over metadata keys of the same name
        return _FastJSON({"query": r.query, "modality": r.modality, "hits": hits})

    def _item_links(item_id: str) -> dict[str, Any]:
        """OpenAPI links from an added item to the operations on it (schemathesis' stateful phase)."""
        return {name: {"operationId": op, "parameters": {"item_id": item_id}}
                for name, op in (("GetItem", "get_item"), ("GetThumbnail", "thumbnail"), ("DeleteItem", "delete"))}

    def _bodies(json_model: str, form: str) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{json_model}"}},
            "multipart/form-data": {"schema": {"$ref": f"#/components/schemas/{form}"},
                                    "encoding": form_encodings()[form]}}}}

    @app.post("/v1/search", summary="Search by text (JSON) or by an image (multipart)", response_model=SearchResults,
              openapi_extra=_bodies("SearchRequest", "SearchByImage"), responses=errors(400, 401, 413, 415, 422))
    async def search(request: Request, _r: str = Depends(reader)) -> Any:
        if _content_type(request, multipart=True) == "multipart":
            form = await _form(request, files={"image": (1, 1)}, fields={"k": 1, "target": 1, "filter": 1})
            try:
                data = await form["image"].read()
            finally:
                await form.close()
            k = _form_int(form.get("k", "10"), "k", 1, lim.max_k)
            target = form.get("target")
            if target not in (None, "image", "text"):
                raise ApiError(422, f"target: must be 'image' or 'text', got {target!r}", "target")
            flt = _form_filter(form.get("filter"))
            img = await _run(_decode_image, data, lim, "image")
            return await _run(_search, None, img, k, target, flt, None)
        req = await _json_body(request, models.search)
        return await _run(_search, req.text, None, req.k, req.target, req.filter, req.merge)

    # ------------------------------------------------------------------ items
    @app.post("/v1/items", summary="Add texts (JSON) or images (multipart: file parts 'images', ids in X-Item-Id)",
              response_model=AddResult, openapi_extra=_bodies("AddTexts", "AddImages"),
              responses={200: {"links": _item_links("$response.body#/ids/0")},
                         **errors(400, 401, 403, 409, 413, 415, 422)})
    async def add(request: Request, _r: str = Depends(admin)) -> Any:
        if _content_type(request, multipart=True) == "multipart":
            form = await _form(request, files={"images": (1, lim.max_batch)}, fields={})
            files = form.getlist("images")
            try:
                ids = [_part_id(f, i) for i, f in enumerate(files)]
                uploads = [(await f.read(), f.filename or "") for f in files]
            finally:
                await form.close()
            return await _run(_add_images, uploads, ids)
        req = await _json_body(request, models.add_texts)
        texts = [{**(it.model_extra or {}), "text": it.text, "id": it.id} for it in req.items]
        return await _run(_add_items, texts)

    def _add_images(uploads: list[tuple[bytes, str]], ids: list[str | None]) -> dict[str, Any]:
        """Every image decoded before any is kept; the files this request stored are removed again
        if its commit does not happen (a failed request changes nothing stored)."""
        for i, (data, _name) in enumerate(uploads):
            _decode_image(data, lim, f"images[{i}]")
        with svc.upload_lock:  # no other request sees (or removes) a file between its write and commit
            created: list[Path] = []
            try:
                images = []
                for (data, name), own in zip(uploads, ids):
                    path, digest, new = _keep_upload(svc.uploads, data)
                    if new:
                        created.append(path)
                    images.append({"path": path, "id": own, "sha256": digest, "filename": name})
                return _add_items(images=images)
            except BaseException:
                for path in created:
                    path.unlink(missing_ok=True)
                raise

    def _add_items(texts: list | None = None, images: list | None = None) -> dict[str, Any]:
        field = "images" if images is not None else "items"
        rep = svc.call(svc.client.add, texts=texts, images=images, wait=True, chunk_size=max(1, len(texts or images)),
                       field=field)
        return rep.to_dict()

    @app.get("/v1/items/{item_id}", summary="One item: modality, metadata, the space that serves it",
             response_model=ItemOut, responses=errors(401, 404))
    async def get_item(item_id: str, _r: str = Depends(reader)) -> Any:
        item = svc.call(svc.client.get, item_id, field="id")
        return {**item.to_dict(), "metadata": svc.paths.metadata(item.metadata)}

    @app.get("/v1/items/{item_id}/thumbnail", summary="A small PNG of an image item", response_class=Response,
             responses={200: {"description": "A PNG at most `size` pixels on its longer side.",
                              "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}}},
                        **errors(401, 404, 422)})
    async def thumbnail(item_id: str, size: int = Query(160, ge=16, le=512, description="Longer side, pixels."),
                        _r: str = Depends(reader)) -> Any:
        item = svc.collection.lookup(item_id)
        if item is None:
            raise ApiError(404, f"no item with id {item_id!r}", "id")
        if item.modality != "image":
            raise ApiError(404, f"item {item_id!r} is a text: it has no thumbnail", "id")
        return Response(content=await _run(_thumb, Path(item.payload), size), media_type="image/png",
                        headers={"Cache-Control": "max-age=3600"})

    @app.delete("/v1/items/{item_id}", summary="Delete an item (never returned again)", response_model=Deleted,
                responses=errors(401, 403, 404))
    async def delete(item_id: str, _r: str = Depends(admin)) -> Any:
        await _run(svc.call, svc.client.delete, item_id, field="id")
        return {"deleted": item_id}

    # ------------------------------------------------------------------ status / control
    @app.get("/v1/status", summary="Spaces, counts, current model, routes, backfill progress",
             response_model=Status, responses=errors(401))
    async def status(_r: str = Depends(reader)) -> Any:
        return await _run(_status)

    def _status() -> dict[str, Any]:
        st = svc.client.status()
        svc.g_done.set(st["backfill"]["done"])
        svc.g_total.set(st["backfill"]["total"])
        for m, n in st["items"].items():
            svc.g_items.labels(m).set(n)
        return svc.paths.deep(st)  # the collection, models and messages by name, no server path

    def _backfill(fn: Any, *args: Any) -> dict[str, Any]:
        from ..lifecycle.backfill import BackfillError

        try:
            svc.call(fn, *args, field="backfill")
        except BackfillError as e:
            raise ApiError(409, str(e), "backfill") from None
        return svc.backfill_status()

    @app.post("/v1/backfill/start", summary="Start (or resume) the backfill in this server",
              response_model=BackfillStatus, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 409, 413, 415, 422))
    async def backfill_start(req: BackfillRequest, _r: str = Depends(admin)) -> Any:
        return await _run(_backfill, svc.client.backfill_start, req.order, req.rate)

    @app.post("/v1/backfill/pause", summary="Pause the backfill (every worker stops after its batch)",
              response_model=BackfillStatus, responses=errors(401, 403, 409))
    async def backfill_pause(_r: str = Depends(admin)) -> Any:
        return await _run(_backfill, svc.client.backfill_pause)

    @app.post("/v1/backfill/resume", summary="Resume a paused backfill in this server",
              response_model=BackfillStatus, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 409, 413, 415, 422))
    async def backfill_resume(req: BackfillRequest, _r: str = Depends(admin)) -> Any:
        return await _run(_backfill, svc.client.backfill_resume, req.order, req.rate)

    @app.post("/v1/backfill/cancel", summary="Forget the backfill job (what was committed stays and is served)",
              response_model=BackfillStatus, responses=errors(401, 403, 409))
    async def backfill_cancel(_r: str = Depends(admin)) -> Any:
        return await _run(_backfill, svc.client.backfill_cancel)

    @app.post("/v1/upgrade", summary="Register a new model (and its bridges) as the current one",
              response_model=UpgradeResult, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
    async def upgrade(req: UpgradeRequest, _r: str = Depends(admin)) -> Any:
        model = svc.under(settings.models_root, req.model, "model", "--models-root")
        bridges = [svc.under(settings.upgrades_root, b, f"bridges[{i}]", "--upgrades-root")
                   for i, b in enumerate(req.bridges)]
        if not (model / "config.json").is_file():
            raise ApiError(422, f"model: {req.model!r} is not a model directory (no config.json)", "model")
        for i, b in enumerate(bridges):
            if not (b / "upgrade.json").is_file():
                raise ApiError(422, f"bridges[{i}]: {req.bridges[i]!r} is not an upgrade directory", f"bridges[{i}]")
        data = svc.under(settings.data_root, req.calibrate, "calibrate", "--data-root") if req.calibrate else None
        rep = await _run(svc.call, svc.client.upgrade, model, bridges=bridges, calibrate=data,
                         calibrate_split=req.calibrate_split, calibrate_limit=req.calibrate_limit,
                         calibrate_langs=req.calibrate_langs, field="calibrate" if data is not None else "model")
        return svc.paths.deep(rep.to_dict())

    @app.post("/v1/routes", summary="Pin (or unpin) the route to an older space for one direction",
              response_model=Routes, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 413, 415, 422))
    async def pin_route(req: RouteRequest, _r: str = Depends(admin)) -> Any:
        table = await _run(svc.call, svc.client.route, req.space, req.direction, req.route, w=req.w, field="space")
        return svc.paths.deep({"routes": table, "merge": svc.collection.plan.merge_method})

    @app.post("/v1/calibrate", summary="Choose routes and the merge on labelled data (a path under --data-root)",
              response_model=Routes, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
    async def calibrate(req: CalibrateRequest, _r: str = Depends(admin)) -> Any:
        data = svc.under(settings.data_root, req.data, "data", "--data-root")
        out = await _run(svc.call, svc.client.calibrate, data, split=req.split, limit=req.limit, langs=req.langs,
                         field="data")
        return svc.paths.deep(out)

    @app.post("/v1/retire", summary="Drop an old space once the current space serves every item",
              response_model=Retired, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 409, 413, 415, 422))
    async def retire(req: RetireRequest, _r: str = Depends(admin)) -> Any:
        from ..lifecycle.backfill import BackfillError

        try:
            return await _run(svc.call, svc.client.retire, req.space, drop_unsourced=req.drop_unsourced,
                              field="space")
        except BackfillError as e:
            raise ApiError(409, str(e), "space") from None

    @app.post("/v1/verify", summary="Check every stored file of the collection (read only)",
              response_model=VerifyReport, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 413, 415, 422))
    async def verify(req: VerifyRequest, _r: str = Depends(admin)) -> Any:
        rep = await _run(svc.call, svc.client.verify, model_check=req.model_check)
        rep.pop("path", None)
        rep.pop("repaired", None)
        return svc.paths.deep(rep)

    @app.post("/v1/import", summary="Import vectors embedded elsewhere (a path under --data-root)",
              response_model=ImportResult, dependencies=[Depends(admin_json)],
              responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
    async def import_(req: ImportRequest, _r: str = Depends(admin)) -> Any:
        root = settings.data_root
        path = svc.under(root, req.path, "path", "--data-root", file=req.format != "clip-retrieval")
        table = svc.under(root, req.table, "table", "--data-root", file=True) if req.table else None
        images = svc.under(root, req.images_root, "images_root", "--data-root") if req.images_root else None
        rep = await _run(svc.call, svc.client.import_, f"{req.format}:{path}", table=table, id_column=req.id_column,
                         source_column=req.source_column, modality=req.modality, images_root=images,
                         trust_model=req.trust_model, lossy=req.lossy, field="path")
        out = {k: v for k, v in rep.to_dict().items() if k in ImportResult.model_fields}
        return svc.paths.deep(out)

    # ------------------------------------------------------------------ health, metrics, page
    @app.get("/healthz", summary="Liveness and the collection's generation", response_model=Health)
    async def healthz() -> Any:
        return {"ok": True, "generation": svc.collection.generation, "models": len(svc.pool.loaded())}

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics() -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        await _run(_status)  # refresh the gauges
        return Response(generate_latest(svc.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def page() -> Any:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/favicon.ico", include_in_schema=False)
    @app.get("/favicon.svg", include_in_schema=False)
    async def favicon() -> Any:
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml",
                            headers={"Cache-Control": "max-age=86400"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


# ----------------------------------------------------------------------------- helpers
class _FastJSON(JSONResponse):
    """A JSON response serialised by orjson (several times faster than json for hit lists); what
    orjson refuses (integers past 64 bits, very deep nesting) goes through the json module."""

    def render(self, content: Any) -> bytes:
        import orjson

        try:
            return orjson.dumps(content)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            return json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")


class _LimitsAndMetrics:
    """Pure ASGI middleware (no per-request task, unlike ``@app.middleware``): refuses a body whose
    declared length is over the limit before it is read (and one that grows past it while read),
    answers 404 for a path whose segment holds an encoded '/' (it would route elsewhere once
    decoded), and records each request's count and latency by route for ``/metrics``."""

    def __init__(self, app, *, max_body: int, service) -> None:
        self.app, self.max_body, self.svc = app, int(max_body), service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await _error(400, "content-length: not a number", "content-length")(scope, receive, send)
                return
            if int(length) > self.max_body:
                await _error(413, f"body of {int(length)} bytes exceeds the limit of {self.max_body}",
                             "body")(scope, receive, send)
                return
        if b"%2f" in (scope.get("raw_path") or b"").lower():
            await _error(404, f"not found: {scope['method']} {scope['path']} (a path segment holds an encoded '/')",
                         "path")(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = {"code": 500}
        seen = {"bytes": 0}

        async def counted() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
                if seen["bytes"] > self.max_body:
                    raise _TooLarge(self.max_body)
            return message

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, counted, send_status)
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            self.svc.m_requests.labels(endpoint, scope["method"], str(status["code"])).inc()
            self.svc.m_latency.labels(endpoint).observe(time.perf_counter() - t0)


def _error(status: int, detail: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    """The one error body (:class:`~nobackfill.serve.schema.ErrorBody`): ``field`` always present."""
    return _FastJSON({"detail": detail, "field": field}, status_code=status, headers=headers)


def _loc(parts: Any) -> str:
    """``("items", 0, "text")`` -> ``items[0].text``."""
    out = ""
    for x in parts:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def _validation(errs: list[dict]) -> ApiError:
    """The first of pydantic's errors as one message that names the field (``items[0].text``)."""
    from .schema import ID_PATTERN, NONBLANK, REL_PATH, SEGMENT

    first = errs[0] if errs else {}
    field = _loc([x for x in first.get("loc", ()) if x not in ("body", "query", "path", "header")]) or "body"
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
            if isinstance(value, str) and (value.startswith("/") or ".." in value.replace("\\", "/").split("/")):
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


def _content_type(request: Request, *, multipart: bool) -> str:
    """``json`` or ``multipart`` (where the operation takes it) from the Content-Type; 415 else. No
    Content-Type at all is read as JSON."""
    raw = request.headers.get("content-type")
    if raw is None:
        return "json"
    main = raw.split(";", 1)[0].strip().lower()
    if main == "application/json" or (main.startswith("application/") and main.endswith("+json")):
        return "json"
    if multipart and main == "multipart/form-data":
        return "multipart"
    takes = "application/json or multipart/form-data" if multipart else "application/json"
    raise ApiError(415, f"content-type: {main or raw!r} is not taken here (send {takes})", "content-type")


def _parse_json(raw: bytes) -> Any:
    """Strict JSON (RFC 8259: no NaN / Infinity, UTF-8, no lone surrogates); 400 else."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=constant)
        json.dumps(obj, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    except (ValueError, UnicodeError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(400, f"malformed JSON: {e}" if raw.strip() else "malformed JSON: the body is empty",
                       "body") from None
    return obj


async def _json_body(request: Request, model: Any) -> Any:
    """The request's JSON body validated by ``model`` (strict: 400 malformed, 422 invalid)."""
    from pydantic import ValidationError

    obj = _parse_json(await request.body())
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise _validation(e.errors()) from None


async def _form(request: Request, *, files: dict[str, tuple[int, int]], fields: dict[str, int]):
    """The multipart form, every part checked: ``files`` (name -> (min, max) count) must be file
    parts, ``fields`` (name -> max count) plain fields; any other part is refused. 422 naming the part."""
    form = await _read_form(request)
    try:
        _check_parts(form, files, fields)
    except ApiError:
        await form.close()
        raise
    return form


def _check_parts(form, files: dict[str, tuple[int, int]], fields: dict[str, int]) -> None:
    allowed = [*files, *fields]
    for name in form.keys():
        if name not in allowed:
            raise ApiError(422, f"{name}: unknown part (this operation takes {', '.join(allowed)})", name)
    for name, (lo, hi) in files.items():
        parts = form.getlist(name)
        for i, part in enumerate(parts):
            if not isinstance(part, UploadFile):
                at = f"{name}[{i}]" if hi > 1 else name
                raise ApiError(422, f"{at}: must be a file part (a filename or an image Content-Type), not a "
                                    "plain field", at)
        if len(parts) < lo:
            raise ApiError(422, f"{name}: a file part named {name!r} is required", name)
        if len(parts) > hi:
            raise ApiError(422, f"{name}: {len(parts)} files, the limit is {hi} per request", name)
    for name, hi in fields.items():
        parts = form.getlist(name)
        for i, part in enumerate(parts):
            if not isinstance(part, str):
                at = f"{name}[{i}]" if hi > 1 else name
                raise ApiError(422, f"{at}: must be a plain field, not a file part", at)
        if len(parts) > hi:
            raise ApiError(422, f"{name}: given {len(parts)} times, at most {hi}", name)


async def _read_form(request: Request):
    """The multipart body, a part counted as a file when it has a filename or a Content-Type other
    than text (RFC 7578: a part's type defaults to text/plain; data carries its own), so an image
    sent without a filename stays bytes. 400 for a body that does not parse."""
    from starlette.formparsers import MultiPartException, MultiPartParser, parse_options_header

    class Parser(MultiPartParser):
        def on_headers_finished(self) -> None:
            part = self._current_part
            ctype = dict(part.item_headers).get(b"content-type", b"").split(b";")[0].strip().lower()
            _, options = parse_options_header(part.content_disposition)
            if b"filename" not in options and ctype and not ctype.startswith(b"text/"):
                part.content_disposition += b'; filename=""'
            super().on_headers_finished()

    try:
        form = await Parser(request.headers, request.stream()).parse()
    except MultiPartException as e:
        raise ApiError(400, f"malformed multipart body: {e.message}", "body") from None
    return form


def _part_id(part: UploadFile, i: int) -> str | None:
    """The item id an image part names in its ``X-Item-Id`` header (None: one from its content)."""
    from .schema import ID_HEADER, ID_PATTERN, MAX_ID

    own = part.headers.get(ID_HEADER)
    if own is None:
        return None
    try:  # part headers arrive as bytes read as latin-1; an id is UTF-8
        own = own.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    if not own or len(own) > MAX_ID or not re.search(ID_PATTERN, own):
        raise ApiError(422, f"images[{i}]: {ID_HEADER} {own!r} is not a valid id (1 to {MAX_ID} characters, no "
                            "'/', '\\' or control characters, not starting with '.', '[' or a space)", f"images[{i}]")
    return own


def _form_filter(value: str | None) -> dict | None:
    """The ``filter`` field of an image search: a flat JSON object (exactly the schema's pattern)."""
    from .schema import FILTER_FIELD

    if value is None:
        return None
    if not re.search(FILTER_FIELD, value):
        raise ApiError(422, "filter: a JSON object {key: value | [values]} whose values are strings, numbers, "
                            "booleans, null or lists of them", "filter")
    return _form_json(value, "filter")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this path (for ``Allow``)."""
    from starlette.routing import Match, Route

    methods: set[str] = set()
    for route in request.scope["app"].router.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    return sorted(methods, key=lambda m: (order.index(m) if m in order else len(order), m))


async def _run(fn, *args, **kw):
    """Run blocking library code in the thread pool (the event loop keeps serving)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args, **kw)


def _decode_image(data: bytes, lim, field: str):
    """An RGB PIL image from uploaded bytes as a person sees it (:func:`~nobackfill.data.images.to_rgb`:
    EXIF orientation, every mode), refusing non-images, corrupt files and pixel bombs."""
    from PIL import Image

    from ..data.images import to_rgb

    if not data:
        raise ApiError(422, f"{field}: empty file", field)
    if len(data) > lim.max_image_bytes:
        raise ApiError(413, f"{field}: {len(data)} bytes, the limit is {lim.max_image_bytes}", field)
    try:
        im = Image.open(io.BytesIO(data))
        w, h = im.size
    except Image.DecompressionBombError as e:
        raise ApiError(413, f"{field}: too many pixels ({e}), the limit is {lim.max_image_pixels}", field) from None
    except Exception as e:
        raise ApiError(422, f"{field}: not an image ({type(e).__name__})", field) from None
    if w * h > lim.max_image_pixels:
        raise ApiError(413, f"{field}: {w}x{h} pixels, the limit is {lim.max_image_pixels}", field)
    try:
        im.load()
        out = to_rgb(im)
        out.load()
        return out
    except MemoryError:
        raise ApiError(413, f"{field}: too large to decode", field) from None
    except Exception as e:
        raise ApiError(422, f"{field}: corrupt image ({type(e).__name__}: {e})", field) from None


def _keep_upload(folder: Path, data: bytes) -> tuple[Path, str, bool]:
    """Store an uploaded image by its content hash (atomic, idempotent): its item's source, the
    sha256 of its bytes (so the item need not read the file back to hash it) and whether this call
    created the file."""
    from ..index.store import atomic_write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest[:32]}.img"
    if path.exists():
        return path, digest, False
    atomic_write_bytes(path, data)
    return path, digest, True


def _thumb(path: Path, size: int) -> bytes:
    from PIL import Image

    from ..data.images import to_rgb

    try:
        with Image.open(path) as im:
            im.draft("RGB", (size * 2, size * 2))  # JPEG: decode at a reduced scale
            rgb = to_rgb(im)
            rgb = rgb.copy() if rgb is im else rgb
            rgb.thumbnail((size, size))
            buf = io.BytesIO()
            rgb.save(buf, format="PNG")
            return buf.getvalue()
    except (OSError, ValueError) as e:
        raise ApiError(404, f"the item's image is not readable here ({e.__class__.__name__})", "id") from None


def _form_int(value: Any, field: str, lo: int, hi: int) -> int:
    """An integer form field: its text as a JSON number with no fraction (``7``, ``7.0``, ``7e0``)."""
    try:
        number = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        number = None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool):
        raise ApiError(422, f"{field}: not an integer: {value!r}", field)
    if not lo <= number <= hi:
        raise ApiError(422, f"{field}: must be between {lo} and {hi}, got {number}", field)
    return number


def _form_json(value: Any, field: str) -> Any:
    if value is None:
        return None
    try:
        return _parse_json(value.encode("utf-8"))
    except (ApiError, UnicodeError):
        raise ApiError(422, f"{field}: not valid JSON", field) from None


__all__ = ["ApiError", "Service", "create_app"]
