"""The catalog of a collection (SQLite / PostgreSQL): opening reads a header, serving rows are kept
up to date by commits, metadata filters run in the database with the semantics of
``matches_filter``, hits are named from memory, snapshots never change under a reader, a repaired
store's rows are served again."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _collection_helpers import OLD_REF, HashEncoder, pool_with
from nobackfill.catalog.catalog import CatalogError, sqlite_catalog, unsourced_sql
from nobackfill.catalog.schema import UNSOURCED_INDEX
from nobackfill.collection.collection import CATALOG_FILE, Collection
from nobackfill.catalog.items import row_json
from nobackfill.collection.snapshot import HitTable
from nobackfill.collection.ingest import add_items, text_item
from nobackfill.search import Searcher
from nobackfill.search.searcher import matches_filter


def _coll(tmp_path, n: int = 40, location: str | None = None):
    enc = HashEncoder(16, "cat")
    loc = location or str(tmp_path / "c")
    c = Collection.create(loc, space_id=enc.space_id, dim=16, model=OLD_REF, modalities=["text"])
    items = [text_item(f"text number {i}", id=f"t{i}", metadata={"group": i % 4, "tag": ["a", "b"][i % 2],
                                                                 "nested": {"x": i % 3}}) for i in range(n)]
    add_items(c, enc, items, progress=False)
    return c, enc, pool_with((OLD_REF, enc))


def test_a_new_sqlite_catalog_has_large_pages_and_an_old_one_keeps_its_own(tmp_path):
    """A catalog is created with 16 KiB pages (a bulk insert costs less); a catalog of 4 KiB pages,
    as older versions made, opens and takes writes as it is."""
    from nobackfill.catalog.catalog import PAGE_BYTES

    c, enc, pool = _coll(tmp_path, n=5)
    db = sqlite3.connect(tmp_path / "c" / CATALOG_FILE)
    assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE_BYTES == 16384
    db.close()
    old = tmp_path / "old"
    import nobackfill.catalog.catalog as catalog_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(catalog_module, "PAGE_BYTES", 4096)
        c4 = Collection.create(str(old), space_id=enc.space_id, dim=16, model=OLD_REF, modalities=["text"])
    add_items(c4, enc, [text_item("a text", id="a")], progress=False)
    again = Collection.open(str(old))
    assert again.lookup("a") is not None and len(again) == 1
    db = sqlite3.connect(old / CATALOG_FILE)
    assert db.execute("PRAGMA page_size").fetchone()[0] == 4096
    db.close()


def test_open_reads_the_header_not_the_items(tmp_path, monkeypatch):
    c, enc, pool = _coll(tmp_path)
    from nobackfill.catalog import catalog as cat

    def refuse(*_a, **_k):
        raise AssertionError("read every item")

    monkeypatch.setattr(cat.Catalog, "rows", refuse)
    again = Collection.open(c.path)
    st_ = again.status()
    assert st_["items"]["text"] == 40 and st_["unserved"] == 0 and st_["catalog"] == "sqlite"
    hits = Searcher(again, pool=pool).search(text="text number 7", k=3, target="text").hits
    assert hits[0].id == "t7" and hits[0].metadata["group"] == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flt=st.dictionaries(st.sampled_from(["group", "tag", "nested.x", "missing"]),
                           st.one_of(st.integers(0, 4), st.sampled_from(["a", "b", "c"]), st.booleans(), st.none(),
                                     st.lists(st.one_of(st.integers(0, 4), st.sampled_from(["a", "b"])), max_size=3)),
                           min_size=1, max_size=3))
def test_filters_in_the_database_match_the_python_filter(tmp_path_factory, flt):
    c = _filter_coll(tmp_path_factory)
    want = sorted(i for i, it in c.items().items() if matches_filter(it.metadata, flt))
    got = sorted(r.id for r in c.catalog.rows_by_rid(c.catalog.rids_matching("text", flt).tolist()).values())
    assert got == want


_FILTER_COLL: dict[str, Collection] = {}


def _filter_coll(factory) -> Collection:
    if "c" not in _FILTER_COLL:
        _FILTER_COLL["c"] = _coll(factory.mktemp("flt"), n=24)[0]
    return _FILTER_COLL["c"]


def test_filtered_search_on_postgresql_matches_sqlite(tmp_path, postgres_db):
    local, _, pool = _coll(tmp_path / "a")
    shared, _, _ = _coll(tmp_path / "b", location=f"{tmp_path}/b?catalog={postgres_db}#flt")
    assert shared.catalog.dialect == "postgresql" and not (tmp_path / "b" / CATALOG_FILE).exists()
    for flt in ({"group": 1}, {"tag": ["a"], "nested.x": 2}, {"group": [0, 3], "tag": "b"}, {"missing": None}):
        a = Searcher(local, pool=pool).search(text="text number 5", k=50, target="text", filter=flt).hits
        b = Searcher(shared, pool=pool).search(text="text number 5", k=50, target="text", filter=flt).hits
        assert [h.id for h in a] == [h.id for h in b] and a, flt
        assert all(matches_filter(h.metadata, flt) for h in a)


def test_hit_table_names_rows_across_gaps_and_extensions():
    t = HitTable()
    t.extend([(1, "a", "{}"), (4, "dé", '{"x": 1}')])  # rids 2 and 3 were deleted before they were read
    t.extend([(9, "z", "[]")])
    assert t.last == 9
    assert t.get([1, 2, 4, 9, 10, 0, -3]) == {1: ("a", "{}"), 4: ("dé", '{"x": 1}'), 9: ("z", "[]")}
    assert t.fields([9, 1, 4]) == ["z", "[]", "a", "{}", "dé", '{"x": 1}']  # in the order asked
    assert t.fields([1, 2]) is None and t.fields([10]) is None and t.fields([]) == []


def test_hit_table_names_a_record_that_breaks_the_separator_rule_one_by_one():
    """A record holding the separator in its metadata (no writer of ours makes one: JSON escapes
    control characters) is still named right: the joined split does not line up, so each record
    is split alone."""
    t = HitTable()
    t.extend([(1, "a", '{"k": "x\x1fy"}'), (2, "b", "{}")])
    assert t.get([2, 1]) == {2: ("b", "{}"), 1: ("a", '{"k": "x\x1fy"}')}
    assert t.fields([1, 2]) == ["a", '{"k": "x\x1fy"}', "b", "{}"]
    assert t.get([2]) == {2: ("b", "{}")} and t.get([]) == {} and t.get([5]) == {}


def test_a_hit_deleted_after_the_snapshot_is_left_out_and_the_ranks_close_up(tmp_path, monkeypatch):
    """A reader's snapshot may still serve an item deleted since, whose record the hit table (read
    after the delete) does not hold: the one-query path then names its hits row by row, leaving
    that item out, with ranks 1..n as ever."""
    c, enc, pool = _coll(tmp_path, n=12)
    old = c.snapshot()
    c.delete(["t5"])
    monkeypatch.setattr(c, "snapshot", lambda: old)  # a reader still on the snapshot before the delete
    s = Searcher(c, pool=pool)
    hits = s.search(text="text number 5", k=12, target="text").hits
    assert "t5" not in [h.id for h in hits] and len(hits) == 11
    assert [h.rank for h in hits] == list(range(1, 12)) and hits[0].metadata["group"] in (0, 1, 2, 3)
    served = [r for r in old.views("text")[enc.space_id].rids.tolist() if r]  # t5's row included
    named = old.hits(served)
    assert len(named) == len(served) - 1 and old.hit_fields(served) is None
    assert old.hit_fields([r for r in served if r in named])[0::2] == [named[r][0] for r in served if r in named]


def test_a_snapshot_never_changes_under_its_reader(tmp_path):
    c, enc, pool = _coll(tmp_path)
    snap = c.snapshot()
    view = snap.views("text")[enc.space_id]
    rids = view.rids.copy()
    c.delete(["t3"])
    add_items(c, enc, [text_item("a late text", id="late")], progress=False)
    assert np.array_equal(view.rids, rids) and snap.item_count("text") == 40
    new = c.snapshot()
    assert new is not snap and new.item_count("text") == 40 and new.views("text")[enc.space_id].count == 40
    ids = {h.id for h in Searcher(c, pool=pool).search(text="a late text", k=50, target="text").hits}
    assert "late" in ids and "t3" not in ids


def test_rows_a_store_gained_after_the_snapshot_are_never_returned(tmp_path, monkeypatch):
    """A backfill stores its vectors before its catalog commit: a reader whose snapshot is older
    (the store refreshed meanwhile, by anyone) searches only the rows its snapshot serves."""
    c, enc, pool = _coll(tmp_path, n=12)
    monkeypatch.setattr(Collection, "RECHECK_S", 3600.0)
    s = Searcher(c, pool=pool)
    before = [h.id for h in s.search(text="text number 4", k=20, target="text").hits]
    g = c.gallery(enc.space_id)
    keys = [f"stray{i}" for i in range(30)]
    g.add("text", keys, enc.encode_texts(["text number 4"] * 30), space_id=enc.space_id)
    g.refresh()
    assert [h.id for h in s.search(text="text number 4", k=20, target="text").hits] == before


def test_a_commit_of_another_process_is_seen(tmp_path):
    c, enc, pool = _coll(tmp_path)
    s = Searcher(c, pool=pool)
    assert "t5" in {h.id for h in s.search(text="text number 5", k=3, target="text").hits}
    code = ("import sys\nfrom nobackfill.collection.collection import Collection\n"
            f"Collection.open(sys.argv[1]).delete(['t5'])\n")
    subprocess.run([sys.executable, "-c", code, str(c.path)], check=True, timeout=120)
    import time

    time.sleep(2 * Collection.RECHECK_S)
    assert "t5" not in {h.id for h in s.search(text="text number 5", k=3, target="text").hits}


def test_verify_runs_the_databases_own_check_and_the_catalogs_invariants(tmp_path):
    c, enc, _ = _coll(tmp_path)
    assert not c.verify()
    conn = sqlite_catalog(tmp_path / "c" / CATALOG_FILE)._connect()
    conn.execute("UPDATE header SET n_text = n_text + 1")  # a header that lies about the items
    conn.close()
    problems = Collection.open(c.path).verify()
    assert any("header says 41 text items" in p for p in problems)


def test_a_repaired_store_is_served_again_from_its_new_rows(tmp_path):
    """``verify --repair`` drops a damaged chunk: later rows move down, and the catalog's serving
    rows are worked out again, so every hit still names the right item."""
    from typer.testing import CliRunner

    from nobackfill.cli import app

    enc = HashEncoder(16, "rep")
    c = Collection.create(tmp_path / "c", space_id=enc.space_id, dim=16, model=OLD_REF, modalities=["text"])
    for part in range(3):  # three chunks
        add_items(c, enc, [text_item(f"part {part} text {i}", id=f"p{part}-{i}") for i in range(5)], progress=False)
    g = c.gallery(enc.space_id)
    npz = g.path / g.manifest["modalities"]["text"]["chunks"][0]["npz"]
    npz.write_bytes(npz.read_bytes()[:-20])
    r = CliRunner().invoke(app, ["verify", str(c.path), "--repair", "--json"])
    rep = json.loads(r.stdout)
    assert rep["ok"] and any("5 item(s) have no vector" in a for a in rep["advice"]), r.stdout
    again = Collection.open(c.path)
    hits = Searcher(again, pool=pool_with((OLD_REF, enc))).search(text="part 2 text 3", k=20, target="text").hits
    assert hits[0].id == "p2-3" and len(hits) == 10 and all(h.id.startswith(("p1", "p2")) for h in hits)
    assert again.status()["unserved"] == 5


def test_a_catalog_that_is_not_ours_is_named(tmp_path):
    import sqlite3

    (tmp_path / "c").mkdir()
    conn = sqlite3.connect(tmp_path / "c" / CATALOG_FILE)
    conn.execute("CREATE TABLE header (x)")
    conn.close()
    with pytest.raises((CatalogError, Exception), match=CATALOG_FILE):
        Collection.open(tmp_path / "c")


def test_the_cli_takes_a_collection_uri_as_written(tmp_path, postgres_db):
    """A collection argument is a URI, not a path: ``postgresql://`` keeps its two slashes (a path
    would fold them, and the catalog would not be found)."""
    from pathlib import Path

    from typer.testing import CliRunner

    from nobackfill.cli import app

    uri = f"{tmp_path}/c?catalog={postgres_db}#cli"
    model = Path(__file__).resolve().parents[1] / "models" / "world-old"
    r = CliRunner().invoke(app, ["collection", "create", uri, "--model", str(model)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["collection", "status", uri, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["catalog"] == "postgresql" and not (tmp_path / "c" / CATALOG_FILE).exists()


def test_a_milvus_uri_names_its_postgresql_catalog_by_its_fragment():
    """Two Milvus collections in one PostgreSQL database have a catalog each (docs/milvus.md: the
    collection's name in the database is the URI's #NAME); a catalog URL naming its own wins."""
    from nobackfill.collection.uri import parse_uri

    pg = "postgresql://nb@127.0.0.1:5432/nb"
    a = parse_uri(f"milvus://127.0.0.1:19530/default#photos?catalog={pg}")[1]
    b = parse_uri(f"milvus://127.0.0.1:19530#products?catalog={pg}")[1]
    assert (a["name"], a["catalog"]) == ("photos", f"{pg}#photos") and b["catalog"] == f"{pg}#products"
    assert parse_uri(f"milvus://127.0.0.1:19530?catalog={pg}")[1]["catalog"] == f"{pg}#default"
    assert parse_uri(f"milvus-lite:/d/m.db#x?catalog={pg}")[1]["catalog"] == f"{pg}#x"
    assert parse_uri(f"milvus://h:1#photos?catalog={pg}#shared")[1]["catalog"] == f"{pg}#shared"
    assert parse_uri(f"/data/c?catalog={pg}#c")[1]["catalog"] == f"{pg}#c"
    # a folder named in the Milvus URIs' order (trial AH: a folder 'c#shop' and a collection 'default')
    assert parse_uri(f"/data/c#shop?catalog={pg}")[1] == {"path": "/data/c", "catalog": f"{pg}#shop"}
    assert parse_uri("/data/c#shop")[1] == {"path": "/data/c#shop"}  # no catalog: a folder's own name
    with pytest.raises(ValueError, match="name the collection once"):
        parse_uri(f"/data/c#shop?catalog={pg}#other")
    with pytest.raises(ValueError, match=r"milvus-lite database is a file whose name ends in \.db, got '/tmp/x'"):
        parse_uri("milvus-lite:/tmp/x#y")  # refused before pymilvus sees it (its own error is a traceback)


def test_opening_a_missing_milvus_lite_database_creates_nothing(tmp_path):
    """A read (status, search) of a milvus-lite path with no database there is 'not a collection', and
    leaves no database behind (milvus-lite makes one on connecting)."""
    from nobackfill.collection.collection import Collection

    with pytest.raises(Exception, match="is not a collection"):
        Collection.open(f"milvus-lite:{tmp_path}/nope.db#y")
    assert list(tmp_path.iterdir()) == []


_SOURCES = [  # (modality, source JSON as stored, unsourced?)
    ("image", '{"path":"/data/a.jpg"}', False), ("image", '{"path":""}', True), ("image", "{}", True),
    ("image", '{"path":null}', True), ("image", '{"path":"","url":"https://x/a.jpg"}', True),
    ("image", '{"url":"path"}', True), ("image", '{"note":"\\"path\\":","url":"u"}', True),
    ("image", '{"path": ""}', True), ("image", '{"path": "/b.jpg", "url": ""}', False),
    ("image", '{"other":{"path":"/c.jpg"}}', True), ("image", '{"path":"/nullable.jpg"}', False),
    ("text", '{"text":"a cat"}', False), ("text", '{"text":""}', True), ("text", "{}", True),
    ("text", '{"text": null}', True), ("text", '{"text":"\\"\\" quoted"}', False), ("text", '{"path":"/d.jpg"}', True),
]


def test_items_without_a_source_are_counted_through_their_index_whatever_json_wrote_them(tmp_path):
    c = Collection.create(tmp_path / "c", space_id="s", dim=8, model=OLD_REF)
    rows = [(f"i{j}", m, f"i{j}", src, "{}") for j, (m, src, _) in enumerate(_SOURCES)]
    c.commit_rows(rows)  # (older catalogs hold JSON with spaces after the colons: written as such here)
    want = {f"i{j}" for j, (_, _, unsourced) in enumerate(_SOURCES) if unsourced}
    got = {r[0] for r in c.catalog.query(f"SELECT id FROM items WHERE {unsourced_sql('sqlite')}")}
    assert got == want and sum(c.count_unsourced().values()) == len(want)
    plan = " ".join(str(r) for r in c.catalog.query(f"EXPLAIN QUERY PLAN SELECT space, modality FROM items WHERE "
                                                    f"{unsourced_sql('sqlite')}"))
    assert UNSOURCED_INDEX["sqlite"] in plan


#: the partial indexes of unsourced items that older versions made (their names, their conditions)
_OLDER_UNSOURCED = {
    "items_unsourced": "((modality = 'image' AND coalesce(json_extract(source, '$.path'), '') = '') OR "
                       "(modality = 'text' AND coalesce(json_extract(source, '$.text'), '') = ''))",
    "items_unsourced_v2": "((modality = 'image' AND (substr(source, 1, 9) <> '{\"path\":\"' OR "
                          "substr(source, 10, 1) = '\"') AND coalesce(json_extract(source, '$.path'), '') = '') OR "
                          "(modality = 'text' AND (substr(source, 1, 9) <> '{\"text\":\"' OR "
                          "substr(source, 10, 1) = '\"') AND coalesce(json_extract(source, '$.text'), '') = ''))"}


@pytest.mark.parametrize("older", sorted(_OLDER_UNSOURCED))
def test_a_catalog_with_older_indexes_gets_this_versions_at_its_first_write(tmp_path, older):
    c = Collection.create(tmp_path / "c", space_id="s", dim=8, model=OLD_REF)
    c.commit_rows([("a", "image", "a", '{"path":""}', "{}"), ("b", "image", "b", '{"path":"/b.jpg"}', "{}"),
                   ("u", "image", "u", '{"path":"","url":"https://x/u.jpg"}', "{}")])
    db = sqlite3.connect(tmp_path / "c" / CATALOG_FILE)  # the catalog as an older nobackfill left it
    db.execute(f"DROP INDEX {UNSOURCED_INDEX['sqlite']}")
    db.execute(f"CREATE INDEX {older} ON items (modality) WHERE {_OLDER_UNSOURCED[older]}")
    db.execute("CREATE INDEX items_key ON items (key)")
    db.commit()
    db.close()
    c = Collection.open(tmp_path / "c")
    assert sum(c.count_unsourced().values()) == 2  # read before any write: right, through the older index or a scan
    c.commit_rows([("c", "text", "c", '{"text":""}', "{}")])
    names = {r[0] for r in c.catalog.query("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert UNSOURCED_INDEX["sqlite"] in names and not names & {*_OLDER_UNSOURCED, "items_key"}
    assert sum(c.count_unsourced().values()) == 3 and not c.verify()


_PLAIN_UNSOURCED = _OLDER_UNSOURCED["items_unsourced"]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "x", '"', "path", "null"]),
    lambda kids: st.lists(kids, max_size=2) | st.dictionaries(st.sampled_from(["path", "text", "url", "a"]), kids,
                                                              max_size=2), max_leaves=4)


