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
