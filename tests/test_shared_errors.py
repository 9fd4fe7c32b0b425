"""A shared deployment's wrong input and absent servers, as a user meets them (trial C): every
collection name opens its own collection or is refused, a refused create writes nothing, a catalog
database that does not answer is said to be unreachable (not "not a collection"), and a backfill's
settings that would loop are refused."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from nobackfill.catalog.catalog import CatalogUnreachable, check_collection_name, postgres_catalog
from nobackfill.cli import app

runner = CliRunner()
DEAD_PG = "postgresql://nb@127.0.0.1:1/nb"  # nothing listens on port 1


@pytest.mark.parametrize("name", ["Photos", "pho-tos", "pho tos", "é", "a;drop", 'x"y', "", "a" * 51])
def test_a_name_that_would_be_changed_to_fit_is_refused(name):
    with pytest.raises(ValueError, match="collection name"):
        check_collection_name(name, lowercase=True)
    with pytest.raises(ValueError, match="collection name"):
        postgres_catalog(DEAD_PG, name)  # refused before any connection


def test_names_that_fit_are_kept_as_they_are():
    assert check_collection_name("photos_2024") == "photos_2024"
    assert check_collection_name("Photos") == "Photos"  # Milvus names keep their case
    assert postgres_catalog(DEAD_PG, "photos_2024")._schema == "nb_photos_2024"


def test_milvus_uris_with_a_name_that_does_not_fit_are_refused_before_connecting(tmp_path):
    from nobackfill.collection.uri import open_storage

    for uri in (f"milvus-lite:{tmp_path / 'm.db'}#pho-tos", "milvus://127.0.0.1:1/default#é"):
        with pytest.raises(ValueError, match="collection name"):
            open_storage(uri)
    assert not (tmp_path / "m.db").exists()


def test_a_milvus_server_uri_without_a_catalog_is_refused_before_anything_is_made():
    """On port 1 nothing answers: the refusal comes before any connection to Milvus, and says what
    to add; opening it says the same (not "no catalog.sqlite")."""
    from nobackfill.collection.collection import Collection

    with pytest.raises(ValueError, match=r"add \?catalog=postgresql://"):
        Collection.create("milvus://127.0.0.1:1/default#photos", space_id="s", dim=4, model="m")
    r = runner.invoke(app, ["collection", "status", "milvus://127.0.0.1:1/default#photos"])
    assert r.exit_code == 2 and "?catalog=postgresql://" in r.output and "catalog.sqlite" not in r.output, r.output


def test_a_catalog_database_that_does_not_answer_is_unreachable_not_absent(tmp_path):
    from nobackfill import Client
    from nobackfill.client.errors import Unreachable

    cat = postgres_catalog(DEAD_PG, "photos")
    with pytest.raises(CatalogUnreachable, match="cannot reach the catalog") as refused:
        cat.exists()
    assert "refused" in str(refused.value).lower() and "(  " not in str(refused.value)  # the cause, on one line
    uri = f"{tmp_path / 'c'}?catalog={DEAD_PG}#photos"
    with pytest.raises(Unreachable, match="cannot reach the catalog") as e:
        Client(uri).status()
    assert isinstance(e.value, ConnectionError)
    r = runner.invoke(app, ["collection", "create", uri, "--model", "models/world-old"])
    assert r.exit_code == 2 and "cannot reach the catalog" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "c").exists()  # nothing made
    r = runner.invoke(app, ["collection", "status", uri])
    assert r.exit_code == 2 and "cannot reach the catalog" in r.output and "not a collection" not in r.output


def test_a_collection_on_postgres_is_named_by_its_fragment_not_its_query(tmp_path, postgres_db):
    from nobackfill.collection.collection import Collection

    uri = f"milvus-lite:{tmp_path / 'm.db'}#shop?catalog={postgres_db}"
    c = Collection.create(uri, space_id="s", dim=4, model="m")
    assert c.status()["name"] == "shop"


def test_a_milvus_server_gone_mid_call_is_one_unreachable_error_and_other_milvus_errors_pass():
    from nobackfill.client.errors import Unreachable, as_client_error

    cls = type("MilvusException", (Exception,), {"__module__": "pymilvus.exceptions"})
    gone = cls("<MilvusException: (code=2, message=Fail connecting to server on 127.0.0.1:19530, illegal connection "
               "params or server unavailable)>")
    err = as_client_error(gone)
    assert isinstance(err, Unreachable) and "the Milvus server did not answer" in str(err) and "run the same command again" in str(err)
    assert as_client_error(cls("collection not found[collection=x]")) is None  # not a lost connection: not hidden


def test_a_ray_that_cannot_start_is_one_connection_error():
    from nobackfill.lifecycle.cluster.ray_backfill import RayOptions, _start

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):
            raise RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port")

    with pytest.raises(ConnectionError, match=r"could not start or join a local Ray \(Timed out waiting"):
        _start(FakeRay(), RayOptions())


def test_no_command_shows_the_catalog_password(tmp_path, postgres_db):
    """A catalog URL with a password (trial H: `collection backfill` printed it): what every command
    prints, as text and as --json, shows it as ``***``."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "models"
    assert postgres_db.startswith("postgresql://nobackfill@")
    url = postgres_db.replace("postgresql://nobackfill@", "postgresql://nobackfill:s3cret-pw@")  # trust: ignored
    uri = f"{tmp_path / 'c'}?catalog={url}#c"
    said = []

    def run(*args):
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, r.output
        said.append(r.output)

    run("world", "--out", tmp_path / "w", "--n-train", 2, "--n-val", 2, "--n-test", 4, "--workers", 1, "--langs", "en")
    run("collection", "create", uri, "--model", models / "world-old")
    run("collection", "add", uri, "--data", tmp_path / "w", "--split", "test")
    run("collection", "upgrade", uri, "--model", models / "world-new", "--no-fit-bridge")
    run("collection", "backfill", uri, "--limit", 2)
    run("collection", "backfill", uri, "--cancel")
    run("collection", "backfill", uri, "--limit", 2, "--json")
    run("collection", "status", uri)
    run("collection", "status", uri, "--json")
    assert all("s3cret-pw" not in out for out in said), [out for out in said if "s3cret-pw" in out][0]
    assert any("nobackfill:***@" in out for out in said)


def test_a_name_its_database_catalog_does_not_hold_is_said_so(tmp_path, postgres_db):
    """Trial H: a PostgreSQL catalog without that collection was "not a collection: no catalog.sqlite
    in it"; it says its catalog holds no collection of that name."""
    r = runner.invoke(app, ["collection", "status", f"{tmp_path / 'c'}?catalog={postgres_db}#nosuch"])
    assert r.exit_code == 2 and "its catalog holds no collection of that name" in r.output, r.output
    assert "catalog.sqlite" not in r.output
