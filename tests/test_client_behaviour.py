"""One behaviour suite for every face of nobackfill: ``Client`` in process, ``Client`` over HTTP
(the service, through FastAPI's test client) and the command line (``nobackfill collection ...
--json``, read back into the client's types). Each face runs the same life of a collection with
the shipped world models: add, search, get, status, upgrade with a bridge, pin a route, backfill,
cancel, retire, delete, verify, and the same refusals."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from typer.testing import CliRunner

from nobackfill import Client, ClientError
from nobackfill.client import AlreadyExists, BackfillRefused, Conflict, InvalidRequest, NotFound, Unreachable
from nobackfill.client import NotAServer
from nobackfill.lifecycle.backfill import BackfillError
from nobackfill.cli import app
from nobackfill.client import AddResult, ImportResult, ItemInfo, SearchHit, SearchResults, UpgradeResult

from _cli_helpers import ok

ROOT = Path(__file__).resolve().parents[1]
MODELS, UPGRADES = ROOT / "models", ROOT / "upgrades"
ADMIN = "admin-key-0123456789"
STATUS_KEYS = {"name", "path", "generation", "items", "current", "spaces", "routes", "merge", "calibrated",
               "backfill", "limits", "unsourced"}


class CliFace:
    """The command line with the client's methods: each call one ``nobackfill collection`` command
    with ``--json``, its output read back into the client's types; a failed command raises
    ClientError with what it printed."""

    def __init__(self, path: Path, scratch: Path) -> None:
        self.path, self.scratch, self.runner = path, scratch, CliRunner()

    def _run(self, *args: Any, json_out: bool = True) -> Any:
        r = self.runner.invoke(app, [str(a) for a in args] + (["--json"] if json_out else []))
        if r.exit_code != 0:
            raise ClientError(0, r.output)
        return json.loads(r.stdout) if json_out else r.output

    def _c(self, cmd: str, *args: Any) -> Any:
        return self._run("collection", cmd, self.path, *args)

    def add(self, *, texts: list[dict]) -> AddResult:
        f = self.scratch / f"texts-{time.monotonic_ns()}.jsonl"
        f.write_text("".join(json.dumps(t) + "\n" for t in texts))
        return AddResult.from_dict(self._c("add", "--texts", f))

    def search(self, *, text: str, k: int = 10, target: str | None = None) -> SearchResults:
        return SearchResults.from_dict(self._c("search", "--text", text, "--k", k, *(["--target", target] if target
                                                                                   else [])))

    def get(self, item_id: str) -> ItemInfo:
        return ItemInfo.from_dict(self._c("get", "--id", item_id))

    def delete(self, *ids: str) -> int:
        return self._c("delete", *[a for i in ids for a in ("--id", i)])["deleted"]

    def status(self) -> dict:
        return self._c("status")

    def upgrade(self, model: Path, *, bridges: list[Path]) -> UpgradeResult:
        return UpgradeResult.from_dict(self._c("upgrade", "--model", model, *[a for b in bridges for a in ("--bridge", b)]))

    def route(self, space: str, direction: str, route: str | None = None, *, w: float | None = None) -> dict:
        return self._c("route", "--space", space, "--direction", direction,
                       *(["--route", route] if route else ["--unpin"]), *(["--w", w] if w is not None else []))

    def backfill_start(self, order: str = "uncertainty", rate: float | None = None) -> dict:
        return self._c("backfill", "--order", order)

    def backfill_status(self) -> dict:
        return self.status()["backfill"]

    def backfill_cancel(self) -> dict:
        return self._c("backfill", "--cancel")

    def retire(self, space: str, *, drop_unsourced: bool = False) -> dict:
        return self._c("retire", "--space", space)

    def verify(self) -> dict:
        return self._run("verify", self.path)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("behaviour")
    ok("world", "--out", root / "world", "--n-train", 4, "--n-val", 8, "--n-test", 10, "--workers", 1, "--langs", "en")
    return root / "world"


@contextlib.contextmanager
def _face(kind: str, world: Path, tmp_path: Path):
    """(the face, how it names a model, how it names a bridge), over a new collection of the world's
    test split (created and filled through the face itself where it can: a server serves a collection
    that exists)."""
    path = tmp_path / "photos"
    if kind == "cli":
        ok("collection", "create", path, "--model", MODELS / "world-old")
        ok("collection", "add", path, "--data", world, "--split", "test")
        yield CliFace(path, tmp_path), (lambda m: MODELS / m), (lambda b: UPGRADES / b)
        return
    local = Client(path)
    local.create(MODELS / "world-old")
    local.add(folder=world, split="test")
    if kind == "local":
        yield local, (lambda m: MODELS / m), (lambda b: UPGRADES / b)
        return
    from fastapi.testclient import TestClient

    from nobackfill.serve import KeyRing, ServeSettings, create_app

    settings = ServeSettings(collection=str(path), keys=KeyRing({"admin": [ADMIN]}), models_root=MODELS,
                             upgrades_root=UPGRADES, data_root=world.parent)
    with TestClient(create_app(settings)) as http:
        remote = Client("http://testserver", api_key=ADMIN, http=http)
        assert type(remote).__name__ == "RemoteClient" and type(local).__name__ == "LocalClient"
        yield remote, (lambda m: m), (lambda b: b)


@pytest.fixture(params=["local", "remote", "cli"])
def face(request, world, tmp_path):
    with _face(request.param, world, tmp_path) as f:
        yield f


@pytest.fixture(params=["local", "remote"])
def client(request, world, tmp_path):
    """The two clients (in process, over HTTP) of one collection of the world's test split."""
    with _face(request.param, world, tmp_path) as f:
        yield f[0]


