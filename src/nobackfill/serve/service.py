"""What the app holds for its life (:class:`Service`, ``app.state.service``): the in-process client
of the collection, the request models under the server's limits, the path rules and the metrics.
The routers reach it through :func:`~nobackfill.serve.deps.get_service`."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from .batching import SearchBatcher
from .errors import ApiError, library_error
from .paths import PublicPaths
from .schema import request_models
from .settings import ServeSettings

__all__ = ["Service"]

log = logging.getLogger("nobackfill.serve")


class Service:
    """What the app holds for its life: the in-process client of the collection (warm models and
    searchers, the backfill thread), the path rules and the metrics."""

    def __init__(self, settings: ServeSettings, pool: Any = None) -> None:
        from ..client.local import LocalClient

        self.settings = settings
        if pool is None:
            from ..search import ModelPool

            pool = ModelPool(query_cache=settings.query_cache, onnx=settings.onnx, onnx_threads=settings.query_threads)
        self.client = LocalClient(settings.collection, pool=pool, limits=settings.limits)
        lim = settings.limits
        self.models = request_models(lim.max_k, lim.max_caption_chars, lim.max_batch, lim.max_image_bytes)
        if settings.uploads is not None:
            self.uploads = Path(settings.uploads)
        elif isinstance(self.collection.path, Path):
            self.uploads = self.collection.path / "uploads"
        else:
            raise ValueError("a collection outside the file system needs --uploads DIR for uploaded images")
        self.upload_lock = threading.Lock()  # image adds: stored files and their commit, or neither
        local = self.collection.path if isinstance(self.collection.path, Path) else None
        self.paths = PublicPaths([(local, ""), (self.uploads, "uploads/"), (settings.data_root, ""),
                                  (settings.models_root, ""), (settings.upgrades_root, "")],
                                 aliases=None if local is not None else self._uri_aliases())
        self.batcher = SearchBatcher(self.client.searcher, threads=settings.query_threads)
        self._metrics()
        self._index_lock = threading.Lock()
        self._indexer: threading.Thread | None = None
        self._index_again = False
        self.unfinished: list[str] = []  # threads still running when the server stopped (close)
        self.start_index_builds()  # a collection imported before the server started gets its graph indexes

    def close(self, timeout: float = 30.0) -> list[str]:
        """At the server's shutdown: its backfill worker, if one runs, stops before its next batch
        (its shard handed back, "the server stopped" recorded for ``collection status``; a bridge fit
        it runs ends first), and an index build ends, each waited for up to ``timeout`` seconds; the
        job stays for a later start or ``collection backfill``. Returns the threads still running
        (the process then ends without waiting for them: ``serve``)."""
        left = []
        if not self.client.worker.stop("the server stopped", timeout):
            left.append("the backfill worker")
        indexer = self._indexer
        if indexer is not None and indexer.is_alive():
            indexer.join(timeout)
            if indexer.is_alive():
                left.append("an index build")
        if left:
            log.warning("%s did not end within %.0f s: the process ends without them (what they committed "
                        "stays; a backfill's lease expires unfinished)", " and ".join(left), timeout)
        self.unfinished = left
        return left

    def _uri_aliases(self) -> dict[str, str]:
        """A storage URI's spellings (as given, as the collection holds it, redacted) -> the
        collection's name: what responses show of a collection outside the file system."""
        from ..catalog.schema import redact

        c = self.collection
        forms = {str(self.settings.collection), str(c.path)}
        return {f: c.name for form in forms for f in (form, redact(form))}

    @property
    def collection(self) -> Any:
        """The client's open collection (never a copy of it that could go stale)."""
        return self.client.collection

    @property
    def pool(self) -> Any:
        return self.client.pool

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
        r.register(_QueryCacheMetrics(self))


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
            there = target.is_file() if file else target.is_dir()
            head, _, rest = rel.partition("/")
            if not there and rest and head in (root.name, base.name):  # models/m under --models-root models
                return self.under(root, rest, what, option, file=file)
            if not there:
                raise ApiError(404, f"{what}: {rel!r} is no {'file' if file else 'directory'} under {option} "
                                    "(names are relative to the server's roots)", what)
        except OSError as e:  # a name too long, a loop of links, no permission: nothing usable there
            raise ApiError(404, f"{what}: {rel!r} is not readable under {option} ({type(e).__name__})", what) from None
        return target

    def model(self, root: Path | None, rel: str, *, check: bool = True) -> Path | str:
        """A model a request names: a directory under ``root`` (--models-root), or an alias of a
        shipped pretrained model (``minilm``) that is no such directory. ``check``: 422 unless the
        directory holds a config.json (:meth:`check_model`)."""
        from ..encoders import PRETRAINED_TEXT_ALIASES

        if rel in PRETRAINED_TEXT_ALIASES and (root is None or not (root / rel).exists()):
            return rel
        model = self.under(root, rel, "model", "--models-root")
        return self.check_model(model, rel) if check else model

    @staticmethod
    def check_model(model: Path | str, rel: str) -> Path | str:
        """``model``, or 422 for a directory that holds no model (no config.json)."""
        if isinstance(model, Path) and not (model / "config.json").is_file():
            raise ApiError(422, f"model: {rel!r} is not a model directory (no config.json)", "model")
        return model

    # ------------------------------------------------------------------ graph indexes
    def start_index_builds(self, *, wait_listed: bool = False) -> list[dict[str, Any]]:
        """Build the graph index of every ``auto`` space past its threshold that lacks it, in a
        daemon thread (one at a time: a call while it runs makes it look again when it ends);
        searches stay exact until each index is whole. ``wait_listed``: list what is missing
        first (each with ``building`` true) instead of returning at once with an empty list."""
        missing = self.collection.missing_graph_indexes() if wait_listed else []
        with self._index_lock:
            self._index_again = True
            if self._indexer is None or not self._indexer.is_alive():
                self._indexer = threading.Thread(target=self._build_indexes, name="nobackfill-index-builds",
                                                 daemon=True)
                self._indexer.start()
        return [{**m, "building": True} for m in missing]

    def _build_indexes(self) -> None:
        while True:
            with self._index_lock:
                if not self._index_again:
                    self._indexer = None
                    return
                self._index_again = False
            try:
                self.collection.build_graph_indexes(log=log.info)
            except Exception:  # noqa: BLE001 - searches stay exact; the next call tries again
                log.exception("building the graph indexes of %s failed (searches stay exact)", self.collection.path)

    # ------------------------------------------------------------------ the client
    def status(self) -> dict[str, Any]:
        """The collection's status (the collection, models and messages by name, no server path);
        refreshes the gauges of ``/metrics``. Blocking: call it in the thread pool."""
        st = self.client.status()
        self.g_done.set(st["backfill"]["done"])
        self.g_total.set(st["backfill"]["total"])
        for m, n in st["items"].items():
            self.g_items.labels(m).set(n)
        return self.paths.deep(st)

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
        except ClientError as e:  # (a storage that did not answer: status 0 in process, 503 here)
            raise ApiError(e.status or 503, e.detail, e.field or field) from None
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise ApiError(422, str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e), field) from None
        except Exception as e:  # a catalog or Milvus server that does not answer: 503, naming it
            err = library_error(e, field)
            if err is None:
                raise
            if err.status == 503:
                self.client.forget_storage()
            raise err from None


