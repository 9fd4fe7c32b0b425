"""A client whose collection directory is removed under it refuses, NotFound, and creates nothing:
before, its open files answered searches from the deleted collection and an ``add`` made the folder
anew (holding a lock file only), which ``verify`` then called "not a gallery"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nobackfill import Client
from nobackfill.client import NotFound

MODEL = Path(__file__).resolve().parents[1] / "models" / "world-old"


def test_a_removed_collection_is_not_found_and_not_made_anew(tmp_path):
    path = tmp_path / "c"
    c = Client(path)
    c.create(MODEL)
    c.add(texts=["a red cube", "a blue ball"])
    assert c.search(text="red", k=1).hits
    shutil.rmtree(path)
    with pytest.raises(NotFound, match="removed or replaced while this client had it open"):
        c.search(text="red", k=1)
    for call in (lambda: c.search(text="red", k=1), lambda: c.get("x"), c.status, lambda: c.add(texts=["x"]),
                 c.verify):
        with pytest.raises(NotFound, match="no such"):
            call()
    assert not path.exists()
    c.create(MODEL)  # a collection made again at the path is the client's again
    c.add(texts=["a green cone"])
    hits = c.search(text="green", k=5).hits
    assert len(hits) == 1 and c.get(hits[0].id).modality == "text"  # the new collection's one item, not the old two


def test_an_image_query_naming_a_directory_says_so(tmp_path):
    from nobackfill.client.base import check_image_file

    with pytest.raises(NotFound, match="is a directory, not an image file"):
        check_image_file(tmp_path)
    with pytest.raises(NotFound, match="no such file"):
        check_image_file(tmp_path / "q.png")


def test_a_collection_removed_and_made_again_as_an_empty_folder_is_not_answered_from_the_old_files(tmp_path):
    """trial U: an empty folder made where the collection was: stale results, raw sqlite errors, and a
    broken catalog and lock files written into the new folder."""
    path = tmp_path / "c"
    c = Client(path)
    c.create(MODEL)
    c.add(texts=["a red cube"])
    assert c.search(text="red", k=1).hits
    shutil.rmtree(path)
    path.mkdir()
    for call in (lambda: c.search(text="red", k=1), c.status, lambda: c.add(texts=["x"]), lambda: c.get("x")):
        with pytest.raises(NotFound):
            call()
    assert list(path.iterdir()) == []
