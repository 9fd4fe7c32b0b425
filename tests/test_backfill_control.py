"""The backfill's controls where no backfill exists: pause and cancel refuse (409 over HTTP, the
same ``BackfillRefused`` in process) and change nothing; a resume starts one, as
``collection backfill --resume`` does."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair, write_procrustes_upgrade  # noqa: E402
from nobackfill.client import Client, ClientError  # noqa: E402
from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.collection.ingest import add_items, folder_items  # noqa: E402
from nobackfill.lifecycle.backfill import BackfillJob  # noqa: E402
from nobackfill.lifecycle.plan_changes import upgrade_collection  # noqa: E402
from nobackfill.serve import KeyRing, ServeSettings, create_app  # noqa: E402

ADMIN = "admin-key-0123456789"


@pytest.fixture
def upgraded(tmp_path):
    old, new, w = related_pair()
    data = make_folder(tmp_path / "data", n_images=4, captions_per_image=1)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    upgrade_collection(c, NEW_REF, bridges=[write_procrustes_upgrade(tmp_path / "up", w, new, old)], pool=pool)
    return c, pool


def test_no_backfill_to_pause_or_cancel_over_http(upgraded, tmp_path):
    c, pool = upgraded
    settings = ServeSettings(collection=str(c.path), keys=KeyRing({"admin": [ADMIN]}), models_root=tmp_path)
    api = TestClient(create_app(settings, pool=pool))
    auth = {"Authorization": f"Bearer {ADMIN}"}
    for action in ("pause", "cancel"):
        r = api.post(f"/v1/backfill/{action}", headers=auth)
        assert r.status_code == 409 and "no backfill" in r.json()["detail"], (action, r.text)
    assert BackfillJob.load(Collection.open(c.path)) is None  # nothing was started
    assert api.get("/v1/status", headers=auth).json()["backfill"]["state"] == "none"


def test_no_backfill_to_pause_or_cancel_in_process(upgraded):
    c, pool = upgraded
    client = Client(str(c.path), pool=pool)
    for call in (client.backfill_pause, client.backfill_cancel):
        with pytest.raises(ClientError, match="no backfill") as e:
            call()
        assert e.value.status == 409
    assert BackfillJob.load(Collection.open(c.path)) is None
    # with a job, cancel forgets it (and a second cancel has nothing left to cancel)
    client.backfill_start("sequential", wait=True)
    assert client.backfill_cancel()["state"] == "none"
    with pytest.raises(ClientError, match="no backfill to cancel"):
        client.backfill_cancel()
