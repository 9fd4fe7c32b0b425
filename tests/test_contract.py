"""One contract for every collection storage: the local FAISS store, milvus-lite and (tests marked
``milvus_server``) a real Milvus standalone server. Add, re-add, upsert, delete, upgrade, search
across two spaces, backfill, retire, and a writer killed mid-add then restarted."""

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

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, write_procrustes_upgrade
from nobackfill.index.collection import Collection, ItemNotFoundError
from nobackfill.index.ingest import add_items, folder_items, text_item
from nobackfill.search import Searcher
from nobackfill.search.backfill import backfill_status, retire_space, run_worker, start_backfill
from nobackfill.search.plan import upgrade_collection

BACKENDS = ["local", "milvus-lite", pytest.param("milvus-server", marks=pytest.mark.milvus_server)]


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "c")
    if request.param == "milvus-lite":
        pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
        return f"milvus-lite:{tmp_path}/milvus.db#c{uuid.uuid4().hex[:6]}"
    server = request.getfixturevalue("milvus_server")
    return f"milvus://{server}#c{uuid.uuid4().hex[:8]}"


def _world(tmp_path: Path, location: str, n_images: int = 5):
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=2, extra_images=1)
    c = Collection.create(location, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
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


KILLED_ADDER = r"""
import sys, time
sys.path.insert(0, {tests!r})
from _collection_helpers import *
from nobackfill.index.collection import Collection
from nobackfill.index.ingest import add_items, folder_items
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
    from nobackfill.index import milvus

    if not isinstance(c.path, Path):
        milvus.close_clients()


def test_milvus_search_is_strong_only_while_the_space_has_fresh_rows(tmp_path, monkeypatch):
    """A Strong search waits for the server's next time tick (~200 ms): a space whose rows this
    process knows are all older than FRESH_S is searched Bounded, a fresh one Strong."""
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")
    import numpy as np

    from nobackfill.index import milvus as mv

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
    monkeypatch.setattr(mv, "FRESH_S", 0.0)
    assert store.search("image", x[:2], 1, space_id="s").ids == [["k0"], ["k1"]]
    assert levels == [mv.STRONG, mv.BOUNDED]
    mv.close_clients()
