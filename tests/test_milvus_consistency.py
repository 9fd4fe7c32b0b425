"""Consistency of a collection on Milvus by commit timestamps (docs/storage.md): each commit records,
in its own transaction, the Milvus timestamp of the vectors it names; a reader numbers a space's rows
from the catalog alone (no read of the server) and searches with the largest timestamp it has seen
as Milvus' guarantee timestamp (not Strong: no wait for the server's next time tick). A commit made
by one process is read at once by a serving replica that did not make it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from _collection_helpers import OLD_REF, HashEncoder, milvus_server_location, pool_with, related_pair
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, text_item

TESTS = Path(__file__).parent


class _FakeClient:
    """The calls a :class:`MilvusSpaceStore` reader makes, recorded; a read of the server's rows
    (query iterator, get) fails the test."""

    def __init__(self, keys: list[str], dim: int) -> None:
        self.keys, self.dim, self.searches = keys, dim, []

    def load_collection(self, name):
        pass

    def search(self, name, data, **kw):
        self.searches.append(kw)
        return [[{"id": k, "distance": 1.0 - i / 10, "entity": {"key": k}} for i, k in enumerate(self.keys)]
                for _ in data]

    def query_iterator(self, *a, **kw):
        raise AssertionError("a reader read the server's rows (query iterator)")

    def get(self, *a, **kw):
        raise AssertionError("a reader looked rows up on the server")


def test_a_reader_numbers_rows_from_the_catalog_and_waits_for_the_commit_timestamp():
    """``know`` + ``guarantee`` (what a snapshot does): the search reads no row list from the server
    and asks for the commit's timestamp (Customized), not Strong; before any timestamp is known a
    reader of catalog rows stays Strong."""
    from nobackfill import milvus as mv

    client = _FakeClient(["a", "b", "c"], 4)
    store = mv.MilvusSpaceStore(client, "s", space_id="sp", dim=4, model="m", backend="flat")
    store.know("image", ["a", "b", "c"])
    q = np.ones((1, 4), np.float32)
    assert store.search("image", q, 2, space_id="sp").ids == [["a", "b"]]
    assert client.searches[-1]["consistency_level"] == mv.STRONG  # catalog rows, no timestamp yet
    store.guarantee(4242)
    store.guarantee(17)  # the largest one seen stays
    assert store.search("image", q, 2, space_id="sp").ids == [["a", "b"]]
    assert client.searches[-1]["consistency_level"] == "Customized"
    assert client.searches[-1]["guarantee_timestamp"] == 4242


def test_a_commit_records_the_largest_vector_timestamp_in_its_own_transaction(tmp_path):
    """The catalog keeps the largest ``commit_ts`` of the stores a committing process opened; a
    smaller one later leaves it; a commit that fails records nothing."""
    enc = HashEncoder(16, "ts")
    c = Collection.create(tmp_path / "c", space_id=enc.space_id, dim=16, model=OLD_REF, modalities=["text"])
    add_items(c, enc, [text_item("first", id="t0")], progress=False)
    assert c.catalog.vectors_ts() == 0  # a directory's store has no timestamps
    g = c.gallery(enc.space_id)
    g.commit_ts = lambda: 900
    add_items(c, enc, [text_item("second", id="t1")], progress=False)
    assert c.catalog.vectors_ts() == 900
    g.commit_ts = lambda: 500
    c.delete(["t1"])
    assert c.catalog.vectors_ts() == 900
    g.commit_ts = lambda: 2000
    with pytest.raises(Exception, match="no item"):
        c.delete(["missing"])
    assert c.catalog.vectors_ts() == 900
    assert Collection.open(tmp_path / "c").catalog.vectors_ts() == 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.milvus_server
def test_a_commit_is_read_at_once_by_another_process_and_a_replica_that_did_not_make_it(request, tmp_path,
                                                                                          monkeypatch):
    """The test process commits texts one at a time; right after each commit (a catalog recheck
    later) a serving replica in another process (HTTP) and a reader of its own in a further
    process find the new text first, on their first search. In this process, a second reader
    refreshes from the catalog only (reading the server's rows fails the test) and searches at the
    catalog's commit timestamp, which covers the writer's inserts."""
    pytest.importorskip("fastapi")
    from nobackfill.client import Client
    from nobackfill.search import Searcher

    uri = milvus_server_location(request)
    old, new, _ = related_pair()
    c = Collection.create(uri, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old",
                          modalities=["text"])
    add_items(c, old, [text_item(f"base text {i}", id=f"base-{i}") for i in range(20)], progress=False)
    key, port = "consistency-key-0123", _free_port()
    (tmp_path / "server").mkdir()
    log = open(tmp_path / "server" / "log.txt", "w")
    server = subprocess.Popen([sys.executable, str(TESTS / "_shared_server.py"), uri, str(port), key],
                              cwd=tmp_path / "server", stdout=log, stderr=subprocess.STDOUT)
    reader = subprocess.Popen([sys.executable, str(TESTS / "_milvus_reader.py"), uri], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        api = Client(f"http://127.0.0.1:{port}", key, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            try:
                if api.search(text="base text 3", k=1, target="text").hits[0].id == "base-3":
                    break
            except Exception:  # not listening yet
                pass
            assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "server" / "log.txt").read_text()
            time.sleep(0.2)
        assert reader.stdout.readline().strip() == "ready"

        local = Collection.open(uri)  # a reader of this process with stores of its own
        pool = pool_with((OLD_REF, old))
        assert Searcher(local, pool=pool).search(text="base text 5", k=1, target="text").hits[0].id == "base-5"

        def no_server_rows(*a, **kw):
            raise AssertionError("a reader's refresh read the server's rows")

        reading = local.gallery(old.space_id)
        monkeypatch.setattr(reading, "refresh", no_server_rows)
        monkeypatch.setattr(reading, "_all", no_server_rows)
        monkeypatch.setattr(reading, "_existing", no_server_rows)
        for i in range(4):
            add_items(c, old, [text_item(f"fresh text {i}", id=f"fresh-{i}")], progress=False)
            written = c.gallery(old.space_id).write_ts
            assert written > 0 and c.catalog.vectors_ts() >= written
            time.sleep(2 * Collection.RECHECK_S)
            assert api.search(text=f"fresh text {i}", k=1, target="text").hits[0].id == f"fresh-{i}"
            reader.stdin.write(f"fresh text {i}\n")
            reader.stdin.flush()
            assert reader.stdout.readline().strip() == f"fresh-{i}"
            assert Searcher(local, pool=pool).search(text=f"fresh text {i}", k=1, target="text").hits[0].id == \
                f"fresh-{i}"
            level = local.gallery(old.space_id)._level("text")
            assert level == {"consistency_level": "Customized", "guarantee_timestamp": c.catalog.vectors_ts()}
    finally:
        server.kill()
        reader.kill()
        server.wait(30)
        reader.wait(30)
        log.close()


def test_status_and_delete_of_a_milvus_collection_neither_import_pymilvus_nor_connect(tmp_path):
    """Cold commands that read or write only the catalog: ``status`` (counts from the catalog) and
    ``delete`` run in a fresh process that never imports pymilvus (nor torch) nor connects."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    from nobackfill import milvus

    uri = f"milvus-lite:{tmp_path}/m.db#c"
    enc = HashEncoder(16, "cold")
    c = Collection.create(uri, space_id=enc.space_id, dim=16, model=OLD_REF, modalities=["text"])
    add_items(c, enc, [text_item(f"text {i}", id=f"t{i}") for i in range(5)], progress=False)
    milvus.close_clients()
    code = ("import json, sys\nfrom nobackfill.client.local import LocalClient\n"
            "cl = LocalClient(sys.argv[1])\nbefore = cl.status()\nn = cl.delete('t1')\nafter = cl.status()\n"
            "print(json.dumps([before['items']['text'], n, after['items']['text'], after['unserved'],\n"
            "                  after['backfill']['done'], 'pymilvus' in sys.modules, 'torch' in sys.modules]))\n")
    r = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[5, 1, 4, 0, 4, false, false]", r.stdout


def test_route_and_retire_of_a_milvus_collection_import_no_torch_and_route_no_pymilvus(tmp_path):
    """The other cold plan commands: pinning a route writes the plan in the catalog only (no pymilvus,
    no torch, no model loaded); retiring a space drops its Milvus collection (pymilvus, no torch)."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    from _collection_helpers import NEW_REF, write_procrustes_upgrade
    from nobackfill import milvus
    from nobackfill.lifecycle.backfill import run_backfill
    from nobackfill.lifecycle.plan_changes import upgrade_collection

    uri = f"milvus-lite:{tmp_path}/m.db#c"
    old, new, w = related_pair()
    c = Collection.create(uri, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, modalities=["text"])
    add_items(c, old, [text_item(f"text {i}", id=f"t{i}") for i in range(5)], progress=False)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(tmp_path / "up", w, new, old)], pool=pool)
    run_backfill(c, new, order="sequential", pool=pool)
    old_store = c.gallery(old.space_id).name
    milvus.close_clients()
    code = ("import json, sys\nfrom nobackfill.client.local import LocalClient\n"
            "cl = LocalClient(sys.argv[1])\nroutes = cl.route(sys.argv[2], 't2t', 'old-model')\n"
            "after_route = ['pymilvus' in sys.modules, 'torch' in sys.modules]\n"
            "cl.retire(sys.argv[2])\nst = cl.status()\n"
            "print(json.dumps([routes[sys.argv[2]]['t2t']['route'], after_route,\n"
            "                  'torch' in sys.modules, sorted(k for k, v in st['spaces'].items() if not v['retired'])]))\n")
    r = subprocess.run([sys.executable, "-c", code, uri, old.space_id], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    routes, after_route, torch_loaded, spaces = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert routes == "old-model" and after_route == [False, False] and not torch_loaded
    assert spaces == [new.space_id]
    assert old_store not in milvus._client("milvus-lite", {"path": f"{tmp_path}/m.db"}).list_collections()
    milvus.close_clients()


def test_a_reader_follows_changed_slots_and_an_older_catalog_gets_them_at_its_first_write(tmp_path):
    """Items of a Milvus space get serving-page slots (their rids): a reader maps only the slots
    that changed (a delete and an add are seen, the unchanged rows are not read again); a catalog
    written before slots (no document, no pages) is served by keys, and its first write gives it
    the slots, after which readers use them and the catalog's check holds."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    from nobackfill.catalog.catalog import sqlite_catalog
    from nobackfill.catalog.writer import KEYED_PAGES_DOC
    from nobackfill.collection import keyed
    from nobackfill.search import Searcher

    uri = f"milvus-lite:{tmp_path}/m.db#c"
    enc = HashEncoder(16, "slots")
    pool = pool_with((OLD_REF, enc))
    c = Collection.create(uri, space_id=enc.space_id, dim=16, model=OLD_REF, modalities=["text"])
    add_items(c, enc, [text_item(f"text {i}", id=f"t{i}") for i in range(30)], progress=False)
    s = Searcher(c, pool=pool)
    assert s.search(text="text 7", k=1, target="text").hits[0].id == "t7"
    read: list[int] = []
    real = keyed._keys
    keyed._keys = lambda cat, space, m, rids: (read.extend(rids), real(cat, space, m, rids))[1]
    try:
        c.delete(["t7"])
        add_items(c, enc, [text_item("text 7 again", id="n7")], progress=False)
        hits = [h.id for h in s.search(text="text 7 again", k=30, target="text").hits]
    finally:
        keyed._keys = real
    assert "t7" not in hits and hits[0] == "n7" and len(hits) == 30 and len(read) == 1, (hits, read)

    cat = sqlite_catalog(tmp_path / "m.db.c.catalog.sqlite")  # now as an older version left it
    conn = cat._connect()
    conn.execute("DELETE FROM docs WHERE name = ?", (KEYED_PAGES_DOC,))
    conn.execute("DELETE FROM serving")
    conn.execute("UPDATE header SET version = 2")
    conn.close()
    from nobackfill import milvus

    c.storage.close()
    milvus.close_clients()
    old = Collection.open(uri)
    assert Searcher(old, pool=pool).search(text="text 3", k=1, target="text").hits[0].id == "t3"
    assert old.catalog.check() == []  # items without rows are not counted against pages before the slots
    old.delete(["t3"])  # the first write: slots for every served item
    assert old.catalog.read_doc(KEYED_PAGES_DOC) is not None and old.catalog.check() == []
    assert old.catalog.header()["version"] == 3  # versions that keep no slots refuse it from now on
    fresh = Searcher(Collection.open(uri), pool=pool)

    def no_server_rows(*a, **kw):
        raise AssertionError("a reader read the server's rows")

    from nobackfill.milvus.space_store import MilvusSpaceStore

    real_refresh, MilvusSpaceStore.refresh = MilvusSpaceStore.refresh, no_server_rows
    try:  # a fresh reader: every row numbered from the catalog's slots (no query of the server's rows)
        hits = [h.id for h in fresh.search(text="text 4", k=30, target="text").hits]
    finally:
        MilvusSpaceStore.refresh = real_refresh
    assert hits[0] == "t4" and "t3" not in hits and len(hits) == 29
    assert fresh.collection._slotted


def test_a_writers_key_lookups_wait_for_one_server_timestamp_not_one_each(monkeypatch):
    """The existence check of a large add: every request of it reads at one timestamp taken from the
    server first (Customized), so they wait for the server's time tick once; where the server gives no
    timestamp, or one request suffices, Strong."""
    from nobackfill import milvus as mv
    from nobackfill.milvus import connection, space_store

    class Lookups:
        def __init__(self) -> None:
            self.gets = []

        def load_collection(self, name):
            pass

        def get(self, name, ids, **kw):
            self.gets.append(kw)
            return [{"key": k} for k in ids if k.endswith("7")]

    keys = [f"k{i}" for i in range(2 * connection.LOOKUP_MAX + 5)]
    for server_ts, want in ((987654, {"consistency_level": connection.CUSTOMIZED, "guarantee_timestamp": 987654}),
                            (0, {"consistency_level": mv.STRONG})):
        monkeypatch.setattr(space_store, "alloc_ts", lambda client, ts=server_ts: ts)
        client = Lookups()
        store = mv.MilvusSpaceStore(client, "s", space_id="sp", dim=4, model="m", backend="flat")
        assert store._existing("image", keys) == {k for k in keys if k.endswith("7")}
        assert len(client.gets) == 3
        assert all({k: g[k] for k in want} == want and g["partition_names"] == ["image"] for g in client.gets)
        if server_ts:
            assert all("guarantee_timestamp" in g for g in client.gets)
    monkeypatch.setattr(space_store, "alloc_ts", lambda client: (_ for _ in ()).throw(AssertionError("no fence")))
    client = Lookups()
    store = mv.MilvusSpaceStore(client, "s", space_id="sp", dim=4, model="m", backend="flat")
    store._existing("image", keys[:10])  # one request: Strong, no timestamp asked for
    assert client.gets[0]["consistency_level"] == mv.STRONG


def test_a_large_add_inserts_each_part_while_the_next_parts_are_looked_up(monkeypatch):
    """``add(skip_existing=True)`` of more keys than one lookup takes: the lookups run in a thread, all
    at one server timestamp, while each part whose lookup came back is inserted (only its keys the
    server does not hold); without ``skip_existing`` a held key refuses the whole call first."""
    import threading

    from nobackfill import milvus as mv
    from nobackfill.gallery.types import DuplicateIdError
    from nobackfill.milvus import connection, space_store

    events: list[tuple[str, str]] = []
    first_insert, overlapped = threading.Event(), []

    class Server:
        def load_collection(self, name):
            pass

        def get(self, name, ids, **kw):
            if any(e[0] == "get" for e in events):  # a later part's lookup is answered only once the
                overlapped.append(first_insert.wait(10))  # first part went in (never, were they in turn)
            assert kw["consistency_level"] == connection.CUSTOMIZED and kw["guarantee_timestamp"] == 4242
            events.append(("get", threading.current_thread().name))
            return [{"key": k} for k in ids if k.endswith("7")]

        def insert(self, name, rows, partition_name=None):
            first_insert.set()
            events.append(("insert", ",".join(r["key"] for r in rows)))

    monkeypatch.setattr(space_store, "alloc_ts", lambda client: 4242)
    keys = [f"k{i}" for i in range(2 * connection.LOOKUP_MAX + 5)]
    vecs = np.ones((len(keys), 4), np.float32) / 2
    store = mv.MilvusSpaceStore(Server(), "s", space_id="sp", dim=4, model="m", backend="flat")
    new = [k for k in keys if not k.endswith("7")]
    assert store.add("image", keys, vecs, space_id="sp", skip_existing=True) == len(new)
    gets = [e for e in events if e[0] == "get"]
    inserts = [e for e in events if e[0] == "insert"]
    assert len(gets) == 3 and all(g[1].startswith("milvus-lookup") for g in gets)
    assert [k for e in inserts for k in e[1].split(",")] == new  # each absent key once, in order
    assert overlapped == [True, True]  # the later lookups ran while the first part was inserted
    assert store.ids("image") == new

    events.clear()
    first_insert.set()
    fresh = mv.MilvusSpaceStore(Server(), "s", space_id="sp", dim=4, model="m", backend="flat")
    with pytest.raises(DuplicateIdError):
        fresh.add("image", keys, vecs, space_id="sp")
    assert [e for e in events if e[0] == "insert"] == [] and fresh._keys["image"] == []


def test_key_lookups_in_one_read_time_block_share_one_server_timestamp(monkeypatch):
    """``one_read_time``: this thread's key lookups in the block read at the timestamp taken as it
    starts (Customized), an inner block keeps the outer one's, another thread's lookups stay Strong,
    and after the block they are Strong again; a server that gives no timestamp: Strong throughout."""
    import threading

    from nobackfill import milvus as mv
    from nobackfill.milvus import space_store

    gets: list[dict] = []

    class Client(_FakeClient):
        def get(self, name, ids, **kw):
            gets.append(kw)
            return [{"key": k} for k in ids if k in self.keys]

    stamps = iter(range(111, 10**6, 111))  # the fence of rows found on the server takes one too
    monkeypatch.setattr(space_store, "alloc_ts", lambda client: next(stamps))
    store = mv.MilvusSpaceStore(Client(["a", "b"], 4), "s", space_id="sp", dim=4, model="m", backend="flat")
    store.know("image", [])
    with store.one_read_time():
        assert store.positions("image", ["a", "x"]) == {"a": 0}
        with store.one_read_time():  # keeps the outer timestamp
            store.positions("text", ["b"])
        other = threading.Thread(target=lambda: store.positions("text", ["y"]))
        other.start()
        other.join()
    store.positions("image", ["z"])
    levels = [(g["consistency_level"], g.get("guarantee_timestamp")) for g in gets]
    assert levels == [("Customized", 111), ("Customized", 111), (mv.STRONG, None), (mv.STRONG, None)]
    monkeypatch.setattr(space_store, "alloc_ts", lambda client: 0)  # milvus-lite: no timestamp
    with store.one_read_time():
        store.positions("image", ["w"])
    assert gets[-1]["consistency_level"] == mv.STRONG