@settings(max_examples=200, deadline=None)
@given(sources=st.lists(st.tuples(st.sampled_from(["image", "text"]),
                                  st.dictionaries(st.sampled_from(["path", "text", "url", "other", "a"]), _json_values,
                                                  max_size=3), st.booleans()), min_size=1, max_size=8))
def test_the_text_test_of_unsourced_items_never_changes_the_answer_of_the_json(sources):
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE items (id INTEGER, modality TEXT, source TEXT)")
    db.executemany("INSERT INTO items VALUES (?, ?, ?)",
                   [(j, m, row_json(src) if ours else json.dumps(src)) for j, (m, src, ours) in enumerate(sources)])
    fast = {r[0] for r in db.execute(f"SELECT id FROM items WHERE {unsourced_sql('sqlite')}")}
    plain = {r[0] for r in db.execute(f"SELECT id FROM items WHERE {_PLAIN_UNSOURCED}")}
    assert fast == plain


def test_hit_table_grows_past_its_buffers_and_old_views_stay_valid():
    """Thousands of rows in several extends (with gaps) outgrow the initial buffers; a reader that
    took the table's view before a growth still reads what it saw."""
    t = HitTable()
    model: dict[int, tuple[str, str]] = {}
    rid = 0
    for part in range(4):
        rows = []
        for i in range(1500):
            rid += 1 + (i % 7 == 0)  # every seventh rid was deleted before it was read
            rows.append((rid, f"item-{rid}-é", json.dumps({"part": part, "pad": "x" * (i % 50)})))
        before = t._view
        t.extend(rows)
        model.update((r, (i, m)) for r, i, m in rows)
        assert t._view is not before and t.last == rid
        if part == 0:
            first_view, first_model = t._view, dict(model)
    assert t.get(range(rid + 2)) == model
    assert t.get([rid + 1, 0, -1]) == {}
    reader = HitTable()
    reader._view = first_view  # a reader holding the view taken before three growths
    assert reader.get(range(rid + 2)) == first_model


