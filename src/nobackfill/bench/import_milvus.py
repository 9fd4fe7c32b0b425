"""The ``milvus_in_place`` part of ``bench import`` (:mod:`nobackfill.bench.importing`): a user's own
Milvus collection adopted in place (:func:`~nobackfill.adopt.in_place.adopt_milvus`), searched,
upgraded, backfilled, searched again and its space retired, while its row count and a checksum of
its vectors never change.

The user's collection is the world test images embedded by ``world-old``, in THEIR schema (``pk``
INT64, not a row number; ``embedding``; ``image_path``) with THEIR index (HNSW, COSINE), created
with pymilvus beside nobackfill's collection. The flow:

1. fingerprint (row count + sha256 of ``pk`` and float32 vector, rows sorted by ``pk``);
2. adopt (model check on: it must accept);
3. search: text queries (world captions) through the :class:`~nobackfill.search.Searcher`; hits
   non-empty and all from the adopted space, p50 ms, how often the caption's own image is in the top 10;
4. upgrade to ``world-new`` with the shipped bridge (``upgrades/world-old-to-new``), search (bridge);
5. backfill every item (``run_backfill``, random order), search (native);
6. retire the adopted space (nobackfill stops reading it, never drops it), search, fingerprint.

Every search pass opens the collection anew, so searches of the adopted collection run in the
first seconds after a process discovered its rows, at Strong consistency (``strong_window_s``:
:data:`~nobackfill.milvus.FRESH_S`); on a Milvus server that waits for a time tick (about
100 ms a search), which a long-lived searcher pays only for that window.

Where: milvus-lite (a file in the work dir) by default; a Milvus server when ``cfg.milvus_uri``
names one (``HOST:PORT`` or ``milvus://HOST:PORT``) with the PostgreSQL catalog ``cfg.catalog``
(``postgresql://...``; None: one started in the work dir), or with ``cfg.shared`` a PostgreSQL and a
Milvus server both started on 127.0.0.1 in the work dir and stopped after (run it under
``scripts/isolated.sh``). nobackfill's collections and the user's collection this bench made are
dropped at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

if TYPE_CHECKING:
    from .import_data import World
    from .import_config import ImportBenchConfig

K = 10


def fingerprint(client: Any, name: str, batch_rows: int = 1000) -> tuple[int, str]:
    """The row count of Milvus collection ``name`` and the sha256 of its rows' primary keys and
    vectors (float32), rows sorted by primary key (``pk`` / ``embedding``)."""
    rows: list[tuple[Any, bytes]] = []
    it = client.query_iterator(name, batch_size=batch_rows, filter="", output_fields=["pk", "embedding"],
                               consistency_level="Strong")
    try:
        while batch := it.next():
            rows.extend((r["pk"], np.asarray(r["embedding"], np.float32).tobytes()) for r in batch)
    finally:
        it.close()
    rows.sort(key=lambda r: r[0])
    h = hashlib.sha256()
    for pk, vec in rows:
        h.update(str(pk).encode())
        h.update(vec)
    return len(rows), h.hexdigest()


def user_collection(client: Any, name: str, vectors: np.ndarray, paths: list[str], pks: list[int]) -> None:
    """The user's own collection as they made it: ``pk`` INT64, ``embedding``, ``image_path``, an
    HNSW index with the COSINE metric."""
    from pymilvus import DataType

    s = client.create_schema(auto_id=False, enable_dynamic_field=False)
    s.add_field("pk", DataType.INT64, is_primary=True)
    s.add_field("embedding", DataType.FLOAT_VECTOR, dim=int(vectors.shape[1]))
    s.add_field("image_path", DataType.VARCHAR, max_length=1024)
    idx = client.prepare_index_params()
    idx.add_index(field_name="embedding", index_type="HNSW", metric_type="COSINE",
                  params={"M": 16, "efConstruction": 200})
    client.create_collection(name, schema=s, index_params=idx, consistency_level="Strong")
    for i in range(0, len(pks), 1000):
        client.insert(name, [{"pk": int(p), "embedding": v.tolist(), "image_path": path}
                             for p, v, path in zip(pks[i:i + 1000], vectors[i:i + 1000], paths[i:i + 1000])])


@contextlib.contextmanager
def _servers(cfg: "ImportBenchConfig", say: Callable[[str], None]) -> Iterator[tuple[str | None, str | None]]:
    """``(milvus address, catalog url)``: (None, None) for milvus-lite; the configured server, or
    (``cfg.shared``) a PostgreSQL and a Milvus server started in the work dir and stopped after."""
    if not cfg.shared and not cfg.milvus_uri:
        yield None, None
        return
    from ..testing.milvus_server import start_server
    from ..testing.postgres_server import start_postgres

    base = cfg.work / f"milvus-servers-{os.getpid()}"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        catalog = cfg.catalog
        if catalog is None:
            shutil.rmtree(base, ignore_errors=True)
            say("  starting PostgreSQL on 127.0.0.1 ...")
            pg = start_postgres(base / "pg")
            stack.callback(pg.stop)
            catalog = pg.url
        address = cfg.milvus_uri
        if not address:
            say("  starting a Milvus server on 127.0.0.1 ...")
            t0 = time.time()
            srv = start_server(base / "milvus")
            stack.callback(srv.stop)
            address = srv.address
            say(f"  Milvus server at {address} ({time.time() - t0:.0f}s)")
        yield str(address).removeprefix("milvus://"), catalog


class _Searches:
    """Text queries (captions) against a collection: hits, routes, spaces, R@10; p50 ms end to end
    (the query embedded by the model, on CPU) and with the query vectors embedded beforehand (the
    routes, the stores and the merge only)."""

    def __init__(self, pool: Any, captions: list[str], own: list[int]) -> None:
        self.pool, self.captions, self.own = pool, captions, own

    def run(self, uri: str) -> dict[str, Any]:
        from ..collection.collection import Collection
        from ..search import Searcher

        s = Searcher(Collection.open(uri), pool=self.pool)
        cache: dict = {}
        for q in self.captions:  # warm: the models, the index; each query's vector into the cache
            s.search_batch(texts=[q], k=K, target="image", cache=cache)
        ms, cached_ms, routes, spaces, empty, found = [], [], {}, {}, 0, 0
        for q, own in zip(self.captions, self.own):
            t0 = time.perf_counter()
            hits = s.search(text=q, k=K, target="image").hits
            ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            s.search_batch(texts=[q], k=K, target="image", cache=cache)
            cached_ms.append((time.perf_counter() - t0) * 1000)
            empty += not hits
            found += any(h.id == str(own) for h in hits)
            for h in hits:
                routes[h.route] = routes.get(h.route, 0) + 1
                spaces[h.space] = spaces.get(h.space, 0) + 1
        return {"queries": len(ms), "empty": empty, "p50_ms": round(float(np.median(ms)), 2),
                "p50_embedded_ms": round(float(np.median(cached_ms)), 2),
                "r_at_10": round(found / max(len(ms), 1), 3), "routes": routes, "spaces": spaces}


def run_milvus_in_place(cfg: "ImportBenchConfig", log: Callable[[str], None] | None = None, *,
                        pool: Any = None, world: "World | None" = None) -> dict[str, Any]:
    """The flow of the module doc; ``{"adopted", "storage", "rows_before", "rows_after",
    "checksum_equal", "backfilled", "searches_ok", "seconds", ...}``."""
    from .import_data import load_world

    say = log or (lambda _m: None)
    need = ("pymilvus",) + (() if cfg.shared or cfg.milvus_uri else ("milvus_lite",))
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        return {"skipped": f"{', '.join(missing)} not installed"}
    from ..search import ModelPool

    pool = pool or ModelPool()
    w = world if world is not None else load_world(cfg, say)
    base = cfg.work / "milvus-in-place"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    with _servers(cfg, say) as (address, catalog):
        return _flow(cfg, pool, w, base, address, catalog, say)


def _flow(cfg: "ImportBenchConfig", pool: Any, w: "World", base: Path, address: str | None, catalog: str | None,
          say: Callable[[str], None]) -> dict[str, Any]:
    from .. import milvus
    from ..adopt.in_place import adopt_milvus
    from ..collection.collection import Collection
    from ..collection.uri import parse_uri
    from ..lifecycle.backfill import backfill_status, retire_space, run_backfill
    from ..search.models import model_ref
    from ..lifecycle.plan_changes import upgrade_collection

    t_all = time.time()
    tag = uuid.uuid4().hex[:8]
    theirs, ours = f"products_{tag}", f"photos_{tag}"
    if address is None:
        storage, where = "milvus-lite", f"milvus-lite:{base / 'milvus.db'}"
        uri = f"{where}#{ours}"
    else:
        storage, where = "milvus-server", f"milvus://{address}"
        uri = f"{where}#{ours}?catalog={catalog}#{ours}"
    source = f"{where}#{theirs}"
    old_ref, new_ref = model_ref(cfg.models / "world-old"), model_ref(cfg.models / "world-new")
    old, new = pool.get(old_ref), pool.get(new_ref)
    upgrade = cfg.upgrade if cfg.upgrade is not None else cfg.models.parent / "upgrades" / "world-old-to-new"
    images = [Path(p) for p in w.image_queries]
    pks = [1000 + 7 * i for i in range(len(images))]  # their keys, not row numbers
    pk_of = {p: pk for p, pk in zip(images, pks)}
    step = max(1, len(w.captions) // cfg.milvus_queries)
    picked = list(range(0, len(w.captions), step))[:cfg.milvus_queries]
    searches = _Searches(pool, [w.captions[i] for i in picked], [pk_of[Path(w.images[i])] for i in picked])
    out: dict[str, Any] = {"adopted": False, "storage": storage, "items": len(images), "queries": len(picked),
                           "index": "HNSW/COSINE", "strong_window_s": milvus.FRESH_S, "steps_s": {}}
    steps = out["steps_s"]
    client = milvus._client(*parse_uri(source))
    try:
        t0 = time.time()
        vecs = np.asarray(old.encode_images(images, progress=False), np.float32)
        user_collection(client, theirs, vecs, [str(p) for p in images], pks)
        steps["user_collection"] = round(time.time() - t0, 2)
        before = fingerprint(client, theirs)
        out["rows_before"] = before[0]
        say(f"milvus in place ({storage}): the user's collection {theirs}: {before[0]} rows, HNSW/COSINE, "
            f"sha256 {before[1][:12]} ({steps['user_collection']}s)")
        checks: dict[str, bool] = {}

        t0 = time.time()
        rep = adopt_milvus(uri, source, old, model=old_ref, vector_field="embedding", id_field="pk",
                           source_field="image_path", modality="image", samples=cfg.samples,
                           threshold=cfg.threshold, seed=cfg.seed)
        steps["adopt"] = round(time.time() - t0, 2)
        mc = rep["model_check"]
        out["adopted"] = bool(rep["created"] and mc.get("accepted") and rep["items"] == len(images))
        out["model_check"] = {k: mc[k] for k in ("accepted", "n", "median_cosine", "message") if k in mc}
        checks["after_adopt"] = fingerprint(client, theirs) == before
        say(f"  adopted {rep['items']} items in {steps['adopt']}s ({mc.get('message')})")

        out["search_adopted"] = searches.run(uri)
        c = Collection.open(uri)
        t0 = time.time()
        upgrade_collection(c, new_ref, bridges=[upgrade], pool=pool)
        steps["upgrade"] = round(time.time() - t0, 2)
        checks["after_upgrade"] = fingerprint(client, theirs) == before
        out["search_upgraded"] = searches.run(uri)

        t0 = time.time()
        bf = run_backfill(c, new, order="random", batch_size=64, pool=pool)
        steps["backfill"] = round(time.time() - t0, 2)
        status = backfill_status(Collection.open(uri))
        out["backfilled"] = bool(status["fraction"] == 1.0 and bf["committed"] == len(images))
        out["backfill"] = {"committed": bf["committed"], "fraction": status["fraction"],
                           "items_per_s": round(bf["committed"] / max(steps["backfill"], 1e-9), 1)}
        checks["after_backfill"] = fingerprint(client, theirs) == before
        out["search_backfilled"] = searches.run(uri)

        t0 = time.time()
        retire_space(c, old.space_id)
        steps["retire"] = round(time.time() - t0, 2)
        out["search_retired"] = searches.run(uri)
        out["user_collection_kept"] = bool(client.has_collection(theirs))
        after = fingerprint(client, theirs)
        checks["after_retire"] = after == before
        out["rows_after"] = after[0]
        out["checksum_equal"] = bool(after[1] == before[1] and all(checks.values()))
        out["checksum_equal_after"] = checks
        out["sha256"] = before[1]
        spaces = {"search_adopted": ({old.space_id}, set()), "search_upgraded": (None, {"native"}),
                  "search_backfilled": ({new.space_id}, {"bridge"}), "search_retired": ({new.space_id}, {"bridge"})}
        out["searches_ok"] = all(out[k]["queries"] > 0 and out[k]["empty"] == 0
                                 and (sp is None or set(out[k]["spaces"]) == sp) and not bad & set(out[k]["routes"])
                                 for k, (sp, bad) in spaces.items())
        out["p50_ms"] = out["search_adopted"]["p50_ms"]
        Collection.open(uri).storage.drop()  # nobackfill's own collections only
        out["user_collection_kept"] &= bool(client.has_collection(theirs)) and fingerprint(client, theirs) == before
    finally:
        with contextlib.suppress(Exception):
            if client.has_collection(theirs):  # the bench's stand-in for the user's collection
                client.drop_collection(theirs)
        milvus.close_clients()
        if address is None:
            shutil.rmtree(base, ignore_errors=True)
    out["seconds"] = round(time.time() - t_all, 1)
    p50 = " / ".join(f"{out[k]['p50_ms']} ({out[k]['p50_embedded_ms']})" for k in
                     ("search_adopted", "search_upgraded", "search_backfilled", "search_retired"))
    say(f"  rows {out['rows_before']} -> {out['rows_after']}, checksum equal {out['checksum_equal']}, backfilled "
        f"{out['backfilled']}, searches ok {out['searches_ok']}; p50 ms adopted / upgraded / backfilled / retired "
        f"(query vectors given): {p50}; R@10 {out['search_adopted']['r_at_10']} -> "
        f"{out['search_retired']['r_at_10']} ({out['seconds']}s)")
    return out


__all__ = ["fingerprint", "run_milvus_in_place", "user_collection"]
