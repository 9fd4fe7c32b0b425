"""Collections: items with stable ids in several spaces, deletes and upserts, atomic commits, legacy
galleries, and the search invariants (each item at most once, deleted never)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _collection_helpers import NEW_REF, OLD_REF, HashEncoder, make_folder, pool_with, related_pair, \
    write_procrustes_upgrade
from nobackfill.data.folder import DataFormatError
from nobackfill.gallery import Gallery, build_gallery
from nobackfill.collection.collection import (CATALOG_FILE, COLLECTION_FILE, Collection, CollectionBusyError,
                                              CorruptCollectionError, ItemNotFoundError, NotACollectionError)
from nobackfill.collection.ingest import add_items, folder_items, text_file_items, text_item
from nobackfill.gallery.types import DuplicateIdError, SpaceMismatchError
from nobackfill.search import Searcher
from nobackfill.lifecycle.plan_changes import UpgradeRefused, upgrade_collection


def _new_collection(path: Path, enc: HashEncoder, ref: str = OLD_REF) -> Collection:
    return Collection.create(path, space_id=enc.space_id, dim=enc.embed_dim, model=ref, name=enc.name,
                             modalities=enc.modalities)


def _setup(tmp_path: Path, **folder_kw):
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", **folder_kw)
    c = _new_collection(tmp_path / "c", old)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    return c, old, new, w, data, pool


# ----------------------------------------------------------------------------- items and ids
def test_add_folder_counts_and_readd_is_a_no_op(tmp_path):
    c, old, _, _, data, _ = _setup(tmp_path, n_images=5, captions_per_image=2, extra_images=2)
    fi = folder_items(data)
    assert fi.count("image") == 7 and fi.count("text") == 10 and fi.uncaptioned == 2
    rep = add_items(c, old, fi.items, progress=False)
    assert rep.added == 17 and c.count("image") == 7 and c.count("text") == 10
    calls = old.calls
    again = add_items(c, old, folder_items(data).items, progress=False)
    assert again.added == 0 and again.unchanged == 17
    assert old.calls == calls  # nothing embedded
    assert Collection.open(c.path).count() == 17


def test_ids_are_stable_when_a_line_is_inserted_at_the_top(tmp_path):
    data = make_folder(tmp_path / "d", n_images=3)
    before = {it.id: it.key for it in folder_items(data).items}
    lines = (data / "captions.jsonl").read_text().splitlines()
    new = json.dumps({"image": "images/001.png", "caption": "a brand new first line", "lang": "en"})
    (data / "captions.jsonl").write_text("\n".join([new] + lines) + "\n")
    after = {it.id: it.key for it in folder_items(data).items}
    assert set(before) < set(after) and len(after) == len(before) + 1
    assert all(after[i] == k for i, k in before.items())


def test_own_id_field_and_uncaptioned_only_folder(tmp_path):
    d = tmp_path / "photos"
    make_folder(d, n_images=0, extra_images=4)
    (d / "captions.jsonl").unlink()
    fi = folder_items(d)
    assert fi.count("image") == 4 and fi.uncaptioned == 4
    d2 = make_folder(tmp_path / "d2", n_images=1, captions_per_image=1)
    rec = json.loads((d2 / "captions.jsonl").read_text())
    rec["id"] = "my-caption-7"
    (d2 / "captions.jsonl").write_text(json.dumps(rec) + "\n")
    assert {it.id for it in folder_items(d2).items if it.modality == "text"} == {"my-caption-7"}


def test_truncated_image_stream_is_named_or_skipped(tmp_path):
    d = make_folder(tmp_path / "d", n_images=0, extra_images=3)
    (d / "captions.jsonl").unlink()
    bad = d / "images" / "001.png"
    raw = bad.read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataFormatError, match="001.png"):
        folder_items(d)
    fi = folder_items(d, skip_bad=True)
    assert fi.count("image") == 2 and fi.skipped == 1


def test_upsert_reembeds_changed_content_and_metadata_only_changes_do_not(tmp_path):
    c, old, _, _, _, _ = _setup(tmp_path)
    add_items(c, old, [text_item("first text", id="t1", metadata={"v": 1})], progress=False)
    key1 = c.get("t1").key
    calls = old.calls
    rep = add_items(c, old, [text_item("first text", id="t1", metadata={"v": 2})], progress=False)
    assert rep.metadata_updated == 1 and old.calls == calls and c.get("t1").metadata["v"] == 2
    rep = add_items(c, old, [text_item("edited text", id="t1"), text_item("another", id="t2")], progress=False)
    assert rep.added == 2 and rep.replaced == 1 and c.get("t1").key != key1  # the upsert is counted as such
    hits = Searcher(c, pool=pool_with((OLD_REF, old))).search(text="edited text", k=5, target="text").hits
    assert [h.id for h in hits] == ["t1", "t2"] and hits[0].metadata["text"] == "edited text"


def test_duplicate_id_with_other_content_is_refused_before_writing(tmp_path):
    c, old, _, _, _, _ = _setup(tmp_path)
    with pytest.raises(DuplicateIdError, match="'x'"):
        add_items(c, old, [text_item("a", id="x"), text_item("b", id="x")], progress=False)
    assert c.count() == 0 and c.generation == 0


def test_an_id_held_by_the_other_modality_is_refused_before_writing(tmp_path):
    """An upsert replaces content of its own modality; an image's id never silently becomes a
    caption's (its captions' ``image_id`` would point at a text), nor a caption's an image's."""
    from nobackfill.collection.ingest import image_item

    c, old, _, _, data, _ = _setup(tmp_path, n_images=2, captions_per_image=1)
    add_items(c, old, folder_items(data).items, progress=False)
    image = next(i for i, it in c.items().items() if it.modality == "image")
    caption = next(i for i, it in c.items().items() if it.modality == "text")
    png = next(p for p in (data / "images").iterdir())
    gen, before = c.generation, {i: (it.modality, it.key) for i, it in c.items().items()}
    with pytest.raises(DuplicateIdError, match=f"id '{image}' already holds a stored image item, not a text"):
        add_items(c, old, [text_item("new words", id="fresh"), text_item("a caption now", id=image)], progress=False)
    with pytest.raises(DuplicateIdError, match=f"id '{caption}' already holds a stored text item"):
        add_items(c, old, [image_item(png, id=caption)], progress=False)
    assert c.generation == gen and {i: (it.modality, it.key) for i, it in c.items().items()} == before


def test_wrong_model_and_text_only_model_are_refused_before_writing(tmp_path):
    c, old, new, _, data, _ = _setup(tmp_path)
    with pytest.raises(SpaceMismatchError, match="current model"):
        add_items(c, new, folder_items(data).items, progress=False)
    txt = HashEncoder(8, "txt", modalities=("text",), name="text-only")
    ct = _new_collection(tmp_path / "ct", txt, ref="/fake/txt")
    with pytest.raises(ValueError, match="embeds only text: cannot add image items"):
        add_items(ct, txt, folder_items(data).items, progress=False)
    assert ct.count() == 0 and c.count() == 0


def test_delete_is_final_and_unknown_ids_are_named(tmp_path):
    c, old, _, _, data, _ = _setup(tmp_path)
    add_items(c, old, folder_items(data).items, progress=False)
    victim = next(i for i, it in c.items().items() if it.modality == "image")
    c.delete([victim])
    s = Searcher(c, pool=pool_with((OLD_REF, old)))
    for q in ["caption 0 of image 1 seed 0", "caption 1 of image 3 seed 0"]:
        assert victim not in {h.id for h in s.search(text=q, k=100).hits}
    gen = c.generation
    with pytest.raises(ItemNotFoundError, match="no item with id 'nope'"):
        c.delete(["nope"])
    assert c.generation == gen  # nothing written
    with pytest.raises(ItemNotFoundError):
        c.get(victim)


def test_text_file_items(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"text": "one", "id": "a", "lang": "en"}\n\n{"text": "two"}\n')
    items = text_file_items(f)
    assert [i.id for i in items][0] == "a" and items[0].metadata["lang"] == "en" and len(items) == 2
    f.write_text('{"txt": "one"}\n')
    with pytest.raises(DataFormatError, match="line 1"):
        text_file_items(f)
    png = tmp_path / "q.png"  # a binary file given as texts: an error naming it, not a codec's
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(DataFormatError, match=r"q\.png: not UTF-8 text"):
        text_file_items(png)


# ----------------------------------------------------------------------------- storage
def test_open_errors_name_the_directory(tmp_path):
    with pytest.raises(NotACollectionError, match="no such directory"):
        Collection.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotACollectionError, match="collection create"):
        Collection.open(tmp_path / "empty")
    (tmp_path / "notes.jsonl").write_text("{}\n")  # a file: said so, and a create there refused untouched
    with pytest.raises(NotACollectionError, match="it is a file; a collection is a directory"):
        Collection.open(tmp_path / "notes.jsonl")
    with pytest.raises(FileExistsError, match="notes.jsonl is a file; a collection is a directory"):
        Collection.create(tmp_path / "notes.jsonl", model="m", space_id="s", dim=4)
    assert (tmp_path / "notes.jsonl").read_text() == "{}\n"
    c, old, *_ = _setup(tmp_path)
    with pytest.raises(FileExistsError):
        _new_collection(c.path, old)


def _as_format_1(root: Path) -> None:
    """Rewrite the collection at ``root`` in the previous format: ``collection.json`` + one log chunk
    (what nobackfill wrote before the catalog), the catalog removed."""
    import hashlib
    import json

    c = Collection.open(root)
    events = "".join(json.dumps({"op": "put", "item": it.to_json()}, sort_keys=True) + "\n"
                     for it in c.items().values()).encode()
    (root / "log").mkdir()
    (root / "log" / "00000001.jsonl").write_bytes(events)
    manifest = {"format": "nobackfill-collection", "version": 1, "name": c.name, "backend": c.backend,
                "created": "2026-01-01T00:00:00+00:00", "updated": "2026-01-01T00:00:00+00:00", "generation": 1,
                "log": [{"file": "log/00000001.jsonl", "count": len(c), "sha256": hashlib.sha256(events).hexdigest()}],
                "plan": c.plan.to_json()}
    (root / "collection.json").write_text(json.dumps(manifest))
    c.catalog.close()
    for p in root.glob(CATALOG_FILE + "*"):
        p.unlink()


def test_a_collection_of_the_previous_format_is_converted_once_and_keeps_its_results(tmp_path):
    c, old, _, _, data, pool = _setup(tmp_path)
    add_items(c, old, folder_items(data).items, progress=False)
    c.delete([next(iter(c.items()))])
    s = Searcher(c, pool=pool_with((OLD_REF, old)))
    queries = ["caption 0 of image 1 seed 0", "caption 1 of image 3 seed 0"]
    before = [[(h.id, round(h.score, 5)) for h in s.search(text=q, k=8).hits] for q in queries]
    items = {i: it.to_json() for i, it in c.items().items()}
    _as_format_1(c.path)
    again = Collection.open(c.path)
    assert (c.path / CATALOG_FILE).is_file() and (c.path / "collection.json.v1").is_file()
    assert not (c.path / "collection.json").exists() and (c.path / "log").is_dir()  # kept, set aside
    assert {i: it.to_json() for i, it in again.items().items()} == items
    s = Searcher(again, pool=pool_with((OLD_REF, old)))
    assert [[(h.id, round(h.score, 5)) for h in s.search(text=q, k=8).hits] for q in queries] == before
    assert not again.verify()


def test_a_damaged_log_chunk_of_the_previous_format_is_named_and_nothing_is_converted(tmp_path):
    c, old, _, _, data, _ = _setup(tmp_path)
    add_items(c, old, folder_items(data).items, progress=False)
    _as_format_1(c.path)
    chunk = c.path / "log" / "00000001.jsonl"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptCollectionError, match=chunk.name):
        Collection.open(c.path)
    assert not (c.path / CATALOG_FILE).exists() and (c.path / "collection.json").is_file()


def test_a_damaged_catalog_is_named_by_open_or_verify(tmp_path):
    c, old, _, _, data, _ = _setup(tmp_path)
    add_items(c, old, folder_items(data).items, progress=False)
    c.catalog.close()
    db = c.path / CATALOG_FILE
    import sqlite3

    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    raw = bytearray(db.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    db.write_bytes(bytes(raw))
    try:
        problems = Collection.open(c.path).verify()
    except CorruptCollectionError as e:
        problems = [str(e)]
    assert problems and any(CATALOG_FILE in p for p in problems)


def test_busy_ingest_lock_names_the_holder(tmp_path):
    c, old, _, _, data, _ = _setup(tmp_path)
    with c.ingesting():
        other = Collection.open(c.path)
        with pytest.raises(CollectionBusyError, match=f"process {os.getpid()}.*--wait"):
            add_items(other, old, folder_items(data).items, progress=False)
    assert add_items(Collection.open(c.path), old, folder_items(data).items, progress=False).added > 0


def test_a_busy_collection_names_no_exited_process(tmp_path):
    """The holder's record can be an earlier holder's (the new one has the lock, not yet its record):
    a process of this host that has exited is not named as the one adding items (trial M #10)."""
    import socket
    import subprocess
    import sys

    c, old, _, _, data, _ = _setup(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with c.ingesting():
        c.catalog.write_doc("locks/ingest.holder", json.dumps(
            {"pid": int(gone.stdout), "host": socket.gethostname(), "since": "2026-01-01T00:00:00+00:00"}).encode())
        with pytest.raises(CollectionBusyError, match="busy: another process is adding items") as e:
            add_items(Collection.open(c.path), old, folder_items(data).items, progress=False)
        assert gone.stdout.strip() not in str(e.value) and "wait=True" in str(e.value)


def test_legacy_gallery_opens_as_a_one_space_collection(tmp_path):
    old, _, _ = related_pair()
    data = make_folder(tmp_path / "d", n_images=4)
    ds_images = sorted((data / "images").glob("*.png"))
    g = build_gallery(old, tmp_path / "g", images=[(f"img:{p.name}", p) for p in ds_images],
                      texts=[("txt:1", "hello world", {}), ("txt:2", "another text", {})], model_ref=OLD_REF,
                      progress=False)
    files = sorted(p.relative_to(g.path) for p in g.path.rglob("*"))
    from nobackfill.lifecycle.backfill import backfill_status

    c = Collection.open(g.path)
    assert c.is_legacy_gallery and c.count("image") == 4 and c.count("text") == 2
    assert backfill_status(c)["state"] == "none" and c.status()  # reads: trial AE saw a .backfill-lock made
    assert sorted(p.relative_to(g.path) for p in g.path.rglob("*")) == files
    s = Searcher(c, pool=pool_with((OLD_REF, old)))
    assert s.search(text="hello world", k=1, target="text").hits[0].id == "txt:1"
    c.delete(["txt:2"])  # the first write makes it a collection; the gallery stays valid
    assert (g.path / COLLECTION_FILE).is_file() and not Collection.open(g.path).is_legacy_gallery
    assert Collection.open(g.path).count("text") == 1
    assert Gallery.open(g.path).count("text") == 2 and Gallery.open(g.path).verify().ok


# ----------------------------------------------------------------------------- upgrades
def test_upgrade_serves_old_items_through_the_bridge_and_new_items_natively(tmp_path):
    c, old, new, w, data, pool = _setup(tmp_path, n_images=4)
    add_items(c, old, folder_items(data).items, progress=False)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    before = {i: it.key for i, it in c.items().items()}
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    assert c.current_space == new.space_id and {i: it.key for i, it in c.items().items()} == before
    assert c.status()["spaces"][new.space_id]["image"] == 0  # nothing re-embedded
    add_items(c, new, [text_item("a text added after the upgrade", id="late")], progress=False)
    s = Searcher(c, pool=pool)
    hits = s.search(text="a text added after the upgrade", k=3, target="text").hits
    assert hits[0].id == "late" and hits[0].route == "native" and hits[0].space == new.space_id
    routes = {h.route for h in s.search(text="caption 0 of image 2 seed 0", k=30, target="text").hits}
    assert routes == {"native", "bridge"}
    q = "caption 1 of image 2 seed 0"
    top = s.search(text=q, k=1, target="text").hits[0]
    assert top.metadata["text"] == q and top.route == "bridge"  # the perfect bridge finds the exact caption


def test_upgrade_refusals_change_nothing(tmp_path):
    c, old, new, w, data, pool = _setup(tmp_path)
    plan = c.plan
    with pytest.raises(UpgradeRefused, match="already the current model"):
        upgrade_collection(c, OLD_REF, pool=pool)
    stranger = HashEncoder(16, "stranger")
    bad = write_procrustes_upgrade(tmp_path / "bad", w, stranger, old)
    with pytest.raises(UpgradeRefused, match="source space"):
        upgrade_collection(c, NEW_REF, bridges=[bad], pool=pool)
    assert c.plan == plan and not (c.path / "spaces" / new.space_id).exists()


# ----------------------------------------------------------------------------- the brute-force model
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "delete", "upgrade", "search"]),
                              st.integers(0, 11), st.integers(0, 3)), min_size=1, max_size=25))
