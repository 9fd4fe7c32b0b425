"""A Milvus collection adopted in place: :func:`adopt_milvus`.

A user's own Milvus collection (their schema: a primary key, a float-vector field, optionally a
field with each row's image path or caption text; any index they built, with metric COSINE or IP)
becomes the store of the old space of a nobackfill collection in the same Milvus (server or
milvus-lite file) without copying a vector. nobackfill never writes to it and never drops it
(retiring its space forgets the registration only); its own state is its catalog (SQLite beside a
milvus-lite file, PostgreSQL for a server) and its own ``nb_<NAME>_*`` collections.

Steps: the user's collection is checked (fields, width, metric: :func:`~.milvus.describe_adoptable`);
unless ``trust_model``, the model check re-embeds a random sample of rows whose source is readable
with the declared model and compares with the stored vectors (:func:`~.model_check.check_model`;
:class:`~.importing.ModelCheckRefused` and nothing created when it refuses); the collection is
created with the user's collection as its space's store (:meth:`Collection.create` with
``adopt=``); then the user's rows are paged through (ids and sources only, never a vector) and
committed as catalog items: id and vector key ``str(primary key)``, source ``{"path": ...}`` for an
image, ``{"text": ...}`` for a caption, ``{}`` when the row has none (searchable, never
backfilled). The plan records the import (``"in_place": True``). Killed at any point, the same call
again finishes the job: rows already in the catalog are left unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from ..progress import progress_bar
from ..collection.collection import Collection, is_collection, row_json
from .importing import ModelCheckRefused
from ..catalog.items import id_problem
from .model_check import DEFAULT_SAMPLES, DEFAULT_THRESHOLD, Sample, check_model, skipped_check
from .sources.items import source_metadata
from ..collection.uri import parse_uri
from ..gallery.manifest import MODALITIES
from ..gallery.types import SpaceMismatchError

if TYPE_CHECKING:  # the encoder module pulls in torch
    from ..encoders.base import DualEncoder

__all__ = ["adopt_milvus"]

STRONG = "Strong"


def _target(uri: str, what: str) -> tuple[str, dict[str, str]]:
    kind, parts = parse_uri(uri)
    if kind not in ("milvus", "milvus-lite"):
        raise ValueError(f"{what} {uri}: a Milvus collection is adopted in place, by a nobackfill collection in the "
                         "same Milvus: milvus://HOST:PORT[/DB]#NAME?catalog=postgresql://... or milvus-lite:PATH#NAME")
    return kind, parts


def _same_milvus(a: tuple[str, dict[str, str]], b: tuple[str, dict[str, str]]) -> bool:
    (ka, pa), (kb, pb) = a, b
    if ka != kb:
        return False
    if ka == "milvus-lite":
        return os.path.realpath(pa["path"]) == os.path.realpath(pb["path"])
    return pa["uri"].lower() == pb["uri"].lower() and pa.get("db", "default") == pb.get("db", "default")


def _source_json(modality: str, value: Any, images_root: str | None) -> dict[str, Any]:
    """An item's source from the value of the user's source field (``{}``: none)."""
    text = "" if value is None else str(value)
    if not text.strip():
        return {}
    if modality == "text":
        return {"text": text}
    if "://" in text:  # a url: searchable, not embeddable again
        return {"path": "", "url": text}
    path = text if os.path.isabs(text) or not images_root else os.path.join(images_root, text)
    return {"path": os.path.abspath(path)}


def _payload(modality: str, source: dict[str, Any]) -> str:
    """What a sampled row is embedded from, or "" when its source cannot be read."""
    if modality == "image":
        path = source.get("path") or ""
        return path if path and os.path.isfile(path) and os.access(path, os.R_OK) else ""
    return str(source.get("text") or "")


def _pages(client: Any, name: str, fields: list[str], batch_rows: int):
    """The user's rows, ``batch_rows`` at a time (only ``fields``: never the vectors). A released
    collection is loaded first, as its store does (milvus-lite forgets the load in each new process:
    trial AH saw every fresh adoption with the model check end in pymilvus' traceback)."""
    from ..milvus.connection import _loaded

    it = _loaded(client, name, lambda: client.query_iterator(name, batch_size=int(batch_rows), filter="",
                                                             output_fields=fields, consistency_level=STRONG))
    try:
        while True:
            batch = it.next()
            if not batch:
                return
            yield batch
    finally:
        with contextlib.suppress(Exception):
            it.close()


def _sample(client: Any, ext: dict[str, Any], n: int, seed: int, batch_rows: int,
            images_root: str | None) -> tuple[list[Sample], int]:
    """Up to ``n`` random rows whose source is readable, with their stored vectors (a reservoir of
    candidates with a source, drawn in one pass over ids and sources, then checked for readability
    in random order), and the number of rows read."""
    name, idf, sf, modality = ext["collection"], ext["id_field"], ext["source_field"], ext["modality"]
    rng = np.random.default_rng(seed)
    cap = max(8 * int(n), 512)
    reservoir: list[tuple[Any, dict[str, Any]]] = []
    seen = rows = 0
    for batch in _pages(client, name, [idf, sf], batch_rows):
        rows += len(batch)
        for r in batch:
            src = _source_json(modality, r.get(sf), images_root)
            if not src or not (src.get("path") or src.get("text")):
                continue
            seen += 1
            if len(reservoir) < cap:
                reservoir.append((r[idf], src))
            else:
                j = int(rng.integers(0, seen))
                if j < cap:
                    reservoir[j] = (r[idf], src)
    picked: list[tuple[Any, str]] = []
    for i in rng.permutation(len(reservoir)):
        pk, src = reservoir[int(i)]
        payload = _payload(modality, src)
        if payload:
            picked.append((pk, payload))
            if len(picked) >= n:
                break
    if not picked:
        return [], rows
    vecs: dict[Any, Any] = {}
    for s in range(0, len(picked), 1000):
        ids = [pk for pk, _ in picked[s:s + 1000]]
        for r in client.get(name, ids=ids, output_fields=[idf, ext["vector_field"]], consistency_level=STRONG):
            vecs[r[idf]] = r[ext["vector_field"]]
    out = [Sample(modality, payload, np.asarray(vecs[pk], np.float32), -1, str(pk))
           for pk, payload in picked if pk in vecs]
    return out, rows


def adopt_milvus(collection_uri: str, source_uri: str, encoder: "DualEncoder", *, model: str, vector_field: str,
                 id_field: str, source_field: str | None = None, modality: str, trust_model: bool = False,
                 samples: int = DEFAULT_SAMPLES, batch_rows: int = 10000, progress: bool = False,
                 images_root: str | None = None, threshold: float = DEFAULT_THRESHOLD, seed: int = 0,
                 backend: str = "auto", search_params: dict[str, Any] | None = None,
                 wait: bool = False) -> dict[str, Any]:
    """Adopt the user's Milvus collection ``source_uri`` (``milvus://HOST:PORT[/DB]#COLLECTION`` or
    ``milvus-lite:PATH#COLLECTION``) in place as the space of ``encoder`` (declared as ``model``) of
    the nobackfill collection ``collection_uri`` (created, or resumed when it exists; it must be in
    the same Milvus). ``vector_field`` / ``id_field`` (its primary key) / ``source_field`` (image
    path or caption text; relative image paths are resolved against ``images_root``, else the
    current directory) name the user's fields; every row is an item of ``modality``.
    ``search_params``: the parameters searches pass to the user's index (default: see
    :func:`~.milvus.adopted_search_params`). See the module doc; returns a report (JSON-able).

    Raises ``ValueError`` (a width, field or metric that does not fit, another Milvus, ...) or
    :class:`~.importing.ModelCheckRefused`; in both cases nothing was created or committed."""
    from ..milvus import MilvusAdoptedStore, _client, _safe, describe_adoptable

    t0 = time.perf_counter()
    target = _target(collection_uri, "collection")
    src = _target(source_uri, "source")
    if "catalog" in src[1]:
        raise ValueError(f"source {source_uri}: name the user's collection only (milvus://HOST:PORT#COLLECTION), "
                         "without ?catalog=")
    if "#" not in str(source_uri) or not src[1]["name"]:
        raise ValueError(f"source {source_uri}: name the Milvus collection to adopt after '#' "
                         "(milvus://HOST:PORT#COLLECTION or milvus-lite:PATH#COLLECTION)")
    if not _same_milvus(target, src):
        where = f"file {target[1]['path']}" if target[0] == "milvus-lite" else \
            f"server {target[1]['uri']} (database {target[1].get('db', 'default')})"
        raise ValueError(f"source {source_uri} is not in the Milvus that holds collection {collection_uri} ({where}): "
                         "a collection is adopted in place, never copied; create the nobackfill collection in the "
                         "Milvus where the user's collection is")
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    if modality not in tuple(getattr(encoder, "modalities", MODALITIES)):
        raise ValueError(f"{model} embeds only {', '.join(encoder.modalities)}: cannot adopt {modality} vectors")
    if int(batch_rows) < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    ext: dict[str, Any] = {"collection": src[1]["name"], "source": str(source_uri), "id_field": id_field,
                           "vector_field": vector_field, "source_field": source_field or None, "modality": modality}
    if search_params:
        ext["search_params"] = dict(search_params)
    ext = {k: v for k, v in ext.items() if v is not None}
    name = ext["collection"]
    prefix = f"nb_{_safe(target[1]['name'])}_"
    if name.startswith(prefix):
        raise ValueError(f"Milvus collection {name!r} is named like nobackfill's own collections of {collection_uri} "
                         f"({prefix}*), which nobackfill drops with that collection: adopt it into a collection of "
                         "another name")
    client = _client(*src)
    dim = int(encoder.embed_dim)
    describe_adoptable(client, ext, dim, model)  # fields, width, metric: before anything else

    existing = Collection.open(collection_uri) if is_collection(collection_uri) else None
    if existing is not None:
        try:
            entry = existing.space(encoder.space_id)
        except KeyError:
            cur = existing.space(existing.current_space)
            raise SpaceMismatchError(cur.space_id, encoder.space_id, f"adopt {name} into collection {collection_uri}",
                                     what=f"vectors declared as {model}'s", expected_name=cur.name,
                                     hint="adopt into a new collection, or declare the model of its space") from None
        reg = existing.storage.read_doc(f"spaces/{entry.dir}.json")
        adopted = (json.loads(reg).get("external") or {}) if reg else {}
        if entry.retired or adopted.get("collection") != name:
            what = "was retired" if entry.retired else f"is not the adopted Milvus collection {name!r}"
            raise ValueError(f"collection {collection_uri}: space {entry.space_id} {what}: nothing to resume (adopt "
                             "into a new collection)")

    if trust_model:
        check: dict[str, Any] = skipped_check(model)
    else:
        if not source_field:
            raise ModelCheckRefused(f"Milvus collection {name!r}: no source field to re-embed a sample from, so "
                                    f"nothing shows that {model} made its vectors; name the field with the image "
                                    "paths or captions (source_field), or pass trust_model=True to adopt it "
                                    "unchecked (the plan records that the check was skipped)")
        picked, _ = _sample(client, ext, int(samples), seed, int(batch_rows), images_root)
        if not picked:
            raise ModelCheckRefused(f"no row of Milvus collection {name!r} has a readable source (an image file that "
                                    f"exists, a caption) to check that {model} made its vectors; pass "
                                    "trust_model=True to adopt it unchecked (the plan records that the check was "
                                    "skipped)")
        verdict = check_model(encoder, picked, threshold=threshold, model=model)
        if not verdict.accepted:
            raise ModelCheckRefused(verdict.message + " (nothing was adopted; trust_model=True skips the check)")
        check = verdict.to_json()

    c = existing if existing is not None else \
        Collection.create(collection_uri, space_id=encoder.space_id, dim=dim, model=model,
                          name=getattr(encoder, "name", ""), backend=backend,
                          modalities=list(getattr(encoder, "modalities", MODALITIES)), adopt=ext)
    space_id = encoder.space_id
    store = c.gallery(space_id)
    total = store._row_count(STRONG) if isinstance(store, MilvusAdoptedStore) else None
    items = added = 0
    unsourced = 0
    fields = [id_field] + ([source_field] if source_field else [])
    with c.ingesting(wait=wait), progress_bar(progress, f"adopting {name}", total) as advance:
        for batch in _pages(client, name, fields, batch_rows):
            rows = []
            for r in batch:
                item_id = str(r[id_field])
                problem = id_problem(item_id)
                if problem:
                    raise ValueError(f"Milvus collection {name!r}, primary key {r[id_field]!r}: {problem}")
                source = _source_json(modality, r.get(source_field), images_root) if source_field else {}
                unsourced += not _payload_field(modality, source)
                rows.append((item_id, modality, item_id, row_json(source), row_json(source_metadata(source))))
            hint = (space_id, {row[2]: 0 for row in rows}) if c.current_space == space_id else None
            added += c.commit_rows(rows, stored=hint, skip_unchanged=True)
            items += len(rows)
            advance(len(rows))
        record = {"from": str(source_uri), "items": items, "added": added, "model_check": check,
                  "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "in_place": True}
        if added or not any(r.get("from") == record["from"] for r in c.plan.space(space_id).imports):
            c.set_plan(lambda p: p.with_import(space_id, record))  # (a run that changed nothing: no record)
    return {"collection": str(c.path), "source": str(source_uri), "adopted": name, "created": existing is None,
            "space": space_id, "items": items, "added": added, "unchanged": items - added, "unsourced": unsourced,
            "model_check": check, "in_place": True, "seconds": round(time.perf_counter() - t0, 3)}


def _payload_field(modality: str, source: dict[str, Any]) -> str:
    """The image path or caption text of a source ("" when it has none: cannot be backfilled)."""
    return str(source.get("path" if modality == "image" else "text") or "")
