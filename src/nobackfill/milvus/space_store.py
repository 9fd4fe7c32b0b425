""":class:`MilvusSpaceStore`: one embedding space in one Milvus collection of nobackfill's own
(rows discovered by ``seq``, writes, searches at the right consistency level), for
:mod:`nobackfill.milvus`."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from ..gallery.types import DuplicateIdError, SearchResult, SpaceMismatchError, VerifyReport
from .connection import (BOUNDED, CUSTOMIZED, FILTER_IN_MAX, FLUSH_EVERY, FRESH_S, INSERT_ROWS, KEY_MAX, LOOKUP_MAX,
                         MAX_TOPK, SEQ_MARGIN_NS, STRONG, _loaded, alloc_ts, insert_ts, milvus_index_params,
                         raise_if_lost, wait_index_built)


class MilvusSpaceStore:
    """One embedding space in one Milvus collection (the :class:`~nobackfill.storage.base.SpaceStore`
    protocol; see the module doc). Row positions are local: the order in which this reader
    discovered the rows (by ``seq``)."""

    def __init__(self, client: Any, name: str, *, space_id: str, dim: int, model: str, backend: str) -> None:
        self.client, self.name = client, name
        self.space_id, self._dim, self.model, self.backend = space_id, int(dim), model, backend
        self._keys: dict[str, list[str]] = {"image": [], "text": []}
        self._pos: dict[str, dict[str, int]] = {"image": {}, "text": {}}
        self._last_seq = 0
        self._newest_ns = {"image": 0, "text": 0}  # the youngest row's seq this process knows of
        self._lock = threading.RLock()
        self._search_params = milvus_index_params(backend)[1]
        self._loaded = False
        self._unflushed = 0
        self.path = name
        #: the largest insert timestamp this process got from the server, the largest commit
        #: timestamp its catalog named (:meth:`guarantee`), and a server timestamp taken after rows of
        #: unknown timestamp were found on the server: reads wait for the largest (see :meth:`_level`)
        self.write_ts = self._read_ts = self._fence_ts = 0
        self._from_catalog = False  # rows numbered by :meth:`know` (the catalog), not discovered here
        self._pin = threading.local()  # .ts: the read time of this thread's lookups (:meth:`one_read_time`)

    @property
    def dim(self) -> int:
        return self._dim

    # ------------------------------------------------------------------ schema
    @classmethod
    def create(cls, client: Any, name: str, *, space_id: str, dim: int, model: str, backend: str) -> "MilvusSpaceStore":
        from pymilvus import DataType

        if not client.has_collection(name):
            s = client.create_schema(auto_id=False, enable_dynamic_field=False)
            s.add_field("key", DataType.VARCHAR, is_primary=True, max_length=KEY_MAX)
            s.add_field("modality", DataType.VARCHAR, max_length=8)
            s.add_field("seq", DataType.INT64)
            s.add_field("vec", DataType.FLOAT_VECTOR, dim=int(dim))
            idx = client.prepare_index_params()
            index, _ = milvus_index_params(backend)
            idx.add_index(field_name="vec", metric_type="IP", **index)
            client.create_collection(name, schema=s, index_params=idx, consistency_level=STRONG)
            for m in ("image", "text"):
                client.create_partition(name, m)
        return cls(client, name, space_id=space_id, dim=dim, model=model, backend=backend)

    def _ensure_loaded(self) -> None:
        """Load the collection once per process: a collection comes back released after a server
        or milvus-lite restart, and a fresh process finds it so (reads then fail)."""
        if not self._loaded:
            try:
                self.client.load_collection(self.name)
                self._loaded = True
            except Exception:  # the read that follows names the problem (and tries to load again)
                pass

    def _read(self, call: Any) -> Any:
        """``call()`` (a read) on a loaded collection: loaded first, and loaded again if it was
        released meanwhile (a server restart)."""
        self._ensure_loaded()
        return _loaded(self.client, self.name, call)

    # ------------------------------------------------------------------ reading
    def _all(self, fields: Sequence[str], filter: str = "seq >= 0") -> list[dict]:
        def read() -> list[dict]:
            it = self.client.query_iterator(self.name, batch_size=4096, filter=filter, output_fields=list(fields),
                                            consistency_level=STRONG)
            rows: list[dict] = []
            try:
                while True:
                    batch = it.next()
                    if not batch:
                        break
                    rows.extend(batch)
            finally:
                it.close()
            return rows

        return self._read(read)

    #: a reader learns which rows this store serves from the catalog (:meth:`know`), never by
    #: reading the server (an adopted collection, whose owner adds rows, says False)
    keys_from_catalog = True
    #: a search is a round trip to a server: a search of several spaces sends theirs at once
    remote_search = True

    def know(self, modality: str, keys: Sequence[str]) -> None:
        """Number ``keys`` (rows the catalog says this store holds: a commit names vectors only once
        they are stored) without asking the server; with :meth:`guarantee`, how a reader refreshes."""
        with self._lock:
            self._from_catalog = True
            known, order = self._pos[modality], self._keys[modality]
            for k in keys:
                if k not in known:
                    known[k] = len(order)
                    order.append(k)

    def guarantee(self, ts: int) -> None:
        """Reads from now on wait for every write up to hybrid timestamp ``ts`` (the largest commit
        timestamp the catalog holds) and no later one: Milvus' guarantee timestamp."""
        self._read_ts = max(self._read_ts, int(ts))

    def commit_ts(self) -> int:
        """What a commit naming this store's rows records: a timestamp at or after the insert of every
        row this process stored or found on the server (0: unknown)."""
        return max(self.write_ts, self._fence_ts)

    def _level(self, modality: str | None = None) -> dict[str, Any]:
        """The consistency of a read: Strong while rows of unknown timestamp were found less than
        :data:`FRESH_S` ago; else the guarantee timestamp of the newest commit seen or write made
        (the read waits only for what the server has not consumed yet); Strong for a reader that
        numbers rows from a catalog holding no timestamp; Bounded otherwise (rows discovered by
        :meth:`refresh`, older than :data:`FRESH_S`)."""
        newest = max(self._newest_ns.values()) if modality is None else self._newest_ns.get(modality, 0)
        if time.time_ns() - newest < FRESH_S * 1e9:
            return {"consistency_level": STRONG}
        ts = max(self._read_ts, self.write_ts, self._fence_ts)
        if ts:
            return {"consistency_level": CUSTOMIZED, "guarantee_timestamp": ts}
        return {"consistency_level": STRONG if self._from_catalog else BOUNDED}

    def _found_unknown(self, modality: str) -> None:
        """Rows whose insert timestamp is unknown were just found on the server: later reads and
        commits wait for a server timestamp taken now (or stay Strong a while, where none is given)."""
        ts = alloc_ts(self.client)
        if ts:
            self._fence_ts = max(self._fence_ts, ts)
        else:
            self._newest_ns[modality] = time.time_ns()

    def refresh(self) -> bool:
        """Discover rows inserted since the last refresh (by ``seq``, with a margin for clock skew
        between writers and late visibility); True if any was new."""
        with self._lock:
            rows = self._all(["key", "modality", "seq"], f"seq >= {max(0, self._last_seq - SEQ_MARGIN_NS)}")
            changed = False
            for r in sorted(rows, key=lambda r: (r["seq"], r["key"])):
                m = r["modality"]
                if m in self._pos and r["key"] not in self._pos[m]:
                    self._pos[m][r["key"]] = len(self._keys[m])
                    self._keys[m].append(r["key"])
                    changed = True
                self._last_seq = max(self._last_seq, int(r["seq"]))
                if m in self._newest_ns:
                    self._newest_ns[m] = max(self._newest_ns[m], int(r["seq"]))
            return changed

    def ids(self, modality: str) -> list[str]:
        if self._undiscovered():
            self.refresh()
        return list(self._keys[modality])

    def count(self, modality: str) -> int:
        return len(self.ids(modality)) if self._undiscovered() else len(self._keys[modality])

    def _undiscovered(self) -> bool:
        """No row is numbered yet, by the catalog or by a read of the server (a fresh process)."""
        return not self._from_catalog and not self._keys["image"] and not self._keys["text"]

    #: rows are numbered in the order this process discovered them: not shared with other processes,
    #: so a catalog records which space serves an item, not its row here
    stable_positions = False
    #: the metric searches ask for (our own collections are indexed by inner product)
    metric = "IP"

    def positions(self, modality: str, keys: Sequence[str]) -> dict[str, int]:
        """This process's row of each of ``keys`` the server holds (absent keys are left out)."""
        with self._lock:
            if self._undiscovered():
                self.refresh()
            known = self._pos[modality]
            rest = [k for k in keys if k not in known]
            if rest:
                found = False
                for k in sorted(self._existing(modality, rest)):
                    if k not in known:  # on the server but not discovered yet: number it now
                        known[k] = len(self._keys[modality])
                        self._keys[modality].append(k)
                        found = True
                if found:
                    self._found_unknown(modality)
            return {k: known[k] for k in keys if k in known}

    def __contains__(self, item: tuple[str, str]) -> bool:
        modality, key = item
        if key in self._pos.get(modality, {}):
            return True
        return bool(self._existing(modality, [key]))

    def _existing(self, modality: str, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` the server holds for ``modality`` (primary-key lookups that see every write
        acknowledged before the call). Several requests share one server timestamp taken first, so they
        wait for the server's time tick once, not once each (each Strong read waits for its own)."""
        out: set[str] = set()
        level = self._lookup_level(len(keys))
        for s in range(0, len(keys), LOOKUP_MAX):
            out |= self._lookup(modality, keys[s:s + LOOKUP_MAX], level)
        return out

    @contextlib.contextmanager
    def one_read_time(self) -> Iterator[None]:
        """This thread's key lookups inside the block read at one server timestamp taken as it starts
        (as strong as a Strong read then), so they wait for the server's time tick once, not once each
        (a backfill batch looks its keys up per modality, and again as it stores them); a block inside
        another keeps the outer one's."""
        outer = getattr(self._pin, "ts", 0)
        self._pin.ts = outer or alloc_ts(self.client)
        try:
            yield
        finally:
            self._pin.ts = outer

    def _lookup_level(self, n: int) -> dict[str, Any]:
        """The consistency of the lookups of ``n`` keys: at the read time of :meth:`one_read_time`;
        else Strong for one request, and for several one server timestamp taken now (later than every
        acknowledged write: as strong as a Strong read now)."""
        if getattr(self._pin, "ts", 0):
            return {"consistency_level": CUSTOMIZED, "guarantee_timestamp": self._pin.ts}
        if n > LOOKUP_MAX:
            ts = alloc_ts(self.client)
            if ts:
                return {"consistency_level": CUSTOMIZED, "guarantee_timestamp": ts}
        return {"consistency_level": STRONG}

    def _lookup(self, modality: str, keys: Sequence[str], level: dict[str, Any]) -> set[str]:
        """Which of ``keys`` (at most :data:`LOOKUP_MAX`) the server holds, read at ``level``."""
        batch = list(keys)
        rows = self._read(lambda: self.client.get(self.name, ids=batch, output_fields=["key"],
                                                  partition_names=[modality], **level))
        return {r["key"] for r in rows}

    def get_vectors(self, modality: str, keys: Sequence[str]) -> np.ndarray:
        """The vectors of ``keys`` (in that order; every key must exist)."""
        found: dict[str, list[float]] = {}
        for s in range(0, len(keys), LOOKUP_MAX):
            batch = list(keys[s:s + LOOKUP_MAX])
            for r in self._read(lambda: self.client.get(self.name, ids=batch, output_fields=["key", "vec"],
                                                        **self._level())):
                found[r["key"]] = r["vec"]
        missing = [k for k in keys if k not in found]
        if missing:
            raise KeyError(f"{self.name}: no rows for {missing[:3]}")
        return np.asarray([found[k] for k in keys], np.float32).reshape(len(keys), self._dim)

    def vectors(self, modality: str) -> np.ndarray:
        """All vectors of ``modality`` in local row order (reads the whole space)."""
        keys = self.ids(modality)
        return self.get_vectors(modality, keys) if keys else np.zeros((0, self._dim), np.float32)

    # ------------------------------------------------------------------ writing
    def add(self, modality: str, ids: Sequence[str], vectors: np.ndarray, metadata: Any = None, *, space_id: str,
            skip_existing: bool = False) -> int:
        if space_id != self.space_id:
            raise SpaceMismatchError(self.space_id, space_id, f"add {modality} vectors to {self.name}", what="vectors",
                                     hint="a space's store holds one embedding space")
        ids = [str(i) for i in ids]
        vecs = np.asarray(vectors, np.float32)
        if vecs.ndim != 2 or vecs.shape != (len(ids), self._dim):
            raise ValueError(f"vectors must have shape ({len(ids)}, {self._dim}) for {self.name}, got {vecs.shape}")
        if not np.isfinite(vecs).all():
            raise ValueError("vectors contain NaN or infinite values")
        if len(set(ids)) != len(ids):
            raise DuplicateIdError(f"ids repeated within one batch for {self.name}")
        if not ids:
            return 0
        base = time.time_ns()
        if skip_existing and len(ids) > LOOKUP_MAX:
            keys, stamps = self._insert_new(modality, ids, vecs, base)
        else:  # every key looked up before anything is stored: a duplicate refuses the whole call
            present = self._existing(modality, ids)
            if present and not skip_existing:
                raise DuplicateIdError(f"{len(present)} {modality} ids already in {self.name}: {sorted(present)[:5]}")
            keep = [i for i, k in enumerate(ids) if k not in present]
            keys = [ids[i] for i in keep]
            kept = vecs if len(keep) == len(ids) else vecs[keep]
            stamps = [self._insert(modality, keys[s:s + INSERT_ROWS], kept[s:s + INSERT_ROWS], base + s)
                      for s in range(0, len(keys), INSERT_ROWS)]
        if not keys:
            return 0
        ts = max(stamps) if all(stamps) else 0  # one of them unknown: unknown
        with self._lock:  # our own rows are known at once; other writers' by refresh()
            known, order = self._pos[modality], self._keys[modality]
            for k in keys:
                if k not in known:
                    known[k] = len(order)
                    order.append(k)
            self._unflushed += len(keys)
            if ts:
                self.write_ts = max(self.write_ts, ts)
            else:  # searches stay Strong a while
                self._newest_ns[modality] = max(self._newest_ns[modality], base + len(keys) - 1)
            seal = self._unflushed >= FLUSH_EVERY
            if seal:
                self._unflushed = 0
        if seal:  # sealed by the server meanwhile: the writer does not wait for it
            threading.Thread(target=self._seal, name="milvus-seal", daemon=True).start()
        return len(keys)

    def _insert(self, modality: str, keys: Sequence[str], vecs: np.ndarray, seq0: int) -> int:
        """One insert request of ``keys`` (their ``seq`` from ``seq0``); the server's timestamp of it."""
        return insert_ts(self.client, self.name, {"key": list(keys), "modality": [modality] * len(keys),
                                                  "seq": list(range(seq0, seq0 + len(keys))), "vec": vecs.tolist()},
                         modality)

    def _insert_new(self, modality: str, ids: list[str], vecs: np.ndarray, seq0: int) -> tuple[list[str], list[int]]:
        """Store the rows of ``ids`` the server does not hold yet, :data:`LOOKUP_MAX` at a time: the
        lookups of the next part run in a thread (waiting on the server) while this one converts and
        inserts the part before (its own work), all at one server timestamp taken first. Returns the
        keys stored and the insert timestamps."""
        from concurrent.futures import ThreadPoolExecutor

        parts = [(s, ids[s:s + LOOKUP_MAX]) for s in range(0, len(ids), LOOKUP_MAX)]
        level = self._lookup_level(len(ids))
        stored: list[str] = []
        stamps: list[int] = []
        with ThreadPoolExecutor(1, thread_name_prefix="milvus-lookup") as pool:
            found = [pool.submit(self._lookup, modality, part, level) for _, part in parts]
            for (s, part), fut in zip(parts, found):
                present = fut.result()
                keep = [i for i, k in enumerate(part) if k not in present]
                if not keep:
                    continue
                keys = [part[i] for i in keep]
                rows = vecs[s:s + len(part)]
                stamps.append(self._insert(modality, keys, rows if len(keep) == len(part) else rows[keep],
                                           seq0 + s))
                stored += keys
        return stored, stamps

    def _seal(self) -> None:
        with contextlib.suppress(Exception):  # a later flush or wait_indexed() seals them anyway
            self.client.flush(self.name)

    def flush(self) -> None:
        """Seal the rows inserted so far into indexed segments (Milvus builds their index)."""
        self.client.flush(self.name)
        self._unflushed = 0

    def wait_indexed(self, timeout_s: float = 900.0, poll_s: float = 0.2) -> dict:
        """Flush, wait until Milvus has built the index of every sealed row, and have the server load
        those segments (until then it answers from growing segments and their interim index: a
        recall@10 of 0.42 against 0.98 measured on 20k random vectors). Returns the index's
        description; raises TimeoutError naming the collection."""
        self.flush()
        deadline = time.monotonic() + timeout_s
        desc = wait_index_built(self.client, self.name, deadline, timeout_s, poll_s)
        if not getattr(self.client, "_nobackfill_embedded", False) and desc.get("index_type") != "FLAT":
            with contextlib.suppress(Exception):  # a server: load the sealed, indexed segments now
                self.client.refresh_load(self.name, timeout=max(1.0, deadline - time.monotonic()))
        return desc

    # ------------------------------------------------------------------ search
    def search(self, modality: str, queries: np.ndarray, k: int = 10, *, space_id: str,
               mask: np.ndarray | None = None) -> SearchResult:
        """Top ``k`` rows of ``modality`` among the allowed ones (``mask`` over local row order):
        filtered on the keys when they are few, else over-fetched and filtered here (deeper until
        ``k`` allowed rows are found). Scores are inner products (cosine for unit vectors)."""
        if space_id != self.space_id:
            raise SpaceMismatchError(self.space_id, space_id, f"search {self.name}", what="queries",
                                     hint="embed them with the space's model")
        q = np.asarray(queries, np.float32)
        if q.ndim == 1:
            q = q[None]
        if q.ndim != 2 or q.shape[1] != self._dim:
            raise ValueError(f"queries must have shape (N, {self._dim}) for {self.name}, got {q.shape}")
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self._undiscovered():
            self.refresh()  # a fresh process: discover the rows first
        keys = self._keys[modality]
        if mask is None:
            allowed = np.ones(len(keys), bool)
        else:
            mask = np.asarray(mask, bool)
            allowed = np.zeros(len(keys), bool)
            allowed[:min(len(mask), len(keys))] = mask[:len(keys)]
        n_allowed = int(allowed.sum())
        kk = min(int(k), n_allowed)
        if kk == 0 or len(q) == 0:
            return SearchResult(np.zeros((len(q), kk), np.float32), [[] for _ in q], np.zeros((len(q), kk), np.int64))
        params = {"metric_type": self.metric, "params": dict(self._search_params)}
        pos = self._pos[modality]
        if n_allowed <= FILTER_IN_MAX and n_allowed < len(keys):
            allowed_keys = [keys[i] for i in np.flatnonzero(allowed)]
            hits = self._search(q, kk, modality, params, self._in_filter(allowed_keys))
            rows = [self._take(h, kk, pos, allowed) for h in hits]
        else:
            # over-fetch by the allowed share (a filter keeping a tenth asks ~15k hits for k: one round trip)
            share = n_allowed / max(1, len(keys))
            rows, limit = [None] * len(q), min(MAX_TOPK, kk if n_allowed == len(keys) else max(kk * 2, 16,
                                                                                               int(1.5 * kk / share)))
            todo = list(range(len(q)))
            while todo:
                hits = self._search(q[todo], limit, modality, params)
                nxt = []
                for qi, h in zip(todo, hits):
                    got = self._take(h, kk, pos, allowed)
                    if len(got) >= kk or limit >= min(MAX_TOPK, len(keys)):
                        rows[qi] = got
                    else:
                        nxt.append(qi)
                todo, limit = nxt, min(MAX_TOPK, limit * 4)
        short = [i for i, r in enumerate(rows) if len(r) < kk]
        for i in short:  # the index could not reach kk allowed rows: answer exactly
            rows[i] = self._exact(q[i], kk, [keys[j] for j in np.flatnonzero(allowed)], pos)
        scores = np.array([[s for s, _ in r] for r in rows], np.float32).reshape(len(q), kk)
        positions = np.array([[p for _, p in r] for r in rows], np.int64).reshape(len(q), kk)
        return SearchResult(scores, [[keys[p] for p in row] for row in positions], positions)

    def _in_filter(self, keys: Sequence[str]) -> str:
        """A filter expression true for the rows of ``keys``."""
        return f"key in {json.dumps(list(keys))}"

    def _search(self, q: np.ndarray, limit: int, modality: str, params: dict, expr: str = "") -> list[list[dict]]:
        if "ef" in params["params"]:  # HNSW needs ef >= the number of results asked for
            params = {**params, "params": {**params["params"], "ef": max(params["params"]["ef"], int(limit))}}
        return self._read(lambda: self.client.search(
            self.name, data=q.tolist(), filter=expr, limit=int(limit), anns_field="vec", output_fields=["key"],
            search_params=params, partition_names=[modality], **self._level(modality)))

    @staticmethod
    def _hit_key(hit: dict) -> str:
        """The store key of one Milvus hit."""
        return hit.get("entity", {}).get("key", hit.get("id"))

    def _take(self, hits: list[dict], k: int, pos: dict[str, int], allowed: np.ndarray) -> list[tuple[float, int]]:
        """Up to ``k`` ``(score, row)`` of ``hits`` whose rows ``allowed`` admits, each key once."""
        out, seen = [], set()
        for h in hits:
            key = self._hit_key(h)
            p = pos.get(key)
            if p is None or p >= len(allowed) or not allowed[p] or key in seen:
                continue
            seen.add(key)
            out.append((float(h["distance"]), p))
            if len(out) == k:
                break
        return out

    def _exact(self, q: np.ndarray, k: int, keys: list[str], pos: dict[str, int]) -> list[tuple[float, int]]:
        vecs = self.get_vectors("", keys)
        s = vecs @ q
        top = np.argsort(-s, kind="stable")[:k]
        return [(float(s[i]), pos[keys[i]]) for i in top]

    # ------------------------------------------------------------------ integrity
    def verify(self) -> VerifyReport:
        report = VerifyReport()
        try:
            self.refresh()
            rows = self._all(["key", "modality"])
        except Exception as e:  # the server's own error, named; a server that does not answer is no damage
            raise_if_lost(e)
            report.problems.append(f"{self.name}: cannot read ({type(e).__name__}: {e})")
            return report
        keys = [r["key"] for r in rows]
        if len(set(keys)) != len(keys):
            report.problems.append(f"{self.name}: {len(keys) - len(set(keys))} duplicated keys")
        bad = [r for r in rows if r["modality"] not in ("image", "text")]
        if bad:
            report.problems.append(f"{self.name}: {len(bad)} rows of unknown modality")
        report.checked_chunks = len(keys)
        return report

    def close(self) -> None:
        """Forget what this process discovered (the next read discovers the rows and loads again)."""
        with self._lock:
            self._keys = {"image": [], "text": []}
            self._pos = {"image": {}, "text": {}}
            self._last_seq = 0
            self._loaded = False
            self._from_catalog = False
