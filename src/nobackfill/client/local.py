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
from ..search.merge import DEFAULT_MERGE
from .base import (Client, check_image_file, check_item_id, check_path, check_upgrade, collection_removed, ray_options,
                   refusals)
from .errors import Conflict, InvalidRequest, NotFound
from .types import AddResult, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult
from .worker import BackgroundWorker
from .upload import check_items, given_items, load_calibration, one_source, read_files, unembeddable

__all__ = ["LocalClient"]

#: keys of a backfill's status that only some states have: null otherwise, in process as over HTTP
NULLABLE_BACKFILL_KEYS = ("order", "target", "shards", "engine", "eta_s", "phase", "sample", "last_worker", "note",
                          "worker", "rate_cap", "worker_stopped", "error", "worker_run")

logger = logging.getLogger("nobackfill.client")


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
        self.worker = BackgroundWorker()  # the backfill worker thread of backfill_start / resume

    def __repr__(self) -> str:
        return f"LocalClient({self.target!r})"

    # ------------------------------------------------------------------ plumbing
    @property
    def collection(self) -> Any:
        """The open :class:`~nobackfill.collection.collection.Collection` (opened on first use)."""
        if self._collection is None:
            from ..collection.collection import Collection

            self._collection = Collection.open(self.target)
        else:
            self._check_present()
        return self._collection

    def forget_storage(self) -> None:
        """After the storage stopped answering: the next call reopens the collection and reconnects."""
        storage = getattr(self._collection, "storage", None)
        self._collection, self._searchers = None, {}
        getattr(storage, "reconnect", lambda: None)()  # Milvus: a fresh client (gRPC's back-off ran ~30 s)

    def _check_present(self) -> None:
        if collection_removed(self._collection):  # its open files would answer from a deleted collection
            self._collection, self._searchers = None, {}
            raise NotFound(404, f"{self.target} is not a collection any more: its directory was removed or replaced "
                                "while this client had it open", "collection")


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
    @refusals
    def create(self, model: str | Path, *, backend: str = "auto") -> dict[str, Any]:
        from ..collection.collection import Collection
        from ..search.models import model_ref

        ref = model_ref(check_path(model, "model"))
        Collection.check_new(self.target, backend)  # refused before the model loads (seconds)
        enc = self.pool.get(ref)
        self._collection = Collection.create(self.target, space_id=enc.space_id, dim=enc.embed_dim, model=ref,
                                             name=getattr(enc, "name", ""), backend=backend,
                                             modalities=list(getattr(enc, "modalities", ("image", "text"))))
        return self.status()

    @refusals
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
        from ..gallery.types import DuplicateIdError
        from ..collection.ingest import FolderItems, UnembeddableItem, add_items

        one_source(texts, images, folder, text_file)
        if folder is not None or text_file is not None:
            items, read = read_files(folder, split, text_file, langs, skip_bad, self.limits.max_caption_chars)
        else:
            items, read = given_items(texts, images, ids, self.limits.check_text), FolderItems(items=[])
        check_items(items)  # the ids the HTTP API can name, JSON metadata: one rule for both clients
        try:
            rep = add_items(self.collection, self.encoder(), items, chunk_size=chunk_size, skip_bad=skip_bad,
                            progress=progress, wait=wait, before_embed=before_embed)
        except DuplicateIdError as e:
            raise Conflict(409, str(e), "id") from None
        except UnembeddableItem as e:
            raise unembeddable(e, items, given=folder is None and text_file is None) from None
        out = AddResult(**rep.to_dict(), ids=[it.id for it in items], problems=read.problems + list(rep.problems),
                        skipped_images={**read.skipped_images, **rep.skipped_images}, uncaptioned=read.uncaptioned)
        out.skipped += read.skipped
        if build_indexes and rep.added:
            self.collection.build_graph_indexes(log=log)
        return out

    @refusals
    def import_(self, source: str, *, table: str | Path | None = None, id_column: str | None = None,
                source_column: str | None = None, modality: str | None = None, images_root: str | Path | None = None,
                model: str | Path | None = None, trust_model: bool = False, lossy: bool = False, samples: int = 64,
                backend: str = "auto", wait: bool = False, progress: bool = False,
                metadata_columns: Sequence[str] | None = None) -> ImportResult:
        from ..adopt.importing import ModelCheckRefused, import_source
        from ..adopt.sources import open_source
        from ..gallery.types import DuplicateIdError
        from ..encoders.meta import ModelInfo, remembered
        from ..search.models import model_ref

        # trusted (nothing embedded): the model is not loaded where the plan or a record says what it is
        if model is None:  # into the collection as it is: its current model made the vectors
            try:
                coll = self.collection
            except FileNotFoundError as e:
                raise NotFound(404, f"{e}; to create it by this import, name the model that made the vectors "
                                    "(model=, --model)", "model") from None
            cur = coll.space(coll.current_space)
            ref, enc = cur.model, ModelInfo.of_space(cur) if trust_model else self.encoder()
        else:
            ref = model_ref(model)
            enc = (remembered(ref) if trust_model else None) or self.pool.get(ref)
        with self.write_lock:
            src = open_source(source, table=table, id_column=id_column, source_column=source_column,
                              modality=modality, images_root=images_root, lossy=lossy, expect_dim=int(enc.embed_dim),
                              metadata_columns=metadata_columns)
            try:
                target = self._collection if self._collection is not None else self.target  # (an empty one is falsy)
                rep = import_source(target, src, enc, model=ref, trust_model=trust_model, samples=samples,
                                    backend=backend, progress=progress, wait=wait)
            except ModelCheckRefused as e:
                raise Conflict(409, str(e), "model") from None
            except DuplicateIdError as e:  # an id holding an item of the other modality (as add refuses it)
                raise Conflict(409, str(e), "id") from None
        self.pool.remember(ref)  # loaded here, its fingerprint computed: a later trusted import needs neither
        # an open collection took the rows itself; an unopened one is opened on first use
        return ImportResult(items=rep.items, added=rep.added, unchanged=rep.unchanged, seconds=round(rep.seconds, 3),
                            model_check=rep.model_check, warnings=list(rep.warnings), source=rep.source,
                            stored=rep.stored, replaced=rep.replaced)

    @refusals
    def adopt(self, source: str, *, model: str | Path, vector_field: str, id_field: str, modality: str,
              source_field: str | None = None, images_root: str | Path | None = None, trust_model: bool = False,
              samples: int = 64, backend: str = "auto", wait: bool = False, progress: bool = False) -> dict[str, Any]:
        """A Milvus collection (``milvus://HOST:PORT#NAME``, ``milvus-lite:PATH#NAME``) adopted in place."""
        from ..adopt.in_place import adopt_milvus
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
        """Forget the open collection (adopting wrote its plan through another handle), its searchers."""
        self._collection, self._searchers = None, {}

    # ------------------------------------------------------------------ plan changes
    @refusals
    def upgrade(self, model: str | Path, *, bridges: Sequence[str | Path] = (), calibrate: str | Path | None = None,
                calibrate_split: str = "val", calibrate_limit: int | None = None,
                calibrate_langs: Sequence[str] | str = ("en",),
                log: Callable[[str], None] | None = None, fit_bridges: bool | None = None,
                queries: Sequence[str] = (), fit_sample: Mapping[str, Any] | None = None) -> UpgradeResult:
        from ..lifecycle.plan_changes import UpgradeRefused, route_table, upgrade_collection

        bridges = check_upgrade(model, bridges)
        tasks, label = (load_calibration(calibrate, calibrate_split, calibrate_limit, calibrate_langs)
                        if calibrate is not None else (None, ""))
        with self.write_lock:
            try:
                plan = upgrade_collection(self.collection, model, bridges=list(bridges), calibration=tasks,
                                          calibration_label=label, pool=self.pool, log=log, fit_bridges=fit_bridges,
                                          queries=queries, fit_sample=dict(fit_sample) if fit_sample else None)
            except UpgradeRefused as e:
                raise Conflict(409, str(e), "model") from None
        try:  # committed: a model that fails to load now is named by the search that needs it
            self.warm()
        except Exception as e:  # (``log`` is the caller's: the command line prints it)
            note = f"upgraded; a model did not load for searching ({type(e).__name__}: {e})"
            logger.warning(note)
            if log is not None:
                log(note)
        return UpgradeResult(current=plan.current, spaces=list(plan.space_ids),
                             merge=plan.merge_method or DEFAULT_MERGE, routes=route_table(plan))

    def _known_space(self, space: str) -> str:
        """The id of ``space``: one of the collection's space ids, or the name of exactly one of its
        spaces (status and search tables show names first: trial V); else NotFound (404) listing them."""
        plan = self.collection.plan
        if plan.has(space):
            return space
        named = [s.space_id for s in plan.spaces if s.name and s.name == space]
        if len(named) == 1:
            return named[0]
        known = ", ".join(f"{s.space_id} ({s.name})" if s.name else s.space_id for s in plan.spaces)
        why = f"{len(named)} spaces are named {space!r}: give its id" if named else f"no space {space!r}"
        raise NotFound(404, f"collection {self.collection.path} has {why} (spaces: {known})", "space")

    @refusals
    def route(self, space: str, direction: str, route: str | None = None, *, w: float | None = None) -> dict[str, Any]:
        from ..lifecycle.plan_changes import RouteRefused, pin_route, route_table

        space = self._known_space(space)
        with self.write_lock:
            try:
                return route_table(pin_route(self.collection, space, direction, route, w))
            except RouteRefused as e:
                raise Conflict(409, str(e), "route") from None

    @refusals
    def calibrate(self, data: str | Path, *, split: str = "val", limit: int | None = None,
                  langs: Sequence[str] | str = ("en",)) -> dict[str, Any]:
        from ..lifecycle.plan_changes import calibrate_collection, route_table

        tasks, label = load_calibration(data, split, limit, langs)
        with self.write_lock:
            plan = calibrate_collection(self.collection, tasks, label=label)
        return {"routes": route_table(plan), "merge": plan.merge_method or DEFAULT_MERGE}

    @refusals
    def retire(self, space: str, *, drop_unsourced: bool = False) -> dict[str, Any]:
        from ..lifecycle.backfill import retire_space

        space = self._known_space(space)
        with self.write_lock:
            if self.collection.space(space).retired:  # (a rerun: said, not done again)
                return {"retired": space, "dropped_unsourced": 0, "already": True}
            dropped = len(self.collection.unsourced_ids(space)) if drop_unsourced else 0
            retire_space(self.collection, space, drop_unsourced=drop_unsourced)
        return {"retired": space, "dropped_unsourced": dropped, "already": False}

    # ------------------------------------------------------------------ reads
    @refusals
    def search(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: Mapping[str, Any] | None = None, merge: str | None = None) -> SearchResults:
        if text is not None:
            self.limits.check_text(text)
        check_image_file(image)
        k = self.limits.check_k(k)  # (the arguments before a cold search loads the model: trial AE waited 4 s)
        if target is not None and target not in ("image", "text"):
            raise ValueError(f"target must be 'image' or 'text', got {target!r}")
        if not self._searchers:
            self._first_search()
        else:
            self._check_present()
        return _results(self.searcher(merge).search(text=text, image=image, k=k, target=target, filter=filter))

    def _first_search(self) -> None:
        """Before this client's first search: load the current model in a thread while this one
        reads the collection's state and connects to its vector stores (a cold ``collection
        search`` waits for the longer of the two, not for both). A model that fails to load fails
        again, named, where the search asks for it."""
        c = self.collection

        def load() -> None:
            try:
                self.encoder()
            except Exception:  # the search's own call reports it
                pass

        loader = threading.Thread(target=load, name="load-query-model", daemon=True)
        loader.start()
        try:
            c.snapshot()
        finally:
            loader.join()

    @refusals
    def get(self, item_id: str) -> ItemInfo:
        snap = self.collection.snapshot()
        item = snap.item(check_item_id(item_id))
        if item is None:
            raise NotFound(404, f"no item with id {item_id!r}", "id")
        return ItemInfo(id=item.id, modality=item.modality, metadata=dict(item.metadata),
                        space=snap.serving_space(item_id))

    @refusals
    def delete(self, *ids: str) -> int:
        from ..collection.collection import ItemNotFoundError

        try:
            return self.collection.delete([check_item_id(i, "delete") for i in ids])
        except ItemNotFoundError as e:
            raise NotFound(404, str(e), "id") from None

    @refusals
    def index(self, *, log: Callable[[str], None] | None = None, progress: bool = False) -> dict[str, Any]:
        todo = self.collection.missing_graph_indexes()
        built = self.collection.build_graph_indexes(log=log, progress=progress)
        return {"indexes": [{**t, **built.get(t["space"], {}).get(t["modality"], {})} for t in todo]}

    @refusals
    def status(self) -> dict[str, Any]:
        from ..lifecycle.backfill_fit import fit_summary
        from ..lifecycle.plan_changes import route_table

        c = self.collection
        st = c.status()
        plan = c.plan
        st["routes"], st["merge"], st["calibrated"] = route_table(plan), plan.merge_method or DEFAULT_MERGE, \
            bool(plan.calibration)
        st["merge_without_labels"] = plan.merge is not None and "without_labels" in (plan.merge.calibration or {})
        st["backfill"] = self.backfill_status()
        st["fitted_bridges"], st["limits"] = fit_summary(c), dataclasses.asdict(self.limits)
        return st

    @refusals
    def verify(self, *, repair: bool = False, model_check: bool = False) -> dict[str, Any]:
        from ..lifecycle.verify import verify_path

        return verify_path(self.target, repair=repair, model_check=model_check, pool=self.pool).to_dict()

    # ------------------------------------------------------------------ the backfill
    @refusals
    def backfill_start(self, order: str = "uncertainty", rate: float | None = None, *, wait: bool = False,
                       resume: bool = False, limit: int | None = None, workers: int = 1, batch_size: int = 64,
                       progress: Callable[[int], None] | None = None,
                       log: Callable[[str], None] | None = None, engine: str = "local",
                       ray_address: str | None = None, actors: int | None = None,
                       gpus_per_actor: float = 0.0, shards: int | None = None) -> dict[str, Any]:
        """Start (or go on with) the backfill. ``wait``: run ``workers`` worker processes (1: this
        one) until done, ``limit`` or a pause, and return the run's report; otherwise a worker thread
        of this process goes on in the background (the service's way) and the status is returned. A
        paused job is refused unless ``resume`` (:meth:`backfill_resume`): a pause holds until then.
        ``engine="ray"``: the embedding runs on the Ray cluster at ``ray_address`` (``auto``: the
        running one; None: a Ray started on this machine), ``actors`` embedding actors of
        ``gpus_per_actor`` GPUs each. ``shards``: a new job's shards (default ``workers``; more for the
        workers of other machines to share it)."""
        from ..lifecycle.backfill import (BackfillError, BackfillJob, backfill_status, check_run_settings,
                                          pause_backfill, run_backfill)

        check_run_settings(workers=workers, batch_size=batch_size, rate=rate, limit=limit, shards=shards)
        self.collection.storage.backfill_workers(1, engine)  # ray on storage one process holds: refused now
        ray = ray_options(engine, ray_address, actors, gpus_per_actor)
        job = BackfillJob.load(self.collection)
        if job is not None and job.state == "paused" and not resume:  # an operator's pause holds until a resume
            st = backfill_status(self.collection)
            raise BackfillError(f"the backfill is paused ({st['done']}/{st['total']} done): resume it "
                                "(POST /v1/backfill/resume, `nobackfill collection backfill NAME --resume`, "
                                "Client.backfill_resume())")
        if wait:
            if resume:
                pause_backfill(self.collection, paused=False)
            return run_backfill(self.collection, self.encoder(), order=order, workers=workers, limit=limit,
                                rate=rate, batch_size=batch_size, pool=self.pool, progress=progress, log=log,
                                engine=engine, ray=ray, load=self._loader() if ray else None, uri=self.target,
                                shards=shards)
        return self._start_thread(order, rate, ray)

    def _loader(self) -> Any:
        """How a Ray actor loads the current model (by its reference, into a pool of its own)."""
        from ..lifecycle.cluster.ray_backfill import PoolLoader

        c = self.collection
        return PoolLoader(c.space(c.current_space).model, c.current_space)

    def _start_thread(self, order: str, rate: float | None, ray: Any = None) -> dict[str, Any]:
        """A paused job runs again; a worker thread still in its batch goes on (it re-checks the
        job before it stops), else one is started (``ray``: a Ray pipeline's driver)."""
        from ..lifecycle.backfill import BackfillJob, backfill_running, run_worker, start_backfill

        with self.write_lock:
            enc = self.encoder()
            job = BackfillJob.load(self.collection)
            if rate is None and job is not None and job.state == "paused":
                rate = self.worker.rate_cap  # a resume keeps the run's cap (trial AG: it ran uncapped)
            start_backfill(self.collection, enc, order=order, pool=self.pool)  # resumes a paused job

            def one_run() -> Any:
                if ray is None:  # (its bridge fits told to this module's logger; status names them too)
                    return run_worker(self.collection, enc, rate=rate, batch_size=32, log=logger.info,
                                      stop=self.worker.stop_reason, progress=self.worker.progress)
                from ..lifecycle.cluster.ray_backfill import run_ray_worker

                return run_ray_worker(self.collection, self._loader(), uri=self.target, options=ray, rate=rate,
                                      batch_size=32, log=logger.info, stop=self.worker.stop_reason,
                                      progress=self.worker.progress)

            def resumed(rep: Any) -> bool:
                job = backfill_running(self.collection)
                return rep.stopped in ("paused", "job removed") and job is not None and job.state == "running"

            self.worker.start(one_run, resumed, rate)  # (none while one is active: it sees the resumed job, goes on)
        return self.backfill_status()

    @refusals
    def backfill_pause(self) -> dict[str, Any]:
        from ..lifecycle.backfill import pause_backfill

        pause_backfill(self.collection)
        return self.backfill_status()

    @refusals
    def backfill_resume(self, order: str = "uncertainty", rate: float | None = None, *, engine: str = "local",
                        ray_address: str | None = None, actors: int | None = None,
                        gpus_per_actor: float = 0.0) -> dict[str, Any]:
        from ..lifecycle.backfill import check_run_settings

        check_run_settings(rate=rate)  # (then as a start that resumes: one started where none is paused)
        self.collection.storage.backfill_workers(1, engine)
        return self._start_thread(order, rate, ray_options(engine, ray_address, actors, gpus_per_actor))

    @refusals
    def backfill_cancel(self) -> dict[str, Any]:
        from ..lifecycle.backfill import BackfillError, BackfillJob, cancel_backfill

        if BackfillJob.load(self.collection) is None:  # as pause
            raise BackfillError(f"no backfill to cancel in {self.collection.path}")
        cancel_backfill(self.collection)
        return self.backfill_status()

    @refusals
    def backfill_status(self) -> dict[str, Any]:
        """The collection's backfill status with this client's worker thread: ``worker`` (running |
        idle), ``worker_stopped`` (why it last stopped), ``error``."""
        from ..lifecycle.backfill import backfill_status

        st = self.worker.annotate(backfill_status(self.collection))
        for key in NULLABLE_BACKFILL_KEYS:  # null when they do not apply, as over HTTP (trial AJ)
            st.setdefault(key, None)
        return st

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop this client's backfill worker, if one runs (before its next batch: its shard handed
        back, "its client was closed" recorded), waiting up to ``timeout`` seconds; a collection holds
        no connection between calls."""
        self.worker.stop("its client was closed (the server stopped, or the program closed it)", timeout)


def _results(r: Any) -> SearchResults:
    """The searcher's response as the client's type."""
    return SearchResults(query=r.query, modality=r.modality,
                         hits=[SearchHit(h.rank, h.score, h.id, h.space, h.route, h.metadata) for h in r.hits])

