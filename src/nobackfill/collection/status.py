"""A collection's locks, integrity and status: the ingest lock and who holds it, building graph
indexes, :meth:`CollectionStatus.verify`, the items without a source and :meth:`CollectionStatus.status`.
A mixin of :class:`~nobackfill.collection.collection.Collection`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..gallery.atomic_files import _now, pid_alive
from ..ann.backends import AUTO_GRAPH_AT, parse_spec
from ..catalog.catalog import CatalogError, unsourced_sql
from ..catalog.items import CollectionBusyError, CollectionError
from .snapshot import EMPTY
from ..gallery.manifest import MODALITIES
from ..gallery.types import GalleryError

__all__ = ["CollectionStatus"]

INGEST_LOCK = "ingest"  # catalog lock names


class CollectionStatus:
    """Locks, checks and status of a :class:`~nobackfill.collection.collection.Collection`."""

    @contextlib.contextmanager
    def ingesting(self, *, wait: bool = False) -> Iterator[None]:
        """Hold the ingest lock (one ``add`` at a time). Without ``wait``, raise
        :class:`CollectionBusyError` naming the process that holds it."""
        with self.catalog.lock(INGEST_LOCK, blocking=wait) as taken:
            if not taken:
                holder = self.lock_holder(INGEST_LOCK)
                raise CollectionBusyError(f"collection {self.path} is busy: {holder} is adding items; wait for it "
                                          "to finish, or queue behind it (--wait; wait=True in Python)")
            self._record_holder(INGEST_LOCK)
            yield

    def lock_holder(self, name: str) -> str:
        """Who holds lock ``name`` (as its holder recorded)."""
        try:
            info = json.loads(self.catalog.read_doc(f"locks/{name}.holder") or b"")
            host = f" on {info['host']}" if info.get("host") else ""
            if info.get("host") == socket.gethostname() and not pid_alive(int(info["pid"])):
                return "another process"  # (an earlier holder's record: the new one has not written its own yet)
            return f"process {info['pid']}{host} (started {info['since']})"
        except (ValueError, KeyError, TypeError):
            return "another process"

    def _record_holder(self, name: str) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
        with contextlib.suppress(CatalogError):
            self.catalog.write_doc(f"locks/{name}.holder", json.dumps(info).encode())

    def missing_graph_indexes(self) -> list[dict[str, Any]]:
        """The graph indexes an ``auto`` space past its threshold does not answer searches with yet
        (searches of those rows are exact meanwhile): per space and modality, ``space``,
        ``modality``, ``count``, ``graph`` (the factory string), ``in_use`` and ``building``."""
        out: list[dict[str, Any]] = []
        if not isinstance(self.path, Path):  # a Milvus collection: the server indexes its vectors
            return out
        for sid in self.space_ids():
            g = self.gallery(sid)
            if not str(getattr(g, "backend", "")).startswith("auto") or not hasattr(g, "build_index"):
                continue
            g.refresh()
            _, opts = parse_spec(g.backend)
            at, graph = int(opts.get("at", AUTO_GRAPH_AT)), str(opts.get("graph", "HNSW32"))
            info = g.index_info()
            for m in MODALITIES:
                n = g.count(m)
                if n >= at and info.get(m, {}).get("in_use") != graph:
                    out.append({"space": sid, "modality": m, "count": n, "graph": graph,
                                "in_use": info.get(m, {}).get("in_use"), "building": info.get(m, {}).get("building")})
        return out

    def build_graph_indexes(self, log: Callable[[str], None] | None = None,
                            progress: bool = False) -> dict[str, dict[str, Any]]:
        """Build now the graph index of every ``auto`` space past its threshold (or extend its
        cached graph with the rows added since), waiting for it: what ``collection index`` and a
        service's background thread run (an import returns before, its rows searched exactly
        meanwhile). Each index is written to disk whole or not at all (temporary file, rename,
        then its stamp): a build killed at any point is started again by the next one, never
        served half-built. ``progress``: a bar per index. Returns ``{space: index info}`` of the
        spaces it touched."""
        from ..progress import progress_bar

        say = log or (lambda _m: None)
        out: dict[str, dict[str, Any]] = {}
        for todo in self.missing_graph_indexes():
            sid, m = todo["space"], todo["modality"]
            say(f"building the {todo['graph']} index of {todo['count']} {m} vectors in space {sid} (searches stay "
                "exact until it is ready) ...")
            with progress_bar(progress, f"{todo['graph']} index of space {sid[:20]}", todo["count"]) as advance:
                out[sid] = self.gallery(sid).build_index(m, advance)  # or extends the cached graph with the rows added since
        return out

    def verify(self) -> list[str]:
        """Problems found (empty when all is well): the catalog database's own check and its
        invariants, every space's store verified, every served row inside its store. A catalog or
        Milvus server that does not answer raises (``ConnectionError``): it is no damage to repair."""
        try:
            self.refresh()
            problems = self.catalog.check()
            if problems:
                return problems
            self.snapshot()
        except ConnectionError:  # a catalog or Milvus server that does not answer: nothing was checked
            raise
        except (CollectionError, CatalogError, GalleryError) as e:
            return [str(e)]
        for s in self.plan.spaces:
            if s.retired:
                continue
            try:
                g = self.gallery(s.space_id)
                report = g.verify()
            except ConnectionError:
                raise
            except (CollectionError, GalleryError, OSError) as e:
                problems.append(str(e))
                continue
            problems += report.problems
            for m in MODALITIES:
                if not getattr(g, "stable_positions", False):  # slots of rids, not rows (collection/keyed.py)
                    continue
                arr = self._serving.get((s.space_id, m), EMPTY)
                if np.any(arr[g.count(m):]):
                    problems.append(f"{self.catalog}: space {s.space_id} serves {m} rows past the "
                                    f"{g.count(m)} its store holds")
        return problems

    def unsourced_counts(self) -> dict[tuple[str | None, str], int]:
        """``{(serving space or None, modality): n}`` of the live items with no source to embed them
        again from: searchable where their vectors are, never backfilled
        (:func:`~nobackfill.catalog.catalog.unsourced_sql`). One read through their partial index,
        counted here: a condition on ``space`` or a GROUP BY sends SQLite's planner to the index of
        served items, over every row."""
        out: dict[tuple[str | None, str], int] = {}
        for key in self.catalog.query(f"SELECT space, modality FROM items WHERE {unsourced_sql(self.catalog.dialect)}"):
            out[(key[0], key[1])] = out.get((key[0], key[1]), 0) + 1
        return out

    def count_unsourced(self, space_id: str | None = None) -> dict[str, int]:
        """Per modality, the live items without a source (served by ``space_id``, if given)."""
        out: dict[str, int] = {}
        for (space, m), n in self.unsourced_counts().items():
            if space_id is None or space == space_id:
                out[m] = out.get(m, 0) + n
        return out

    def unsourced_ids(self, space_id: str) -> list[str]:
        """Ids of the live items without a source that ``space_id`` serves."""
        sql = f"SELECT id FROM items WHERE {unsourced_sql(self.catalog.dialect)} AND space = ? ORDER BY rid"
        return [r[0] for r in self.catalog.query(sql, (space_id,))]

    def status(self) -> dict[str, Any]:
        """Counts per space and modality, the current space, and what the plan says."""
        st = self.served_counts()
        return self._status_of(st["plan"], st["generation"], st["served"], st["items"],
                               index_info=not getattr(self.storage, "keyed_stores", False))

    def served_counts(self) -> dict[str, Any]:
        """One committed state's ``plan``, ``generation``, ``served`` (``{space: {modality: items it
        serves}}``) and ``items`` (``{modality: live items}``). A storage whose stores serve what the
        catalog says (Milvus: ``keyed_stores``) is counted from the catalog alone, in one read (no
        connection to the vector store); others from the snapshot."""
        if not getattr(self.storage, "keyed_stores", False):
            snap = self.snapshot()
            return {"plan": snap.plan, "generation": snap.generation, "served": snap.counts(),
                    "items": {m: snap.item_count(m) for m in MODALITIES}}
        with self.catalog.reading():
            header = self.catalog.header()
            rows = self.catalog.query("SELECT space, modality, count(*) FROM items WHERE space IS NOT NULL "
                                      "GROUP BY space, modality")
        self._take_header(header)  # what this collection object says next (its plan) is what was counted
        served: dict[str, dict[str, int]] = {sid: {m: 0 for m in MODALITIES} for sid in header["plan"].serving_order()}
        for space, m, n in rows:
            if space in served:
                served[space][m] = int(n)
        return {"plan": header["plan"], "generation": header["generation"], "served": served,
                "items": {m: header[f"n_{m}"] for m in MODALITIES}}

    def _status_of(self, plan: Any, generation: int, counts: dict[str, dict[str, int]], items: dict[str, int],
                   index_info: bool = True) -> dict[str, Any]:
        spaces = {}
        for s in plan.spaces:
            spaces[s.space_id] = {"name": s.name, "model": s.model, "dim": s.dim, "current": s.space_id == plan.current,
                                  "retired": s.retired, "modalities": list(s.modalities),
                                  **counts.get(s.space_id, {m: 0 for m in MODALITIES}),
                                  "imports": [dict(i) for i in s.imports]}
            if not s.retired:
                # a catalog-only status opens the stores of collections adopted in place only (their own index)
                opened = index_info or any(r.get("in_place") for r in s.imports)
                info = getattr(self.gallery(s.space_id), "index_info", None) if opened else None
                spaces[s.space_id]["index"] = info() if info else {}
        served = sum(n for c in counts.values() for n in c.values())
        return {"name": self.name, "path": str(self.storage), "generation": generation,
                "items": items, "catalog": self.catalog.dialect,
                "current": plan.current, "spaces": spaces, "unserved": sum(items.values()) - served,
                "unsourced": sum(self.count_unsourced().values()),
                "backend": self.backend}
