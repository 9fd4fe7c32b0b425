"""Fitted bridges kept in the collection's catalog: an upgrade without a bridge works end to end on a
shared deployment (vectors in a directory or on a Milvus server, the catalog in PostgreSQL) through
the Python client, the CLI and HTTP; a reader on another machine (another cache) reads the bridge
from the catalog; a stored version is never overwritten."""

from __future__ import annotations

import json
import shutil

import pytest

from _collection_helpers import NEW_REF, OLD_REF, make_folder, milvus_server_location, pool_with, related_pair
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items
from nobackfill.compat.fitted import FitConfig
from nobackfill.compat.fitted.stored import is_stored, materialize, next_version, resolve_plan, store_dir
from nobackfill.lifecycle.backfill import run_backfill
from nobackfill.lifecycle.fit_bridges import FitBridgesConfig
from nobackfill.search import Searcher

CFG = FitBridgesConfig(fit=FitConfig(families=("orthogonal", "ridge", "mlp"), epochs=10, hidden=32, max_steps=100))
QUERY = "caption 0 of image 3 seed 0"


def _location(tmp_path, postgres_db, request, vectors: str) -> str:
    if vectors == "directory":
        return f"{tmp_path / 'shared'}?catalog={postgres_db}#photos"
    return milvus_server_location(request)