def test_random_add_delete_upgrade_search_match_brute_force(tmp_path_factory, ops):
    """Every space here is an exact isometry of the old one (so are the bridges), so the brute-force
    score of an item is its old-space cosine wherever it lives; a raw merge must return the global
    top-k of the live items, each at most once, never a deleted one."""
    tmp = tmp_path_factory.mktemp("sm")
    old, new, w = related_pair(seed=1)
    q12 = np.linalg.qr(np.random.default_rng(5).standard_normal((16, 16)))[0][:12].astype(np.float32)
    newer = HashEncoder(16, "newer", base=old, mix=q12, name="newer")
    encs, refs = [old, new, newer], [OLD_REF, NEW_REF, "/fake/models/newer"]
    pool = pool_with(*zip(refs, encs))
    ups = [write_procrustes_upgrade(tmp / "u1", w, new, old), write_procrustes_upgrade(tmp / "u2", q12.T.copy(), newer, old)]
    c = _new_collection(tmp / "c", old)
    s = Searcher(c, pool=pool, merge="raw")
    live: dict[str, str] = {}
    level = 0
    for op, a, b in ops:
        if op == "add":
            text = f"text {a} version {b}"
            add_items(c, encs[level], [text_item(text, id=f"i{a}")], progress=False)
            live[f"i{a}"] = text
        elif op == "delete":
            if f"i{a}" in live:
                c.delete([f"i{a}"])
                del live[f"i{a}"]
            else:
                with pytest.raises(ItemNotFoundError):
                    c.delete([f"i{a}"])
        elif op == "upgrade" and level < 2:
            level += 1
            upgrade_collection(c, refs[level], bridges=[ups[level - 1]], pool=pool)
        elif op == "search" and live:
            q = f"text {a} version {b}"
            hits = s.search(text=q, k=5, target="text").hits
            ids = [h.id for h in hits]
            assert len(ids) == len(set(ids)) and set(ids) <= set(live)
            qv = old.encode_texts([q])[0]
            want = {i: float(qv @ old.encode_texts([t])[0]) for i, t in live.items()}
            assert len(hits) == min(5, len(live))
            assert np.allclose([h.score for h in hits], sorted(want.values(), reverse=True)[: len(hits)], atol=1e-5)
            assert all(abs(h.score - want[h.id]) < 1e-5 for h in hits)
    assert c.count("text") == len(live) and not c.verify()


