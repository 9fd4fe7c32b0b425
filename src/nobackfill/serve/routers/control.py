"""The collection's control: its status, the backfill (start, pause, resume, cancel), upgrades,
routes, calibration, retiring a space, verification, imports and graph index builds. Everything but the status takes an
admin key; a path a request names lies under a root the server was started with."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from ..deps import admin, admin_json, get_service, get_settings, reader
from ..errors import ApiError
from ..schema import (BackfillRequest, BackfillStatus, CalibrateRequest, ImportRequest, ImportResult, IndexBuilds,
                      RetireRequest, Retired, RouteRequest, Routes, Status, UpgradeRequest, UpgradeResult, VerifyReport,
                      VerifyRequest, errors)
from ..service import Service
from ...search.merge import DEFAULT_MERGE
from ..settings import ServeSettings

__all__ = ["router"]

router = APIRouter(prefix="/v1")


@router.get("/status", summary="Spaces, counts, current model, routes, backfill progress",
            response_model=Status, responses=errors(401))
async def status(_r: str = Depends(reader), svc: Service = Depends(get_service)) -> Any:
    return await run_in_threadpool(svc.call, svc.status)


# ----------------------------------------------------------------------------- the backfill
def _backfill(svc: Service, fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` of the client, a backfill refused as 409; the backfill's status after it."""
    from ...lifecycle.backfill import BackfillError

    try:
        svc.call(fn, *args, field="backfill")
    except BackfillError as e:
        raise ApiError(409, str(e), "backfill") from None
    return svc.backfill_status()


def _engine(svc: Service, req: BackfillRequest, fn: Any) -> Any:
    """``fn`` with the request's engine: the Ray one on the cluster the server was started with
    (``--ray-address``), refused (422) on storage one process holds (milvus-lite), (409) when the
    server was started without an address (or with ``local``), and (503) when nothing
    answers at that address (checked when ``fn`` is called, in the thread pool: a TCP connect of
    a few seconds, before any job is started)."""
    if req.engine == "local":  # actors and gpus_per_actor are the ray engine's (the schema says so)
        return fn
    try:  # storage that one process holds (milvus-lite) refuses the engine whatever the address (422,
        # trial AB/AC: a 503 or 409 first, and following its advice led to this refusal)
        svc.client.collection.storage.backfill_workers(1, "ray")
    except ValueError as e:
        raise ApiError(422, str(e), "engine") from None
    from ...lifecycle.cluster.ray_address import own_ray

    address = svc.settings.ray_address
    if not address or own_ray(address):  # (local: a Ray of the request's own, in a worker thread)
        raise ApiError(409, "this server runs no Ray backfill: start it with --ray-address (auto: the Ray cluster "
                            "of this machine) to accept engine 'ray'", "engine")
    start = functools.partial(fn, engine="ray", ray_address=address, actors=req.actors,
                              gpus_per_actor=req.gpus_per_actor or 0.0)

    def checked(*args: Any) -> Any:
        from ...lifecycle.cluster.ray_backfill import ray_address_error

        why = ray_address_error(address, retry="restart this server with --ray-address auto for the cluster "
                                              "`ray start` runs on its machine")
        if why:
            raise ApiError(503, why, "engine")
        return start(*args)

    return checked


@router.post("/backfill/start", summary="Start the backfill in this server (a paused one: 409, resume it)",
             response_model=BackfillStatus, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 409, 413, 415, 422))