def _filled(uri: str, tmp_path, n_images: int):
    old, new, _ = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    data = make_folder(tmp_path / "data", n_images=n_images, captions_per_image=2)
    c = Collection.create(uri, space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    return c, old, new, pool


def _fitted(c: Collection) -> list:
    return [u for u in c.plan.upgrades if u.kind == "fitted"]


@pytest.mark.parametrize("vectors", ["directory", pytest.param("milvus-server", marks=pytest.mark.milvus_server)])
def test_client_upgrade_without_a_bridge_on_a_shared_catalog_fits_and_another_machine_serves_it(
        tmp_path, postgres_db, request, vectors, monkeypatch):
    from nobackfill.client import Client
    from nobackfill.lifecycle import backfill_fit, fit_bridges

    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    monkeypatch.setenv("NOBACKFILL_CACHE", str(tmp_path / "cache-machine-a"))
    uri = _location(tmp_path, postgres_db, request, vectors)
    c, old, new, pool = _filled(uri, tmp_path, 60)
    client = Client(uri, pool=pool)
    client.upgrade(NEW_REF)  # no bridge
    assert backfill_fit.fit_state(Collection.open(uri))["target"] == new.space_id
    run_backfill(Collection.open(uri), new, order="random", batch_size=32)
    c = Collection.open(uri)
    fitted = _fitted(c)
    assert {u.directions for u in fitted} >= {("t2i",), ("i2t",)}
    for u in fitted:  # kept in the catalog, every file, the manifest naming the bridge's score
        assert is_stored(u.path)
        manifest = json.loads(c.catalog.read_doc(f"bridges/{u.name}/upgrade.json"))
        assert manifest["kind"] == "fitted" and manifest["fitted"]["version"] == u.info["version"]
        assert c.catalog.read_doc(f"bridges/{u.name}/fitted.safetensors")
    st = client.status()["fitted_bridges"]
    assert {b["direction"] for b in st["serving"]} >= {"t2i", "i2t"} and st["fits"]
    # another machine: nothing of the first one's files (its cache, or the shared directory's copy)
    shutil.rmtree(tmp_path / "cache-machine-a", ignore_errors=True)
    shutil.rmtree(tmp_path / "shared" / "bridges", ignore_errors=True)
    monkeypatch.setenv("NOBACKFILL_CACHE", str(tmp_path / "cache-machine-b"))
    searcher = Searcher(Collection.open(uri), pool=pool)
    t2i = [u for u in fitted if u.directions == ("t2i",)][0]
    side = searcher.query_side(old.space_id, "t2i", "bridge")  # the old space's route through the bridge
    assert side.bridge.family == t2i.info["family"] and side.bridge.info["version"] == t2i.info["version"]
    cache = tmp_path / ("shared" if vectors == "directory" else "cache-machine-b")
    assert (next(cache.rglob(f"{t2i.name}/upgrade.json"))).is_file()  # read from the catalog into this machine
    q = side.embed("text", [QUERY])
    assert q.shape == (1, old.embed_dim) and abs(float((q * q).sum()) - 1.0) < 1e-4


@pytest.mark.parametrize("interface", ["cli", "http"])
def test_cli_and_http_upgrade_without_a_bridge_on_a_postgresql_catalog(tmp_path, postgres_db, monkeypatch,
                                                                        interface):
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app
    from nobackfill.lifecycle import backfill_fit, fit_bridges

    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    monkeypatch.setenv("NOBACKFILL_CACHE", str(tmp_path / "cache"))
    uri = f"{tmp_path / 'shared'}?catalog={postgres_db}#photos"
    c, old, new, pool = _filled(uri, tmp_path, 40)
    cli = lambda *a: CliRunner().invoke(app, [str(x) for x in a])  # noqa: E731
    if interface == "cli":
        monkeypatch.setattr(models, "ModelPool", lambda: pool)
        r = cli("collection", "upgrade", uri, "--model", NEW_REF)
        assert r.exit_code == 0, r.output
        assert "fits bridges" in " ".join(r.output.split())
    else:
        pytest.importorskip("fastapi")
        from fastapi.testclient import TestClient

        from nobackfill.serve import KeyRing, ServeSettings, create_app

        model = tmp_path / "models" / "new"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
        pool.put(str(model.resolve()), new)
        (tmp_path / "upgrades").mkdir()
        settings = ServeSettings(collection=uri, keys=KeyRing({"read": ["r" * 20], "admin": ["a" * 20]}),
                                 models_root=tmp_path / "models", upgrades_root=tmp_path / "upgrades")
        api = TestClient(create_app(settings, pool=pool))
        r = api.post("/v1/upgrade", json={"model": "new"}, headers={"Authorization": "Bearer " + "a" * 20})
        assert r.status_code == 200, r.text
        monkeypatch.setattr(models, "ModelPool", lambda: pool)
    assert backfill_fit.fit_state(Collection.open(uri))["target"] == new.space_id
    r = cli("collection", "backfill", uri, "--order", "random", "--batch-size", 32)
    assert r.exit_code == 0, r.output
    r = cli("collection", "status", uri, "--json")
    assert r.exit_code == 0, r.output
    serving = json.loads(r.output)["fitted_bridges"]["serving"]
    assert {b["direction"] for b in serving} >= {"t2i", "i2t"}
    assert all(b["path"].startswith("catalog:bridges/fitted-") for b in serving)


def test_a_stored_version_is_never_overwritten_and_an_absent_one_is_named(tmp_path):
    c, old, new, pool = _filled(tmp_path / "c", tmp_path, 4)
    up = tmp_path / "up"
    up.mkdir()
    (up / "upgrade.json").write_text('{"kind": "fitted"}')
    (up / "fitted.safetensors").write_bytes(b"tensors")
    assert next_version(c.catalog, "fitted-s-t2i") == 1
    path = store_dir(c.catalog, up, "fitted-s-t2i-v1")
    assert path == "catalog:bridges/fitted-s-t2i-v1" and next_version(c.catalog, "fitted-s-t2i") == 2
    assert next_version(c.catalog, "fitted-s-i2t") == 1
    (up / "fitted.safetensors").write_bytes(b"other")
    with pytest.raises(FileExistsError):
        store_dir(c.catalog, up, "fitted-s-t2i-v1")
    assert c.catalog.read_doc("bridges/fitted-s-t2i-v1/fitted.safetensors") == b"tensors"
    d = materialize(c.catalog, path, tmp_path / "cache")
    assert (d / "fitted.safetensors").read_bytes() == b"tensors" and d == tmp_path / "cache" / "fitted-s-t2i-v1"
    with pytest.raises(FileNotFoundError, match="bridges/fitted-s-t2i-v9/"):
        materialize(c.catalog, "catalog:bridges/fitted-s-t2i-v9", tmp_path / "cache")
    with pytest.raises(ValueError, match="catalog:bridges/<name>"):
        materialize(c.catalog, "catalog:../etc", tmp_path / "cache")
    from nobackfill.catalog.plan import UpgradeRecord
    import dataclasses

    plan = dataclasses.replace(c.plan, upgrades=(
        UpgradeRecord(path=path, kind="fitted", source="a", target="b", name="fitted-s-t2i-v1"),
        UpgradeRecord(path="catalog:bridges/gone-v1", kind="fitted", source="a", target="b", name="gone-v1")))
    errors = []
    resolved = resolve_plan(plan, c.catalog, tmp_path / "cache2", on_error=lambda p, e: errors.append(p))
    assert [u.path for u in resolved.upgrades] == [str(tmp_path / "cache2" / "fitted-s-t2i-v1"),
                                                   "catalog:bridges/gone-v1"]
    assert errors == ["catalog:bridges/gone-v1"]


def _fit_enabled(uri, tmp_path, n_images: int, **fit_sample):
    from nobackfill.lifecycle.plan_changes import upgrade_collection

    c, old, new, pool = _filled(uri, tmp_path, n_images)
    upgrade_collection(c, NEW_REF, pool=pool, fit_sample=fit_sample)
    return c, old, new, pool


def test_one_fit_per_threshold_the_fit_lock_held_elsewhere_skips_it(tmp_path, postgres_db, monkeypatch):
    from nobackfill.lifecycle import backfill_fit, fit_bridges

    monkeypatch.setattr(fit_bridges, "FitBridgesConfig", lambda: CFG)
    monkeypatch.setenv("NOBACKFILL_CACHE", str(tmp_path / "cache"))
    uri = f"{tmp_path / 'shared'}?catalog={postgres_db}#photos"
    c, old, new, pool = _fit_enabled(uri, tmp_path, 40, fraction=1.0, min_pairs=40, max_pairs=120)
    run_backfill(c, new, order="random", batch_size=32, limit=96)  # the sample (all 120) not in yet: no fit
    assert backfill_fit.fit_state(c)["fits"] == [] and not _fitted(c)
    other = Collection.open(uri)  # another worker holds the fit lock (a PostgreSQL session lock)
    with other.catalog.lock("backfill/fit", blocking=False) as taken:
        assert taken
        assert backfill_fit.maybe_fit(c, final=True, pool=pool, cfg=CFG) is None
        assert backfill_fit.fit_state(c)["fits"] == [] and not _fitted(Collection.open(uri))
    rep = backfill_fit.maybe_fit(c, final=True, pool=pool, cfg=CFG)  # released: this worker fits
    assert rep and backfill_fit.fit_state(c)["fits"][0]["pairs"] == 96 and _fitted(Collection.open(uri))


KILLED_BACKFILL = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from _collection_helpers import NEW_REF, OLD_REF, pool_with, related_pair
from nobackfill.collection.collection import Collection
from nobackfill.lifecycle import fit_bridges
from nobackfill.lifecycle.backfill import run_backfill

def killed(*a, **kw):
    os.kill(os.getpid(), signal.SIGKILL)  # SIGKILLed while it fits

fit_bridges.fit_candidates = killed
old, new, _ = related_pair()
run_backfill(Collection.open({uri!r}), new, order="sequential", batch_size=16)
"""


def test_a_backfill_killed_during_a_fit_keeps_the_serving_bridge_and_fits_again_when_resumed(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from nobackfill.lifecycle import backfill_fit, fit_bridges
    from nobackfill.lifecycle.backfill import backfill_status

    c, old, new, pool = _fit_enabled(tmp_path / "c", tmp_path, 120, fraction=0.1, min_pairs=40, max_pairs=60)
    real = fit_bridges.fit_collection_bridges
    fit_bridges.fit_collection_bridges = lambda collection, **kw: real(collection, **{**kw, "cfg": CFG, "pool": pool})
    try:
        run_backfill(c, new, order="sequential", batch_size=16, limit=96)  # the first fit at 80 pairs
        serving = {u.directions: u for u in _fitted(Collection.open(c.path))}
        assert {("t2i",), ("i2t",)} <= set(serving) and backfill_fit.fit_state(c)["next"] == 160
        code = KILLED_BACKFILL.format(tests=os.path.dirname(__file__), uri=str(c.path))
        p = subprocess.run([sys.executable, "-c", code], env={**os.environ}, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
        after = Collection.open(c.path)
        assert {u.directions: u for u in _fitted(after)} == serving  # the serving bridges, untouched
        st = backfill_fit.fit_state(after)
        assert st["next"] == 160 and len(st["fits"]) == 1  # the threshold not moved: the fit is owed
        assert 160 <= backfill_fit.backfilled_count(after, new.space_id) < 360
        side = Searcher(after, pool=pool).query_side(old.space_id, "t2i", "bridge")  # served as before
        assert side.bridge.info["version"] == serving[("t2i",)].info["version"]
        run_backfill(after, new, order="sequential", batch_size=16)  # resumed: the owed fit, then the last
        st = backfill_fit.fit_state(Collection.open(c.path))
        assert [f["pairs"] for f in st["fits"]][-1] == 360 and len(st["fits"]) >= 3
        assert backfill_status(Collection.open(c.path))["state"] == "done"
    finally:
        fit_bridges.fit_collection_bridges = real


def test_two_readers_writing_one_stored_bridge_at_once_both_read_it(tmp_path, monkeypatch):
    """Two processes of one machine materialize the same bridge at once: the one whose rename
    loses reads the other's (identical) directory."""
    from nobackfill.compat import upgrade_files

    c, old, new, pool = _filled(tmp_path / "c", tmp_path, 4)
    up = tmp_path / "up"
    up.mkdir()
    (up / "upgrade.json").write_text('{"kind": "fitted"}')
    path = store_dir(c.catalog, up, "fitted-s-t2i-v1")
    real = upgrade_files.atomic_dir

    def raced(directory, write):
        real(directory, write)  # the other process wins the rename ...
        raise OSError("Directory not empty")  # ... this one's fails

    monkeypatch.setattr(upgrade_files, "atomic_dir", raced)
    d = materialize(c.catalog, path, tmp_path / "cache")
    assert (d / "upgrade.json").read_text() == '{"kind": "fitted"}'
    monkeypatch.setattr(upgrade_files, "atomic_dir", lambda directory, write: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError, match="disk"):
        materialize(c.catalog, path, tmp_path / "cache2")
