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
    with pytest.raises(NotFound, match="removed while this client had it open"):
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
