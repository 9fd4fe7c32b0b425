"""The HTTP service over one live-upgrading collection (FastAPI): search, items, status, upgrades,
the backfill, health and Prometheus metrics, and a web page.

Every search takes one snapshot of the collection (:class:`~nobackfill.search.Searcher`); models stay
warm for the life of the process; writes go through the collection's commits (durable once
acknowledged). A backfill runs as a thread of the server or as a separate ``collection backfill``
process on the same collection. Keys and roles: :class:`~nobackfill.serve.settings.KeyRing`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Literal, Optional

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from .batching import SearchBatcher
from .settings import ServeSettings

log = logging.getLogger("nobackfill.serve")
STATIC = Path(__file__).with_name("static")


class ApiError(Exception):
    """An error a client caused: ``status`` and a message naming the field or the problem."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


# ----------------------------------------------------------------------------- request models
class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., description="The query text.")
    k: int = Field(10, description="Number of results.")
    target: Optional[Literal["image", "text"]] = Field(None, description="Modality of the results.")
    filter: Optional[dict[str, Any]] = Field(None, description="Metadata filter {key: value | [values]}.")
    merge: Optional[Literal["raw", "calibrated", "rank"]] = None


class TextItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str
    id: Optional[str] = None


class AddTexts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[TextItem]


class UpgradeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(..., description="The new model: a directory relative to --models-root.")
    bridges: list[str] = Field(default_factory=list, description="Upgrade directories relative to --models-root.")
    calibrate: Optional[str] = Field(None, description="Calibration data relative to --data-root.")
    calibrate_split: str = "val"
    calibrate_limit: Optional[int] = None


class BackfillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: Literal["sequential", "random", "uncertainty"] = "uncertainty"
    rate: Optional[float] = Field(None, gt=0)


# ----------------------------------------------------------------------------- the service state
class Service:
    """What the app holds for its life: the collection, warm models, the searcher, the backfill
    thread and the metrics."""

    def __init__(self, settings: ServeSettings, pool: Any = None) -> None:
        from ..index.collection import Collection
        from ..search import ModelPool, Searcher

        self.settings = settings
        self.collection = Collection.open(settings.collection)
        self.pool = pool or ModelPool()
        self.searcher = Searcher(self.collection, pool=self.pool)
        if settings.uploads is not None:
            self.uploads = Path(settings.uploads)
        elif isinstance(self.collection.path, Path):
            self.uploads = self.collection.path / "uploads"
        else:
            raise ValueError("a collection outside the file system needs --uploads DIR for uploaded images")
        self.write_lock = threading.Lock()  # plan changes through this server, one at a time
        self._merge_searchers: dict[str, Any] = {}
        self.batcher = SearchBatcher(self.searcher_for)
        self.backfill_thread: threading.Thread | None = None
        self.backfill_error: str | None = None
        self._metrics()

    def searcher_for(self, merge: str | None) -> Any:
        """The warm searcher, or one with another merge (sharing the warm models)."""
        from ..search import Searcher

        if merge is None:
            return self.searcher
        if merge not in self._merge_searchers:
            self._merge_searchers[merge] = Searcher(self.collection, pool=self.pool, merge=merge)
        return self._merge_searchers[merge]

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
    def under(self, root: Path | None, rel: str, what: str) -> Path:
        """``root / rel`` if it stays inside ``root`` (a path from a request is never used as is)."""
        if root is None:
            raise ApiError(403, f"{what}: this server takes no such paths (start it with the root option)", what)
        if not isinstance(rel, str) or not rel or "\x00" in rel:
            raise ApiError(422, f"{what}: a relative path is required", what)
        base = root.resolve()
        target = (base / rel).resolve()
        if base != target and base not in target.parents:
            raise ApiError(400, f"{what}: {rel!r} lies outside the allowed root", what)
        if not target.exists():
            raise ApiError(404, f"{what}: {rel!r} does not exist under the allowed root", what)
        return target

    # ------------------------------------------------------------------ backfill thread
    def start_backfill(self, order: str, rate: float | None) -> dict[str, Any]:
        from ..search.backfill import backfill_status, pause_backfill, run_worker, start_backfill

        with self.write_lock:
            if self.backfill_thread is not None and self.backfill_thread.is_alive():
                return backfill_status(self.collection)
            sid = self.collection.current_space
            enc = self.pool.get(self.collection.space(sid)["model"], sid, what="collection's current model")
            job = start_backfill(self.collection, enc, order=order, pool=self.pool)
            if job.state == "paused":
                pause_backfill(self.collection, paused=False)
            self.backfill_error = None

            def work() -> None:
                try:
                    run_worker(self.collection, enc, rate=rate, batch_size=32)
                except Exception as e:  # reported by /v1/status, never silent
                    self.backfill_error = f"{type(e).__name__}: {e}"
                    log.exception("backfill worker failed")

            self.backfill_thread = threading.Thread(target=work, name="backfill", daemon=True)
            self.backfill_thread.start()
        return backfill_status(self.collection)