# ----------------------------------------------------------------------------- kill trials
def _in_child(fn, kill_at: str | None) -> int:
    """Run ``fn`` in a forked child with the crash hook armed; its exit status (negative: signal)."""
    import nobackfill._atomic as atomic_files

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            atomic_files._WRITES = 0
            if kill_at is not None:
                os.environ["NOBACKFILL_TEST_KILL_AT_WRITE"] = kill_at
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _state(root: Path) -> dict:
    c = Collection.open(root)
    snap = c.snapshot()
    out = {"items": {i: (it.key, it.modality, dict(it.metadata)) for i, it in snap.items.items()},
           "current": c.current_space, "spaces": c.plan.space_ids,
           "upgrades": [u.path for u in c.plan.upgrades], "routes": c.plan.routes}
    for m in ("image", "text"):
        for sid, view in snap.views(m).items():
            vecs = np.asarray(view.gallery.vectors(m))[: len(view.mask)][view.mask]
            out[f"{sid}/{m}"] = sorted(zip([i for i in view.item_ids if i], vecs.round(6).tolist()))
    return out


@pytest.mark.slow
def test_sigkill_at_every_write_of_add_and_upgrade_leaves_a_clean_build(tmp_path):
    """SIGKILL just before and just after every atomic rename of ``add`` and of ``upgrade``; then
    the collection verifies, and finishing the job gives exactly the clean build."""
    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=3, captions_per_image=1, extra_images=1)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)

    def add(root: Path) -> None:
        c = Collection.open(root) if (root / COLLECTION_FILE).exists() else _new_collection(root, old)
        add_items(c, old, folder_items(data).items, chunk_size=2, progress=False)

    def upgrade(root: Path) -> None:
        c = Collection.open(root)
        if c.current_space != new.space_id:
            upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)

    add(tmp_path / "clean")
    upgrade(tmp_path / "clean")
    want = _state(tmp_path / "clean")
    add(tmp_path / "base")
    trials = 0
    for name, step in (("add", add), ("upgrade", upgrade)):
        n, finished = 0, False
        while not finished:
            n += 1
            for after in ("", "+"):
                root = tmp_path / f"{name}-{n}{after}"
                if name == "upgrade":
                    shutil.copytree(tmp_path / "base", root)
                status = _in_child(lambda: step(root), f"{n}{after}")
                if status == 0:
                    finished = True  # fewer writes than n: every point of this operation was tried
                    break
                assert status == -9
                trials += 1
                if (root / COLLECTION_FILE).exists():
                    assert not Collection.open(root).verify()
                if name == "add":
                    add(root)
                upgrade(root)
                assert _state(root) == want, f"{name} killed at write {n}{after}"
    print(f"kill trials: {trials}")
    assert trials >= 20


