"""Images added over HTTP keep their metadata (each image part's ``X-Item-Metadata`` header), as in
process; the remote client checks every id before its first request, and a request refused later
names its item as an index of the whole call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nobackfill import Client  # noqa: E402
from nobackfill.client import InvalidRequest  # noqa: E402
from nobackfill.client.upload import MAX_METADATA_BYTES, upload_items  # noqa: E402
from nobackfill.collection.ingest import image_item, text_item  # noqa: E402
from nobackfill.serve import KeyRing, ServeSettings, create_app  # noqa: E402

MODELS = Path(__file__).resolve().parents[1] / "models"
ADMIN = "admin-key-0123456789"
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def _folder(root: Path) -> Path:
    """A user's folder: captioned images with labels (names and labels beyond ASCII), one without a caption."""
    (root / "images").mkdir(parents=True)
    lines = []
    for i, (colour, rgb) in enumerate(list(COLOURS.items()) * 3):
        name = f"images/ü_café_{i}.png"
        Image.new("RGB", (17 + i, 23), rgb).save(root / name)
        lines.append({"image": name, "caption": f"a {colour} square « {i} »", "lang": "en",
                      "labels": {"colour": colour, "shape": "square", "note": "🎨 红色" if i % 2 else None}})
    (root / "captions.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    Image.new("L", (31, 17), 90).save(root / "images" / "loose.png")
    return root


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """(in process, over HTTP, the served collection's uploads folder, a folder of images): two
    collections of the same model, the second served."""
    tmp = tmp_path_factory.mktemp("upload-metadata")
    local = Client(tmp / "local")
    local.create(MODELS / "world-old")
    Client(tmp / "served").create(MODELS / "world-old")
    settings = ServeSettings(collection=str(tmp / "served"), keys=KeyRing({"admin": [ADMIN]}), models_root=MODELS)
    with TestClient(create_app(settings)) as http:
        yield local, Client("http://testserver", api_key=ADMIN, http=http), tmp / "served" / "uploads", \
            _folder(tmp / "my_photos")


def _own(meta: dict) -> dict:
    """An item's metadata but what each side sets for itself (where the file is, its name)."""
    return {k: v for k, v in meta.items() if k not in ("path", "filename")}


def test_a_folder_added_in_process_and_over_http_keeps_the_same_metadata(clients):
    local, remote, _uploads, folder = clients
    a, b = local.add(folder=folder), remote.add(folder=folder)
    assert a.ids == b.ids and a.added == b.added == 19
    images = [i for i in a.ids if i.startswith("img-")]
    assert len(images) == 10
    for item_id in images:
        mine, served = local.get(item_id).metadata, remote.get(item_id).metadata
        assert _own(mine) == _own(served), item_id
        assert served["path"].startswith("uploads/") and served["filename"] == Path(mine["path"]).name
    assert sum("labels" in local.get(i).metadata for i in images) == 9
    for flt in ({"labels.colour": "red"}, {"labels": {"colour": ["green", "blue"]}}, {"labels.note": "🎨 红色"}):
        for query in ({"text": "a red square"}, {"image": folder / "images" / "ü_café_0.png"}):
            hits = [[(h.id, round(h.score, 5)) for h in c.search(**query, k=5, target="image", filter=flt).hits]
                    for c in (local, remote)]
            assert hits[0] == hits[1] and hits[0], (flt, query)
    assert remote.add(folder=folder).unchanged == 19  # the same metadata again: nothing to change


def test_an_image_rows_metadata_goes_with_it(clients, tmp_path):
    local, remote, _uploads, _folder_ = clients
    Image.new("RGB", (20, 20), (0, 160, 0)).save(tmp_path / "extra.png")
    row = {"path": str(tmp_path / "extra.png"), "id": "pimg", "album": "summer", "filename": "mine.png"}
    for c in (local, remote):
        assert c.add(images=[row]).ids == ["pimg"]
        assert _own(c.get("pimg").metadata) == {"album": "summer"}
        assert [h.id for h in c.search(text="green", k=5, filter={"album": "summer"}).hits] == ["pimg"]
    assert remote.get("pimg").metadata["filename"] == "mine.png"  # the row's own name, not the part's


def _state(remote: Client, uploads: Path) -> tuple:
    st = remote.status()
    return st["generation"], st["items"], sorted(p.name for p in uploads.iterdir())


@pytest.mark.parametrize("header, says", [
    ("not json", "not valid JSON"), ('{"a": NaN}', "not valid JSON"), ("[1, 2]", "must be a JSON object"),
    ('"summer"', "must be a JSON object"), ('{"path": "/etc/passwd"}', "'path'"), ('{"id": "x"}', "'id'"),
    ('{"sha256": "00"}', "'sha256'"),
    ('{"a": "' + "x" * (MAX_METADATA_BYTES - 8) + '"}', f"at most {MAX_METADATA_BYTES}"),  # one byte too many
])
def test_a_bad_metadata_header_is_a_422_naming_its_part_and_adds_nothing(clients, header, says):
    _local, remote, uploads, folder = clients
    remote.add(images=[folder / "images" / "loose.png"])  # the uploads folder exists
    before = _state(remote, uploads)
    parts = [("images", (f"p{i}.png", (folder / "images" / f"ü_café_{i}.png").read_bytes(), "image/png",
                         {"X-Item-Metadata": h})) for i, h in enumerate(['{"album": "ok"}', header])]
    r = remote.http.post("/v1/items", files=parts, headers=remote.headers)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "images[1]" and says in r.json()["detail"] and "X-Item-Metadata" in r.json()["detail"]
    assert _state(remote, uploads) == before


def test_both_clients_refuse_an_id_the_http_api_cannot_name(clients, tmp_path):
    """One id rule: an id the server refuses ('a/b': GET /v1/items/a/b cannot reach it) is refused
    in process too, from given rows and from a text file's "id" field, with the same field."""
    local, remote, _uploads, folder = clients
    lines = tmp_path / "slash.jsonl"
    lines.write_text('{"text": "abc", "id": "a/b", "lang": "en"}\n')
    for c in (local, remote):
        n = c.status()["items"]
        with pytest.raises(InvalidRequest) as e:
            c.add(texts=[{"text": "fine", "id": "ok-1"}, {"text": "abc", "id": "a/b"}])
        assert e.value.field == "texts[1].id" and "'a/b'" in e.value.detail
        with pytest.raises(InvalidRequest, match="'a/b' is not a valid id"):
            c.add(text_file=lines)
        with pytest.raises(InvalidRequest) as e:
            c.add(images=[{"path": folder / "images" / "loose.png", "id": "[x"}])
        assert e.value.field == "images[0].id"
        assert c.status()["items"] == n


def test_the_remote_client_checks_every_id_before_its_first_request(clients):
    _local, remote, uploads, folder = clients
    remote.add(images=[folder / "images" / "loose.png"])
    before = _state(remote, uploads)
    texts = [{"text": f"partial test caption {i}", "id": f"pt-{i}"} for i in range(300)]
    texts[280]["id"] = "pt/280"
    with pytest.raises(InvalidRequest) as e:
        remote.add(texts=texts)
    assert e.value.field == "texts[280].id" and "'pt/280'" in e.value.detail
    images = [folder / "images" / "ü_café_1.png", {"path": folder / "images" / "ü_café_2.png", "id": ".hidden"}]
    with pytest.raises(InvalidRequest) as e:
        remote.add(images=images)
    assert e.value.field == "images[1].id"
    with pytest.raises(InvalidRequest) as e:  # ids= beside the rows: the same rule
        remote.add(texts=["a", "b"], ids=["fine", "no\\way"])
    assert e.value.field == "texts[1].id"
    with pytest.raises(InvalidRequest, match=r"texts\[1\] is 2001 characters long"):  # the server's caption limit
        remote.add(texts=["a", "b" * 2001])
    with pytest.raises(InvalidRequest, match=rf"images\[1\]: its metadata is \d+ bytes as JSON, at most "
                                             rf"{MAX_METADATA_BYTES}"):
        remote.add(images=[images[0], {"path": images[1]["path"], "note": "é" * MAX_METADATA_BYTES}])
    assert _state(remote, uploads) == before


def test_a_later_request_refused_names_the_item_of_the_call(clients, tmp_path):
    _local, remote, _uploads, folder = clients
    (tmp_path / "not-an-image.png").write_bytes(b"these bytes are no image")
    images = [folder / "images" / "ü_café_3.png", folder / "images" / "ü_café_4.png", tmp_path / "not-an-image.png"]
    with pytest.raises(InvalidRequest) as e:
        remote.add(images=images, chunk_size=2)  # the first request is stored, the second refused
    assert e.value.field == "images[2]" and \
        e.value.detail.startswith(f"images[2] ({tmp_path / 'not-an-image.png'}): not an image")  # the file, not its upload
    assert "the 2 items of this call sent before it are stored" in e.value.detail


def test_upload_items_names_a_refused_caption_by_its_index_in_the_call(tmp_path):
    """A request of captions refused by the server (``items[j]`` of that request) is raised naming
    ``texts[start + j]`` of the call, after the images and captions sent before it."""
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "a.png")
    items = [image_item(tmp_path / "a.png", metadata={"album": "x"})] + [text_item(f"t{i}") for i in range(5)]
    sent: list[dict] = []

    def call(method: str, path: str, **kw):
        sent.append(kw)
        if len(sent) == 3:
            raise InvalidRequest(422, "items[1].text: not allowed", "items[1].text")
        return {"added": len(kw.get("files") or kw["json"]["items"])}

    with pytest.raises(InvalidRequest) as e:
        upload_items(call, items, {"max_batch": 2})
    assert e.value.field == "texts[3].text" and e.value.detail.startswith("texts[3].text: not allowed")
    assert "the 3 items of this call sent before it are stored" in e.value.detail
    name, data, ctype, headers = sent[0]["files"][0][1]
    assert headers == {"X-Item-Id": items[0].id, "X-Item-Metadata": '{"album":"x"}'}  # no path: the server's


