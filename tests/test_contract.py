"""One contract for every collection storage: local vectors with a SQLite or a PostgreSQL catalog,
milvus-lite (its SQLite catalog beside its file) and (tests marked ``milvus_server``) a real Milvus
standalone server with a PostgreSQL catalog. Add, re-add, upsert, delete, upgrade, search across two
spaces, backfill, retire, and a writer killed mid-add then restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from _collection_helpers import (NEW_REF, OLD_REF, make_folder, milvus_server_location, pool_with, related_pair,
                                write_procrustes_upgrade)
from nobackfill.collection.collection import Collection, ItemNotFoundError
from nobackfill.collection.ingest import add_items, folder_items, text_item
from nobackfill.search import Searcher
from nobackfill.lifecycle.backfill import backfill_status, retire_space, run_worker, start_backfill
from nobackfill.lifecycle.plan_changes import upgrade_collection

BACKENDS = ["local", "local+postgresql", "milvus-lite",
            pytest.param("milvus-server+postgresql", marks=pytest.mark.milvus_server)]


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "c")
    if request.param == "local+postgresql":  # a directory for the vectors, the catalog in PostgreSQL
        return f"{tmp_path / 'c'}?catalog={request.getfixturevalue('postgres_db')}#c"
    if request.param == "milvus-lite":
        pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
        return f"milvus-lite:{tmp_path}/milvus.db#c{uuid.uuid4().hex[:6]}"
    return milvus_server_location(request)


def _world(tmp_path: Path, location: str, n_images: int = 5):
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=2, extra_images=1)
    c = Collection.create(location, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    shared = "?catalog=postgresql://" in location  # the catalog is where the URI says, nowhere else
    assert c.catalog.dialect == ("postgresql" if shared else "sqlite")
    if shared and not location.startswith("milvus"):
        assert not (tmp_path / "c" / "catalog.sqlite").exists()
    return c, old, new, w, data, pool_with((OLD_REF, old), (NEW_REF, new))


def test_add_readd_upsert_delete(tmp_path, location):
    c, old, new, w, data, pool = _world(tmp_path, location)
    rep = add_items(c, old, folder_items(data).items, progress=False)
    assert rep.added == 16 and c.count("image") == 6 and c.count("text") == 10
    again = Collection.open(location)
    assert add_items(again, old, folder_items(data).items, progress=False).unchanged == 16
    add_items(again, old, [text_item("first version", id="t")], progress=False)
    add_items(again, old, [text_item("second version", id="t")], progress=False)
    s = Searcher(Collection.open(location), pool=pool)
    hits = s.search(text="second version", k=20, target="text").hits
    assert hits[0].id == "t" and hits[0].metadata["text"] == "second version"
    assert [h.id for h in hits].count("t") == 1 and len(hits) == 11
    again.delete(["t"])
    with pytest.raises(ItemNotFoundError):
        again.delete(["t"])
    assert "t" not in {h.id for h in s.search(text="second version", k=20, target="text").hits}
    assert not Collection.open(location).verify()


def test_upgrade_search_two_spaces_backfill_retire(tmp_path, location):
    c, old, new, w, data, pool = _world(tmp_path, location)
    add_items(c, old, folder_items(data).items, progress=False)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    add_items(c, new, [text_item("added after the upgrade", id="late")], progress=False)
    s = Searcher(Collection.open(location), pool=pool)
    hits = s.search(text="added after the upgrade", k=30, target="text").hits
    assert hits[0].id == "late" and hits[0].route == "native" and {h.route for h in hits} == {"native", "bridge"}
    assert len(hits) == len({h.id for h in hits}) == 11
    start_backfill(c, new, order="random", seed=0, pool=pool)
    run_worker(c, new, batch_size=4, limit=5)
    mid = s.search(text="caption 0 of image 1 seed 0", k=30, target="text").hits
    assert len(mid) == len({h.id for h in mid}) == 11
    run_worker(c, new, batch_size=4)
    assert backfill_status(c)["fraction"] == 1.0
    retire_space(c, old.space_id)
    hits = Searcher(Collection.open(location), pool=pool).search(text="caption 1 of image 2 seed 0", k=30,
                                                                 target="text").hits
    assert {h.route for h in hits} == {"native"} and hits[0].metadata["text"] == "caption 1 of image 2 seed 0"
    assert not Collection.open(location).verify()


def test_vectors_a_killed_worker_stored_are_committed_not_embedded_again(tmp_path, location):
    """A worker killed between storing a batch's vectors and its catalog transaction: the next worker
    finds those rows (on a Milvus server, at the read time it takes as it claims the shard, one read
    time for all its lookups in that shard) and commits them without embedding them again; every item
    ends served by the new space, each row stored once."""
    c, old, new, w, data, pool = _world(tmp_path, location)
    add_items(c, old, folder_items(data).items, progress=False)
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(tmp_path / "up", w, new, old)], pool=pool)
    start_backfill(c, new, order="sequential", pool=pool)
    items = list(c.items().values())
    stored = [it for it in items if it.modality == "text"][1::3] + [it for it in items if it.modality == "image"][:2]
    killed = Collection.open(location).gallery(new.space_id)  # the killed worker's own store object
    for m in ("image", "text"):
        mine = [it for it in stored if it.modality == m]
        payloads = [Path(it.payload) for it in mine] if m == "image" else [it.payload for it in mine]
        vecs = new.encode_images(payloads) if m == "image" else new.encode_texts(payloads)
        killed.add(m, [it.key for it in mine], vecs, space_id=new.space_id)
    embedded = []

    class Counting(type(new)):
        def _rows(self, datas, what):
            embedded.extend(datas)
            return super()._rows(datas, what)

    run_worker(Collection.open(location), Counting(new._dim, new._salt, base=new.base, mix=new.mix, name="new"),
               batch_size=4)
    c = Collection.open(location)
    assert backfill_status(c)["fraction"] == 1.0
    assert len(embedded) == len(items) - len(stored)  # the stored rows were committed as they were
    assert {sp for _, sp in c.serving(list(c.items())).values()} == {new.space_id}
    assert not c.verify()  # a Milvus store's check names duplicated keys


KILLED_ADDER = r"""
import sys, time
sys.path.insert(0, {tests!r})
from _collection_helpers import *
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items
old, new, w = related_pair()
class Slow(type(old)):
    def _rows(self, datas, what):
        time.sleep(0.05)
        return super()._rows(datas, what)