def test_checkpoints_apart_copy_the_log_in_a_thread_and_restore_sqlites_own(tmp_path):
    """Inside ``checkpoints_apart`` commits do not checkpoint themselves: a thread does, woken by
    each commit, so the database file grows while the writer goes on; at the end the log is
    checkpointed, commits checkpoint themselves again, and every row is there."""
    import time

    c, enc, pool = _coll(tmp_path, n=4)
    cat = c.catalog
    db = tmp_path / "c" / CATALOG_FILE
    assert db.is_file()
    size0 = db.stat().st_size
    with cat.checkpoints_apart():
        with cat.checkpoints_apart():  # nested: the outer one runs the thread
            assert cat._write_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
            add_items(c, enc, [text_item(f"bulk text {i}", id=f"b{i}") for i in range(300)], progress=False)
            deadline = time.monotonic() + 30
            while db.stat().st_size <= size0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert db.stat().st_size > size0  # the thread copied pages into the database file
    assert cat._committed is None
    assert cat._write_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    busy, log, done = cat._write_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and log == done  # nothing left in the log that is not in the database
    assert len(Collection.open(tmp_path / "c")) == 304


def _terminate_sessions(url: str, admin_url: str) -> int:
    """``pg_terminate_backend`` of every other session of ``url``'s database (what a PostgreSQL
    restart does to a client's kept connections); how many were ended."""
    import psycopg

    db = url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        n = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s "
                         "AND pid <> pg_backend_pid()", (db,)).fetchone()[0]
    return int(n)


