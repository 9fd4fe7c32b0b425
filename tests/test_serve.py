"""The HTTP service through its API (FastAPI's test client): keys and roles, search by text and by
image, items, status, the backfill, metrics, and every class of bad input (a clear 4xx naming the
problem, and the collection unchanged)."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, write_procrustes_upgrade  # noqa: E402
from nobackfill.bench.serve_inputs import bad_input_cases  # noqa: E402
from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.collection.ingest import add_items, folder_items  # noqa: E402
from nobackfill.lifecycle.plan_changes import upgrade_collection  # noqa: E402
from nobackfill.serve import KeyRing, Limits, ServeSettings, create_app  # noqa: E402

READ, ADMIN = "read-key-0123456789", "admin-key-0123456789"


def _env(tmp_path, n_images=6):
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    up = write_procrustes_upgrade(tmp_path / "upgrades" / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"read": [READ], "admin": [ADMIN]}),
                             models_root=tmp_path / "models", upgrades_root=tmp_path / "upgrades", limits=LIMITS)
    (tmp_path / "models" / "docs").mkdir(parents=True)  # a directory that is not a model
    app = create_app(settings, pool=pool)
    return TestClient(app), c, data, tmp_path


@pytest.fixture
def env(tmp_path):
    return _env(tmp_path)


def h(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def state(c: Collection) -> tuple:
    c = Collection.open(c.path)
    st = c.status()
    return c.generation, st["items"], {s: (v.get("image"), v.get("text")) for s, v in st["spaces"].items()}, \
        sorted(c.items())


def png(size=(8, 8), seed=0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_search_by_text_and_image_and_status(env):
    api, c, data, _ = env
    r = api.post("/v1/search", json={"text": "caption 1 of image 3 seed 0", "k": 5, "target": "text"}, headers=h(READ))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["modality"] == "text" and len(out["hits"]) == 5
    top = out["hits"][0]
    assert top["text"] == "caption 1 of image 3 seed 0" and top["route"] == "bridge" and top["rank"] == 1
    img = next((data / "images").iterdir()).read_bytes()
    r = api.post("/v1/search", files={"image": ("q.png", img)}, data={"k": "3"}, headers=h(READ))
    assert r.status_code == 200 and r.json()["modality"] == "text" and len(r.json()["hits"]) == 3
    st = api.get("/v1/status", headers=h(READ)).json()
    assert st["items"] == {"image": 6, "text": 12} and len(st["spaces"]) == 2 and st["backfill"]["done"] == 0
    assert api.get("/healthz").json()["ok"]
    metrics = api.get("/metrics").text
    assert 'nobackfill_requests_total{endpoint="/v1/search",method="POST",status="200"}' in metrics
    assert "nobackfill_search_hits_total" in metrics and "nobackfill_backfill_total 18.0" in metrics
    assert "/v1/search" in api.get("/openapi.json").json()["paths"]


def test_items_add_get_thumbnail_delete(env):
    api, c, data, _ = env
    r = api.post("/v1/items", json={"items": [{"text": "a text over http", "id": "h1", "lang": "en"},
                                              {"text": "another one"}]}, headers=h(ADMIN))
    assert r.status_code == 200, r.text
    assert r.json()["added"] == 2 and r.json()["ids"][0] == "h1"
    r = api.post("/v1/items", json={"items": [{"text": "a text over http", "id": "h1", "lang": "en"}]}, headers=h(ADMIN))
    assert r.json()["unchanged"] == 1
    item = api.get("/v1/items/h1", headers=h(READ)).json()
    assert item["modality"] == "text" and item["metadata"]["lang"] == "en"
    r = api.post("/v1/items", files=[("images", ("a.png", png(seed=3), "image/png", {"X-Item-Id": "up-a"})),
                                     ("images", ("b.png", png(seed=4)))], headers=h(ADMIN))
    assert r.status_code == 200 and r.json()["added"] == 2, r.text
    thumb = api.get("/v1/items/up-a/thumbnail", headers=h(READ))
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(thumb.content)).size[0] <= 160
    hits = api.post("/v1/search", files={"image": ("q.png", png(seed=3))}, data={"k": "1", "target": "image"},
                    headers=h(READ)).json()["hits"]
    assert hits[0]["id"] == "up-a" and hits[0]["route"] == "native"
    assert api.delete("/v1/items/h1", headers=h(ADMIN)).json() == {"deleted": "h1"}
    assert api.get("/v1/items/h1", headers=h(READ)).status_code == 404


def test_backfill_through_the_api(env):
    api, c, _, _ = env
    r = api.post("/v1/backfill/start", json={"order": "sequential"}, headers=h(ADMIN))
    assert r.status_code == 200, r.text
    svc = api.app.state.service
    svc.client.worker.thread.join(timeout=60)
    st = api.get("/v1/status", headers=h(READ)).json()
    assert st["backfill"]["fraction"] == 1.0 and st["backfill"]["worker"] == "idle"
    hits = api.post("/v1/search", json={"text": "anything", "k": 18, "target": "text"}, headers=h(READ)).json()["hits"]
    assert {x["route"] for x in hits} == {"native"}


LIMITS = Limits(max_body_bytes=300_000, max_k=50, max_batch=5, max_caption_chars=200, max_image_pixels=64 * 64)
BAD = bad_input_cases(READ, ADMIN, max_k=LIMITS.max_k, max_caption=LIMITS.max_caption_chars, max_batch=LIMITS.max_batch,
                      max_pixels=LIMITS.max_image_pixels, max_body=LIMITS.max_body_bytes)


@pytest.mark.parametrize("case", BAD, ids=[b["name"] for b in BAD])
def test_bad_input_gets_a_clear_4xx_and_changes_nothing(env, case):
    """The classes of ``bench serve``: each a 4xx whose message names the problem, nothing stored changed."""
    api, c, _, _ = env
    before = state(c)
    kw = dict(case["kw"])
    headers = dict(kw.pop("headers", {}))
    key = case.get("key", ADMIN)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    r = api.request(case["method"], case["path"], headers=headers, **kw)
    assert r.status_code == case["status"], r.text
    detail = r.json()["detail"]
    assert all(w in detail for w in case["words"]), detail
    assert state(c) == before


def test_upgrade_during_a_backfill_is_a_409(env):
    api, c, _, tmp = env
    from nobackfill.lifecycle.backfill import start_backfill

    start_backfill(c, api.app.state.service.pool.get(NEW_REF), order="sequential")
    model = tmp / "models" / "newer"
    model.mkdir()
    (model / "config.json").write_text("{}")
    before = state(c)
    r = api.post("/v1/upgrade", json={"model": "newer"}, headers=h(ADMIN))
    assert r.status_code == 409 and "let it finish" in r.json()["detail"]
    assert state(c) == before


# ----------------------------------------------------------------------------- issue 24, items 6, 7, 9, 10
def uploads(c: Collection) -> list:
    folder = c.path / "uploads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_every_multipart_part_is_checked_for_its_kind(env):
    """A plain field where a file goes, a file where a plain field goes, an unknown or repeated part:
    a 422 naming the part (never a 500), nothing stored."""
    api, c, _, _ = env
    before, stored = state(c), uploads(c)
    cases = [
        ("/v1/items", [("images", (None, "not a file"))], "images[0]"),
        ("/v1/items", [("images", ("a.png", png(seed=7))), ("images", (None, "plain"))], "images[1]"),
        ("/v1/items", [("images", ("a.png", png(seed=7))), ("ids", (None, "x"))], "ids"),
        ("/v1/items", [("images", ("a.png", png(seed=7), "image/png", {"X-Item-Id": "../x"}))], "images[0]"),
        ("/v1/search", [("image", (None, "plain"))], "image"),
        ("/v1/search", [("image", ("q.png", png())), ("k", ("k.txt", b"3"))], "k"),
        ("/v1/search", [("image", ("q.png", png())), ("filter", ("f.json", b"{}"))], "filter"),
        ("/v1/search", [("image", ("q.png", png())), ("image", ("r.png", png(seed=1)))], "image"),
        ("/v1/search", [("image", ("q.png", png())), ("filter", (None, '{"a": {"b": 1}}'))], "filter"),
        ("/v1/search", [("image", ("q.png", png())), ("k", (None, "2.5"))], "k"),
        ("/v1/search", [("image", ("q.png", png())), ("filter", (None, '{"": "x"}'))], "filter"),
    ]
    for path, files, field in cases:
        r = api.post(path, files=files, headers=h(ADMIN))
        assert r.status_code == 422, (path, field, r.text)
        assert r.json()["field"] == field and field in r.json()["detail"], r.text
    assert state(c) == before and uploads(c) == stored
    # an image part with an image Content-Type but no filename is a file (RFC 7578), k as a JSON number
    r = api.post("/v1/search", files=[("image", (None, png(seed=2), "image/png")), ("k", (None, "3.0")),
                                      ("filter", (None, '{"labels.n": [0, 1, 2]}'))], headers=h(READ))
    assert r.status_code == 200 and len(r.json()["hits"]) <= 3, r.text


def test_a_rejected_upload_stores_nothing(env, monkeypatch):
    """A failed request changes nothing stored: no image file under uploads/, no item, no vector;
    whether an image is refused (422, 413), the ids conflict (409) or the server fails (500)."""
    from fastapi.testclient import TestClient

    api, c, _, _ = env
    before, stored = state(c), uploads(c)
    cases = [
        ([("images", ("a.png", png(seed=11))), ("images", ("b.png", png()[:60]))], 422),
        ([("images", ("a.png", png(seed=12))), ("images", ("big.png", png(size=(80, 80))))], 413),
        ([("images", ("a.png", png(seed=13), "image/png", {"X-Item-Id": "same"})),
          ("images", ("b.png", png(seed=14), "image/png", {"X-Item-Id": "same"}))], 409),
    ]
    for files, status in cases:
        r = api.post("/v1/items", files=files, headers=h(ADMIN))
        assert r.status_code == status, r.text
        assert uploads(c) == stored and state(c) == before, r.text

    import nobackfill.collection.ingest as ingest

    def broken(*a, **kw):
        raise RuntimeError("the store went away")

    monkeypatch.setattr(ingest, "add_items", broken)
    r = TestClient(api.app, raise_server_exceptions=False).post(
        "/v1/items", files=[("images", ("a.png", png(seed=15)))], headers=h(ADMIN))
    assert r.status_code == 500 and r.json() == {"detail": "internal error (RuntimeError)", "field": None}
    assert uploads(c) == stored and state(c) == before


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def test_no_response_shows_a_server_path(env):
    """Items, hits, status and error messages name files relative to the collection (uploads/...)
    or by their name, for every role: never the server's file system."""
    api, c, data, tmp = env
    r = api.post("/v1/items", files=[("images", ("mine.png", png(seed=21), "image/png", {"X-Item-Id": "u1"}))],
                 headers=h(ADMIN))
    assert r.status_code == 200, r.text
    roots = {str(tmp), str(tmp.resolve())}
    bodies = []
    for key in (READ, ADMIN):
        bodies.append(api.get("/v1/status", headers=h(key)))
        hits = api.post("/v1/search", json={"text": "caption 0 of image 1 seed 0", "k": 20, "target": "image"},
                        headers=h(key))
        bodies.append(hits)
        bodies += [api.get(f"/v1/items/{x['id']}", headers=h(key)) for x in hits.json()["hits"]]
        bodies.append(api.post("/v1/search", files={"image": ("q.png", png(seed=21))}, data={"target": "image"},
                               headers=h(key)))
    bodies.append(api.post("/v1/backfill/pause", headers=h(ADMIN)))  # 409: no backfill in <the collection>
    bodies.append(api.post("/v1/upgrade", json={"model": "docs", "bridges": ["nothing"]}, headers=h(ADMIN)))
    for r in bodies:
        assert not any(root in r.text for root in roots), r.text
        assert not [x for x in _strings(r.json()) if x.startswith("/")], r.text
    assert bodies[-2].status_code == 409 and set(bodies[-2].json()) == {"detail", "field"}
    st = bodies[0].json()
    assert st["path"] == "c" and {s["model"] for s in st["spaces"].values()} == {"old", "new"}
    item = api.get("/v1/items/u1", headers=h(READ)).json()
    assert item["metadata"]["path"].startswith("uploads/") and item["metadata"]["filename"] == "mine.png"
    shown = {x["path"] for x in hits.json()["hits"]}
    assert "uploads/" + item["metadata"]["path"].split("/", 1)[1] in shown
    assert {p for p in shown if not p.startswith("uploads/")} <= {p.name for p in (data / "images").iterdir()}