slow = Slow(old._dim, old._salt, name="old")
c = Collection.open(sys.argv[1])
print("ready", flush=True)
add_items(c, slow, folder_items(sys.argv[2]).items, chunk_size=2, progress=False)
print("done", flush=True)
"""


def test_a_writer_killed_mid_add_then_restarted(tmp_path, location):
    c, old, new, w, data, pool = _world(tmp_path, location, n_images=8)
    _release(c)
    code = KILLED_ADDER.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code, location, str(data)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    c = Collection.open(location)
    assert not c.verify()
    partial = c.count()
    rep = add_items(c, old, folder_items(data).items, progress=False)  # the restart finishes the job
    assert rep.added + rep.recovered + rep.unchanged == 25 and rep.unchanged == partial
    assert c.count() == 25 and not c.verify()
    hits = Searcher(c, pool=pool).search(text="caption 0 of image 3 seed 0", k=40, target="text").hits
    assert len(hits) == len({h.id for h in hits}) == 16


def _release(c: Collection) -> None:
    """Let another process open the storage (milvus-lite allows one process per path)."""
    from nobackfill import milvus

    if not isinstance(c.path, Path):
        milvus.close_clients()


def test_milvus_search_is_strong_only_while_the_space_has_fresh_rows(tmp_path, monkeypatch):
    """A Strong search waits for the server's next time tick (~200 ms): a space whose rows this
    process knows are all older than FRESH_S is searched Bounded, a fresh one Strong."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    import numpy as np

    from nobackfill import milvus as mv

    client = mv._client("milvus-lite", {"path": str(tmp_path / "m.db")})
    store = mv.MilvusSpaceStore.create(client, "fresh", space_id="s", dim=8, model="m", backend="flat")
    x = np.eye(8, dtype=np.float32)
    store.add("image", [f"k{i}" for i in range(8)], x, space_id="s")
    levels = []
    real = client.search

    def spy(*a, **kw):
        levels.append(kw.get("consistency_level"))
        return real(*a, **kw)

    monkeypatch.setattr(client, "search", spy)
    assert store.search("image", x[:2], 1, space_id="s").ids == [["k0"], ["k1"]]
    monkeypatch.setattr(mv.space_store, "FRESH_S", 0.0)  # looked up where the search runs
    assert store.search("image", x[:2], 1, space_id="s").ids == [["k0"], ["k1"]]
    assert levels == [mv.STRONG, mv.BOUNDED]
    mv.close_clients()