def _wait_done(c: Any, timeout: float = 120.0) -> dict:
    t0 = time.monotonic()
    while True:
        st = c.backfill_status()
        if st["state"] == "done" or st["done"] == st["total"]:
            return st
        assert time.monotonic() - t0 < timeout, f"the backfill did not finish: {st}"
        time.sleep(0.2)


def test_one_life_of_a_collection(face):
    c, model, bridge = face
    # add: a new id, then the same again (unchanged)
    rep = c.add(texts=[{"text": "a caption only this test added", "id": "mine-1", "source": "behaviour"}])
    assert isinstance(rep, AddResult) and rep.added == 1 and rep.ids == ["mine-1"]
    assert c.add(texts=[{"text": "a caption only this test added", "id": "mine-1", "source": "behaviour"}]).unchanged == 1
    # search / get
    r = c.search(text="a caption only this test added", k=3, target="text")
    assert isinstance(r, SearchResults) and r.modality == "text" and len(r.hits) == 3
    assert isinstance(r.hits[0], SearchHit) and r.hits[0].id == "mine-1" and r.hits[0].route == "native"
    assert [h.rank for h in r.hits] == [1, 2, 3] and r.hits[0].score >= r.hits[1].score
    item = c.get("mine-1")
    assert isinstance(item, ItemInfo) and item.modality == "text" and item.metadata["source"] == "behaviour"
    st = c.status()
    assert STATUS_KEYS <= set(st) and item.space == st["current"]
    assert st["items"] == {"image": 10, "text": 21} and st["backfill"]["state"] == "none"
    old = st["current"]
    # upgrade through the shipped XBT bridge: nothing re-embedded, old items reached through the bridge
    up = c.upgrade(model("world-new"), bridges=[bridge("world-old-to-new")])
    assert isinstance(up, UpgradeResult) and up.current != old and set(up.spaces) == {old, up.current}
    assert up.routes[old]["t2i"]["route"] == "bridge"
    hits = c.search(text="a red circle", k=5).hits
    assert len(hits) == 5 and {(h.space, h.route) for h in hits} == {(old, "bridge")}
    # pin a route, then unpin it
    assert c.route(old, "t2i", "old-model")[old]["t2i"]["pinned"]
    assert {h.route for h in c.search(text="a red circle", k=5).hits} == {"old-model"}
    assert not c.route(old, "t2i", None)[old]["t2i"]["pinned"]
    assert c.route("world-old", "i2t", "old-model")[old]["i2t"]["pinned"]  # by its name, as tables show it
    assert not c.route(old, "i2t", None)[old]["i2t"]["pinned"]
    # the backfill into the new space, then its job forgotten, then the old space retired
    c.backfill_start("sequential")
    st = _wait_done(c)
    assert st["done"] == st["total"] == 31
    assert {h.route for h in c.search(text="a red circle", k=5).hits} == {"native"}
    assert c.backfill_cancel()["state"] == "none"
    first = c.retire(old)
    assert first["retired"] == old and not first["already"]
    assert c.retire(old) == {"retired": old, "dropped_unsourced": 0, "already": True}  # (trial AD: "removed" again)
    st = c.status()
    assert st["spaces"][old]["retired"] and c.get("mine-1").space == up.current
    # delete, and the refusals every face shares
    assert c.delete("mine-1") == 1
    with pytest.raises(ClientError) as e:
        c.get("mine-1")
    assert "mine-1" in str(e.value)
    with pytest.raises(ValueError, match="k"):
        c.search(text="a red circle", k=0)
    with pytest.raises(ClientError, match="nope"):
        c.delete("nope")
    rep = c.verify()
    assert rep["problems"] == [] and rep["kind"] == "collection"


