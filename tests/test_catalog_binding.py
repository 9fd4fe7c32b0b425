"""A database catalog opens only with its own vectors (:mod:`nobackfill.storage.binding`): a URI
whose vector part names another store (a typo in a host, a port, a file; another deployment using
the same database) is refused at open, naming both, and nothing is written; the collection's own
vectors, reached by another path, still open it (trial Q: such a URI's upgrade broke the real
collection)."""

from __future__ import annotations

import json

import pytest

from nobackfill.collection.collection import Collection
from nobackfill.storage.binding import BINDING_DOC, WrongVectorsError


def _create(uri: str) -> Collection:
    c = Collection.create(uri, space_id="s", dim=4, model="m", modalities=("text",))
    return c


def test_a_directory_catalog_opens_only_with_its_own_directory(tmp_path, postgres_db):
    uri = f"{tmp_path / 'a'}?catalog={postgres_db}#photos"
    _create(uri)
    assert Collection.open(uri).count("text") == 0
    (tmp_path / "b").mkdir()
    with pytest.raises(WrongVectorsError, match=r"b: the directory .*b holds no vectors of this collection") as e:
        Collection.open(f"{tmp_path / 'b'}?catalog={postgres_db}#photos")
    assert f"vectors are at {(tmp_path / 'a').resolve()}" in str(e.value)  # where they are, as recorded
    assert list((tmp_path / "b").iterdir()) == []  # nothing written there
    (tmp_path / "link").symlink_to(tmp_path / "a")  # the same directory by another path (another mount)
    assert Collection.open(f"{tmp_path / 'link'}?catalog={postgres_db}#photos").count("text") == 0
    with pytest.raises(WrongVectorsError, match=r"vectors are at .*a, not at milvus-lite:"):
        Collection.open(f"milvus-lite:{tmp_path / 'x.db'}#photos?catalog={postgres_db}")
    assert not (tmp_path / "x.db").exists()  # refused before milvus-lite made its file


def test_a_milvus_lite_catalog_opens_only_with_its_own_file(tmp_path, postgres_db):
    pytest.importorskip("milvus_lite")
    uri = f"milvus-lite:{tmp_path / 'a.db'}#clash?catalog={postgres_db}"
    _create(uri)
    for other in (f"milvus-lite:{tmp_path / 'other.db'}#clash?catalog={postgres_db}",
                  f"{tmp_path / 'dir'}?catalog={postgres_db}#clash"):
        with pytest.raises(WrongVectorsError, match=r"holds a collection whose vectors are at milvus-lite:.*a\.db"):
            Collection.open(other)
        with pytest.raises(WrongVectorsError):  # a create there names the same conflict
            Collection.create(other, space_id="s", dim=4, model="m")
    assert not (tmp_path / "other.db").exists() and not (tmp_path / "dir").exists()
    c = Collection.open(f"milvus-lite:{tmp_path / '.' / 'a.db'}#clash?catalog={postgres_db}")  # the same file
    assert c.count("text") == 0


def test_a_catalog_from_before_the_binding_opens_as_before(tmp_path, postgres_db):
    uri = f"{tmp_path / 'a'}?catalog={postgres_db}#old"
    c = _create(uri)
    c.storage.catalog().delete_doc(BINDING_DOC)
    (tmp_path / "b").mkdir()
    assert Collection.open(f"{tmp_path / 'b'}?catalog={postgres_db}#old").count("text") == 0


@pytest.mark.milvus_server
def test_a_milvus_server_catalog_opens_by_another_address_of_the_same_server_only(request, postgres_db):
    from _collection_helpers import milvus_server_location

    uri = milvus_server_location(request)
    c = _create(uri)
    host, port = uri.removeprefix("milvus://").split("#")[0].split(":")
    same = uri.replace(f"milvus://{host}:{port}", f"milvus://localhost:{port}")  # another name, the same server
    assert same != uri and Collection.open(same).count("text") == 0
    other_db = uri.replace(f"{host}:{port}#", f"{host}:{port}/elsewhere#")  # the same server, another database
    with pytest.raises(WrongVectorsError, match="holds no vectors of this collection"):
        Collection.open(other_db)
    name = uri.split("#")[1].split("?")[0]
    with pytest.raises(WrongVectorsError, match=r"vectors are at milvus://"):
        Collection.open(f"milvus-lite:{request.getfixturevalue('tmp_path') / 'l.db'}#{name}?catalog="
                        + uri.split("?catalog=")[1])
    stored = json.loads(c.storage.catalog().read_doc(BINDING_DOC))
    assert stored["kind"] == "milvus" and stored["where"] == f"milvus://{host}:{port}/default" and stored["uid"]