MILVUS = ["milvus-lite", pytest.param("milvus-server+postgresql", marks=pytest.mark.milvus_server)]


@pytest.fixture(params=MILVUS)
def milvus_location(request, tmp_path):
    if request.param == "milvus-lite":
        pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
        return f"milvus-lite:{tmp_path}/milvus.db#c{uuid.uuid4().hex[:6]}"
    return milvus_server_location(request)


def _release_all(c: Collection) -> None:
    """What a server restart (or a fresh milvus-lite process) leaves: every collection released."""
    st = c.storage
    for name in st.client.list_collections():
        if name.startswith(st.prefix + "_"):
            st.client.release_collection(name)


def test_every_read_works_on_a_released_collection(tmp_path, milvus_location):
    """Reads of a released collection (a fresh process, a restarted server) load it first -
    contains, existing keys, get, ids, count, search, verify, the documents - and an add of new
    items, a search and a delete after reopening work."""
    from nobackfill import milvus

    c, old, new, w, data, pool = _world(tmp_path, milvus_location)
    add_items(c, old, folder_items(data).items, progress=False)
    store = c.gallery(c.current_space)
    texts, images = store.ids("text"), store.ids("image")
    q = store.get_vectors("text", texts[:2])
    milvus.close_clients()  # a fresh process: milvus-lite reopens the path with every collection released

    c = Collection.open(milvus_location)
    store = c.gallery(c.current_space)
    fresh = lambda: type(store)(store.client, store.name, space_id=store.space_id, dim=store.dim,  # noqa: E731
                                model=store.model, backend=store.backend)
    checks = {
        "contains": lambda s: ("text", texts[0]) in s and ("image", texts[0]) not in s,
        "existing": lambda s: s._existing("image", images + ["nope"]) == set(images),
        "get": lambda s: np.allclose(s.get_vectors("text", texts[:2]), q),
        "ids": lambda s: sorted(s.ids("text")) == sorted(texts),
        "count": lambda s: s.count("image") == len(images),
        "search": lambda s: s.search("text", q, 1, space_id=store.space_id).ids == [[texts[0]], [texts[1]]],
        "verify": lambda s: not s.verify().problems and s.verify().checked_chunks == len(texts) + len(images),
        "vectors": lambda s: s.vectors("image").shape == (len(images), store.dim),
        "documents": lambda s: bool(c.storage.list_docs("spaces/")),
    }
    used = fresh()
    lite = str(milvus_location).startswith("milvus-lite:")
    if not lite:
        # a server loads a collection in about ten seconds, not milliseconds: every read path
        # shares the loading code (each one is checked on milvus-lite), so the server checks two
        checks = {k: checks[k] for k in ("existing", "search")}
    for what, check in checks.items():
        _release_all(c)
        assert check(fresh()), f"{what} on a store that never loaded"
        if lite:
            _release_all(c)
            assert check(used), f"{what} on a store that had loaded, then released"

    _release_all(c)
    c = Collection.open(milvus_location)
    rep = add_items(c, old, folder_items(data).items + [text_item("new after reopening", id="n")], progress=False)
    assert rep.added == 1 and rep.unchanged == 16
    _release_all(c)
    hits = Searcher(Collection.open(milvus_location), pool=pool).search(text="new after reopening", k=3,
                                                                      target="text").hits
    assert hits[0].id == "n"
    if lite:
        _release_all(c)
    Collection.open(milvus_location).delete(["n"])
    if lite:
        _release_all(c)
    c = Collection.open(milvus_location)
    assert c.count() == 16 and not c.verify()
    milvus.close_clients()