def test_the_two_clients_refuse_alike(client, monkeypatch):
    """One error hierarchy, the same limits and the same refusals in process and over HTTP: each
    refusal a ClientError subclass (still a ValueError, and the built-in error the library raised
    before: FileExistsError, FileNotFoundError, BackfillError)."""
    c = client
    with pytest.raises(AlreadyExists) as e:  # a collection is there (a server serves one that exists)
        c.create(MODELS / "world-old")
    assert isinstance(e.value, FileExistsError) and isinstance(e.value, ValueError) and e.value.status == 409
    with pytest.raises(NotFound) as e:
        c.search(image="/nope.png")
    assert isinstance(e.value, FileNotFoundError) and "nope.png" in str(e.value)
    with pytest.raises(NotFound) as e:  # a model that is not there
        c.upgrade("no-such-model")
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(BackfillRefused) as e:  # the current space cannot be retired
        c.retire(c.status()["current"])
    assert isinstance(e.value, BackfillError) and isinstance(e.value, Conflict) and e.value.status == 409
    # the same limits: the largest k
    assert c.status()["limits"]["max_k"] == 1000
    assert len(c.search(text="a red circle", k=1000, target="text").hits) == 20
    with pytest.raises(InvalidRequest, match="k"):
        c.search(text="a red circle", k=1001)
    # the same refusals: several ids deleted at once, all or nothing; an empty add
    assert c.add(texts=[]).added == 0
    assert c.add(texts=[{"text": f"caption {i}", "id": f"d-{i}"} for i in range(3)]).added == 3
    with pytest.raises(NotFound, match="nope"):
        c.delete("d-0", "nope")
    assert c.get("d-0").id == "d-0"
    assert c.delete("d-0", "d-1") == 2
    with pytest.raises(NotFound):
        c.get("d-1")
    # README's names (relative to the working directory in process, to the server's roots over HTTP)
    monkeypatch.chdir(ROOT)
    with pytest.raises(InvalidRequest) as e:  # fit settings and query texts: refused before anything changes
        c.upgrade("models/world-new", fit_sample={"min_pairs": 9, "max_pairs": 3})
    assert e.value.field == "fit_sample" and e.value.status == 422
    with pytest.raises(InvalidRequest) as e:
        c.upgrade("models/world-new", queries=["a red circle", 3])
    assert e.value.field.startswith("queries") and len(c.status()["spaces"]) == 1
    up = c.upgrade("models/world-new", bridges=["upgrades/world-old-to-new"])
    assert len(up.spaces) == 2 and up.routes


def test_the_two_clients_check_arguments_alike(client, world):
    """What the in-process client refuses as a ClientError, the remote one refuses with the same
    class and message before anything is sent (no AttributeError or TypeError of its own); a PIL
    image is a query either way."""
    from PIL import Image

    c = client
    with pytest.raises(InvalidRequest, match="filter: a JSON object"):
        c.search(text="a red circle", filter="x")
    for k in (None, 2.0, True, "5"):
        with pytest.raises(InvalidRequest, match=r"k must be an integer between 1 and 1000, got "):
            c.search(text="a red circle", k=k)
    with pytest.raises(InvalidRequest, match="k must be an integer"):
        c.search(image=next((world / "test" / "images").iterdir()), k=None)
    with pytest.raises(InvalidRequest, match="text must be a string, got int"):
        c.search(text=5)
    with pytest.raises(InvalidRequest, match="text is 2001 characters long; at most 2000 are taken"):
        c.search(text="a" * 2001)
    for call in (lambda: c.get(5), lambda: c.delete(5)):
        with pytest.raises(NotFound, match="no item with id 5"):
            call()
    path = sorted((world / "test" / "images").iterdir())[0]
    by_path = [(h.id, round(h.score, 5)) for h in c.search(image=path, k=5).hits]
    with Image.open(path) as im:
        assert [(h.id, round(h.score, 5)) for h in c.search(image=im, k=5).hits] == by_path
        assert [(h.id, round(h.score, 5)) for h in c.search(image=im.convert("L"), k=5).hits]
    with pytest.raises(InvalidRequest, match="filter"):  # a nested filter's bad value, named as in process
        c.search(image=path, k=3, filter={"labels": {"colour": object()}})


def test_an_unreachable_server_is_one_error():
    c = Client("http://127.0.0.1:9", api_key="k" * 12)
    with pytest.raises(Unreachable) as e:
        c.status()
    assert isinstance(e.value, ConnectionError) and isinstance(e.value, ClientError)
    assert "http://127.0.0.1:9" in str(e.value) and "\n" not in str(e.value)


def test_metadata_keys_named_as_a_hits_own_fields_come_back_whole(face):
    """A user's metadata keys named rank, score, space, route or metadata are neither lost nor
    taken for the hit's own fields, in every face (the JSON of a hit holds the metadata whole)."""
    c, _model, _bridge = face
    meta = {"rank": "first", "score": 99, "space": "kitchen", "route": 66, "metadata": {"nested": [1, 2]},
            "colour": "red"}
    c.add(texts=[{"text": "a caption whose metadata is odd", "id": "odd-1", **meta}])
    hit = c.search(text="a caption whose metadata is odd", k=1, target="text").hits[0]
    assert (hit.id, hit.rank, hit.route) == ("odd-1", 1, "native") and isinstance(hit.score, float)
    assert hit.metadata == {"text": "a caption whose metadata is odd", **meta}
    assert c.get("odd-1").metadata == {"text": "a caption whose metadata is odd", **meta}