def test_index_and_collection_add_give_the_same_stable_ids(tmp_path):
    """``nobackfill index`` (a plain gallery) and ``collection add`` name items alike, so adding the
    folder again to the gallery opened as a collection embeds nothing."""
    from nobackfill.data.folder import load_pairs
    from nobackfill.collection.ingest import index_pairs

    old, _, _ = related_pair()
    data = make_folder(tmp_path / "d", n_images=3, captions_per_image=2)
    g = index_pairs(old, load_pairs(data), tmp_path / "g", model_ref=OLD_REF, progress=False)
    assert set(g.ids("image")) == {it.id for it in folder_items(data).items if it.modality == "image"}
    c = Collection.open(g.path)
    calls = old.calls
    rep = add_items(c, old, folder_items(data).items, progress=False)
    assert rep.added == 0 and rep.unchanged + rep.metadata_updated == 9 and old.calls == calls
    assert len(Searcher(c, pool=pool_with((OLD_REF, old))).search(text="caption 0 of image 1 seed 0", k=20,
                                                                 target="text").hits) == 6


def test_creating_over_a_collection_points_to_what_exists(tmp_path):
    """The refusal names no command that does not exist (there is no command that deletes a
    collection): it says to use the collection, or to choose another location."""
    Collection.create(tmp_path / "c", space_id="s", dim=4, model="/m/s")
    with pytest.raises(FileExistsError) as e:
        Collection.create(tmp_path / "c", space_id="s", dim=4, model="/m/s")
    msg = str(e.value)
    assert "already holds a collection" in msg and "delete it" not in msg and "choose another location" in msg