# ----------------------------------------------------------------------------- the app
def create_app(settings: ServeSettings, pool: Any = None) -> FastAPI:
    """The FastAPI application over ``settings.collection`` (see the module doc); ``pool``: a
    :class:`~nobackfill.search.ModelPool` to use (tests hand in stand-in models)."""
    svc = Service(settings, pool)
    if settings.warm:
        svc.searcher.warm()
    lim = settings.limits
    app = FastAPI(title="nobackfill", version="1",
                  description="Cross-modal search over a collection whose model upgrades without a re-index.")
    app.state.service = svc

    # ------------------------------------------------------------------ middleware / errors
    app.add_middleware(_LimitsAndMetrics, max_body=lim.max_body_bytes, service=svc)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError):
        return _error(exc.status, exc.detail, exc.field)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path", "form"))
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return _error(400, f"malformed JSON: {msg}", "body")
        return _error(422, f"{loc or 'body'}: {msg}", loc or "body")

    async def role(authorization: Optional[str] = Header(None)) -> str:  # async: no thread-pool hop
        key = authorization[7:].strip() if authorization and authorization.lower().startswith("bearer ") else None
        r = settings.keys.role_of(key)
        if r is None:
            raise ApiError(401, "missing or unknown API key (send Authorization: Bearer KEY)", "authorization")
        return r

    async def reader(r: str = Depends(role)) -> str:
        return r

    async def admin(r: str = Depends(role)) -> str:
        if r != "admin":
            raise ApiError(403, "this needs an admin key", "authorization")
        return r

    # ------------------------------------------------------------------ search
    def _search(text: str | None, image: Any, k: int, target: str | None, flt: dict | None,
                merge: str | None) -> dict[str, Any]:
        if not 1 <= k <= lim.max_k:
            raise ApiError(422, f"k: must be between 1 and {lim.max_k}, got {k}", "k")
        if text is not None:
            if not text.strip():
                raise ApiError(422, "text: the query is empty", "text")
            if len(text) > lim.max_caption_chars:
                raise ApiError(422, f"text: {len(text)} characters, the limit is {lim.max_caption_chars}", "text")
        t0 = time.perf_counter()
        try:
            r = svc.batcher.search(text=text, image=image, k=k, target=target, filter=flt, merge=merge)
        except (ValueError, KeyError) as e:
            raise ApiError(422, str(e)) from None
        spent = time.perf_counter() - t0
        for h in r.hits:
            svc.m_hits.labels(h.space, h.route).inc()
        for space in {h.space for h in r.hits} or {"none"}:
            svc.m_space.labels(space).observe(spent)
        return _FastJSON(r.to_json())  # serialised once, without FastAPI's per-field encoder walk

    search_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": SearchRequest.model_json_schema()},
        "multipart/form-data": {"schema": {"type": "object", "required": ["image"], "properties": {
            "image": {"type": "string", "format": "binary"}, "k": {"type": "integer", "default": 10},
            "target": {"type": "string", "enum": ["image", "text"]},
            "filter": {"type": "string", "description": "a JSON object"}}}}}}}
    add_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": AddTexts.model_json_schema()},
        "multipart/form-data": {"schema": {"type": "object", "required": ["images"], "properties": {
            "images": {"type": "array", "items": {"type": "string", "format": "binary"}},
            "ids": {"type": "string", "description": "a JSON list of ids (or nulls), one per image"}}}}}}}

    @app.post("/v1/search", summary="Search by text (JSON) or by an image (multipart)", openapi_extra=search_body)
    async def search(request: Request, _r: str = Depends(reader)) -> Any:
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            form = await request.form()
            file = form.get("image")
            if file is None or not hasattr(file, "read"):
                raise ApiError(422, "image: a multipart search needs an image file field named 'image'", "image")
            img = _decode_image(await file.read(), lim, "image")
            k = _form_int(form.get("k", "10"), "k")
            target = form.get("target") or None
            if target not in (None, "image", "text"):
                raise ApiError(422, "target: must be 'image' or 'text'", "target")
            flt = _form_json(form.get("filter"), "filter")
            return await _run(_search, None, img, k, target, flt, None)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON: {e}", "body") from None
        try:
            req = SearchRequest.model_validate(body)
        except Exception as e:
            raise _validation(e) from None
        return await _run(_search, req.text, None, req.k, req.target, req.filter, req.merge)

    # ------------------------------------------------------------------ items
    @app.post("/v1/items", summary="Add texts (JSON) or images (multipart: files 'images', optional 'ids')",
              openapi_extra=add_body)
    async def add(request: Request, _r: str = Depends(admin)) -> Any:
        from ..index.ingest import image_item, text_item

        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            form = await request.form()
            files = form.getlist("images")
            if not files:
                raise ApiError(422, "images: no image files (field 'images')", "images")
            if len(files) > lim.max_batch:
                raise ApiError(422, f"images: {len(files)} files, the limit is {lim.max_batch} per request", "images")
            ids = _form_json(form.get("ids"), "ids") or [None] * len(files)
            if not isinstance(ids, list) or len(ids) != len(files):
                raise ApiError(422, f"ids: a JSON list of {len(files)} ids (or null) is required", "ids")
            items = []
            for i, (f, own) in enumerate(zip(files, ids)):
                data = await f.read()
                _decode_image(data, lim, f"images[{i}]")
                path = _keep_upload(svc.uploads, data)
                items.append(image_item(path, id=_check_id(own, f"ids[{i}]"),
                                        metadata={"filename": getattr(f, "filename", "") or ""}))
        else:
            try:
                req = AddTexts.model_validate(await request.json())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"malformed JSON: {e}", "body") from None
            except Exception as e:
                raise _validation(e) from None
            if not req.items:
                raise ApiError(422, "items: empty", "items")
            if len(req.items) > lim.max_batch:
                raise ApiError(422, f"items: {len(req.items)} items, the limit is {lim.max_batch} per request", "items")
            items = []
            for i, it in enumerate(req.items):
                if not it.text.strip():
                    raise ApiError(422, f"items[{i}].text: empty", f"items[{i}].text")
                if len(it.text) > lim.max_caption_chars:
                    raise ApiError(422, f"items[{i}].text: {len(it.text)} characters, the limit is "
                                        f"{lim.max_caption_chars}", f"items[{i}].text")
                meta = {k: v for k, v in (it.model_extra or {}).items()}
                items.append(text_item(it.text, id=_check_id(it.id, f"items[{i}].id"), metadata=meta))
        return await _run(_add_items, items)

    def _add_items(items: list) -> dict[str, Any]:
        from ..index.ingest import add_items
        from ..index.store import DuplicateIdError, SpaceMismatchError

        c = svc.collection
        sid = c.current_space
        enc = svc.pool.get(c.space(sid)["model"], sid, what="collection's current model")
        try:
            rep = add_items(c, enc, items, progress=False, wait=True)
        except DuplicateIdError as e:
            raise ApiError(409, str(e), "id") from None
        except (SpaceMismatchError, ValueError) as e:
            raise ApiError(422, str(e)) from None
        return {**rep.to_dict(), "ids": [it.id for it in items]}

    @app.get("/v1/items/{item_id}", summary="One item: modality, metadata, the space that serves it")
    async def get_item(item_id: str, _r: str = Depends(reader)) -> Any:
        from ..index.collection import ItemNotFoundError

        snap = svc.collection.snapshot()
        item = snap.items.get(item_id)
        if item is None:
            raise ApiError(404, str(ItemNotFoundError(f"no item with id {item_id!r}")), "id")
        return {"id": item.id, "modality": item.modality, "metadata": dict(item.metadata),
                "space": snap.serving_space(item_id)}

    @app.get("/v1/items/{item_id}/thumbnail", summary="A small PNG of an image item")
    async def thumbnail(item_id: str, size: int = 160, _r: str = Depends(reader)) -> Any:
        item = svc.collection.snapshot().items.get(item_id)
        if item is None:
            raise ApiError(404, f"no item with id {item_id!r}", "id")
        if item.modality != "image":
            raise ApiError(404, f"item {item_id!r} is a text: it has no thumbnail", "id")
        if not 16 <= size <= 512:
            raise ApiError(422, "size: between 16 and 512", "size")
        return Response(content=await _run(_thumb, Path(item.payload), size), media_type="image/png",
                        headers={"Cache-Control": "max-age=3600"})

    @app.delete("/v1/items/{item_id}", summary="Delete an item (never returned again)")
    async def delete(item_id: str, _r: str = Depends(admin)) -> Any:
        from ..index.collection import ItemNotFoundError

        try:
            await _run(svc.collection.delete, [item_id])
        except ItemNotFoundError as e:
            raise ApiError(404, str(e), "id") from None
        return {"deleted": item_id}

    # ------------------------------------------------------------------ status / control
    @app.get("/v1/status", summary="Spaces, counts, current model, routes, backfill progress")
    async def status(_r: str = Depends(reader)) -> Any:
        return await _run(_status)

    def _status() -> dict[str, Any]:
        from ..search.backfill import backfill_status
        from ..search.plan import route_table

        c = svc.collection
        st = c.status()
        plan = c.plan
        st["routes"] = route_table(plan)
        st["merge"] = (plan.get("merge") or {}).get("method") or "raw"
        st["calibrated"] = bool(plan.get("calibration"))
        st["backfill"] = backfill_status(c)
        st["limits"] = dataclasses.asdict(lim)
        st["backfill"]["worker"] = "running" if svc.backfill_thread and svc.backfill_thread.is_alive() else "idle"
        if svc.backfill_error:
            st["backfill"]["error"] = svc.backfill_error
        svc.g_done.set(st["backfill"]["done"])
        svc.g_total.set(st["backfill"]["total"])
        for m, n in st["items"].items():
            svc.g_items.labels(m).set(n)
        return st

    @app.post("/v1/backfill/start", summary="Start (or resume) the backfill in this server")
    async def backfill_start(req: BackfillRequest, _r: str = Depends(admin)) -> Any:
        from ..search.backfill import BackfillError

        try:
            return await _run(svc.start_backfill, req.order, req.rate)
        except BackfillError as e:
            raise ApiError(409, str(e)) from None

    @app.post("/v1/backfill/pause", summary="Pause the backfill (every worker stops after its batch)")
    async def backfill_pause(_r: str = Depends(admin)) -> Any:
        from ..search.backfill import BackfillError, backfill_status, pause_backfill

        try:
            await _run(pause_backfill, svc.collection)
        except BackfillError as e:
            raise ApiError(409, str(e)) from None
        return backfill_status(svc.collection)

    @app.post("/v1/backfill/resume", summary="Resume a paused backfill in this server")
    async def backfill_resume(req: BackfillRequest, _r: str = Depends(admin)) -> Any:
        return await backfill_start(req, _r)

    @app.post("/v1/upgrade", summary="Register a new model (and its bridges) as the current one")
    async def upgrade(req: UpgradeRequest, _r: str = Depends(admin)) -> Any:
        model = svc.under(settings.models_root, req.model, "model")
        bridges = [svc.under(settings.models_root, b, f"bridges[{i}]") for i, b in enumerate(req.bridges)]
        if not (model / "config.json").is_file():
            raise ApiError(422, f"model: {req.model!r} is not a model directory (no config.json)", "model")
        for i, b in enumerate(bridges):
            if not (b / "upgrade.json").is_file():
                raise ApiError(422, f"bridges[{i}]: {req.bridges[i]!r} is not an upgrade directory", f"bridges[{i}]")
        data = svc.under(settings.data_root, req.calibrate, "calibrate") if req.calibrate else None
        return await _run(_upgrade, model, bridges, data, req.calibrate_split, req.calibrate_limit)

    def _upgrade(model: Path, bridges: list[Path], data: Path | None, split: str, limit: int | None) -> dict:
        from ..search.plan import UpgradeRefused, upgrade_collection

        tasks, label = (None, "")
        if data is not None:
            from ..evaluate import load_eval_data
            from ..search.calibrate import pair_tasks

            try:
                ds = load_eval_data(data, split, langs=["en"], limit=limit)
            except (ValueError, FileNotFoundError) as e:
                raise ApiError(422, f"calibrate: {e}", "calibrate") from None
            tasks, label = pair_tasks(ds), f"{data.name} {split}"
        with svc.write_lock:
            try:
                plan = upgrade_collection(svc.collection, model, bridges=bridges, calibration=tasks,
                                          calibration_label=label, pool=svc.pool)
            except UpgradeRefused as e:
                raise ApiError(409, str(e)) from None
            except (ValueError, KeyError) as e:
                raise ApiError(422, str(e)) from None
        svc.searcher.warm()
        return {"current": plan["current"], "spaces": [s["space_id"] for s in plan["spaces"]],
                "merge": (plan.get("merge") or {}).get("method")}

    # ------------------------------------------------------------------ health, metrics, page
    @app.get("/healthz", summary="Liveness and the collection's generation")
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

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