def test_messages_keep_the_services_own_endpoints_and_refuse_absolute_paths_plainly(env, tmp_path):
    """The path scrubber leaves the API's own endpoints in text (``POST /v1/backfill/start``), and an
    absolute model path (even one under the root) is refused as absolute, not as "outside the root"
    under a name the server rewrote."""
    from nobackfill.serve.paths import PublicPaths

    pub = PublicPaths([(tmp_path, "")])
    assert pub.text("or POST /v1/backfill/start to go on; see /metrics and /docs") == \
        "or POST /v1/backfill/start to go on; see /metrics and /docs"
    assert pub.text(f"read {tmp_path}/m/config.json.") == "read m/config.json."
    api, c, _, _ = env
    before = state(c)
    r = api.post("/v1/upgrade", json={"model": str(tmp_path / "models" / "world-new")}, headers=h(ADMIN))
    assert r.status_code == 400 and r.json()["field"] == "model" and "absolute path" in r.json()["detail"]
    assert "outside" not in r.json()["detail"] and state(c) == before


def test_a_storage_uri_is_shown_as_the_collections_name(tmp_path):
    """trial Z: status and errors showed a read key the server's Milvus host and database user."""
    from nobackfill.serve.paths import PublicPaths

    uri = "milvus://10.0.0.5:19530/default#photos?catalog=postgresql://nb:secret@db.internal:5432/nb"
    shown = "milvus://10.0.0.5:19530/default#photos?catalog=postgresql://nb:***@db.internal:5432/nb"
    pub = PublicPaths([(tmp_path, "")], aliases={uri: "photos", shown: "photos"})
    got = pub.deep({"path": uri, "note": f"collection {shown} has no space s (spaces: a)", "n": 3})
    assert got == {"path": "photos", "note": "collection photos has no space s (spaces: a)", "n": 3}
    assert pub.text(f"read {tmp_path}/m/config.json") == "read m/config.json"  # paths as before
    from types import SimpleNamespace

    from nobackfill.serve.service import Service

    svc = SimpleNamespace(settings=SimpleNamespace(collection=uri), collection=SimpleNamespace(path=uri, name="photos"))
    assert Service._uri_aliases(svc) == {uri: "photos", shown: "photos"}  # as given, and as messages show it