def test_the_faces_are_one_class():
    """``Client(...)`` picks the implementation from the target; both have every method of the base."""
    from nobackfill.client.base import Client as Base
    from nobackfill.client.local import LocalClient
    from nobackfill.client.remote import RemoteClient

    assert isinstance(Client("somewhere"), LocalClient)
    remote = Client("http://127.0.0.1:9", api_key="k" * 12)
    assert isinstance(remote, RemoteClient) and isinstance(remote, Base)
    public = {n for n in vars(Base) if not n.startswith("_") and callable(getattr(Base, n))}
    for impl in (LocalClient, RemoteClient):
        missing = {n for n in public if getattr(impl, n) is getattr(Base, n) and n != "close"}
        assert not missing, f"{impl.__name__} does not implement {sorted(missing)}"
    with pytest.raises(ClientError, match="create it where it is stored"):
        remote.create("m")
    with pytest.raises(InvalidRequest, match="server's own worker"):
        remote.backfill_start("sequential", wait=True, limit=5)
    assert ImportResult(items=10, seconds=2.0).items_per_s == 5.0


def test_the_readme_python_example_runs_as_written(world, tmp_path, monkeypatch):
    """README's Python client example, run as written (models and upgrades linked in, a world as
    data/world, the last line's server not called)."""
    import re

    text = (ROOT / "README.md").read_text()
    code = re.search(r"<!-- python-client -->\n```python\n(.*?)```\n<!-- /python-client -->", text, re.S).group(1)
    for d in ("models", "upgrades"):
        (tmp_path / d).symlink_to(ROOT / d)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "world").symlink_to(world)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md (python-client)", "exec"), scope)
    st = scope["photos"].status()
    assert st["current"] != scope["old"] and st["spaces"][scope["old"]]["retired"]
    assert st["backfill"]["done"] == st["backfill"]["total"] == 30
    assert type(scope["served"]).__name__ == "RemoteClient"


def _docs_python(page: str, name: str) -> str:
    import re

    text = (ROOT / "docs" / page).read_text()
    found = re.search(rf"<!-- docs-python: {name} -->\n```python\n(.*?)```", text, re.S)
    assert found, f"docs/{page} has no python block {name!r}"
    return found.group(1)


def test_the_docs_python_examples_run_as_written(world, tmp_path, monkeypatch):
    """docs/own-data.md's and then docs/upgrade.md's Python examples, run as written on a folder of
    the user's kind (models and upgrades linked in)."""
    for d in ("models", "upgrades"):
        (tmp_path / d).symlink_to(ROOT / d)
    (tmp_path / "my_photos").symlink_to(world / "test")
    monkeypatch.chdir(tmp_path)
    first: dict = {}
    exec(compile(_docs_python("own-data.md", "own-data"), "docs/own-data.md", "exec"), first)
    assert first["photos"].status()["items"] == {"image": 10, "text": 20}
    second: dict = {}
    exec(compile(_docs_python("upgrade.md", "upgrade"), "docs/upgrade.md", "exec"), second)
    st = second["photos"].status()
    assert st["current"] == second["up"].current != second["old"] and st["backfill"]["done"] == 30


def test_the_import_pages_way_to_make_vectors_runs_and_imports(world, tmp_path, monkeypatch):
    """docs/import.md's Python block (a folder's images embedded with this package, and a table of
    ids and sources) runs as written, and its import line takes what it wrote (trial J: the page did
    not say how to make vectors to try it with)."""
    (tmp_path / "models").symlink_to(ROOT / "models")
    (tmp_path / "my_photos").symlink_to(world / "test")
    monkeypatch.chdir(tmp_path)
    exec(compile(_docs_python("import.md", "make-vectors"), "docs/import.md", "exec"), {})
    rep = Client("photos").import_("npy:emb.npy", model="models/world-old", table="meta.jsonl", id_column="id",
                                   source_column="image_path", modality="image")
    assert rep.items == rep.added == 10 and rep.model_check["accepted"], rep


def test_a_missing_import_file_is_not_found_in_both_clients(client, world):
    """A vector file or table that is not there: NotFound (404) in process as over HTTP (before, the
    in-process client called it an invalid request, 422)."""
    local = type(client).__name__ == "LocalClient"
    root = f"{world.parent}/" if local else ""
    for source, kw in ((f"npy:{root}nope.npy", {"model": str(MODELS / "world-old") if local else "world-old"}),
                       (f"clip-retrieval:{root}nowhere", {})):
        with pytest.raises(NotFound, match="nope.npy|nowhere"):
            client.import_(source, **kw)


def test_a_missing_data_folder_is_not_found_in_both_clients(client, tmp_path):
    """Trial AE: ``add(folder=<missing>)`` raised InvalidRequest, where a missing file is NotFound (a
    FileNotFoundError) everywhere else; a file given as the folder stays an invalid request."""
    with pytest.raises(NotFound, match="nosuch: no such folder") as e:
        client.add(folder=tmp_path / "nosuch")
    assert isinstance(e.value, FileNotFoundError)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InvalidRequest, match="a file, not a data folder"):
        client.add(folder=tmp_path / "afile")
    with pytest.raises(NotFound, match="nosuch.txt: no such text file"):  # (trial AF: 422 "text file not found")
        client.add(text_file=tmp_path / "nosuch.txt")
    with pytest.raises(InvalidRequest, match="a folder, not a text file"):
        client.add(text_file=tmp_path)
    os.mkfifo(tmp_path / "fifo")  # (trial AH: a pipe was called "a folder")
    with pytest.raises(InvalidRequest, match=r"fifo: not a regular file \(a pipe or a device\)"):
        client.add(text_file=tmp_path / "fifo")