def _cli(*args, check: bool = True) -> subprocess.CompletedProcess:
    """``nobackfill ARGS`` in a fresh process (milvus-lite: one process per path, so each command
    reopens it with its collections released)."""
    env = {**os.environ, "COLUMNS": "200"}
    for var in ("TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-m", "nobackfill.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=600)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


NOISE = ("Token indices", "[WARNING]", "MilvusException", "Traceback", "[ERROR]")


def _quiet(r: subprocess.CompletedProcess) -> str:
    out = r.stdout + r.stderr
    assert not [n for n in NOISE if n in out], out
    return out


def test_cli_collection_on_milvus_lite_fresh_processes_and_quiet(tmp_path):
    """Issue 24 items 4 and 12: ``collection create / add / add again with new items / search /
    delete / status`` and ``verify`` through the command line, each in a fresh process, on
    milvus-lite: every one exits 0 and prints our messages only (no tokenizer warning, no pymilvus
    log lines); ``-v`` lets the libraries' warnings through."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    import json

    root = Path(__file__).resolve().parents[1]
    data = make_folder(tmp_path / "data", n_images=3, captions_per_image=2)
    long = " ".join(["a very long caption about a red circle"] * 20)  # far over the model's 40 tokens
    with open(data / "captions.jsonl", "a") as f:
        f.write(json.dumps({"image": "images/000.png", "caption": long, "lang": "en"}) + "\n")
    uri = f"milvus-lite:{tmp_path}/m.db#photos"

    _quiet(_cli("collection", "create", uri, "--model", root / "models" / "world-old"))
    out = _quiet(_cli("collection", "add", uri, "--data", data))
    assert "added 10, already there 0" in out and out.count("exceed the model's 40 tokens") == 1

    more = make_folder(tmp_path / "more", n_images=2, captions_per_image=1, seed=1)
    for p in (more / "images").iterdir():
        p.rename(data / "images" / f"new-{p.name}")
    lines = (more / "captions.jsonl").read_text().replace("images/", "images/new-")
    with open(data / "captions.jsonl", "a") as f:
        f.write(lines)
    out = _quiet(_cli("collection", "add", uri, "--data", data))  # new items after reopening
    assert "added 4, already there 10" in out and "exceed" not in out  # the long caption is not embedded again

    r = _cli("collection", "search", uri, "--text", "caption 0 of image 1 seed 1", "--k", 20, "--target", "text",
             "--json")
    _quiet(r)
    hits = json.loads(r.stdout)["hits"]
    assert len(hits) == 9 and hits[0]["text"] == "caption 0 of image 1 seed 1"
    out = _quiet(_cli("collection", "delete", uri, "--id", hits[0]["id"]))
    assert "deleted 1" in out
    r = _cli("collection", "status", uri, "--json")
    _quiet(r)
    st = json.loads(r.stdout)
    assert st["items"] == {"image": 5, "text": 8}
    assert "OK" in _quiet(_cli("verify", uri))
    loud = _cli("-v", "collection", "add", uri, "--data", data)  # -v: library warnings may appear
    assert "already there 13" in loud.stdout + loud.stderr


def test_status_names_the_plan_it_counted_after_another_writer_changed_it(tmp_path, location):
    """A collection object's status after another process (here another object) upgraded it reports the
    upgraded plan, and the object's plan is that plan from then on (a catalog-only status too)."""
    c, old, new, w, data, pool = _world(tmp_path, location)
    add_items(c, old, folder_items(data).items, progress=False)
    reader = Collection.open(location)
    assert reader.status()["current"] == old.space_id
    upgrade_collection(Collection.open(location), NEW_REF, pool=pool, fit_bridges=False)
    st = reader.status()
    assert st["current"] == new.space_id and new.space_id in st["spaces"]
    assert reader.plan.current == new.space_id


@pytest.mark.milvus_server
def test_a_collection_in_a_milvus_database_other_than_default(tmp_path, request):
    """``milvus://HOST:PORT/prod#NAME``, the docs' form (trial H: pymilvus' ``use_database`` asks the
    server for DescribeDatabase, which Milvus 2.3 lacks, and the command died with a traceback): the
    database is made where missing and the collection's Milvus collections live in it."""
    from pymilvus import MilvusClient

    server = request.getfixturevalue("milvus_server")
    name, db = f"c{uuid.uuid4().hex[:8]}", f"db{uuid.uuid4().hex[:6]}"
    loc = f"milvus://{server}/{db}#{name}?catalog={request.getfixturevalue('postgres_db')}#{name}"
    c, old, new, w, data, pool = _world(tmp_path, loc)
    assert add_items(c, old, folder_items(data).items, progress=False).added == 16
    hits = Searcher(Collection.open(loc), pool=pool).search(text="caption 0 of image 1 seed 0", k=3,
                                                             target="text").hits
    assert hits[0].metadata["text"] == "caption 0 of image 1 seed 0"
    mine = [n for n in MilvusClient(uri=f"http://{server}", db_name=db).list_collections() if name in n]
    assert mine and not [n for n in MilvusClient(uri=f"http://{server}").list_collections() if name in n]
