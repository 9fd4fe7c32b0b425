"""``--skip-bad`` names every skipped image file (relative to the data folder), and an error about a
bad line or unreadable image says that ``--skip-bad`` skips it (issue 24, item 14)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from nobackfill.cli import app
from nobackfill.data.folder import DataFormatError, load_pairs

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "world-old"
runner = CliRunner()
BAD_CAPTIONED = "images/bad one.png"
BAD_UNCAPTIONED = "extra/ünï 🙂/broken:smile:.png"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _folder(root: Path, bad_line: bool = True, bad_captioned: bool = True, bad_uncaptioned: bool = True) -> Path:
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    lines = []
    for k in range(3):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / "images" / f"ok {k}.png")
        lines.append(json.dumps({"image": f"images/ok {k}.png", "caption": f"photo number {k}", "lang": "en"}))
    if bad_captioned:
        (root / BAD_CAPTIONED).write_bytes(b"this is not a png")
        lines.insert(1, json.dumps({"image": BAD_CAPTIONED, "caption": "a broken photo", "lang": "en"}))
    if bad_line:
        lines.insert(2, "{not json")
    if bad_uncaptioned:
        (root / BAD_UNCAPTIONED).parent.mkdir(parents=True)
        (root / BAD_UNCAPTIONED).write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_load_pairs_names_every_skipped_image(tmp_path, caplog):
    root = tmp_path / "d"
    (root / "images").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(root / "images" / "ok.png")
    lines = [{"image": "images/ok.png", "caption": "fine", "lang": "en"}]
    bad = [f"images/broken {i}.png" for i in range(30)]  # more than the per-line warnings shown
    for rel in bad:
        (root / rel).write_bytes(b"nope")
        lines.append({"image": rel, "caption": "x", "lang": "en"})
    (root / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(DataFormatError, match="broken 0.png") as e:
        load_pairs(root)
    assert e.value.skippable
    with caplog.at_level(logging.WARNING):
        ds = load_pairs(root, skip_bad=True)
    assert list(ds.skipped_images) == bad and ds.skipped == 30 and len(ds.problems) == 30
    assert all("cannot decode image" in why for why in ds.skipped_images.values())
    text = caplog.text
    assert all(rel in text for rel in bad)
    assert ds.subset_images([0]).skipped_images == ds.skipped_images


def test_collection_add_names_skipped_files_and_errors_mention_skip_bad(tmp_path):
    data = _folder(tmp_path / "data")
    r = invoke("collection", "create", tmp_path / "c", "--model", MODEL)
    assert r.exit_code == 0, r.output
    r = invoke("collection", "add", tmp_path / "c", "--data", data)
    assert r.exit_code == 2 and "--skip-bad" in r.output and "bad one.png" in r.output, r.output
    r = invoke("collection", "add", tmp_path / "c", "--data", data, "--skip-bad")
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"skipped image {BAD_CAPTIONED}:" in out and f"skipped image {BAD_UNCAPTIONED}:" in out, out
    assert "line 3" in out and "invalid JSON" in out, out
    assert not any(ln.strip().startswith(f"skipped image {data}") for ln in out.splitlines())  # relative paths
    assert "added 6" in out  # 3 images + 3 captions
    # each kind of problem alone: the error says --skip-bad skips it
    for kw in ({"bad_captioned": False, "bad_uncaptioned": False}, {"bad_line": False, "bad_uncaptioned": False},
               {"bad_line": False, "bad_captioned": False}):
        d = _folder(tmp_path / f"d{len(list(tmp_path.iterdir()))}", **kw)
        r = invoke("collection", "add", tmp_path / "c", "--data", d)
        assert r.exit_code == 2 and "(pass --skip-bad to skip it)" in r.output, (kw, r.output)


def test_index_names_skipped_files_and_errors_mention_skip_bad(tmp_path):
    data = _folder(tmp_path / "data", bad_uncaptioned=False)
    r = invoke("index", "--model", MODEL, "--data", data, "--out", tmp_path / "g")
    assert r.exit_code == 2 and "--skip-bad" in r.output and "line 2" in r.output, r.output
    r = invoke("index", "--model", MODEL, "--data", data, "--out", tmp_path / "g", "--skip-bad")
    assert r.exit_code == 0, r.output
    assert f"skipped image {BAD_CAPTIONED}:" in r.output and "line 3" in r.output, r.output
    assert "3 images" in r.output
    # a command without --skip-bad does not suggest it
    data = _folder(tmp_path / "data2", bad_captioned=False, bad_uncaptioned=False)
    r = invoke("eval", "retrieval", "--query-model", MODEL, "--gallery-model", MODEL, "--data", data)
    assert r.exit_code == 2 and "line 3" in r.output and "--skip-bad" not in r.output, r.output


# ----------------------------------------------------------------------------- a text file (--texts)
def test_a_text_file_takes_skip_bad_and_langs_as_a_folder_does(tmp_path):
    """``add --texts`` skips bad lines with ``--skip-bad`` (each named), keeps only ``--langs``, and
    an id given again with other text is named with both lines; without ``--skip-bad`` nothing is
    added."""
    r = invoke("collection", "create", tmp_path / "c", "--model", MODEL)
    assert r.exit_code == 0, r.output
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join([json.dumps({"text": "a red circle", "id": "m1", "lang": "en"}), '{"id": "m3"}',
                            '{"text": "unterminated', json.dumps({"text": "other text", "id": "m1", "lang": "en"}),
                            json.dumps({"text": "ein rotes Quadrat", "id": "d1", "lang": "de"}),
                            json.dumps({"text": "a red circle", "id": "m1", "lang": "en"})]) + "\n", encoding="utf-8")
    r = invoke("collection", "add", tmp_path / "c", "--texts", f)
    assert r.exit_code == 2 and "t.jsonl line 2" in r.output and "--skip-bad" in r.output, r.output
    r = invoke("collection", "status", tmp_path / "c")
    assert "0 texts" in r.output, r.output
    r = invoke("collection", "add", tmp_path / "c", "--texts", f, "--skip-bad", "--langs", "en")
    assert r.exit_code == 0, r.output
    assert "skipped 3 bad line(s)" in r.output and "added 1," in r.output, r.output
    assert "line 3: invalid JSON: Unterminated string" in r.output, r.output  # not "Invalid control character"
    assert "line 4: id 'm1' is given again with other text (first on line 1)" in r.output, r.output
    assert "1 texts" in invoke("collection", "status", tmp_path / "c").output  # the German line left out
    r = invoke("collection", "add", tmp_path / "c", "--texts", f, "--skip-bad", "--langs", "cs")
    assert r.exit_code == 2 and "no texts in languages ['cs']; the file has ['de', 'en']" in r.output, r.output
    plain = tmp_path / "plain.txt"
    plain.write_text("one\ntwo\n")
    r = invoke("collection", "add", tmp_path / "c", "--texts", plain, "--langs", "de")
    assert r.exit_code == 2 and "plain text file has none" in r.output, r.output
    assert "1 texts" in invoke("collection", "status", tmp_path / "c").output


def test_a_caption_id_given_twice_is_named_with_its_lines_and_a_missing_image_listed_once(tmp_path):
    data = _folder(tmp_path / "data", bad_line=False, bad_captioned=False, bad_uncaptioned=False)
    lines = (data / "captions.jsonl").read_text().splitlines()
    lines += [json.dumps({"id": "c1", "image": "images/ok 0.png", "caption": "first", "lang": "en"}),
              json.dumps({"id": "c1", "image": "images/ok 1.png", "caption": "second", "lang": "en"}),
              json.dumps({"image": "images/missing.png", "caption": "ghost", "lang": "en"})]
    (data / "captions.jsonl").write_text("\n".join(lines) + "\n")
    r = invoke("collection", "create", tmp_path / "c", "--model", MODEL)
    assert r.exit_code == 0, r.output
    r = invoke("collection", "add", tmp_path / "c", "--data", data, "--skip-bad")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "captions.jsonl line 5: id 'c1' is given again with another caption (first on line 4)" in out, out
    assert "skipped 2 bad line(s)/image(s)" in out, out
    skipped = [ln for ln in out.splitlines() if ln.strip().startswith("skipped ") and "bad line" not in ln]
    assert len(skipped) == 2 and sum("missing.png" in ln for ln in skipped) == 1, out  # listed once
    (data / "captions.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # the duplicate alone: refused
    r = invoke("collection", "create", tmp_path / "c2", "--model", MODEL)
    r = invoke("collection", "add", tmp_path / "c2", "--data", data)
    assert r.exit_code == 2 and "line 5: id 'c1' is given again" in r.output, r.output