@pytest.mark.parametrize("size", [MAX_METADATA_BYTES + 110, MAX_METADATA_BYTES + 800, 60_000])
def test_a_metadata_header_past_the_parsers_own_bound_is_the_same_422(clients, size):
    """python-multipart refuses a part header line over ~4.2 kB before the server reads it; that is
    still the part's metadata being too long (422 naming the part), not a malformed body."""
    _local, remote, uploads, folder = clients
    remote.add(images=[folder / "images" / "loose.png"])
    before = _state(remote, uploads)
    header = '{"a": "' + "x" * size + '"}'
    parts = [("images", (f"p{i}.png", (folder / "images" / f"ü_café_{i}.png").read_bytes(), "image/png",
                         {"X-Item-Metadata": h})) for i, h in enumerate(['{"album": "ok"}', header])]
    r = remote.http.post("/v1/items", files=parts, headers=remote.headers)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "images[1]" and f"at most {MAX_METADATA_BYTES}" in r.json()["detail"]
    assert _state(remote, uploads) == before


def test_a_multipart_body_cut_before_its_closing_boundary_is_malformed(clients):
    _local, remote, uploads, folder = clients
    png = (folder / "images" / "ü_café_0.png").read_bytes()
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n"
            b"Content-Type: image/png\r\n\r\n" + png)
    headers = {**remote.headers, "Content-Type": "multipart/form-data; boundary=XyZ"}
    for path in ("/v1/search", "/v1/items"):
        r = remote.http.post(path, content=body, headers=headers)
        assert r.status_code == 400 and "closing boundary" in r.json()["detail"], (path, r.text)
        r = remote.http.post(path, content=body + b"\r\n--XyZ--\r\n", headers=headers)
        assert r.status_code != 400, (path, r.text)
