"""The client in process: every call of :class:`~nobackfill.client.Client` on a collection opened
from its path or storage URI. The command line runs it; the service's routes run it too (one
instance for the server's life, warm models and searchers), so a behaviour exists once."""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..search.limits import Limits
from .base import Client
from .types import AddResult, ClientError, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult

__all__ = ["LocalClient", "load_calibration"]

log = logging.getLogger("nobackfill.client")


def load_calibration(data: str | Path, split: str = "val", limit: int | None = None,
                     langs: Sequence[str] | str = ("en",)) -> tuple[list[Any], str]:
    """Calibration tasks and their label from labelled data: a data folder / world root (t2i, i2t)
    or a Multi30K root (t2t: caption 1 -> caption 2 of ``split``). ``split`` is never the one
    evaluated on."""
    from ..evaluate import load_eval_data
    from ..lifecycle.calibrate import pair_tasks, text_pair_task

    data = Path(data)
    langs = [x for x in (langs.split(",") if isinstance(langs, str) else langs) if x]
    if (data / "task2" / "raw").is_dir():
        from ..data.multi30k import read_task2

        cs = read_task2(data, split, "en", ks=(1, 2), limit=limit)
        return [text_pair_task(cs.column(1), cs.column(2))], f"Multi30K {split} ({cs.n_images} caption pairs)"
    ds = load_eval_data(data, split, langs=langs, limit=limit)
    return pair_tasks(ds), f"{data.name} {split} ({len(ds)} images, {len(ds.captions)} captions)"