def test_a_kept_postgresql_connection_the_server_closed_is_replaced_and_the_call_goes_through(tmp_path, postgres_db,
                                                                                              postgres_url):
    """trial Z: after a PostgreSQL restart, a running serve answered its first call with 503
    "stopped answering (AdminShutdown ...)" though the database was up again. A kept connection the
    server closed is replaced and the read, or a transaction not begun yet, runs on the new one."""
    c, _, _ = _coll(tmp_path, n=4, location=f"{tmp_path}/c?catalog={postgres_db}#kept")
    cat = c.catalog
    generation = cat.generation()
    cat.write_doc("probe", b"1")  # a read and a write connection are kept
    assert cat._read_conn is not None and cat._write_conn is not None
    assert _terminate_sessions(postgres_db, postgres_url) >= 2
    assert cat.header()["name"] == "c" and cat.generation() == generation  # a read
    assert _terminate_sessions(postgres_db, postgres_url) >= 1
    cat.write_doc("probe", b"2")  # a write transaction
    assert cat.read_doc("probe") == b"2"
    assert _terminate_sessions(postgres_db, postgres_url) >= 2
    with cat.reading():  # a read transaction
        assert cat.read_doc("probe") == b"2"
    assert _terminate_sessions(postgres_db, postgres_url) >= 1
    assert Collection.open(f"{tmp_path}/c?catalog={postgres_db}#kept").status()["items"]["text"] == 4


