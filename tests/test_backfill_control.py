"""The backfill's controls where no backfill exists: pause and cancel refuse (409 over HTTP, the
same ``BackfillRefused`` in process) and change nothing; a resume starts one, as
``collection backfill --resume`` does."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from _collection_helpers import upgraded_collection  # noqa: E402
from nobackfill.client import Client, ClientError  # noqa: E402
from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.lifecycle.backfill import BackfillJob  # noqa: E402
from nobackfill.serve import KeyRing, ServeSettings, create_app  # noqa: E402

ADMIN = "admin-key-0123456789"


@pytest.fixture
def upgraded(tmp_path):
    c, _old, _new, pool, _data = upgraded_collection(tmp_path, n_images=4, captions=1)
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
