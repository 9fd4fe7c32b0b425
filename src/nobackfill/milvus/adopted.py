"""A user's own Milvus collection adopted in place, read only (:class:`MilvusAdoptedStore`), and
the checks that it can be (:func:`describe_adoptable`), for :mod:`nobackfill.milvus`."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Sequence

import numpy as np

from ..gallery.types import VerifyReport
from .connection import BOUNDED, FILTER_IN_MAX, FRESH_S, STRONG, raise_if_lost
from .space_store import MilvusSpaceStore


#: metrics of a user's index that an adopted collection may have: scores are then cosines (COSINE)
#: or inner products of unit vectors (IP), comparable with every other space's
ADOPTABLE_METRICS = ("COSINE", "IP")
#: an adopted collection's row count is asked again at most this often (seconds); rows its owner
#: added meanwhile are discovered then
ADOPTED_RECHECK_S = 5.0
#: how far from 1 the norm of a vector in a collection indexed by IP may be (a sample is checked)
UNIT_TOLERANCE = 1e-3
ADOPTED_ID_TYPES = ("INT64", "VARCHAR")


def _type_name(t: Any) -> str:
    """``INT64`` for ``DataType.INT64`` (or a number / string a server sent)."""
    name = getattr(t, "name", None)
    if name:
        return str(name)
    with contextlib.suppress(Exception):
        from pymilvus import DataType

        return DataType(int(t)).name
    return str(t)


def _index_on(client: Any, name: str, field: str) -> dict[str, Any] | None:
    """The description of the index on ``field`` of collection ``name`` (None: there is none)."""
    for idx in client.list_indexes(name) or []:
        desc = client.describe_index(name, idx) or {}
        if desc.get("field_name", field) == field:
            return dict(desc)
    return None


def adopted_search_params(index: dict[str, Any], override: dict[str, Any] | None = None) -> dict[str, Any]:
    """Search parameters for a user's index as it is (``override``: the user's own, used as given):
    HNSW ``ef`` 128 (at least the number of results asked for), IVF ``nprobe`` 32 (at most its
    ``nlist``), DiskANN ``search_list`` 128; none for FLAT, AUTOINDEX and the others."""
    if override:
        return dict(override)
    kind = str(index.get("index_type", "")).upper()
    params = index.get("params") if isinstance(index.get("params"), dict) else index
    if kind == "HNSW":
        return {"ef": 128}
    if kind.startswith(("IVF", "GPU_IVF", "SCANN")):
        try:
            nlist = int(params.get("nlist"))
        except (TypeError, ValueError):
            nlist = 0
        return {"nprobe": min(32, nlist) if nlist > 0 else 32}
    if kind == "DISKANN":
        return {"search_list": 128}
    return {}


def describe_adoptable(client: Any, external: dict[str, Any], dim: int, model: str) -> dict[str, Any]:
    """Check that the user's collection ``external["collection"]`` can be adopted as the store of a
    space of ``dim``-d vectors made by ``model`` and return what reading it needs: ``id_type``
    (INT64 / VARCHAR), ``metric`` and ``index`` (the description of the user's index on the vector
    field). ``ValueError`` naming what does not fit otherwise."""
    name = external["collection"]
    if not client.has_collection(name):
        others = sorted(c for c in client.list_collections() if not c.startswith("nb_"))
        raise FileNotFoundError(f"no Milvus collection {name!r} to adopt (collections there: "
                                f"{', '.join(others[:10]) or 'none'})")
    desc = client.describe_collection(name)
    fields = {f["name"]: f for f in desc.get("fields", [])}
    listed = ", ".join(fields)

    def field(key: str, what: str) -> dict[str, Any]:
        fname = external.get(key)
        if not fname:
            raise ValueError(f"adopting Milvus collection {name!r}: name the field that holds {what} ({key})")
        if fname not in fields:
            raise ValueError(f"Milvus collection {name!r} has no field {fname!r} to read {what} from (its fields: "
                             f"{listed})")
        return fields[fname]

    idf = field("id_field", "the ids")
    if not idf.get("is_primary"):
        prim = next((f for f, d in fields.items() if d.get("is_primary")), "?")
        raise ValueError(f"field {idf['name']!r} of Milvus collection {name!r} is not its primary key ({prim!r} is): "
                         "items are looked up by primary key, so name that as the id field")
    id_type = _type_name(idf.get("type"))
    if id_type not in ADOPTED_ID_TYPES:
        raise ValueError(f"Milvus collection {name!r}: primary key {idf['name']!r} is {id_type}; only INT64 and "
                         "VARCHAR keys can be adopted")
    vf = field("vector_field", "the vectors")
    vtype = _type_name(vf.get("type"))
    if vtype != "FLOAT_VECTOR":
        raise ValueError(f"field {vf['name']!r} of Milvus collection {name!r} holds {vtype}, not FLOAT_VECTOR: only "
                         "float32 vectors can be adopted in place")
    width = int((vf.get("params") or {}).get("dim", 0))
    if width != int(dim):
        raise ValueError(f"Milvus collection {name!r} holds {width}-d vectors in {vf['name']!r} but {model} embeds "
                         f"{int(dim)}-d vectors: these vectors were not made by {model}")
    if external.get("source_field"):
        sf = field("source_field", "the sources (image paths or caption texts)")
        stype = _type_name(sf.get("type"))
        if stype != "VARCHAR":
            raise ValueError(f"field {sf['name']!r} of Milvus collection {name!r} is {stype}: a source field holds "
                             "the image path or the caption text of each row (VARCHAR)")
    modality = external.get("modality")
    if modality not in ("image", "text"):
        raise ValueError(f"adopting Milvus collection {name!r}: modality must be 'image' or 'text', got {modality!r}")
    index = _index_on(client, name, vf["name"])
    if index is None:
        raise ValueError(f"Milvus collection {name!r} has no index on {vf['name']!r}: nobackfill searches the index "
                         "you built and never builds one in your collection; create one (metric COSINE or IP) first")
    metric = str(index.get("metric_type", "")).upper()
    if metric not in ADOPTABLE_METRICS:
        raise ValueError(f"Milvus collection {name!r} is indexed with metric {metric or '?'} on {vf['name']!r} "
                         f"({index.get('index_type', '?')} index): nobackfill scores by cosine and searches your index "
                         "as it is (it never rebuilds it), so it adopts collections indexed with metric COSINE or IP "
                         "only")
    return {"id_type": id_type, "metric": metric, "index": index}


class MilvusAdoptedStore(MilvusSpaceStore):
    """A Milvus collection the user already has (their schema, their index), adopted in place as
    the store of one space: read only. Rows are the user's, keyed by their primary key as a string,
    all of one modality (``external["modality"]``); searches use the user's index as it is, with
    its metric (COSINE, or IP over unit vectors: scores are cosines either way). Nothing is ever
    inserted, deleted, flushed, re-indexed or dropped; the collection is loaded when a read finds
    it released (Milvus searches only loaded collections). Rows are numbered per process, in the
    order this process discovered them (``stable_positions`` False); rows the owner adds later are
    discovered when the row count changes (asked at most every :data:`ADOPTED_RECHECK_S`)."""

    keys_from_catalog = False  # the owner adds rows the catalog does not name: discovered by refresh()


    read_only = True

    def __init__(self, client: Any, name: str, *, space_id: str, dim: int, model: str, backend: str,
                 external: dict[str, Any]) -> None:
        super().__init__(client, name, space_id=space_id, dim=dim, model=model, backend=backend)
        self.external = dict(external)
        info = describe_adoptable(client, self.external, dim, model)
        self.id_field = str(self.external["id_field"])
        self.vector_field = str(self.external["vector_field"])
        self.source_field = self.external.get("source_field") or None
        self.modality = str(self.external["modality"])
        self.int_ids = info["id_type"] == "INT64"
        self.metric = info["metric"]
        self.index = info["index"]
        self._search_params = adopted_search_params(self.index, self.external.get("search_params"))
        self._scanned = False
        self._count_at = 0.0
        self._server_rows = 0  # rows the last scan found

    # ------------------------------------------------------------------ keys
    def _ids(self, keys: Sequence[str]) -> list[Any]:
        """The primary keys of ``keys`` (strings); keys that cannot be one of ours are left out."""
        if not self.int_ids:
            return [k for k in keys if isinstance(k, str) and k]
        out = []
        for k in keys:
            try:
                v = int(k)
            except (TypeError, ValueError):
                continue
            if str(v) == k:
                out.append(v)
        return out

    def _in_filter(self, keys: Sequence[str]) -> str:
        ids = self._ids(keys)
        return f"{self.id_field} in {json.dumps(ids)}"

    def _row_count(self, level: str) -> int:
        rows = self._read(lambda: self.client.query(self.name, filter="", output_fields=["count(*)"],
                                                    consistency_level=level))
        return int(rows[0]["count(*)"]) if rows else 0

    def _scan(self) -> list[str]:
        """Every primary key of the collection, as strings (the ids only: no vectors are read)."""

        def read() -> list[str]:
            it = self.client.query_iterator(self.name, batch_size=16384, filter="", output_fields=[self.id_field],
                                            consistency_level=STRONG)
            out: list[str] = []
            try:
                while True:
                    batch = it.next()
                    if not batch:
                        break
                    out.extend(str(r[self.id_field]) for r in batch)
            finally:
                it.close()
            return out

        return self._read(read)

    def refresh(self) -> bool:
        """Discover the collection's rows (all of them the first time; again when its row count
        changed, asked at most every :data:`ADOPTED_RECHECK_S`); True if any was new."""
        with self._lock:
            now = time.monotonic()
            if self._scanned:
                if now - self._count_at < ADOPTED_RECHECK_S:
                    return False
                self._count_at = now
                if self._row_count(BOUNDED) == self._server_rows:
                    return False
            keys = self._scan()
            self._scanned, self._count_at, self._server_rows = True, time.monotonic(), len(keys)
            m = self.modality
            known, order = self._pos[m], self._keys[m]
            changed = False
            for k in keys:
                if k not in known:
                    known[k] = len(order)
                    order.append(k)
                    changed = True
            if changed:  # searches are Strong while rows this process just discovered may be unseen
                self._newest_ns[m] = time.time_ns()
            return changed

    def _existing(self, modality: str, keys: Sequence[str]) -> set[str]:
        if modality != self.modality:
            return set()
        out: set[str] = set()
        ids = self._ids(keys)
        for s in range(0, len(ids), FILTER_IN_MAX):
            batch = ids[s:s + FILTER_IN_MAX]
            rows = self._read(lambda: self.client.get(self.name, ids=batch, output_fields=[self.id_field],
                                                      consistency_level=STRONG))
            out.update(str(r[self.id_field]) for r in rows)
        return out

    def _fetch(self, keys: Sequence[str]) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        ids = self._ids(keys)
        for s in range(0, len(ids), FILTER_IN_MAX):
            batch = ids[s:s + FILTER_IN_MAX]
            for r in self._read(lambda: self.client.get(self.name, ids=batch,
                                                        output_fields=[self.id_field, self.vector_field],
                                                        consistency_level=STRONG)):
                found[str(r[self.id_field])] = r[self.vector_field]
        return found

    def get_vectors(self, modality: str, keys: Sequence[str]) -> np.ndarray:
        """The user's vectors of ``keys`` (in that order; every key must exist), as stored."""
        found = self._fetch(keys)
        missing = [k for k in keys if k not in found]
        if missing:
            raise KeyError(f"{self.name}: no rows for {missing[:3]}")
        return np.asarray([found[k] for k in keys], np.float32).reshape(len(keys), self._dim)

    # ------------------------------------------------------------------ never written
    def add(self, modality: str, ids: Sequence[str], vectors: np.ndarray, metadata: Any = None, *, space_id: str,
            skip_existing: bool = False) -> int:
        raise PermissionError(f"space {self.space_id} is the Milvus collection {self.name!r}, adopted in place: "
                              "nobackfill never writes to a user's collection; items are added to a space of "
                              "nobackfill's own (upgrade the collection to a new model first)")

    def flush(self) -> None:
        """Nothing: the user's collection is never flushed by nobackfill."""

    def wait_indexed(self, timeout_s: float = 900.0, poll_s: float = 0.2) -> dict:
        """The user's index as it is (nothing is flushed or built)."""
        return dict(_index_on(self.client, self.name, self.vector_field) or {})

    def index_info(self) -> dict[str, dict[str, Any]]:
        return {self.modality: {"in_use": str(self.index.get("index_type", "")), "metric": self.metric,
                                "adopted": self.name, "search_params": dict(self._search_params)}}

    # ------------------------------------------------------------------ search
    def _search(self, q: np.ndarray, limit: int, modality: str, params: dict, expr: str = "") -> list[list[dict]]:
        p = dict(params["params"])
        if "ef" in p:  # HNSW needs ef >= the number of results asked for
            p["ef"] = max(int(p["ef"]), int(limit))
        if "search_list" in p:
            p["search_list"] = max(int(p["search_list"]), int(limit))
        fresh = time.time_ns() - self._newest_ns[modality] < FRESH_S * 1e9
        return self._read(lambda: self.client.search(
            self.name, data=q.tolist(), filter=expr, limit=int(limit), anns_field=self.vector_field,
            output_fields=[self.id_field], search_params={"metric_type": self.metric, "params": p},
            consistency_level=STRONG if fresh else BOUNDED))

    def _hit_key(self, hit: dict) -> str:  # type: ignore[override]
        """The user's primary key of one hit, as a string (the catalog's key)."""
        ent = hit.get("entity") or {}
        return str(ent.get(self.id_field, hit.get(self.id_field, hit.get("id"))))

    def _exact(self, q: np.ndarray, k: int, keys: list[str], pos: dict[str, int]) -> list[tuple[float, int]]:
        found = self._fetch(keys)
        keys = [key for key in keys if key in found]  # rows the owner deleted are gone
        if not keys:
            return []
        vecs = np.asarray([found[key] for key in keys], np.float32).reshape(len(keys), self._dim)
        if self.metric == "COSINE":
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        s = vecs @ np.asarray(q, np.float32)
        top = np.argsort(-s, kind="stable")[:k]
        return [(float(s[i]), pos[keys[i]]) for i in top]

    # ------------------------------------------------------------------ integrity
    def check_unit_length(self, n: int = 64) -> None:
        """With metric IP, a sample of ``n`` vectors must be unit length (their inner products are
        then cosines); ``ValueError`` otherwise. Nothing to check for COSINE."""
        if self.metric != "IP":
            return
        rows = self._read(lambda: self.client.query(self.name, filter="", limit=int(n),
                                                    output_fields=[self.id_field, self.vector_field],
                                                    consistency_level=STRONG))
        if not rows:
            return
        norms = np.linalg.norm(np.asarray([r[self.vector_field] for r in rows], np.float32), axis=1)
        off = np.abs(norms - 1.0) > UNIT_TOLERANCE
        if off.any():
            raise ValueError(f"Milvus collection {self.name!r} is indexed with metric IP but {int(off.sum())} of "
                             f"{len(rows)} sampled vectors are not unit length (norms {norms.min():.3g} to "
                             f"{norms.max():.3g}): its inner products are not cosines and would not compare with "
                             "other spaces' scores; index it with metric COSINE (or store unit vectors) to adopt it")

    def verify(self) -> VerifyReport:
        report = VerifyReport()
        try:
            describe_adoptable(self.client, self.external, self._dim, self.model)
            self.refresh()
            report.checked_chunks = self._row_count(STRONG)
        except Exception as e:  # the server's own error, named; a server that does not answer is no damage
            raise_if_lost(e)
            report.problems.append(f"{self.name} (adopted Milvus collection): {type(e).__name__}: {e}")
        return report

    def close(self) -> None:
        with self._lock:
            super().close()
            self._scanned = False
            self._server_rows = 0
