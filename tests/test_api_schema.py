"""The OpenAPI schema is what the service does: ``schemathesis`` (every check, the stateful phase
included) against a live server on 127.0.0.1 over a small collection, with an admin key; plus the
schema's own shape (one error model on every error status, every ``$ref`` resolvable, the
constraints the service enforces) and ``Allow`` on a 405."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from _live_server import LiveServer  # noqa: E402
from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, write_procrustes_upgrade  # noqa: E402
from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.collection.ingest import add_items, folder_items  # noqa: E402
from nobackfill.lifecycle.plan_changes import upgrade_collection  # noqa: E402
from nobackfill.serve import KeyRing, Limits, ServeSettings, create_app  # noqa: E402
from nobackfill.serve.schema import NONBLANK  # noqa: E402

READ, ADMIN = "schema-read-key-0123", "schema-admin-key-0123"
LIMITS = Limits(max_body_bytes=2_000_000, max_k=50, max_batch=5, max_caption_chars=200, max_image_pixels=512 * 512)


def _app(root: Path):
    """A collection of 4 images and 8 captions, mid-upgrade (two spaces, a bridge), stand-in models."""
    old, new, w = related_pair()
    data = make_folder(root / "data", n_images=4, captions_per_image=2)
    c = Collection.create(root / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(root / "up", w, new, old)], pool=pool)
    for d in ("models", "upgrades"):
        (root / d).mkdir()
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"read": [READ], "admin": [ADMIN]}),
                             models_root=root / "models", upgrades_root=root / "upgrades", limits=LIMITS)
    return create_app(settings, pool=pool), c


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    app, c = _app(tmp_path_factory.mktemp("schema"))
    with LiveServer(app) as server:
        server.collection = c
        yield server


def _schemathesis() -> str:
    exe = Path(sys.executable).with_name("st")
    if exe.exists():
        return str(exe)
    found = shutil.which("st") if _has_schemathesis() else None
    if not found:  # a dev dependency: make test installs it, so its absence is a failure, not a skip
        pytest.fail("schemathesis is not installed (pip install -e '.[dev]')")
    return found


def _has_schemathesis() -> bool:
    import importlib.util

    return importlib.util.find_spec("schemathesis") is not None


@pytest.mark.slow
def test_schemathesis_finds_nothing(live, tmp_path):
    """Every check of schemathesis (``--checks all``: status codes, content types, response schemas,
    positive data accepted and negative rejected, auth, Allow, use after free...) over every phase,
    the stateful one included, bounded by examples per operation and a time limit."""
    report = tmp_path / "report.json"
    cmd = [_schemathesis(), "run", live.url + "/openapi.json", "--checks", "all",
           "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "60", "--seed", "24",
           "--header", f"Authorization: Bearer {ADMIN}", "--request-timeout", "30", "--workers", "1",
           "--generation-database", "none", "--no-color", "--report", "json", "--report-json-path", str(report)]
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
           "SCHEMATHESIS_HOOKS": str(Path(__file__).with_name("_schemathesis_hooks.py"))}
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(var, None)
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"schemathesis ran past its time limit:\n{(e.stdout or '')[-6000:]}")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-12000:]
    result = json.loads(report.read_text())
    assert result["complete"] and not result["failures"] and not result["errors"], out[-12000:]
    assert result["test_cases"]["with_failures"] == 0 and result["test_cases"]["generated"] >= 200, result["test_cases"]
    assert result["operations"]["tested"] == result["operations"]["selected"] == 19, result["operations"]
    assert {name: phase["status"] for name, phase in result["phases"].items() if name != "examples"} == \
        {"coverage": "success", "fuzzing": "success", "stateful": "success"}, result["phases"]


# ----------------------------------------------------------------------------- the document itself
def _refs(node, out):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.append(node["$ref"])
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)
    return out


def test_the_schema_documents_every_error_with_one_model(live):
    import httpx

    doc = httpx.get(live.url + "/openapi.json", timeout=10).json()
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc, []):  # every $ref resolves (no '#/$defs/...' left behind)
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    def keys(node):
        if isinstance(node, dict):
            yield from node
            for v in node.values():
                yield from keys(v)
        elif isinstance(node, list):
            for v in node:
                yield from keys(v)

    stray = {k for k in keys(schemas) if k in ("ge", "le", "gt", "lt", "min_length", "max_length")}
    assert not stray, f"constraints that are no JSON Schema keywords: {stray}"
    err = schemas["ErrorBody"]
    assert set(err["properties"]) == {"detail", "field"} and set(err["required"]) == {"detail", "field"}
    assert "HTTPValidationError" not in schemas
    ops = {(m.upper(), p): op for p, item in doc["paths"].items() for m, op in item.items()}
    for (method, path), op in ops.items():
        for status, resp in op["responses"].items():
            if status.startswith(("4", "5")):
                assert resp["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}, \
                    (method, path, status)
        if op.get("security"):
            assert "401" in op["responses"], (method, path)
    admin_ops = [("POST", "/v1/items"), ("DELETE", "/v1/items/{item_id}"), ("POST", "/v1/upgrade"),
                 ("POST", "/v1/backfill/start"), ("POST", "/v1/backfill/pause"), ("POST", "/v1/backfill/resume"),
                 ("POST", "/v1/backfill/cancel"), ("POST", "/v1/routes"), ("POST", "/v1/calibrate"),
                 ("POST", "/v1/retire"), ("POST", "/v1/verify"), ("POST", "/v1/import")]
    for key in admin_ops:
        assert "403" in ops[key]["responses"], key
    for key, statuses in {("POST", "/v1/search"): {"400", "413", "415", "422"},
                          ("POST", "/v1/items"): {"400", "409", "413", "415", "422"},
                          ("GET", "/v1/items/{item_id}"): {"404"}, ("DELETE", "/v1/items/{item_id}"): {"404"},
                          ("POST", "/v1/upgrade"): {"400", "404", "409", "415", "422"},
                          ("POST", "/v1/backfill/pause"): {"409"}, ("POST", "/v1/routes"): {"404", "422"},
                          ("POST", "/v1/retire"): {"404", "409"}, ("POST", "/v1/calibrate"): {"403", "404"}}.items():
        assert statuses <= set(ops[key]["responses"]), (key, sorted(ops[key]["responses"]))
    # 2xx bodies are typed, and the enforced constraints are in the schema
    for key in [("POST", "/v1/search"), ("POST", "/v1/items"), ("GET", "/v1/items/{item_id}"), ("GET", "/v1/status"),
                ("DELETE", "/v1/items/{item_id}"), ("POST", "/v1/upgrade"), ("POST", "/v1/backfill/start")]:
        assert "$ref" in ops[key]["responses"]["200"]["content"]["application/json"]["schema"], key
    search = schemas["SearchRequest"]["properties"]
    assert search["k"]["minimum"] == 1 and search["k"]["maximum"] == LIMITS.max_k
    assert search["text"]["minLength"] == 1 and search["text"]["maxLength"] == LIMITS.max_caption_chars
    assert search["text"]["pattern"] == NONBLANK
    assert schemas["AddTexts"]["properties"]["items"]["maxItems"] == LIMITS.max_batch
    assert schemas["TextItem"]["properties"]["text"]["pattern"] == NONBLANK
    assert "pattern" in schemas["UpgradeRequest"]["properties"]["model"]
    body = ops[("POST", "/v1/items")]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    form = schemas[body["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]]
    assert form["properties"]["images"]["items"]["format"] == "binary" and form["required"] == ["images"]
    assert "/favicon.ico" not in doc["paths"]


def test_405_lists_every_method_of_the_path(live):
    import httpx

    with httpx.Client(base_url=live.url, timeout=10) as http:
        for method in ("OPTIONS", "PUT", "PATCH"):
            r = http.request(method, "/v1/items/anything", headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 405, r.text
            assert {m.strip() for m in r.headers["allow"].split(",")} >= {"GET", "DELETE"}, r.headers["allow"]
            assert r.json()["field"] == "method"
        r = http.get("/v1/items", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_every_error_body_carries_field(live):
    import httpx

    with httpx.Client(base_url=live.url, timeout=10) as http:
        h = {"Authorization": f"Bearer {ADMIN}"}
        answers = [http.get("/no/such/path"), http.request("PATCH", "/v1/status", headers=h),
                   http.get("/v1/items/nope", headers=h), http.post("/v1/upgrade", json={"model": "none"}, headers=h),
                   http.post("/v1/items", json={"items": [{"text": "a", "id": "d"}, {"text": "b", "id": "d"}]},
                             headers=h),
                   http.post("/v1/search", json={"text": "x"}), http.post("/v1/items", content=b"{", headers=h),
                   http.post("/v1/search", content=b"x", headers={**h, "content-type": "text/plain"})]
        for r in answers:
            assert r.status_code >= 400 and set(r.json()) == {"detail", "field"}, (r.request.url, r.text)
        assert sorted(r.status_code for r in answers) == [400, 401, 404, 404, 404, 405, 409, 415]
