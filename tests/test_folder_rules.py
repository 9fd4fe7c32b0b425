"""One set of rules for the lines and images of a data folder, whoever reads it (trial AJ): `collection
add` in process and over HTTP, and `nobackfill index`. A caption line whose own id the HTTP API cannot
name, or whose JSON holds NaN / Infinity / a number no float holds, is a bad line named by file and
line (skipped with --skip-bad); an image whose labels are over the size an image's metadata may have
is refused alike on a path and a URL; over HTTP an image file larger than the server's body limit is
named and skipped, not a whole add failed; a gallery keeps the images' labels."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from nobackfill import Client
from nobackfill.client import InvalidRequest, TooLarge
from nobackfill.search.limits import Limits

from _cli_helpers import ok

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
ADMIN = "admin-key-0123456789"


def _folder(tmp_path: Path, lines: list, n_images: int = 3, raw: list[str] | None = None) -> Path:
    """A data folder of ``n_images`` small PNGs (p0.png ...) and ``lines`` (plus ``raw`` lines as written)."""
    from PIL import Image

    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(n_images):
        Image.new("RGB", (32, 32), (60 * i % 256, 90, 30)).save(folder / f"p{i}.png")
    text = "".join(json.dumps(x) + "\n" for x in lines) + "".join(r + "\n" for r in raw or [])
    (folder / "captions.jsonl").write_text(text, encoding="utf-8")
    return folder


@contextlib.contextmanager
def _client(kind: str, tmp_path: Path, limits: Limits | None = None):
    path = tmp_path / "c"
    local = Client(path)
    local.create(MODELS / "world-old")
    if kind == "local":
        yield local
        return
    from fastapi.testclient import TestClient

    from nobackfill.serve import KeyRing, ServeSettings, create_app

    settings = ServeSettings(collection=str(path), keys=KeyRing({"admin": [ADMIN]}), models_root=MODELS,
                             limits=limits or Limits())
    with TestClient(create_app(settings)) as http:
        yield Client("http://testserver", api_key=ADMIN, http=http)


@pytest.mark.parametrize("kind", ["local", "remote"])
@pytest.mark.parametrize("bad, why", [
    ('{"image": "p1.png", "caption": "slash", "lang": "en", "id": "a/b"}', "field 'id': 'a/b' is not a valid id"),
    ('{"image": "p1.png", "caption": "space", "lang": "en", "id": " lead"}', "field 'id': ' lead' is not a valid id"),
    ('{"image": "p2.png", "caption": "nan", "lang": "en", "score": NaN}', "NaN is no JSON value"),
    ('{"image": "p2.png", "caption": "inf", "lang": "en", "labels": {"w": -Infinity}}', "-Infinity is no JSON value"),
    ('{"image": "p2.png", "caption": "huge", "lang": "en", "score": 1e400}', "1e400 \\(infinite as a float\\)"),
])
def test_a_bad_line_is_named_by_file_and_line_and_skipped(kind, bad, why, tmp_path):
    good = [{"image": "p0.png", "caption": "a good line", "lang": "en"},
            {"image": "p1.png", "caption": "another good line", "lang": "en"}]
    folder = _folder(tmp_path, good, raw=[bad])
    with _client(kind, tmp_path) as c:
        before = c.status()["generation"]
        with pytest.raises(InvalidRequest, match=rf"captions.jsonl line 3: .*{why}"):
            c.add(folder=folder)
        assert c.status()["generation"] == before  # nothing stored
        res = c.add(folder=folder, skip_bad=True)
        assert res.skipped == 1 and "line 3" in res.problems[0] and res.added == 5, res  # 3 images, 2 captions


@pytest.mark.parametrize("kind", ["local", "remote"])
def test_an_image_whose_labels_are_too_large_is_refused_alike_on_a_path_and_a_url(kind, tmp_path):
    labels = {f"tag_{i}": f"value number {i}" for i in range(150)}  # ~4.1 KB of JSON
    folder = _folder(tmp_path, [{"image": "p0.png", "caption": "many labels", "lang": "en", "labels": labels},
                                {"image": "p1.png", "caption": "few labels", "lang": "en"}], n_images=2)
    with _client(kind, tmp_path) as c:
        with pytest.raises(InvalidRequest, match=r"captions.jsonl line 1: image 'p0.png': its labels are \d+ bytes"):
            c.add(folder=folder)
        res = c.add(folder=folder, skip_bad=True)
        assert (res.added, res.skipped) == (2, 1) and "p0.png" in res.skipped_images, res
        assert c.status()["items"] == {"image": 1, "text": 1}


def test_over_http_an_image_over_the_body_limit_is_named_and_skipped(tmp_path):
    """A camera photo over the server's body limit: named by its file before anything is sent, and
    with --skip-bad skipped with its captions while the rest of the folder is added."""
    folder = _folder(tmp_path, [{"image": "p0.png", "caption": "a small one", "lang": "en"},
                                {"image": "big.png", "caption": "the big one", "lang": "en"}], n_images=1)
    (folder / "big.png").write_bytes((folder / "p0.png").read_bytes() + b"\0" * 300_000)  # a PNG with trailing bytes
    with _client("remote", tmp_path, Limits(max_body_bytes=200_000)) as c:
        with pytest.raises(InvalidRequest, match=r"big.png.*more than the server takes in one request \(200000 "
                                                 r"bytes: serve --max-body-mb\)"):
            c.add(folder=folder)
        assert c.status()["items"] == {"image": 0, "text": 0}
        res = c.add(folder=folder, skip_bad=True)
        assert (res.added, res.skipped) == (2, 2) and res.uncaptioned == 0, res  # the image and its caption
        with pytest.raises(TooLarge, match=r"images\[1\] \(.*big.png\): .*nothing was added"):
            c.add(images=[folder / "p0.png", folder / "big.png"])


def test_index_reads_a_folder_as_collection_add_does_and_keeps_labels(tmp_path):
    folder = _folder(tmp_path, [{"image": "p0.png", "caption": "a red thing", "lang": "en",
                                 "labels": {"class": "red circle"}},
                                {"image": "p1.png", "caption": "x" * 2500, "lang": "en"},
                                {"image": "p1.png", "caption": "slash id", "lang": "en", "id": "a/b"}], n_images=2)
    out = ok("index", "--model", MODELS / "world-old", "--data", folder, "--out", tmp_path / "g", "--skip-bad").output
    assert "skipped 2 bad line" in out and "line 2: a caption of 2500 characters" in out and "line 3" in out, out
    ok("collection", "create", tmp_path / "c", "--model", MODELS / "world-old")
    ok("collection", "add", tmp_path / "c", "--data", folder, "--skip-bad")
    g, c = Client(tmp_path / "g"), Client(tmp_path / "c")
    assert g.status()["items"] == c.status()["items"] == {"image": 2, "text": 1}
    hits = [g.search(text="red", filter={"labels.class": "red circle"}).hits,
            c.search(text="red", filter={"labels.class": "red circle"}).hits]
    assert [h.id for h in hits[0]] == [h.id for h in hits[1]] and len(hits[0]) == 1


def test_an_empty_result_says_so_instead_of_an_empty_table(tmp_path):
    folder = _folder(tmp_path, [{"image": "p0.png", "caption": "a red thing", "lang": "en",
                                 "labels": {"class": "red circle"}}], n_images=1)
    ok("collection", "create", tmp_path / "c", "--model", MODELS / "world-old")
    ok("collection", "add", tmp_path / "c", "--data", folder)
    out = ok("collection", "search", tmp_path / "c", "--text", "red", "--filter", 'labels.class="blue"').output
    assert "no images for" in out and "nothing the search may return matched" in out and "rank" not in out, out