def test_metadata_with_a_number_json_has_not_is_refused_alike(client, world):
    """NaN / infinity in an added item's metadata: refused by both clients with the same message
    naming the item and the field, nothing added (in process it had become null silently)."""
    import numpy as np

    c = client
    path = sorted((world / "test" / "images").iterdir())[0]
    cases = [(dict(texts=[{"text": "a red circle", "id": "ok1"}, {"text": "a blue cross", "id": "nan1",
                                                                "score": float("nan")}]),
              r"texts\[1\]: its metadata .*'score' is nan, not a JSON number\); nothing was added"),
             (dict(texts=[{"text": "a red circle", "id": "inf1", "boxes": [[0.0, float("inf")]]}]),
              r"texts\[0\]: .*'boxes'\[0\]\[1\] is inf, not a JSON number"),
             (dict(texts=[{"text": "a red circle", "id": "np1", "v": {"x": np.float32("nan")}}]),
              r"texts\[0\]: .*'v'\['x'\] is nan"),
             (dict(images=[{"path": path, "id": "img-nan", "score": float("-inf")}]),
              r"images\[0\]: .*'score' is -inf, not a JSON number")]
    for kw, message in cases:
        with pytest.raises(InvalidRequest, match=message):
            c.add(**kw)
    for id_ in ("ok1", "nan1", "inf1", "np1", "img-nan"):
        with pytest.raises(NotFound):
            c.get(id_)
    assert c.add(texts=[{"text": "a red circle", "id": "fine1", "score": 0.5, "none": None}]).added == 1
    assert c.get("fine1").metadata["none"] is None  # null itself is JSON, and kept


def test_the_catalog_refuses_nan_metadata_of_an_item_itself(tmp_path):
    from nobackfill.catalog.items import Item, _item_json, metadata_problem

    assert metadata_problem({"a": 1.0, "b": [1, {"c": None}], "d": "nan"}) is None
    assert metadata_problem({"b": [1, {"c": float("nan")}]}) == "'b'[1]['c'] is nan, not a JSON number"
    it = Item(id="x", modality="text", key="k", source={"text": "t"}, metadata={"s": float("nan")})
    with pytest.raises(ValueError, match="item 'x': 's' is nan, not a JSON number"):
        _item_json(it)


def test_metadata_of_numpy_values_and_dates_is_stored_alike(client, world):
    """What the catalog writes in process (numpy values as numbers / lists, a date as ISO text) is
    what an item added over HTTP keeps; a value JSON has no form for (a set, bytes) is refused alike."""
    import datetime

    import numpy as np

    c = client
    path = sorted((world / "test" / "images").iterdir())[1]
    meta = {"score": np.float32(0.5), "n": np.int64(3), "v": np.arange(3, dtype=np.int16),
            "day": datetime.date(2020, 1, 2), "nested": {"w": [np.float64(1.5)]}}
    want = {"score": 0.5, "n": 3, "v": [0, 1, 2], "day": "2020-01-02", "nested": {"w": [1.5]}}
    c.add(texts=[{"text": "a red circle", "id": "np-meta", **meta}])
    got = c.get("np-meta").metadata
    assert {k: got[k] for k in want} == want
    c.add(images=[{"path": path, "id": "np-img", **meta}])
    got = c.get("np-img").metadata
    assert {k: got[k] for k in want} == want
    for bad, what in (({1, 2}, "set"), (b"x", "bytes")):
        with pytest.raises(InvalidRequest, match=rf"texts\[0\]: its metadata is not a JSON object .*{what}"):
            c.add(texts=[{"text": "a blue cross", "id": "bad-meta", "tags": bad}])
    with pytest.raises(NotFound):
        c.get("bad-meta")