def test_bridges_lie_under_the_upgrades_root_and_models_under_the_models_root(env):
    api, c, _, _ = env
    before = state(c)
    r = api.post("/v1/upgrade", json={"model": "docs", "bridges": ["up"]}, headers=h(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "model", r.text  # the bridge was found
    r = api.post("/v1/upgrade", json={"model": "docs", "bridges": ["docs"]}, headers=h(ADMIN))
    assert r.status_code == 404 and r.json()["field"] == "bridges[0]" and "--upgrades-root" in r.json()["detail"]
    r = api.post("/v1/upgrade", json={"model": "up"}, headers=h(ADMIN))
    assert r.status_code == 404 and r.json()["field"] == "model" and "--models-root" in r.json()["detail"]
    r = api.post("/v1/upgrade", json={"model": "docs", "bridges": ["../upgrades/up"]}, headers=h(ADMIN))
    assert r.status_code == 400 and "outside" in r.json()["detail"]
    assert state(c) == before


def test_serve_cli_roots(tmp_path, monkeypatch):
    """--models-root and --upgrades-root are separate options, documented, with defaults models/ and
    upgrades/ (the project's layout, as in the README)."""
    from pathlib import Path

    import uvicorn
    from typer.testing import CliRunner

    import nobackfill.serve as serve
    from nobackfill.cli import app as cli

    seen = []

    class Fake:
        class state:
            class service:
                unfinished: list = []  # (no thread left running when it stopped)

    monkeypatch.setattr(serve, "create_app", lambda settings: seen.append(settings) or Fake())
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    keys = tmp_path / "keys.toml"
    keys.write_text(f'read = ["{READ}"]\n')
    runner = CliRunner()
    r = runner.invoke(cli, ["serve", "photos", "--keys", str(keys)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["serve", "photos", "--keys", str(keys), "--models-root", "m", "--upgrades-root", "u"])
    assert r.exit_code == 0, r.output
    assert (seen[0].models_root, seen[0].upgrades_root) == (Path("models"), Path("upgrades"))
    assert seen[0].limits.max_k == Limits().max_k == 1000  # the largest k of the in-process client too
    assert (seen[1].models_root, seen[1].upgrades_root) == (Path("m"), Path("u"))
    r = runner.invoke(cli, ["serve", "photos", "--keys", str(keys), "--onnx", "export"])
    assert r.exit_code == 0 and seen[2].onnx == "export", r.output
    r = runner.invoke(cli, ["serve", "photos", "--keys", str(keys), "--onnx", "fast"])
    assert r.exit_code != 0 and "--onnx must be one of auto, export, int8, off, got 'fast'" in r.output
    for n in ("0", "-1"):
        r = runner.invoke(cli, ["serve", "photos", "--keys", str(keys), "--query-threads", n])
        assert r.exit_code == 2 and f"--query-threads must be at least 1, got {n}" in r.output
    assert len(seen) == 3
    help_text = runner.invoke(cli, ["serve", "--help"], terminal_width=200).output
    assert "--models-root" in help_text and "--upgrades-root" in help_text


def test_serve_on_a_port_in_use_is_one_line_before_serving(tmp_path, monkeypatch):
    """Trial AJ (D6): ``serve --port P`` with P in use printed "serving ... on http://..." and then
    uvicorn's own ERROR line, exit 3. It is one line naming host:port, exit 2, nothing said to serve:
    before the models load, and again where the port was taken while they loaded."""
    import socket

    import uvicorn
    from typer.testing import CliRunner

    import nobackfill.serve as serve
    from nobackfill.cli import app as cli

    class Fake:
        class state:
            class service:
                unfinished: list = []

    ran, loaded = [], []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: ran.append(kw))
    keys = tmp_path / "keys.toml"
    keys.write_text(f'read = ["{READ}"]\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(serve, "create_app", lambda settings: loaded.append(settings) or Fake())
        r = CliRunner().invoke(cli, ["serve", "photos", "--keys", str(keys), "--port", str(port)])
    assert r.exit_code == 2 and not loaded and not ran, r.output
    assert r.output.strip() == f"error: 127.0.0.1:{port} is already in use (another server listens there); " \
                               "choose another --port", r.output
    holder = []

    def load_while_another_takes_the_port(settings):
        holder.append(socket.create_server(("127.0.0.1", port)))
        return Fake()

    monkeypatch.setattr(serve, "create_app", load_while_another_takes_the_port)
    try:
        r = CliRunner().invoke(cli, ["serve", "photos", "--keys", str(keys), "--port", str(port)])
    finally:
        for sock in holder:
            sock.close()
    assert r.exit_code == 2 and holder and not ran and "serving" not in r.output, r.output
    assert f"127.0.0.1:{port} is already in use" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    monkeypatch.setattr(serve, "create_app", lambda settings: Fake())
    r = CliRunner().invoke(cli, ["serve", "photos", "--keys", str(keys), "--port", str(port)])
    assert r.exit_code == 0 and ran and "serving photos on" in r.output, r.output  # free again: it serves


def test_a_body_past_the_limit_is_a_413_without_a_length(env):
    api, c, _, _ = env

    def chunks():
        for _ in range(LIMITS.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    r = api.post("/v1/items", content=chunks(), headers={**h(ADMIN), "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body", r.text


def test_an_encoded_slash_never_reaches_another_route(env):
    api, c, _, _ = env
    before = state(c)
    for method in ("GET", "DELETE"):
        r = api.request(method, "/v1/items/img-x%2Fthumbnail", headers=h(ADMIN))
        assert r.status_code == 404 and set(r.json()) == {"detail", "field"}, r.text
    assert state(c) == before


def test_the_client_names_any_id(env, tmp_path):
    """The Python client: image ids in the part header, ids with URL-reserved or non-ASCII characters
    escaped in paths, a nested filter of an image search sent flat."""
    from nobackfill.client import Client

    api, c, data, _ = env
    client = Client("http://testserver", ADMIN, http=api)
    img = tmp_path / "odd.png"
    img.write_bytes(png(seed=31))
    odd = "a?b#c é+&=;"  # (no "%": the TestClient decodes a path twice)
    assert client.add(images=[img, next((data / "images").iterdir())], ids=[odd, None]).ids[0] == odd
    assert client.get(odd).metadata["filename"] == "odd.png"
    assert client.thumbnail(odd)[:8] == b"\x89PNG\r\n\x1a\n"
    hits = client.search(image=img, k=3, target="image", filter={"labels": {"n": [0, 1, 2]}}).hits
    assert hits and all(x.metadata["labels"]["n"] in (0, 1, 2) for x in hits)
    assert client.delete(odd) == 1


def test_import_takes_vectors_under_the_data_root_after_the_model_check(env):
    """POST /v1/import: 403 without --data-root, 409 for vectors of another model (nothing changed),
    then the current model's vectors imported and searchable."""
    import json

    from _collection_helpers import HashEncoder

    api, c, _, tmp = env
    svc = api.app.state.service
    old, new = svc.pool.get(OLD_REF), svc.pool.get(NEW_REF)
    root = tmp / "imports"
    root.mkdir()
    texts = [f"imported caption {i}" for i in range(12)]
    (root / "t.jsonl").write_text("".join(json.dumps({"id": f"imp{i}", "text": t, "score": i, "shop": "s", "x": 1})
                                          + "\n" for i, t in enumerate(texts)))
    np.save(root / "new.npy", new.encode_texts(texts))
    np.save(root / "old.npy", old.encode_texts(texts))  # another width: a 422
    np.save(root / "stranger.npy", HashEncoder(new.embed_dim, "stranger").encode_texts(texts))  # same width
    body = {"format": "npy", "path": "new.npy", "table": "t.jsonl", "id_column": "id", "source_column": "text",
            "modality": "text", "metadata_columns": ["score", "shop"]}
    r = api.post("/v1/import", json=body, headers=h(ADMIN))
    assert r.status_code == 403 and "--data-root" in r.json()["detail"]
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"read": [READ], "admin": [ADMIN]}),
                             data_root=root, limits=LIMITS)
    api = TestClient(create_app(settings, pool=svc.pool))
    before = state(c)
    assert api.post("/v1/import", json=body, headers=h(READ)).status_code == 403
    r = api.post("/v1/import", json={**body, "path": "old.npy"}, headers=h(ADMIN))
    assert r.status_code == 422 and "12-d" in r.json()["detail"] and state(c) == before
    r = api.post("/v1/import", json={**body, "path": "stranger.npy"}, headers=h(ADMIN))
    assert r.status_code == 409 and "were not made by" in r.json()["detail"] and state(c) == before
    r = api.post("/v1/import", json={**body, "path": "../t.jsonl"}, headers=h(ADMIN))
    assert r.status_code == 400 and "outside the allowed root" in r.json()["detail"] and state(c) == before
    r = api.post("/v1/import", json=body, headers=h(ADMIN))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["added"] == 12 and out["model_check"]["accepted"] and str(tmp) not in r.text
    assert out["source"].startswith("npy ") and "new.npy" in out["source"] and "t.jsonl" in out["source"]
    hits = api.post("/v1/search", json={"text": texts[4], "k": 1, "target": "text"}, headers=h(READ)).json()["hits"]
    assert hits[0]["id"] == "imp4" and hits[0]["route"] == "native"
    # the source and the columns asked for, whole (a key named as a hit's field too) in /v1/search and the item
    assert hits[0]["metadata"] == {"text": texts[4], "score": 4, "shop": "s"} and hits[0]["score"] != 4
    assert api.get("/v1/items/imp4", headers=h(READ)).json()["metadata"] == {"text": texts[4], "score": 4, "shop": "s"}


def test_metrics_show_the_query_cache(env):
    api, _, _, _ = env
    for text in ("caption 1 of image 3 seed 0", "caption 1 of image 3 seed 0", "caption  1 of image 3 seed 0 "):
        assert api.post("/v1/search", json={"text": text, "k": 3}, headers=h(READ)).status_code == 200
    metrics = api.get("/metrics").text
    hits = float(next(x.split()[1] for x in metrics.splitlines() if x.startswith("nobackfill_query_cache_hits_total")))
    misses = float(next(x.split()[1] for x in metrics.splitlines()
                        if x.startswith("nobackfill_query_cache_misses_total")))
    assert hits >= 1 and misses >= 2  # the third text is the first with other whitespace: another query
    assert "nobackfill_query_cache_size 4096.0" in metrics
    runs = [x for x in metrics.splitlines() if x.startswith("nobackfill_query_encoder{")]
    assert runs and all('runtime="torch"' in x and x.endswith(" 1.0") for x in runs)  # how each query tower runs
    assert {x.split('tower="')[1].split('"')[0] for x in runs} >= {"text"}


def test_metrics_tell_apart_two_query_models_of_one_directory_name(env):
    """Trial AJ (D7): a collection upgraded from models/world-old to models/v2/world-old (another
    model, one directory name) showed ``nobackfill_query_encoder{model="world-old",...}`` twice with
    the same labels, which Prometheus refuses. Each series names its model's space too: unique."""
    import shutil
    from collections import Counter

    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    root = Path(__file__).resolve().parents[1]
    api, _, _, tmp = env
    other = tmp / "v2" / "world-old"
    shutil.copytree(root / "models" / "world-new", other, ignore=shutil.ignore_patterns("onnx"))
    pool = api.app.state.service.pool
    spaces = {pool.query_encoder(str(d)).space_id for d in (root / "models" / "world-old", other)}
    assert len(spaces) == 2
    pool.query_encoder(f"{root}/models/./world-old")  # one model under two references: one series
    families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}
    series = [tuple(sorted(x.labels.items())) for x in families["nobackfill_query_encoder"].samples]
    assert series and not [x for x, n in Counter(series).items() if n > 1], series
    ours = [dict(x) for x in series if dict(x)["model"] == "world-old"]
    assert {(x["space"], x["tower"]) for x in ours} == {(sp, t) for sp in spaces for t in ("image", "text")}, ours
    assert all(dict(x)["space"] for x in series), series  # the stand-ins' spaces too


def test_the_api_docs_pages_load_nothing_from_another_host(env):
    """``/docs`` (Swagger UI) and ``/redoc`` name no CDN: their scripts and styles come from the
    server itself (the package's copy), so the pages work offline (issue 44, item 12)."""
    import re

    api = env[0]
    for page, assets in (("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")), ("/redoc", ("redoc.standalone.js",))):
        r = api.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""", r.text)
        urls = [u for pair in urls for u in pair if u]
        assert urls and not [u for u in urls if "//" in u], (page, urls)  # no http(s):// nor //host
        assert "cdn." not in r.text and "fonts.googleapis" not in r.text, page
        for name in assets:
            url = next(u for u in urls if u.endswith(name))
            got = api.get(url)
            assert got.status_code == 200 and len(got.content) > 50_000, (url, got.status_code)
    assert api.get("/docs/oauth2-redirect").status_code == 200
    assert "/docs" not in api.get("/openapi.json").json()["paths"]


def test_a_captions_own_path_comes_back_as_given(env):
    """Trial K: a caption added with ``{"path": "/etc/passwd"}`` came back as ``passwd`` (the
    server's rule for the paths it stored of images). A caption's ``path`` is its own data; an
    image's stored path still comes back without the server's root."""
    api, c, data, _ = env
    r = api.post("/v1/items", json={"items": [{"text": "a text with a path", "id": "p1", "path": "/etc/passwd"}]},
                 headers=h(ADMIN))
    assert r.status_code == 200, r.text
    assert api.get("/v1/items/p1", headers=h(READ)).json()["metadata"]["path"] == "/etc/passwd"
    hit = api.post("/v1/search", json={"text": "a text with a path", "k": 1, "target": "text"},
                   headers=h(READ)).json()["hits"][0]
    assert hit["id"] == "p1" and hit["metadata"]["path"] == "/etc/passwd"
    img = next(i for i, it in Collection.open(c.path).items().items() if it.modality == "image")
    shown = api.get(f"/v1/items/{img}", headers=h(READ)).json()["metadata"]["path"]
    assert not shown.startswith("/") and str(tmp_root := data.parent) not in shown, (shown, tmp_root)


def test_a_json_adds_metadata_refusal_names_the_bodys_own_field(env):
    """Trial K: ``{"items": [{"text": ..., "score": 1e999}]}`` was refused naming ``texts[0]``, a
    field the body has not; it names ``items[0]``, as this endpoint's other refusals do."""
    api, c, data, _ = env
    before = state(c)
    r = api.post("/v1/items", content=b'{"items": [{"text": "fine"}, {"text": "q", "score": 1e999}]}',
                 headers={**h(ADMIN), "Content-Type": "application/json"})
    body = r.json()
    assert r.status_code == 422 and body["field"] == "items[1]" and body["detail"].startswith("items[1]"), body
    assert state(c) == before


@pytest.mark.parametrize("value, shown", [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf")])
def test_a_literal_nan_in_a_json_body_is_the_422_naming_the_item_and_field(env, value, shown):
    """Trial AJ (D5): a literal ``NaN`` / ``Infinity`` (what Python's ``json.dumps`` writes) was a 400
    "malformed JSON" naming no item; it is the 422 serve.md promises, as ``1e400`` already was (in an
    image part's metadata header it is no valid JSON: a 422 naming the part). Malformed JSON stays a 400."""
    api, c, data, _ = env
    before = state(c)
    body = b'{"items": [{"text": "fine"}, {"text": "q", "score": %s}]}' % value.encode()
    r = api.post("/v1/items", content=body, headers={**h(ADMIN), "Content-Type": "application/json"})
    got = r.json()
    assert r.status_code == 422 and got["field"] == "items[1]", got
    assert got["detail"].startswith("items[1]: ") and f"'score' is {shown}" in got["detail"], got
    files = [("images", ("a.png", png(), "image/png", {"X-Item-Metadata": '{"score": %s}' % value}))]
    got = api.post("/v1/items", files=files, headers=h(ADMIN)).json()  # (a header is strict JSON: 422 naming it)
    assert got["field"] == "images[0]" and "X-Item-Metadata is not valid JSON" in got["detail"], got
    r = api.post("/v1/items", content=b'{"items": [{"text": "fine"},]}',
                 headers={**h(ADMIN), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["detail"].startswith("malformed JSON"), r.text
    assert state(c) == before


def test_retiring_the_current_space_names_the_space_field(env):
    """Trial K: ``POST /v1/retire`` of the current space answered 409 naming the field ``backfill``."""
    api, c, data, _ = env
    cur = Collection.open(c.path).current_space
    r = api.post("/v1/retire", json={"space": cur}, headers=h(ADMIN))
    assert r.status_code == 409 and r.json()["field"] == "space" and "current" in r.json()["detail"], r.text


def test_an_imports_absolute_path_names_the_path_field(env):
    """Trial K: ``POST /v1/import {"path": "/etc/passwd"}`` was refused naming the field ``body``
    (a body field called path was taken for the location of a path parameter)."""
    api, c, data, _ = env
    for bad in ("/etc/passwd", "../models/x.npy"):
        r = api.post("/v1/import", json={"format": "npy", "path": bad}, headers=h(ADMIN))
        assert r.status_code == 400 and r.json()["field"] == "path", r.text


def test_a_filters_empty_key_is_refused_as_naming_nothing(env):
    """An empty key names no metadata field: 422 on ``filter``, in the JSON search as in the image
    search's form field (whose schema pattern says so too)."""
    api, _c, _, _ = env
    for flt in ({"": "x"}, {"labels.n": 1, "": [1, 2]}):
        r = api.post("/v1/search", json={"text": "x", "filter": flt}, headers=h(READ))
        assert r.status_code == 422 and "empty key" in r.json()["detail"], (flt, r.text)
        assert r.json()["field"].startswith("filter"), r.text
    r = api.post("/v1/search", files=[("image", ("q.png", png())), ("filter", (None, '{"": 1}'))], headers=h(READ))
    assert r.status_code == 422 and r.json()["field"] == "filter", r.text


def test_a_weight_with_a_route_other_than_fused_is_refused_naming_w(env):
    """The weight is the fused route's: given with another route (or an unpin) it was ignored; now
    422 on ``w``, as the schema's anyOf says (schemathesis holds the server to it)."""
    api, c, _, _ = env
    old = next(s for s in c.plan.space_ids if s != c.plan.current)
    before = c.plan.routes
    for route in ("bridge", "old-model", None):
        r = api.post("/v1/routes", json={"space": old, "direction": "t2i", "route": route, "w": 0.3}, headers=h(ADMIN))
        assert r.status_code == 422 and r.json()["field"] == "w", (route, r.text)
    assert Collection.open(c.path).plan.routes == before
    r = api.post("/v1/routes", json={"space": old, "direction": "t2i", "route": "fused", "w": 0.3}, headers=h(ADMIN))
    assert r.status_code == 200, r.text


def test_a_backfill_running_at_shutdown_stops_saying_the_server_stopped(tmp_path):
    """The server's shutdown stops its backfill worker before the next batch: the shard is handed back
    and status names the stop (not a worker that vanished), and the job stays to be resumed."""
    api, c, _, _ = _env(tmp_path, n_images=30)  # 90 items: batches of 32
    with api:
        r = api.post("/v1/backfill/start", json={"order": "sequential", "rate": 2}, headers=h(ADMIN))
        assert r.status_code == 200, r.text
        thread = api.app.state.service.client.worker.thread
        for _ in range(400):  # its first batch committed, the next one paced
            if api.get("/v1/status", headers=h(READ)).json()["backfill"]["done"]:
                break
            time.sleep(0.05)
        assert thread.is_alive()
    assert not thread.is_alive()  # (the shutdown waited for it)
    from nobackfill.lifecycle.backfill import backfill_status

    st = backfill_status(c)
    assert st["last_worker"]["stopped"] == "the server stopped" and 0 < st["done"] < st["total"]
    assert st["state"] == "idle" and not st["holders"]


def test_a_thread_that_outlasts_the_shutdown_wait_is_named_and_the_process_ends_at_once(env, monkeypatch):
    """A bridge fit runs to its end before the worker stops; past the wait, the server names what is
    still running and `serve` ends the process itself (a thread in native code as the interpreter
    finalises aborted it: trial AD, exit 134)."""
    import os
    import threading
    from types import SimpleNamespace

    from nobackfill.cli import serve as serve_cli

    api, _, _, _ = env
    svc = api.app.state.service
    release = threading.Event()
    svc.client.worker.start(lambda: release.wait(10) and SimpleNamespace(stopped="done", reason=lambda: "done"),
                            resumed=lambda rep: False)  # (a fit: deaf to the stop)
    try:
        assert svc.close(timeout=0.1) == ["the backfill worker"] and svc.unfinished == ["the backfill worker"]
    finally:
        release.set()
        svc.client.worker.thread.join(10)
    assert svc.close(timeout=1) == [] and svc.unfinished == []
    ended = []
    monkeypatch.setattr(os, "_exit", ended.append)  # (imported where it is called)
    serve_cli._end_without_threads_left([])
    assert ended == []
    serve_cli._end_without_threads_left(["the backfill worker"])
    assert ended == [0]
