""":class:`MilvusStorage`: a collection's storage in Milvus (its documents in ``nb_<NAME>_meta``,
its catalog, its spaces' stores), for :mod:`nobackfill.milvus`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..storage.base import Storage
from ..storage.binding import STORE_MARK, bound_fill, check_binding, new_uid, wrong_store
from ..gallery.types import SpaceMismatchError
from .adopted import MilvusAdoptedStore
from .connection import KEY_MAX, LITE_ONE_PROCESS, STRONG, VALUE_MAX, _client, _loaded, _q, _safe, forget_client
from .space_store import MilvusSpaceStore

if TYPE_CHECKING:
    from ..catalog.catalog import Catalog


def _schema_meta(client: Any):
    from pymilvus import DataType

    s = client.create_schema(auto_id=False, enable_dynamic_field=False)
    s.add_field("k", DataType.VARCHAR, is_primary=True, max_length=KEY_MAX)
    s.add_field("v", DataType.VARCHAR, max_length=65535)
    s.add_field("_v", DataType.FLOAT_VECTOR, dim=2)  # Milvus needs one vector field; unused
    idx = client.prepare_index_params()
    idx.add_index(field_name="_v", index_type="FLAT", metric_type="L2")
    return s, idx


class MilvusStorage(Storage):
    """A collection's storage in Milvus (see the module doc)."""

    #: which space serves an item is the catalog's alone: a collection counts served items there (a
    #: status needs no connection to Milvus)
    keyed_stores = True

    def __init__(self, client: Any, name: str, location: str, *, catalog_uri: str | None = None,
                 catalog_path: Path | None = None, connect: Callable[[], Any] | None = None) -> None:
        """``client``: a pymilvus client; or None and ``connect``, which makes one on first use (a
        command that reads only the catalog never imports pymilvus nor connects)."""
        self._client, self._connect = client, connect
        self.name = name
        self.prefix = f"nb_{_safe(name)}"
        self.location = location
        self.meta = f"{self.prefix}_meta"
        self._catalog_uri = catalog_uri
        self._catalog_path = catalog_path
        self._lite_path: Path | None = None  # a milvus-lite database file (from_uri)
        self.where = location  # where the vectors are, as a catalog records it (:mod:`..storage.binding`)
        self._expected_mark: str | None = None  # the mark its store must hold, once the catalog said
        self._catalog: Catalog | None = None
        self._spaces: dict[str, MilvusSpaceStore] = {}
        self._lock = threading.Lock()
        if client is not None:
            self._ensure_meta(client)

    @property
    def client(self) -> Any:
        """The pymilvus client (connected, and the documents' collection made, on first use)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    c = self._connect()
                    if self._expected_mark:
                        self._check_mark(c)
                    self._ensure_meta(c)
                    self._client = c
        return self._client

    def _ensure_meta(self, client: Any) -> None:
        if not client.has_collection(self.meta):
            schema, idx = _schema_meta(client)
            client.create_collection(self.meta, schema=schema, index_params=idx, consistency_level=STRONG)
        with contextlib.suppress(Exception):
            client.load_collection(self.meta)

    @classmethod
    def from_uri(cls, uri: str, kind: str, parts: dict[str, str]) -> "MilvusStorage":
        path = Path(parts["path"]) if kind == "milvus-lite" else None
        beside = path.with_name(f"{path.name}.{_safe(parts['name'])}.catalog.sqlite") if path is not None else None
        from ..catalog.catalog import check_collection_name, redact

        check_collection_name(parts["name"])
        out = cls(None, parts["name"], redact(uri), catalog_uri=parts.get("catalog"), catalog_path=beside,
                  connect=lambda: _client(kind, parts))
        out._lite_path = path
        out.where = f"milvus-lite:{path.resolve()}" if path is not None else \
            f"milvus://{parts['uri'].removeprefix('http://')}/{parts['db']}"
        return out

    @property
    def _kind(self) -> str:
        return "milvus-lite" if self._lite_path is not None else "milvus"

    @property
    def one_process(self) -> str | None:  # type: ignore[override]
        """Why one process at a time opens a milvus-lite file (None on a Milvus server)."""
        return LITE_ONE_PROCESS if self._lite_path is not None else None

    def _check_mark(self, client: Any) -> None:
        """The Milvus connected to holds this catalog's mark (:mod:`..storage.binding`); checked
        before anything is written there."""
        raw = self.read_doc(STORE_MARK, client) if client.has_collection(self.meta) else None
        found = raw.decode("utf-8") if raw is not None else None
        if found != self._expected_mark:
            raise wrong_store(self.location, self._catalog, self.where, found)

    # ------------------------------------------------------------------ documents
    def _rows(self, filter: str, fields: Sequence[str] = ("k", "v"), client: Any = None) -> list[dict]:
        c = client if client is not None else self.client  # (a client not yet in service: its mark's check)
        return _loaded(c, self.meta, lambda: c.query(self.meta, filter=filter, output_fields=list(fields),
                                                      consistency_level=STRONG))

    def read_doc(self, name: str, client: Any = None) -> bytes | None:
        rows = self._rows(f"k == {_q(name)}", client=client)
        if not rows:
            return None
        head = json.loads(rows[0]["v"])
        if "inline" in head:
            return head["inline"].encode("utf-8")
        parts = self._rows(f'k like {_q(name + "@" + head["version"] + "#")[:-1]}%"', client=client)
        by_index = {int(r["k"].rpartition("#")[2]): r["v"] for r in parts}
        if len(by_index) != head["parts"]:
            raise OSError(f"{self.location}: document {name} has {len(by_index)} of {head['parts']} parts")
        data = "".join(by_index[i] for i in range(head["parts"])).encode("utf-8")
        if hashlib.sha256(data).hexdigest() != head["sha256"]:
            raise OSError(f"{self.location}: document {name} does not match its sha256")
        return data

    def write_doc(self, name: str, data: bytes) -> None:
        if "@" in name or len(name) > KEY_MAX - 40:
            raise ValueError(f"document name {name!r}: no '@', at most {KEY_MAX - 40} characters")
        text = data.decode("utf-8")
        old = self._rows(f"k == {_q(name)}")
        head: dict[str, Any] = {"inline": text}
        if len(json.dumps(head).encode("utf-8")) > VALUE_MAX:  # parts of at most VALUE_MAX bytes each
            version = uuid.uuid4().hex[:12]
            step = VALUE_MAX // 4  # characters: at most 4 bytes each in UTF-8
            pieces = [text[i:i + step] for i in range(0, len(text), step)]
            self.client.upsert(self.meta, [{"k": f"{name}@{version}#{i}", "v": p, "_v": [0.0, 0.0]}
                                           for i, p in enumerate(pieces)])
            head = {"version": version, "parts": len(pieces), "sha256": hashlib.sha256(data).hexdigest()}
        self.client.upsert(self.meta, [{"k": name, "v": json.dumps(head), "_v": [0.0, 0.0]}])  # the switch
        if old:
            prev = json.loads(old[0]["v"]).get("version")
            if prev:
                self.client.delete(self.meta, filter=f'k like {_q(name + "@" + prev + "#")[:-1]}%"')

    def delete_doc(self, name: str) -> None:
        rows = self._rows(f"k == {_q(name)}")
        if rows:
            prev = json.loads(rows[0]["v"]).get("version")
            self.client.delete(self.meta, filter=f"k == {_q(name)}")
            if prev:
                self.client.delete(self.meta, filter=f'k like {_q(name + "@" + prev + "#")[:-1]}%"')

    def list_docs(self, prefix: str) -> list[str]:
        rows = self._rows(f'k like {_q(prefix)[:-1]}%"', fields=("k",))
        return sorted(r["k"] for r in rows if "@" not in r["k"])

    # ------------------------------------------------------------------ catalog and the previous format
    def catalog(self) -> "Catalog | None":
        if self._catalog is None:
            from ..catalog.catalog import open_catalog, sqlite_catalog

            if self._catalog_uri:
                cat = open_catalog(self._catalog_uri)
                if not cat.exists():
                    return None
                bound = check_binding(cat, self.location, self._kind, self.where, same_where=self._kind == "milvus-lite")
                self._catalog = cat
                if bound is not None:
                    self._expected_mark = bound[0]
                    try:
                        if self._client is not None:  # connected already: checked now
                            self._check_mark(self._client)
                        elif bound[1] != self.where:  # another address: is it the same server? (connects)
                            self.client  # noqa: B018 - the property connects and checks the mark
                    except Exception:
                        self._catalog = None
                        raise
                return cat
            elif self._catalog_path is not None and self._catalog_path.is_file():
                cat = sqlite_catalog(self._catalog_path)
            else:
                return None
            self._catalog = cat
        return self._catalog

    def why_not_a_collection(self) -> str | None:
        if not self._catalog_uri and self._catalog_path is None:
            return ("a collection on a Milvus server keeps its catalog in PostgreSQL; add "
                    "?catalog=postgresql://USER@HOST:PORT/DB to the URI")
        return None

    def check_creatable(self) -> None:
        why = self.why_not_a_collection()
        if why is not None:  # before any Milvus collection is made
            raise ValueError(f"{self.location}: {why}")

    def create_catalog(self, header: dict[str, Any], fill: Any = None) -> "Catalog":
        from ..catalog.catalog import create_sqlite, open_catalog

        self.check_creatable()
        if self._catalog_uri:  # the catalog names these vectors (:mod:`..storage.binding`): the mark first
            uid = new_uid()
            self.write_doc(STORE_MARK, uid.encode())
            cat = open_catalog(self._catalog_uri)
            cat.create(header, bound_fill(fill, self._kind, self.where, uid))
        else:
            cat = create_sqlite(self._catalog_path, header, fill)
        self._catalog = cat
        return cat

    def read_manifest(self) -> bytes | None:
        if self._lite_path is not None and not self._lite_path.exists():
            return None  # no milvus-lite database there: nothing to read (and none made by a reader)
        if self._client is None and not self._connect().has_collection(self.meta):
            return None  # nothing of ours there: and asking made none (trial AH: a refused adoption left
            # nb_<name>_meta in the user's Milvus file, made by the check whether a collection existed)
        return self.read_doc("collection.json")

    def read_chunk(self, name: str) -> bytes:
        data = self.read_doc(name)
        if data is None:
            raise FileNotFoundError(f"{self.location}: no document {name}")
        return data

    def retire_v1(self) -> None:
        data = self.read_manifest()
        if data is not None:
            self.write_doc("collection.json.v1", data)
            self.delete_doc("collection.json")

    # ------------------------------------------------------------------ spaces
    def _space_name(self, directory: str) -> str:
        return f"{self.prefix}_s_{hashlib.sha256(directory.encode()).hexdigest()[:16]}"

    def _registered(self, directory: str, space_id: str, action: str) -> dict[str, Any] | None:
        """The registration of store ``directory`` (None: none yet), refused when it names another space."""
        info = self.read_doc(f"spaces/{directory}.json")
        if info is None:
            return None
        got = json.loads(info)
        if got["space_id"] != space_id:
            raise SpaceMismatchError(got["space_id"], space_id, f"{action} space store {directory} in {self.location}",
                                     what="new space", hint="a store holds one embedding space")
        return got

    def create_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str) -> MilvusSpaceStore:
        self._registered(directory, space_id, "create")
        store = MilvusSpaceStore.create(self.client, self._space_name(directory), space_id=space_id, dim=dim,
                                        model=model, backend=backend)
        self.write_doc(f"spaces/{directory}.json", json.dumps({"space_id": space_id, "dim": int(dim), "model": model,
                                                               "backend": backend}).encode())
        self._spaces[directory] = store
        return store

    def adopt_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str,
                    external: Mapping[str, Any]) -> MilvusAdoptedStore:
        """Register the user's collection ``external["collection"]`` (on this storage's server or
        milvus-lite file) as the read-only store ``directory`` of space ``space_id``: its fields
        (``id_field``: the primary key, ``vector_field``: ``dim``-d float vectors, optionally
        ``source_field``: the image path or caption text), ``modality`` (``image`` / ``text``) and
        its own index (metric COSINE, or IP over unit vectors) are checked, then the registration
        document ``spaces/<directory>.json`` is written (with ``"external"``). Nothing is written to
        the user's collection, now or later; :meth:`drop_space` forgets the registration only."""
        ext = {k: v for k, v in dict(external).items() if v is not None}
        name = str(ext.get("collection") or "")
        if not name:
            raise ValueError("adopting a Milvus collection: name it (external['collection'])")
        if name == self.meta or name.startswith(self.prefix + "_"):
            raise ValueError(f"Milvus collection {name!r} is named like nobackfill's own collections of "
                             f"{self.location} ({self.prefix}_*), which nobackfill drops with the collection: "
                             "it cannot be adopted under this name (adopt it into a collection of another name)")
        got = self._registered(directory, space_id, "adopt")
        if got is not None and (got.get("external") or {}).get("collection") != name:
            raise FileExistsError(f"{self.location}: space store {directory} is registered already (as "
                                      f"{(got.get('external') or {}).get('collection') or 'a collection of its own'})")
        store = MilvusAdoptedStore(self.client, name, space_id=space_id, dim=dim, model=model, backend=backend,
                                   external=ext)
        store.check_unit_length()
        self.write_doc(f"spaces/{directory}.json", json.dumps({"space_id": space_id, "dim": int(dim), "model": model,
                                                               "backend": backend, "external": ext}).encode())
        self._spaces[directory] = store
        return store

    def _registration(self, directory: str) -> dict[str, Any] | None:
        info = self.read_doc(f"spaces/{directory}.json")
        return None if info is None else json.loads(info)

    def open_space(self, directory: str) -> MilvusSpaceStore:
        if directory in self._spaces:
            return self._spaces[directory]
        got = self._registration(directory)
        if got is not None and got.get("external"):
            ext = got["external"]
            if not self.client.has_collection(ext["collection"]):
                raise FileNotFoundError(f"{self.location}: space store {directory} is the adopted Milvus collection "
                                        f"{ext['collection']!r}, which no longer exists")
            store: MilvusSpaceStore = MilvusAdoptedStore(self.client, ext["collection"], space_id=got["space_id"],
                                                         dim=got["dim"], model=got["model"], backend=got["backend"],
                                                         external=ext)
        else:
            if got is None or not self.client.has_collection(self._space_name(directory)):
                raise FileNotFoundError(f"{self.location}: no space store {directory}")
            store = MilvusSpaceStore(self.client, self._space_name(directory), space_id=got["space_id"],
                                     dim=got["dim"], model=got["model"], backend=got["backend"])
        self._spaces[directory] = store
        return store

    def has_space(self, directory: str) -> bool:
        got = self._registration(directory)
        if got is None:
            return False
        ext = got.get("external")
        return self.client.has_collection(ext["collection"] if ext else self._space_name(directory))

    def drop_space(self, directory: str) -> None:
        """Delete a space's vectors; for a collection adopted in place, forget its registration only
        (the user's collection is never dropped)."""
        got = self._registration(directory)
        if not (got is not None and got.get("external")):
            name = self._space_name(directory)
            if self.client.has_collection(name):
                self.client.drop_collection(name)
        self.delete_doc(f"spaces/{directory}.json")
        self._spaces.pop(directory, None)

    # ------------------------------------------------------------------ existence
    def stray_entries(self, own_space_dir: str) -> list[str]:
        own = {self.meta, self._space_name(own_space_dir)}
        return sorted(c for c in self.client.list_collections() if c.startswith(self.prefix + "_") and c not in own)

    def reconnect(self) -> None:
        """After the server stopped answering: the next call connects anew (:func:`.connection.forget_client`)."""
        with self._lock:
            client, self._client, self._spaces = self._client, None, {}
        if client is not None:
            forget_client(client)

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.close()

    def drop(self) -> None:
        """Delete everything of this collection from Milvus."""
        for c in self.client.list_collections():
            if c.startswith(self.prefix + "_"):
                self.client.drop_collection(c)
