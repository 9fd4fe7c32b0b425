"""A storage that does not answer (the PostgreSQL catalog, the Milvus server) is 503 naming it, not
``internal error (MilvusException)`` 500, on a search and on the other calls (trial Q)."""

from __future__ import annotations

import pytest

from _collection_helpers import ADMIN, READ, make_folder, served_old_collection
from nobackfill.catalog.schema import CatalogUnreachable


class MilvusException(Exception):  # pymilvus' own, as far as the mapping reads it
    __module__ = "pymilvus.exceptions"


@pytest.mark.parametrize("error", [
    MilvusException("<MilvusException: (code=2, message=Fail connecting to server on 127.0.0.1:19530, illegal "
                    "connection params or server unavailable)>"),
    CatalogUnreachable("cannot reach the catalog postgresql://nb@127.0.0.1:1/nb#c (connection refused)"),
])
def test_a_storage_that_does_not_answer_is_503_naming_it(tmp_path, monkeypatch, error):
    api, c, old, new = served_old_collection(tmp_path, make_folder(tmp_path / "data", n_images=4, captions_per_image=1))
    read, admin = {"Authorization": f"Bearer {READ}"}, {"Authorization": f"Bearer {ADMIN}"}
    assert api.post("/v1/search", json={"text": "a red circle", "k": 2}, headers=read).status_code == 200
    service = api.app.state.service

    def fail(*a, **kw):
        raise error

    monkeypatch.setattr(type(service.client.searcher()), "search_batch", fail)
    before = service.client.collection
    r = api.post("/v1/search", json={"text": "a red circle", "k": 2}, headers=read)
    assert r.status_code == 503, r.text
    # a read key is not shown the storage's address (trial AH: host, port, database and user); an admin key is
    assert r.json()["detail"].startswith("the collection's storage (its catalog database or vector server) does "
                                         "not answer: retry later"), r.json()
    assert "127.0.0.1" not in r.json()["detail"] and "postgresql://" not in r.json()["detail"]
    assert service.client._collection is None and service.client._searchers == {}  # the next call reconnects
    r = api.post("/v1/search", json={"text": "a red circle", "k": 2}, headers=admin)
    assert r.status_code == 503 and ("127.0.0.1:19530" in r.json()["detail"] or "postgresql://" in r.json()["detail"])
    assert service.client._collection is None
    monkeypatch.undo()
    r = api.post("/v1/search", json={"text": "a red circle", "k": 2}, headers=read)
    assert r.status_code == 200 and service.client.collection is not before, r.text
    monkeypatch.setattr(type(service.client.searcher()), "search_batch", fail)
    monkeypatch.setattr(type(service.client), "status", fail)
    r = api.get("/v1/status", headers=admin)
    assert r.status_code == 503 and "cannot reach" in r.json()["detail"] or "Fail connecting" in r.json()["detail"], \
        r.text
    monkeypatch.setattr(type(service.client), "get", fail)
    r = api.get("/v1/items/x", headers=read)
    assert r.status_code == 503, r.text


def test_a_catalog_gone_under_any_route_is_503(tmp_path, monkeypatch):
    """A route that does not go through the service's call (the index builds) meets the same answer."""
    api, c, old, new = served_old_collection(tmp_path, make_folder(tmp_path / "data", n_images=2, captions_per_image=1))
    service = api.app.state.service

    def fail(*a, **kw):
        raise CatalogUnreachable("cannot reach the catalog postgresql://nb@127.0.0.1:1/nb#c (connection refused)")

    monkeypatch.setattr(type(service), "start_index_builds", fail)
    r = api.post("/v1/index", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 503 and r.json()["detail"].startswith("cannot reach the catalog"), r.text


def test_verify_of_a_storage_that_does_not_answer_is_an_error_not_damage(tmp_path, monkeypatch):
    """verify of an unreachable Milvus or catalog checked nothing: an error (503 over HTTP), never a
    problem with the advice to ``--repair`` (which takes vectors out of service)."""
    from nobackfill.client.errors import Unreachable
    from nobackfill.collection.collection import Collection
    from nobackfill.milvus.connection import raise_if_lost

    with pytest.raises(ConnectionError, match="nothing was checked"):
        raise_if_lost(MilvusException("<MilvusException: (code=2, message=Fail connecting to server)>"))
    raise_if_lost(MilvusException("collection not found"))  # a refusal: the caller names it as a problem
    api, c, old, new = served_old_collection(tmp_path, make_folder(tmp_path / "data", n_images=2, captions_per_image=1))

    def fail(self):
        raise CatalogUnreachable("cannot reach the catalog postgresql://nb@127.0.0.1:1/nb#c (connection refused)")

    monkeypatch.setattr(Collection, "refresh", fail)
    with pytest.raises(ConnectionError):
        Collection.open(c.path).verify()
    r = api.post("/v1/verify", json={}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 503 and "cannot reach the catalog" in r.json()["detail"], r.text
    from nobackfill import Client

    with pytest.raises(Unreachable):
        Client(c.path).verify()


def test_the_catalog_names_who_did_not_answer(tmp_path):
    """A PostgreSQL shutdown mid-call is the catalog unreachable (run again), a Milvus error met
    inside a catalog read is Milvus' (not prefixed with the catalog), and a Milvus server that could
    not be reached keeps its own message."""
    from nobackfill.catalog.items import ServerUnreachable
    from nobackfill.collection.collection import Collection

    class OperationalError(Exception):
        __module__ = "psycopg"

    class AdminShutdown(OperationalError):
        __module__ = "psycopg.errors"

    cat = Collection.create(tmp_path / "c", space_id="s", dim=4, model="m").catalog
    e = cat._error(AdminShutdown("terminating connection due to administrator command"))
    assert isinstance(e, CatalogUnreachable) and "stopped answering (AdminShutdown" in str(e)
    assert "run the same command again" in str(e)
    e = cat._error(MilvusException("<MilvusException: (code=2, message=Fail connecting to server on h:1)>"))
    assert isinstance(e, CatalogUnreachable) and str(e).startswith("the Milvus server did not answer")
    e = cat._error(MilvusException("collection not loaded"))
    assert not isinstance(e, ConnectionError) and str(e).startswith("Milvus: MilvusException")
    gone = ServerUnreachable("cannot reach the Milvus server at http://h:1 (refused)")
    assert cat._error(gone) is gone


def test_a_milvus_storage_that_stopped_answering_connects_anew():
    """trial Q: after a Milvus restart the service kept failing ~30 s (gRPC's back-off): its client is
    dropped, the next call makes a new one; milvus-lite's (one opener per file) is kept."""
    from nobackfill.milvus import connection

    class Fake:
        closed = False

        def close(self):
            self.closed = True

    server, lite = Fake(), Fake()
    lite._nobackfill_embedded = True
    connection._CLIENTS.update({"milvus:test-a": server, "milvus-lite:test-b": lite})
    try:
        connection.forget_client(server)
        connection.forget_client(lite)
        assert "milvus:test-a" not in connection._CLIENTS and server.closed
        assert connection._CLIENTS["milvus-lite:test-b"] is lite and not lite.closed
    finally:
        connection._CLIENTS.pop("milvus:test-a", None)
        connection._CLIENTS.pop("milvus-lite:test-b", None)
