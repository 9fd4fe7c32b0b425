"""The HTTP service through its API (FastAPI's test client): keys and roles, search by text and by
image, items, status, the backfill, metrics, and every class of bad input (a clear 4xx naming the
problem, and the collection unchanged)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, write_procrustes_upgrade  # noqa: E402
from nobackfill.bench.serve_inputs import bad_input_cases  # noqa: E402
from nobackfill.index.collection import Collection  # noqa: E402
from nobackfill.index.ingest import add_items, folder_items  # noqa: E402
from nobackfill.search.plan import upgrade_collection  # noqa: E402
from nobackfill.serve import KeyRing, Limits, ServeSettings, create_app  # noqa: E402

READ, ADMIN = "read-key-0123456789", "admin-key-0123456789"


@pytest.fixture
def env(tmp_path):
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", n_images=6, captions_per_image=2)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"read": [READ], "admin": [ADMIN]}),
                             models_root=tmp_path / "models", limits=LIMITS)
    (tmp_path / "models" / "docs").mkdir(parents=True)  # a directory that is not a model
    app = create_app(settings, pool=pool)
    return TestClient(app), c, data, tmp_path


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
    r = api.post("/v1/items", files=[("images", ("a.png", png(seed=3))), ("images", ("b.png", png(seed=4)))],
                 data={"ids": json.dumps(["up-a", None])}, headers=h(ADMIN))
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
    svc.backfill_thread.join(timeout=60)
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
    from nobackfill.search.backfill import start_backfill

    start_backfill(c, api.app.state.service.pool.get(NEW_REF), order="sequential")
    model = tmp / "models" / "newer"
    model.mkdir()
    (model / "config.json").write_text("{}")
    before = state(c)
    r = api.post("/v1/upgrade", json={"model": "newer"}, headers=h(ADMIN))
    assert r.status_code == 409 and "let it finish" in r.json()["detail"]
    assert state(c) == before