class _QueryCacheMetrics:
    """``/metrics`` of the pool's text query cache and of how its query encoders run (read at each
    scrape)."""

    def __init__(self, service: "Service") -> None:
        self.service = service

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.service.pool.query_cache.stats() if hasattr(self.service.pool, "query_cache") else \
            {"hits": 0, "misses": 0, "entries": 0, "size": 0}
        yield CounterMetricFamily("nobackfill_query_cache_hits", "Text queries answered from the embedding cache",
                                  value=st["hits"])
        yield CounterMetricFamily("nobackfill_query_cache_misses", "Text queries embedded (not in the cache)",
                                  value=st["misses"])
        yield GaugeMetricFamily("nobackfill_query_cache_entries", "Text query embeddings held", value=st["entries"])
        yield GaugeMetricFamily("nobackfill_query_cache_size", "Most text query embeddings held (0: off)",
                                value=st["size"])
        runs = GaugeMetricFamily("nobackfill_query_encoder", "1 for each query tower loaded: its model (the "
                                 "directory's name), space (its space id: two models of one directory name "
                                 "differ there), tower and runtime (torch, onnx, onnx-int8)",
                                 labels=["model", "space", "tower", "runtime"])
        towers = getattr(self.service.pool, "query_towers", None)
        seen = set()  # one series each: two references to one model (models/m, ./models/m) are one
        for ref, space, tower, runtime in towers() if towers else ():
            labels = (Path(ref).name, space, tower, runtime)  # ("world-new via world-old-to-new": a bridge's)
            if labels not in seen:
                seen.add(labels)
                runs.add_metric(list(labels), 1)
        yield runs