def test_a_single_value_where_a_list_goes_is_refused_by_both_clients(client, world, tmp_path):
    """Trial M: ``add(texts="hello")`` stored one item per character; ``images="x.png"``, a PIL
    image, an array, ``ids=""``, ``get([id])``, ``upgrade(None)``, ``bridges="dir"``: each is now one
    InvalidRequest (or NotFound for an id no item has) naming its argument, and nothing is stored."""
    import numpy as np

    c = client
    path = sorted((world / "test" / "images").iterdir())[0]
    before = c.status()["items"]
    refused = [
        (lambda: c.add(texts="hello"), "texts"), (lambda: c.add(texts=["h", "i"], ids="ab"), "ids"),
        (lambda: c.add(images=str(path)), "images"), (lambda: c.add(images=[Image.open(path)]), "images[0]"),
        (lambda: c.add(images=[np.zeros((4, 4, 3))]), "images[0]"), (lambda: c.add(texts=["ok", None]), "texts[1]"),
        (lambda: c.add(texts=["ok", 42]), "texts[1]"), (lambda: c.add(texts=["ok", "  "]), "texts[1]"),
        (lambda: c.add(texts=["x"], ids=[""]), "ids[0]"), (lambda: c.add(texts=["x", {"text": "y", "id": ""}]),
                                                              "texts[1].id"),
        (lambda: c.add(texts=[{"text": "real", "id": "tk"}], ids=["other"]), "texts[0]"),
        (lambda: c.upgrade(None), "model"), (lambda: c.upgrade("world-new", bridges="up"), "bridges"),
    ]
    for call, field in refused:
        with pytest.raises(InvalidRequest) as e:
            call()
        assert e.value.field == field, (field, e.value)
    for call, says in ((lambda: c.get(["a"]), "an id is a string"), (lambda: c.delete(["a"]), "delete('a', 'b')")):
        with pytest.raises(NotFound, match=re.escape(says)):
            call()
    assert c.status()["items"] == before and len(c.status()["spaces"]) == 1
    assert [h.id for h in c.search(text="a red circle", k=np.int64(3)).hits] == \
        [h.id for h in c.search(text="a red circle", k=3).hits]
    assert c.add(texts=["one text"], ids=np.array(["np-1"])).ids == ["np-1"]
    for target in (None, 5, ""):
        with pytest.raises(InvalidRequest, match="target: a collection's directory"):
            Client(target)


def test_an_add_that_stops_at_an_unreadable_image_names_it_and_what_it_stored(client, world, tmp_path):
    """The chunks before it stay stored (a call commits chunk by chunk): the refusal names
    ``images[n]`` of the call and how many items of it are stored; the same call with skip_bad
    adds the rest."""
    images = sorted((world / "test" / "images").iterdir())[:8]
    bad = tmp_path / "cut.png"
    bad.write_bytes(images[0].read_bytes()[:100])
    rows = [*images[:5], bad, *images[5:]]
    fresh = tmp_path / "own"  # images no collection holds yet (the world's are in it)
    fresh.mkdir()
    for i, p in enumerate(rows):
        if p != bad:
            Image.open(p).rotate(90).save(fresh / f"r{i}.png")
    rows = [fresh / f"r{i}.png" if p != bad else bad for i, p in enumerate(rows)]
    before = client.status()["items"]["image"]
    with pytest.raises(InvalidRequest) as e:
        client.add(images=rows, chunk_size=2)
    assert e.value.field == "images[5]" and e.value.detail.startswith("images[5]") and "cut.png" in e.value.detail, \
        e.value
    assert "--skip-bad" not in e.value.detail
    stored = client.status()["items"]["image"] - before
    assert stored == 4 and "4 item" in e.value.detail, (stored, e.value.detail)
    out = client.add(images=rows, chunk_size=2, skip_bad=True) if type(client).__name__ == "LocalClient" else None
    if out is not None:
        assert (out.added, out.unchanged, out.skipped) == (4, 4, 1)