def test_a_read_inside_a_transaction_is_not_run_again_on_another_connection(tmp_path, postgres_db, postgres_url):
    """A snapshot is its connection's: a connection lost inside ``reading()`` is the catalog
    unreachable (run again), not a read of another state; the next call works."""
    from nobackfill.catalog.schema import CatalogUnreachable

    c, _, _ = _coll(tmp_path, n=2, location=f"{tmp_path}/c?catalog={postgres_db}#snap")
    cat = c.catalog
    cat.generation()
    with pytest.raises(CatalogUnreachable, match="stopped answering"):
        with cat.reading():
            cat.generation()
            _terminate_sessions(postgres_db, postgres_url)
            cat.generation()
    assert cat.generation()[0] >= 1


def test_a_catalog_that_stopped_answering_is_one_line(tmp_path, postgres_db, postgres_url):
    """trial Z: libpq's message holds a newline and a tab ("... Connection refused\\n\\tIs the server
    running ..."): the error line we build quotes it on one line, for PostgreSQL as for Milvus."""
    import psycopg

    from nobackfill.catalog.schema import CatalogUnreachable, catalog_error, milvus_lost_message

    c, _, _ = _coll(tmp_path, n=2, location=f"{tmp_path}/c?catalog={postgres_db}#gone")
    cat = c.catalog
    cat.generation()
    cat._connect = lambda: psycopg.connect("postgresql://nobackfill@127.0.0.1:1/nobackfill", connect_timeout=5)
    _terminate_sessions(postgres_db, postgres_url)  # the kept connection is gone, and no new one can be made
    with pytest.raises(CatalogUnreachable) as e:
        cat.generation()
    msg = str(e.value)
    assert "\n" not in msg and "\t" not in msg and "  " not in msg, msg
    assert msg.startswith(f"the catalog {cat.location} stopped answering (OperationalError: ") and \
        "Is the server running" in msg and msg.endswith("run the same command again once it answers"), msg
    with pytest.raises(CatalogUnreachable) as e:
        with cat.writing():
            pass
    assert "\n" not in str(e.value) and "Is the server running" in str(e.value)

    class OperationalError(Exception):
        __module__ = "psycopg"

    class MilvusException(Exception):
        __module__ = "pymilvus.exceptions"

    one = catalog_error(OperationalError("connection failed: refused\n\tIs the server running?"), "pg#x")
    assert str(one).startswith("the catalog pg#x stopped answering (OperationalError: connection failed: refused Is "
                               "the server running?); ")
    assert "\n" not in milvus_lost_message(MilvusException("Fail connecting to server\n\ton h:1"))
    assert "\n" not in str(catalog_error(MilvusException("collection\nnot loaded"), "x"))
    assert "\n" not in str(catalog_error(RuntimeError("two\nlines"), "x"))
