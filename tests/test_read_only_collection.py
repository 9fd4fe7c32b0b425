"""A collection on a read-only file system (a snapshot, a backup, a read-only volume) is searched,
its status read and verified; a write is refused in one line naming the cause (trial T: every read
failed with "unable to open database file", which verify called a problem)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nobackfill import Client
from nobackfill.catalog import sqlite_connect
from nobackfill.cli._common import storage_refusal

MODEL = Path(__file__).resolve().parents[1] / "models" / "world-old"


def test_a_read_only_collection_reads_and_refuses_writes_in_one_line(tmp_path, monkeypatch):
    c = Client(tmp_path / "c")
    c.create(MODEL)
    c.add(texts=["a red cube", "a blue ball"])
    hits = [h.id for h in c.search(text="red", k=2).hits]
    monkeypatch.setattr(sqlite_connect.os, "access", lambda *a, **kw: False)  # as a read-only mount says
    ro = Client(tmp_path / "c")
    assert [h.id for h in ro.search(text="red", k=2).hits] == hits
    assert sum(ro.status()["items"].values()) == 2 and ro.verify()["ok"]
    with pytest.raises(Exception) as e:
        ro.delete(hits[0])
    assert storage_refusal(e.value) is not None and "cannot be written" in storage_refusal(e.value)
    assert [h.id for h in ro.search(text="red", k=2).hits] == hits  # nothing changed


@pytest.mark.parametrize("damage", ["missing", "garbled", "another space"])
def test_a_spaces_lost_manifest_is_named_once_without_the_catalog_and_without_repair_advice(tmp_path, damage):
    """trial T: a missing or garbled manifest.json was "catalog c/catalog.sqlite: NotAGalleryError: ...",
    verify advised --repair (which cannot mend it) and --repair listed the problem twice."""
    from nobackfill.lifecycle.verify import verify_path

    c = Client(tmp_path / "c")
    c.create(MODEL)
    c.add(texts=["a red cube"])
    manifest = next((tmp_path / "c" / "spaces").iterdir()) / "manifest.json"
    if damage == "another space":
        import json

        m = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**m, "space_id": "hf-clip-" + "0" * 20}))
    else:
        manifest.unlink() if damage == "missing" else manifest.write_text("nonsense")
    with pytest.raises(Exception) as e:
        Client(tmp_path / "c").status()
    assert str(e.value).count("manifest.json" if damage != "another space" else " holds space ") == 1
    assert "catalog " not in str(e.value).replace("the catalog says", "")
    assert "Error:" not in str(e.value)  # no exception class names
    for repair in (False, True):
        rep = verify_path(tmp_path / "c", repair=repair)
        assert len(rep.problems) == 1 and ("manifest.json" in rep.problems[0] or "holds space" in rep.problems[0])
        assert not any("--repair` takes" in a for a in rep.advice) and any("from a backup" in a for a in rep.advice)


def test_a_damaged_cached_index_is_one_plain_warning_and_rebuilt(tmp_path, caplog):
    """trial T: the warning printed faiss' C++ internals (std::unique_ptr<faiss::Index> ... index_read.cpp)."""
    import logging

    c = Client(tmp_path / "c")
    c.create(MODEL)
    c.add(texts=["a red cube", "a blue ball"])
    hits = [h.id for h in c.search(text="red", target="text", k=2).hits]
    cache = next((tmp_path / "c" / "spaces").iterdir()) / "index-text.faiss"
    assert cache.is_file()
    cache.write_bytes(b"\x00garbage" * 100)
    with caplog.at_level(logging.WARNING, logger="nobackfill"):
        again = [h.id for h in Client(tmp_path / "c").search(text="red", target="text", k=2).hits]
    assert again == hits
    warned = [r.getMessage() for r in caplog.records if "cached index" in r.getMessage()]
    assert warned and all("rebuilt from the vector chunks" in w and "faiss::" not in w for w in warned), warned


def test_a_create_after_a_killed_one_leaves_none_of_its_temporary_catalogs(tmp_path):
    """trial T: a create or import killed before its catalog's rename left .catalog.sqlite.<hex>.tmp
    (and its -journal) in the collection's folder, kept after the rerun."""
    (tmp_path / "c").mkdir()
    for name in (".catalog.sqlite.0123456789ab.tmp", ".catalog.sqlite.0123456789ab.tmp-journal"):
        (tmp_path / "c" / name).write_bytes(b"half")
    Client(tmp_path / "c").create(MODEL)
    assert not [p.name for p in (tmp_path / "c").iterdir() if p.name.startswith(".catalog.sqlite.")]


def test_a_write_to_a_read_only_collection_is_one_line_at_the_command_line(tmp_path, monkeypatch):
    """trial U: delete, route and calibrate printed the raw SQLite line, then the plain one."""
    from typer.testing import CliRunner

    from nobackfill.cli import app

    c = Client(tmp_path / "c")
    c.create(MODEL)
    c.add(texts=["a red cube"])
    hit = c.search(text="red", target="text", k=1).hits[0].id
    monkeypatch.setattr(sqlite_connect.os, "access", lambda *a, **kw: False)
    r = CliRunner().invoke(app, ["collection", "delete", str(tmp_path / "c"), "--id", hit])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: the collection's files cannot be written: a read-only file system, or files this user may not "
        "write; nothing was changed"], r.output