# ----------------------------------------------------------------------------- helpers
class _FastJSON(JSONResponse):
    """A JSON response serialised by orjson (several times faster than json for hit lists)."""

    def render(self, content: Any) -> bytes:
        import orjson

        return orjson.dumps(content)


class _LimitsAndMetrics:
    """Pure ASGI middleware (no per-request task, unlike ``@app.middleware``): refuses a body whose
    declared length is over the limit before it is read, and records each request's count and
    latency by route for ``/metrics``."""

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
        t0 = time.perf_counter()
        status = {"code": 500}

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            self.svc.m_requests.labels(endpoint, scope["method"], str(status["code"])).inc()
            self.svc.m_latency.labels(endpoint).observe(time.perf_counter() - t0)


def _error(status: int, detail: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, **({"field": field} if field else {})}, status_code=status)


def _validation(e: Exception) -> ApiError:
    errs = getattr(e, "errors", lambda: [])()
    first = errs[0] if errs else {}
    loc = ".".join(str(x) for x in first.get("loc", ()))
    return ApiError(422, f"{loc or 'body'}: {first.get('msg', str(e))}", loc or "body")


async def _run(fn, *args):
    """Run blocking library code in the thread pool (the event loop keeps serving)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def _decode_image(data: bytes, lim, field: str):
    """A PIL image from uploaded bytes, refusing non-images, corrupt files and pixel bombs."""
    from PIL import Image

    if not data:
        raise ApiError(422, f"{field}: empty file", field)
    if len(data) > lim.max_image_bytes:
        raise ApiError(413, f"{field}: {len(data)} bytes, the limit is {lim.max_image_bytes}", field)
    try:
        im = Image.open(io.BytesIO(data))
        w, h = im.size
    except Exception as e:
        raise ApiError(422, f"{field}: not an image ({type(e).__name__})", field) from None
    if w * h > lim.max_image_pixels:
        raise ApiError(413, f"{field}: {w}x{h} pixels, the limit is {lim.max_image_pixels}", field)
    try:
        im.load()
        return im.convert("RGB")
    except Exception as e:
        raise ApiError(422, f"{field}: corrupt image ({type(e).__name__}: {e})", field) from None


def _keep_upload(folder: Path, data: bytes) -> Path:
    """Store an uploaded image by its content hash (atomic, idempotent): its item's source."""
    from ..index.store import atomic_write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:32]}.img"
    if not path.exists():
        atomic_write_bytes(path, data)
    return path


def _thumb(path: Path, size: int) -> bytes:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.thumbnail((size, size))
            buf = io.BytesIO()
            im.convert("RGB").save(buf, format="PNG")
            return buf.getvalue()
    except OSError as e:
        raise ApiError(404, f"the item's image is not readable here ({e.__class__.__name__})", "id") from None


def _check_id(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 512:
        raise ApiError(422, f"{field}: an id is a non-empty string of at most 512 characters", field)
    return value


def _form_int(value: Any, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ApiError(422, f"{field}: not an integer: {value!r}", field) from None


def _form_json(value: Any, field: str) -> Any:
    if value in (None, ""):
        return None
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        raise ApiError(422, f"{field}: not valid JSON", field) from None


__all__ = ["ApiError", "Service", "create_app"]