def test_a_caption_over_the_text_limit_is_a_bad_line_for_both_clients_before_anything_is_stored(client, world,
                                                                                                tmp_path):
    """trial W: a folder add took a 2,540-character caption in process, and over HTTP stored the items
    before it and then failed; now both refuse it up front, naming its line, and --skip-bad skips it."""
    import shutil

    folder = tmp_path / "long"
    (folder / "images").mkdir(parents=True)
    src = sorted((world / "val" / "images").iterdir())[:2]
    for p in src:
        shutil.copy(p, folder / "images" / p.name)
    lines = [{"image": f"images/{src[0].name}", "caption": "a caption", "lang": "en"},
             {"image": f"images/{src[1].name}", "caption": "word " * 500, "lang": "en"},
             {"image": f"images/{src[1].name}", "caption": "another caption", "lang": "en"}]
    (folder / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    before = client.status()["generation"]
    with pytest.raises(InvalidRequest, match=r"captions.jsonl line 2: a caption of 2500 characters, longer than the "
                                             r"2000 a text may have \(as a search text\); the line is not added"):
        client.add(folder=folder)
    assert client.status()["generation"] == before  # nothing committed
    res = client.add(folder=folder, skip_bad=True)
    assert res.skipped == 1 and "line 2" in res.problems[0] and res.added == 4 and res.uncaptioned == 0, res
    lines[2]["caption"] = "word " * 450  # (trial AE: an image whose only caption was too long was not counted)
    (folder / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = client.add(folder=folder, skip_bad=True)
    assert res.skipped == 2 and res.uncaptioned == 1, res


def test_a_url_that_is_no_nobackfill_server_is_one_line_naming_it(monkeypatch):
    """trial AB: `collection status http://HOST:PORT` of a plain web server printed its 14-line HTML
    error page as the error."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        answer: int | None = None  # None: the file server's 404 page; else this status with a JSON body

        def log_message(self, *args):  # (its access log would be in the command's output)
            pass

        def _json(self):
            body = json.dumps({"detail": "nope", "status": {"backfill": None}}).encode()
            self.send_response(self.answer)
            self.send_header("Content-Type", "application/json")
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            return self._json() if self.answer else super().do_GET()

        def do_POST(self):
            if self.answer:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                return self._json()
            self.send_error(404)

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}"
    try:
        with pytest.raises(NotAServer, match=rf"{re.escape(url)} does not answer as a nobackfill server: GET "
                                             r"/v1/status got HTTP 404 \(text/html\) without the API's header"):
            Client(url, api_key="k" * 24).status()
        for answer in (200, 302, 404):  # trial AC: a 200 page, a redirect, another API's JSON error: tracebacks
            Quiet.answer = answer
            with pytest.raises(NotAServer, match=rf"got HTTP {answer} \(application/json\) without the API's header"):
                Client(url, api_key="k" * 24).status()
            with pytest.raises(NotAServer):
                Client(url, api_key="k" * 24).search(text="a red circle")
        Quiet.answer = None
        monkeypatch.setenv("NOBACKFILL_API_KEY", "k" * 24)
        r = CliRunner().invoke(app, ["collection", "status", url])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "<html" not in r.output.lower(), \
            r.output
        assert "is this the address of `nobackfill serve`?" in " ".join(r.output.split())
    finally:
        web.shutdown()
        web.server_close()


def test_an_address_that_never_answers_is_said_within_the_probe(monkeypatch):
    """trial AC: a port that takes the connection and never answers held the command for the request's
    own timeout (a minute) before one line."""
    import socket

    from nobackfill.client import remote

    monkeypatch.setattr(remote, "PROBE_S", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections are taken by the kernel; nothing ever answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(Unreachable, match=rf"{re.escape(url)} took the connection but did not answer GET "
                                              r"/healthz within 0.5 s: is this the address of `nobackfill serve`\?"):
            Client(url, api_key="k" * 24).status()
        assert time.monotonic() - t0 < 30  # (the request's own timeout: 60 s)
        monkeypatch.setenv("NOBACKFILL_API_KEY", "k" * 24)
        r = CliRunner().invoke(app, ["collection", "status", url])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "did not answer" in r.output, r.output


def test_following_a_servers_backfill_waits_for_its_last_bridge_fit():
    """Trial AD: `collection backfill URL` returned at "done" while the server's worker still ran the
    backfill's last bridge fit (an upgrade sent then lost its own fits); in process the run returns
    after that fit."""
    from nobackfill.client.remote import _follow

    answers = iter([{"state": "running", "done": 5, "worker": "running"},
                    {"state": "done", "done": 10, "worker": "running"},  # every item in, the last fit running
                    {"state": "done", "done": 10, "worker": "running"},
                    {"state": "done", "done": 10, "worker": "idle", "worker_stopped": "done"}])
    polled = []

    class Server:
        def backfill_status(self):
            polled.append(1)
            return next(answers)

    rep = _follow(Server(), {"done": 0}, None, 0.0)
    assert len(polled) == 4 and rep["stopped"] == "done" and rep["committed"] == 10


def test_following_a_servers_backfill_counts_what_its_worker_committed():
    """Trial AK: `collection backfill URL` said "1350 committed" where its worker re-embedded at most
    1,202: it counted the growth of ``done``, which items added meanwhile (embedded by the current
    model) grow too, and dropped the training sample's count. The server's worker thread counts what
    it commits; a follower reports the part since it began (the whole run of a thread started since,
    the rest of the same thread's)."""
    from nobackfill.client.remote import _follow

    class Server:
        def __init__(self, answers):
            self.answers = iter(answers)

        def backfill_status(self):
            return next(self.answers)

    def end(run, committed, sample):
        return {"state": "done", "done": 1350, "worker": "idle", "worker_stopped": "done",
                "worker_run": {"run": run, "committed": committed, "sample_committed": sample}}

    # a thread started by this call (the last one, run 3, had ended): 150 items were added meanwhile
    before = {"done": 0, "worker": "idle", "worker_run": {"run": 3, "committed": 40, "sample_committed": 0}}
    rep = _follow(Server([end(4, 1200, 64)]), before, None, 0.0)
    assert (rep["committed"], rep["sample_committed"]) == (1200, 64)
    # joined a thread already running (the same run): only what it committed since
    before = {"done": 300, "worker": "running", "worker_run": {"run": 4, "committed": 300, "sample_committed": 64}}
    rep = _follow(Server([end(4, 1200, 64)]), before, None, 0.0)
    assert (rep["committed"], rep["sample_committed"]) == (900, 0)
    # a server without the counts: the growth of done, as before
    rep = _follow(Server([{"state": "done", "done": 50, "worker": "idle"}]), {"done": 10}, None, 0.0)
    assert (rep["committed"], rep["sample_committed"]) == (40, 0)
    # the progress told is the worker's commits, not done (trial AM: 947/900 with items added meanwhile)
    told = []
    mid = {"state": "running", "done": 700, "worker": "running", "worker_run": {"run": 4, "committed": 500,
                                                                                 "sample_committed": 64}}
    _follow(Server([mid, end(4, 900, 64)]), {"done": 0, "worker": "idle"}, told.append, 0.0)
    assert told == [500, 400]


def test_a_backfill_run_reports_what_it_committed_alike_in_process_and_over_http(client):
    """Trial AK: over HTTP a followed run's ``committed`` counted items added during it, and its
    training sample's count was always 0. Both faces report the run's own commits and sample; items
    added while it runs (embedded by the current model) are not among them."""
    client.upgrade(MODELS / "world-new" if type(client).__name__ == "LocalClient" else "world-new")
    added = []

    def progress(n: int) -> None:  # items added while the run goes on
        if not added:
            added.append(client.add(texts=[{"text": f"added during the run {i}", "id": f"during-{i}"}
                                           for i in range(3)]).added)

    rep = client.backfill_start(wait=True, progress=progress)
    st = client.backfill_status()
    assert added == [3] and st["done"] == st["total"] == 33, st
    assert rep["committed"] == 30 and 0 < rep["sample_committed"] == st["sample"] <= 30, rep
    assert client.backfill_start(wait=True)["committed"] == 0


def test_following_a_servers_backfill_prints_what_its_fits_say():
    """Trial AF: over HTTP `collection backfill URL` printed none of the fits' lines (a route leaving
    the bridge given among them) that a run in process prints; the fits keep them, the follower says
    each new one once."""
    from nobackfill.client.remote import _follow

    fits = [{"pairs": 64, "said": ["fitting bridges on 64 backfilled pairs"]}]
    later = fits + [{"pairs": 128, "said": ["fitting bridges on 128 backfilled pairs",
                                            "  s t2i: the serving bridge stays (your --bridge); its route ...: "
                                            "bridge -> old-model"]}]
    states = iter([({"state": "running", "done": 5, "worker": "running"}, fits),
                   ({"state": "running", "done": 9, "worker": "running"}, later),
                   ({"state": "done", "done": 10, "worker": "idle"}, later)])
    now: list = [None, fits]

    class Server:
        def backfill_status(self):
            now[:] = next(states)
            return now[0]

        def status(self):
            maps = ["maps at 64 pairs"] if now[1] is fits else ["maps at 128 pairs: a route changed"]
            return {"fitted_bridges": {"merge_maps_said": maps, "fits": now[1]}}

    said: list = []
    _follow(Server(), {"done": 0}, None, 0.0, said.append)
    # what was said before the follow began is not said again; the maps' refit says its own line
    assert said == ["maps at 128 pairs: a route changed", *later[1]["said"]]


def test_a_cold_search_checks_its_arguments_before_loading_the_model(tmp_path):
    """Trial AE: `collection search --k 0` or `--target video` waited ~4 s for the model to load
    before its one-line refusal."""
    Client(tmp_path / "c").create(MODELS / "world-old")
    cold = Client(tmp_path / "c")
    with pytest.raises(InvalidRequest, match="k must be an integer between 1 and 1000, got 0"):
        cold.search(text="a red circle", k=0)
    with pytest.raises(InvalidRequest, match="target must be 'image' or 'text', got 'video'"):
        cold.search(text="a red circle", target="video")
    assert cold.pool.loaded() == []


def test_a_status_in_process_has_every_key_the_http_one_has(world, tmp_path):
    """Trial AJ: `status()` in process lacked the keys the server's answer fills with null (phase,
    note, last_worker, error, ...) and a space's `imports`; the README promises the same return
    types. Every field of the HTTP response models is there, before and after an upgrade."""
    from nobackfill.serve.responses import BackfillStatus, SpaceStatus, Status

    c = Client(tmp_path / "c")
    c.create(MODELS / "world-old")
    c.add(texts=["a red circle", "a blue square"])
    for upgraded in (False, True):
        if upgraded:
            c.upgrade(MODELS / "world-new", fit_bridges=False)
        st = c.status()
        assert set(Status.model_fields) <= set(st), set(Status.model_fields) - set(st)
        assert all(set(SpaceStatus.model_fields) <= set(s) for s in st["spaces"].values()), st["spaces"]
        assert set(BackfillStatus.model_fields) <= set(st["backfill"]), set(BackfillStatus.model_fields) - set(st["backfill"])
        assert set(BackfillStatus.model_fields) <= set(c.backfill_status())


def test_an_add_result_prints_short():
    """Trial AK: the docs' ``print(photos.add(folder=...))`` printed every id (400 KB for 15,000
    items). Its repr keeps every field and cuts long lists and dicts after a few entries, saying how
    many it left out; the fields themselves stay whole."""
    ids = [f"item-{i}" for i in range(15000)]
    r = AddResult(added=15000, ids=ids, skipped_images={f"bad-{i}.png": "not an image" for i in range(9)})
    text = repr(r)
    assert len(text) < 400 and "added=15000" in text and "(14997 more)" in text and "(6 more)" in text, text
    assert text.startswith("AddResult(") and "'item-0'" in text and "'item-14999'" not in text and r.ids == ids
    assert repr(AddResult(added=2, ids=["a", "b"])) == ("AddResult(added=2, replaced=0, unchanged=0, metadata_updated=0, "
                                                        "recovered=0, skipped=0, ids=['a', 'b'], problems=[], "
                                                        "skipped_images={}, uncaptioned=0)")