async def backfill_start(req: BackfillRequest, _r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    return await run_in_threadpool(_backfill, svc, _engine(svc, req, svc.client.backfill_start), req.order, req.rate)


@router.post("/backfill/pause", summary="Pause the backfill (every worker stops after its batch)",
             response_model=BackfillStatus, responses=errors(401, 403, 409))
async def backfill_pause(_r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    return await run_in_threadpool(_backfill, svc, svc.client.backfill_pause)


@router.post("/backfill/resume",
             summary="Resume a paused backfill in this server (none paused: start one, as --resume does)",
             response_model=BackfillStatus, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 409, 413, 415, 422))
async def backfill_resume(req: BackfillRequest, _r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    return await run_in_threadpool(_backfill, svc, _engine(svc, req, svc.client.backfill_resume), req.order, req.rate)


@router.post("/backfill/cancel", summary="Forget the backfill job (what was committed stays and is served)",
             response_model=BackfillStatus, responses=errors(401, 403, 409))
async def backfill_cancel(_r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    return await run_in_threadpool(_backfill, svc, svc.client.backfill_cancel)


# ----------------------------------------------------------------------------- models and routes
@router.post("/upgrade", summary="Register a new model (and its bridges) as the current one",
             response_model=UpgradeResult, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
async def upgrade(req: UpgradeRequest, _r: str = Depends(admin), svc: Service = Depends(get_service),
                  settings: ServeSettings = Depends(get_settings)) -> Any:
    model = svc.model(settings.models_root, req.model, check=False)
    bridges = [svc.under(settings.upgrades_root, b, f"bridges[{i}]", "--upgrades-root")
               for i, b in enumerate(req.bridges)]
    svc.check_model(model, req.model)
    for i, b in enumerate(bridges):
        if not (b / "upgrade.json").is_file():
            raise ApiError(422, f"bridges[{i}]: {req.bridges[i]!r} is not an upgrade directory", f"bridges[{i}]")
    data = svc.under(settings.data_root, req.calibrate, "calibrate", "--data-root") if req.calibrate else None
    sample = req.fit_sample.model_dump(exclude_none=True) if req.fit_sample else None
    rep = await run_in_threadpool(svc.call, svc.client.upgrade, model, bridges=bridges, calibrate=data,
                                  calibrate_split=req.calibrate_split, calibrate_limit=req.calibrate_limit,
                                  calibrate_langs=req.calibrate_langs, fit_bridges=req.fit_bridges,
                                  queries=req.queries, fit_sample=sample,
                                  field="calibrate" if data is not None else "model")
    return svc.paths.deep(rep.to_dict())


@router.post("/routes", summary="Pin (or unpin) the route to an older space for one direction",
             response_model=Routes, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
async def pin_route(req: RouteRequest, _r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    if req.w is not None and req.route != "fused":
        raise ApiError(422, f"w is the fused route's weight; route {req.route!r} takes none", "w")
    table = await run_in_threadpool(svc.call, svc.client.route, req.space, req.direction, req.route, w=req.w,
                                    field="space")
    return svc.paths.deep({"routes": table, "merge": svc.collection.plan.merge_method or DEFAULT_MERGE})


@router.post("/calibrate", summary="Choose routes and the merge on labelled data (a path under --data-root)",
             response_model=Routes, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
async def calibrate(req: CalibrateRequest, _r: str = Depends(admin), svc: Service = Depends(get_service),
                    settings: ServeSettings = Depends(get_settings)) -> Any:
    data = svc.under(settings.data_root, req.data, "data", "--data-root")
    out = await run_in_threadpool(svc.call, svc.client.calibrate, data, split=req.split, limit=req.limit,
                                  langs=req.langs, field="data")
    return svc.paths.deep(out)


@router.post("/retire", summary="Drop an old space once the current space serves every item",
             response_model=Retired, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
async def retire(req: RetireRequest, _r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    from ...lifecycle.backfill import BackfillError

    try:
        return await run_in_threadpool(svc.call, svc.client.retire, req.space, drop_unsourced=req.drop_unsourced,
                                       field="space")
    except BackfillError as e:
        raise ApiError(409, str(e), "space") from None
    except ApiError as e:  # a refusal of this space (trial K: the current one's named field "backfill")
        if e.field == "backfill":
            e.field = "space"
        raise


# ----------------------------------------------------------------------------- stored data
@router.post("/verify", summary="Check every stored file of the collection (read only)",
             response_model=VerifyReport, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 413, 415, 422))
async def verify(req: VerifyRequest, _r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    rep = await run_in_threadpool(svc.call, svc.client.verify, model_check=req.model_check)
    rep.pop("path", None)
    rep.pop("repaired", None)
    return svc.paths.deep(rep)


@router.post("/import", summary="Import vectors embedded elsewhere (a path under --data-root)",
             response_model=ImportResult, dependencies=[Depends(admin_json)],
             responses=errors(400, 401, 403, 404, 409, 413, 415, 422))
async def import_(req: ImportRequest, _r: str = Depends(admin), svc: Service = Depends(get_service),
                  settings: ServeSettings = Depends(get_settings)) -> Any:
    root = settings.data_root
    path = svc.under(root, req.path, "path", "--data-root", file=req.format != "clip-retrieval")
    table = svc.under(root, req.table, "table", "--data-root", file=True) if req.table else None
    images = svc.under(root, req.images_root, "images_root", "--data-root") if req.images_root else None
    model = svc.model(settings.models_root, req.model) if req.model else None
    rep = await run_in_threadpool(svc.call, svc.client.import_, f"{req.format}:{path}", table=table,
                                  id_column=req.id_column, source_column=req.source_column, modality=req.modality,
                                  images_root=images, trust_model=req.trust_model, lossy=req.lossy, model=model,
                                  samples=req.samples or 64,
                                  metadata_columns=req.metadata_columns, field="path")
    out = {k: v for k, v in rep.to_dict().items() if k in ImportResult.model_fields}
    svc.start_index_builds()  # the import returned when its rows were in: their graph index builds now
    return svc.paths.deep(out)


@router.post("/index", summary="Build the graph index of every space that lacks it, in the background",
             response_model=IndexBuilds, responses=errors(401, 403))
async def index(_r: str = Depends(admin), svc: Service = Depends(get_service)) -> Any:
    return {"indexes": await run_in_threadpool(svc.start_index_builds, wait_listed=True)}