class LocalClient(Client):
    """:class:`Client` over a collection in this process (``target``: its directory or storage
    URI). ``pool``: the :class:`~nobackfill.search.ModelPool` models are loaded into (shared with
    other clients to keep them warm); ``limits``: what a call may carry."""

    def __init__(self, target: str | Path, *, pool: Any = None, limits: Limits | None = None) -> None:
        from ..search.models import ModelPool

        self.target = str(target)
        self.pool = pool or ModelPool()
        self.limits = limits or Limits()
        self._collection: Any = None
        self._searchers: dict[str | None, Any] = {}
        self.write_lock = threading.Lock()  # plan changes and imports through this client, one at a time
        self._backfill_lock = threading.Lock()
        self.backfill_thread: threading.Thread | None = None
        self.backfill_error: str | None = None
        self.backfill_stopped: str | None = None  # why this client's last worker stopped
        self.backfill_active = False  # a worker thread runs, or is deciding whether to go on

    def __repr__(self) -> str:
        return f"LocalClient({self.target!r})"

    # ------------------------------------------------------------------ plumbing
    @property
    def collection(self) -> Any:
        """The open :class:`~nobackfill.index.collection.Collection` (opened on first use)."""
        if self._collection is None:
            from ..index.collection import Collection

            self._collection = Collection.open(self.target)
        return self._collection

    def encoder(self, space_id: str | None = None) -> Any:
        """The model of ``space_id`` (default: the current space), loaded once into the pool."""
        c = self.collection
        sid = space_id or c.current_space
        return self.pool.get(c.space(sid).model, sid, what="collection's current model" if sid == c.current_space
                             else f"model of space {sid}")

    def searcher(self, merge: str | None = None) -> Any:
        """The warm :class:`~nobackfill.search.Searcher` (one per merge override, sharing the models)."""
        if merge not in self._searchers:
            from ..search import Searcher

            self._searchers[merge] = Searcher(self.collection, pool=self.pool, merge=merge, limits=self.limits)
        return self._searchers[merge]

    def warm(self) -> list[str]:
        """Load every model a search may need now (after an upgrade, before the first query)."""
        return self.searcher().warm()

    # ------------------------------------------------------------------ create / add / import
    def create(self, model: str | Path, *, backend: str = "auto") -> dict[str, Any]:
        from ..index.collection import Collection
        from ..search.models import model_ref

        ref = model_ref(model)
        enc = self.pool.get(ref)
        self._collection = Collection.create(self.target, space_id=enc.space_id, dim=enc.embed_dim, model=ref,
                                             name=getattr(enc, "name", ""), backend=backend,
                                             modalities=list(getattr(enc, "modalities", ("image", "text"))))
        return self.status()

    def add(self, *, texts: Sequence[str | Mapping[str, Any]] | None = None, images: Sequence[Any] | None = None,
            ids: Sequence[str | None] | None = None, folder: str | Path | None = None, split: str = "test",
            text_file: str | Path | None = None, langs: Sequence[str] | None = None, skip_bad: bool = False,
            wait: bool = False, chunk_size: int = 256, progress: bool = False,
            before_embed: Callable[[list], None] | None = None, build_indexes: bool = False,
            log: Callable[[str], None] | None = None) -> AddResult:
        """Also ``folder`` (a data folder: images and/or captions.jsonl, or a world root with
        ``split``), ``text_file`` (one text a line, or JSONL); ``images`` rows may be
        ``{"path", "id", "sha256", ...metadata}``. ``build_indexes``: build the graph indexes now
        (before a short-lived process exits) rather than in the background."""
        from ..index.ingest import FolderItems, add_items, text_file_items
        from ..index.gallery_types import DuplicateIdError

        if folder is not None:
            folder = Path(folder)
            if not (folder / "captions.jsonl").is_file() and (folder / split).is_dir():
                folder = folder / split
        if text_file is not None:
            if any(x is not None for x in (texts, images, folder)):
                raise ValueError("give exactly one of texts=, images=, folder= or text_file=")
            items, read = text_file_items(text_file), FolderItems(items=[])
        else:
            items, read = self._items(texts, images, ids, folder, langs, skip_bad)
        try:
            rep = add_items(self.collection, self.encoder(), items, chunk_size=chunk_size, skip_bad=skip_bad,
                            progress=progress, wait=wait, before_embed=before_embed)
        except DuplicateIdError as e:
            raise ClientError(409, str(e), "id") from None
        out = AddResult(**rep.to_dict(), ids=[it.id for it in items], problems=read.problems + list(rep.problems),
                        skipped_images={**read.skipped_images, **rep.skipped_images}, uncaptioned=read.uncaptioned)
        out.skipped += read.skipped
        if build_indexes and rep.added:
            self.collection.build_graph_indexes(log=log)
        return out

    def _items(self, texts: Any, images: Any, ids: Any, folder: Any, langs: Any, skip_bad: bool) -> tuple[list, Any]:
        """The items to add and what reading them found (a folder's skipped lines and images)."""
        from ..index.ingest import FolderItems, folder_items

        given = [x is not None for x in (texts, images, folder)]
        if sum(given) != 1:
            raise ValueError("give exactly one of texts=, images= or folder=")
        if folder is not None:
            fi = folder_items(folder, langs=langs, skip_bad=skip_bad)
            return fi.items, fi
        return self._given_items(texts, images, ids), FolderItems(items=[])

    def _given_items(self, texts: Any, images: Any, ids: Any) -> list:
        from ..index.ingest import image_item, text_item

        rows = list(texts if texts is not None else images)
        own = list(ids) if ids is not None else [None] * len(rows)
        if len(own) != len(rows):
            raise ValueError(f"{len(own)} ids for {len(rows)} {'texts' if texts is not None else 'images'}")
        if images is not None:  # a path, or {"path", "id", "sha256" (if known), ...metadata}
            out = []
            for row, i in zip(rows, own):
                row = {"path": row} if isinstance(row, (str, Path)) else dict(row)
                path, digest = Path(row.pop("path")), row.pop("sha256", None)
                out.append(image_item(path, id=row.pop("id", None) or i, metadata=row, sha256=digest))
            return out
        out = []
        for n, (row, i) in enumerate(zip(rows, own)):
            row = {"text": row} if isinstance(row, str) else dict(row)
            text = self.limits.check_text(row.pop("text", None), f"texts[{n}]")
            out.append(text_item(text, id=row.pop("id", None) or i, metadata=row))
        return out

    def import_(self, source: str, *, table: str | Path | None = None, id_column: str | None = None,
                source_column: str | None = None, modality: str | None = None, images_root: str | Path | None = None,
                model: str | Path | None = None, trust_model: bool = False, lossy: bool = False, samples: int = 64,
                backend: str = "auto", wait: bool = False, progress: bool = False) -> ImportResult:
        from ..index.importing import ModelCheckRefused, import_source
        from ..index.sources import open_source
        from ..search.models import model_ref

        if model is None:  # into the collection as it is: its current model made the vectors
            cur = self.collection.space(self.collection.current_space)
            ref, enc = cur.model, self.encoder()
        else:
            ref = model_ref(model)
            enc = self.pool.get(ref)
        with self.write_lock:
            src = open_source(source, table=table, id_column=id_column, source_column=source_column,
                              modality=modality, images_root=images_root, lossy=lossy, expect_dim=int(enc.embed_dim))
            try:
                target = self._collection if self._collection is not None else self.target  # (an empty one is falsy)
                rep = import_source(target, src, enc, model=ref, trust_model=trust_model, samples=samples,
                                    backend=backend, progress=progress, wait=wait)
            except ModelCheckRefused as e:
                raise ClientError(409, str(e), "model") from None
        # an open collection took the rows itself; an unopened one is opened on first use
        return ImportResult(items=rep.items, added=rep.added, unchanged=rep.unchanged, seconds=round(rep.seconds, 3),
                            model_check=rep.model_check, warnings=list(rep.warnings), source=rep.source)

    def adopt(self, source: str, *, model: str | Path, vector_field: str, id_field: str, modality: str,
              source_field: str | None = None, images_root: str | Path | None = None, trust_model: bool = False,
              samples: int = 64, backend: str = "auto", wait: bool = False, progress: bool = False) -> dict[str, Any]:
        """A Milvus collection (``milvus://HOST:PORT#NAME`` or ``milvus-lite:PATH#NAME``) adopted in
        place as this collection's space: never copied, written to or dropped."""
        from ..index.adopt import adopt_milvus
        from ..search.models import model_ref

        ref = model_ref(model)
        with self.write_lock:
            rep = adopt_milvus(self.target, source, self.pool.get(ref), model=ref, vector_field=vector_field,
                               id_field=id_field, source_field=source_field, modality=modality,
                               trust_model=trust_model, samples=samples,
                               images_root=str(images_root) if images_root else None, backend=backend,
                               progress=progress, wait=wait)
        self._reopen()
        return rep

    def _reopen(self) -> None:
        """Forget the open collection (adopting wrote its plan through another handle) and its
        searchers."""
        self._collection, self._searchers = None, {}

    # ------------------------------------------------------------------ plan changes
    def upgrade(self, model: str | Path, *, bridges: Sequence[str | Path] = (), calibrate: str | Path | None = None,
                calibrate_split: str = "val", calibrate_limit: int | None = None,
                calibrate_langs: Sequence[str] | str = ("en",),
                log: Callable[[str], None] | None = None, fit_bridges: bool | None = None) -> UpgradeResult:
        from ..lifecycle.plan_changes import UpgradeRefused, route_table, upgrade_collection

        tasks, label = (load_calibration(calibrate, calibrate_split, calibrate_limit, calibrate_langs)
                        if calibrate is not None else (None, ""))
        with self.write_lock:
            try:
                plan = upgrade_collection(self.collection, model, bridges=list(bridges), calibration=tasks,
                                          calibration_label=label, pool=self.pool, log=log, fit_bridges=fit_bridges)
            except UpgradeRefused as e:
                raise ClientError(409, str(e), "model") from None
        self.warm()
        return UpgradeResult(current=plan.current, spaces=list(plan.space_ids), merge=plan.merge_method,
                             routes=route_table(plan))

    def _known_space(self, space: str) -> None:
        """ClientError 404 unless ``space`` is one of the collection's spaces."""
        plan = self.collection.plan
        if not plan.has(space):
            raise ClientError(404, f"collection {self.collection.path} has no space {space!r} (spaces: "
                                   f"{', '.join(plan.space_ids)})", "space")

    def route(self, space: str, direction: str, route: str | None = None, *, w: float | None = None) -> dict[str, Any]:
        from ..lifecycle.plan_changes import RouteRefused, pin_route, route_table

        self._known_space(space)
        with self.write_lock:
            try:
                return route_table(pin_route(self.collection, space, direction, route, w))
            except RouteRefused as e:
                raise ClientError(409, str(e), "route") from None

    def calibrate(self, data: str | Path, *, split: str = "val", limit: int | None = None,
                  langs: Sequence[str] | str = ("en",)) -> dict[str, Any]:
        from ..lifecycle.plan_changes import calibrate_collection, route_table

        tasks, label = load_calibration(data, split, limit, langs)
        with self.write_lock:
            plan = calibrate_collection(self.collection, tasks, label=label)
        return {"routes": route_table(plan), "merge": plan.merge_method}

    def retire(self, space: str, *, drop_unsourced: bool = False) -> dict[str, Any]:
        from ..lifecycle.backfill import retire_space

        self._known_space(space)
        with self.write_lock:
            dropped = len(self.collection.unsourced_ids(space)) if drop_unsourced else 0
            retire_space(self.collection, space, drop_unsourced=drop_unsourced)
        return {"retired": space, "dropped_unsourced": dropped}

    # ------------------------------------------------------------------ reads
    def search(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: Mapping[str, Any] | None = None, merge: str | None = None) -> SearchResults:
        if text is not None:
            self.limits.check_text(text)
        r = self.searcher(merge).search(text=text, image=image, k=self.limits.check_k(k), target=target,
                                        filter=filter)
        return _results(r)

    def get(self, item_id: str) -> ItemInfo:
        snap = self.collection.snapshot()
        item = snap.item(item_id)
        if item is None:
            raise ClientError(404, f"no item with id {item_id!r}", "id")
        return ItemInfo(id=item.id, modality=item.modality, metadata=dict(item.metadata),
                        space=snap.serving_space(item_id))

    def delete(self, *ids: str) -> int:
        from ..index.collection import ItemNotFoundError

        try:
            return self.collection.delete(list(ids))
        except ItemNotFoundError as e:
            raise ClientError(404, str(e), "id") from None

    def status(self) -> dict[str, Any]:
        from ..lifecycle.plan_changes import route_table

        c = self.collection
        st = c.status()
        plan = c.plan
        st["routes"] = route_table(plan)
        st["merge"] = plan.merge_method or "raw"
        st["calibrated"] = bool(plan.calibration)
        st["backfill"] = self.backfill_status()
        st["fitted_bridges"] = _fitted(c)
        st["limits"] = dataclasses.asdict(self.limits)
        return st

    def verify(self, *, repair: bool = False, model_check: bool = False) -> dict[str, Any]:
        from ..lifecycle.verify import verify_path

        return verify_path(self.target, repair=repair, model_check=model_check, pool=self.pool).to_dict()

    # ------------------------------------------------------------------ the backfill
    def backfill_start(self, order: str = "uncertainty", rate: float | None = None, *, wait: bool = False,
                       resume: bool = False, limit: int | None = None, workers: int = 1, batch_size: int = 64,
                       progress: Callable[[int], None] | None = None,
                       log: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Start (or go on with) the backfill. ``wait``: run ``workers`` worker processes (1: this
        one) until done, ``limit`` or a pause, and return the run's report (``resume``: a paused job
        runs again first); otherwise a worker thread of this process goes on in the background (the
        service's way; a paused job runs again) and the status is returned."""
        from ..lifecycle.backfill import pause_backfill, run_backfill

        if wait:
            if resume:
                pause_backfill(self.collection, paused=False)
            return run_backfill(self.collection, self.encoder(), order=order, workers=workers, limit=limit,
                                rate=rate, batch_size=batch_size, pool=self.pool, progress=progress, log=log)
        return self._start_thread(order, rate)

    def _start_thread(self, order: str, rate: float | None) -> dict[str, Any]:
        """A paused job runs again; a worker thread still in its batch goes on (it re-checks the
        job before it stops), else one is started."""
        from ..lifecycle.backfill import backfill_running, run_worker, start_backfill

        with self.write_lock:
            enc = self.encoder()
            start_backfill(self.collection, enc, order=order, pool=self.pool)  # resumes a paused job
            with self._backfill_lock:
                if self.backfill_active:
                    return self.backfill_status()
                self.backfill_active, self.backfill_error, self.backfill_stopped = True, None, None

            def work() -> None:
                try:
                    while True:
                        rep = run_worker(self.collection, enc, rate=rate, batch_size=32)
                        with self._backfill_lock:
                            job = backfill_running(self.collection)
                            if rep.stopped in ("paused", "job removed") and job is not None and job.state == "running":
                                continue  # resumed (or started anew) while this worker was stopping
                            self.backfill_stopped, self.backfill_active = rep.reason(), False
                            return
                except Exception as e:  # reported by the status, never silent
                    with self._backfill_lock:
                        self.backfill_error = f"{type(e).__name__}: {e}"
                        self.backfill_stopped, self.backfill_active = f"error: {self.backfill_error}", False
                    log.exception("backfill worker failed")

            self.backfill_thread = threading.Thread(target=work, name="backfill", daemon=True)
            self.backfill_thread.start()
        return self.backfill_status()

    def backfill_pause(self) -> dict[str, Any]:
        from ..lifecycle.backfill import pause_backfill

        pause_backfill(self.collection)
        return self.backfill_status()

    def backfill_resume(self, order: str = "uncertainty", rate: float | None = None) -> dict[str, Any]:
        return self._start_thread(order, rate)

    def backfill_cancel(self) -> dict[str, Any]:
        from ..lifecycle.backfill import cancel_backfill

        cancel_backfill(self.collection)
        return self.backfill_status()

    def backfill_status(self) -> dict[str, Any]:
        """The collection's backfill status with this client's worker thread: ``worker`` (running |
        idle), ``worker_stopped`` (why it last stopped), ``error``."""
        from ..lifecycle.backfill import backfill_status

        st = backfill_status(self.collection)
        active = self.backfill_active
        st["worker"] = "running" if active else "idle"
        if active and st["state"] == "idle":  # this client's worker is about to take a shard
            st["state"] = "running"
            st.pop("note", None)
            st.pop("last_worker", None)
        if self.backfill_error:
            st["error"] = self.backfill_error
        if self.backfill_stopped and not active:
            st["worker_stopped"] = self.backfill_stopped
        return st

    def close(self) -> None:
        """Nothing to release: a collection holds no connection between calls."""


def _results(r: Any) -> SearchResults:
    """The searcher's response as the client's type."""
    return SearchResults(query=r.query, modality=r.modality,
                         hits=[SearchHit(h.rank, h.score, h.id, h.space, h.route, h.metadata) for h in r.hits])


def _fitted(collection: Any) -> dict[str, Any]:
    """The fitted bridges in service (family, pairs, held-out score, when) and the fits so far."""
    from ..lifecycle.backfill_fit import fit_state
    from ..lifecycle.fit_bridges import fitted_status

    st = fit_state(collection) or {}
    return {"serving": fitted_status(collection.plan), "fits": st.get("fits", []), "next": st.get("next"),
            "enabled": bool(st), **({"error": st["error"]} if st.get("error") else {})}
