"""Tests for nobackfill.data.folder: the user-format data folder (images + captions.jsonl)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nobackfill.data import folder as folder_mod
from nobackfill.data.folder import DataFormatError, PairDataset, load_pairs, write_pairs

RECORDS = [
    {"image": "images/a.png", "caption": "a red circle", "lang": "en",
     "labels": {"shape": "circle"}, "source": "synthetic"},
    {"image": "images/b.png", "caption": "a blue square", "lang": "en"},
    {"image": "images/a.png", "caption": "ein roter Kreis", "lang": "de",
     "labels": {"shape": "ignored: not the first line"}},
    {"image": "images/c.png", "caption": "a green star", "lang": "en", "split": "val"},
    {"image": "images/b.png", "caption": "ein blaues Quadrat", "lang": "de"},
]


def _png(path: Path, colour=(200, 30, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), colour).save(path)


def make_folder(root: Path, lines: list, images=("images/a.png", "images/b.png",
                                                "images/c.png")) -> Path:
    """Images as tiny PNGs; ``lines`` as dicts (JSON-encoded) or raw strings."""
    for rel in images:
        _png(root / rel)
    text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
    (root / "captions.jsonl").write_text(text, encoding="utf-8")
    return root


# ----------------------------------------------------------------------------- loading
def test_load_maps_captions_to_images(tmp_path):
    ds = load_pairs(make_folder(tmp_path, RECORDS))
    assert ds.images == ["images/a.png", "images/b.png", "images/c.png"]
    assert len(ds) == 3 and ds.num_captions == 5
    assert ds.caption_image.dtype == np.int64
    assert ds.caption_image.tolist() == [0, 1, 0, 2, 1]
    assert ds.captions[2] == "ein roter Kreis"
    assert ds.langs == ["en", "en", "de", "en", "de"]
    assert ds.caption_lines == [1, 2, 3, 4, 5]
    assert ds.image_labels == [{"shape": "circle"}, {}, {}]
    assert ds.extra[0] == {"source": "synthetic"} and ds.extra[3] == {"split": "val"}
    assert ds.extra[1] == {}
    assert ds.languages() == ["en", "de"]
    assert ds.skipped == 0
    assert ds.captions_of(1) == [1, 4]
    paths = ds.image_paths()
    assert all(p.is_absolute() and p.is_file() for p in paths)
    assert paths[2] == (tmp_path / "images/c.png").absolute()


def test_round_trip_through_write_pairs(tmp_path):
    root = make_folder(tmp_path, [])
    write_pairs(root, RECORDS)
    ds = load_pairs(root)
    write_pairs(root, ds.to_records())
    again = load_pairs(root)
    for name in ("images", "image_labels", "captions", "langs", "caption_lines", "extra"):
        assert getattr(again, name) == getattr(ds, name), name
    np.testing.assert_array_equal(again.caption_image, ds.caption_image)


def test_blank_lines_ignored_and_line_numbers_kept(tmp_path):
    ds = load_pairs(make_folder(tmp_path, [RECORDS[0], "", "   ", RECORDS[1]]))
    assert ds.caption_lines == [1, 4] and ds.skipped == 0


def test_path_normalisation_dedupes_images(tmp_path):
    lines = [RECORDS[1], {**RECORDS[1], "image": "images/./b.png", "caption": "again"}]
    ds = load_pairs(make_folder(tmp_path, lines))
    assert ds.images == ["images/b.png"] and ds.caption_image.tolist() == [0, 0]


def test_langs_and_limit(tmp_path):
    root = make_folder(tmp_path, RECORDS)
    de = load_pairs(root, langs=["de"])
    assert de.images == ["images/a.png", "images/b.png"] and de.caption_lines == [3, 5]
    limited = load_pairs(root, limit=2)
    assert limited.images == ["images/a.png", "images/b.png"]
    assert limited.caption_lines == [1, 2, 3, 5]  # all captions of the kept images


def test_check_images_false_needs_no_images(tmp_path):
    root = make_folder(tmp_path, RECORDS, images=())
    ds = load_pairs(root, check_images=False)
    assert len(ds) == 3
    with pytest.raises(DataFormatError, match="not found"):
        load_pairs(root)


# ----------------------------------------------------------------------------- errors
BAD_LINES = {
    "invalid_json": ('{"image": "images/a.png", "caption": ', "invalid JSON"),
    "not_object": ("[1, 2, 3]", "expected a JSON object"),
    "missing_field": (json.dumps({"image": "images/a.png", "lang": "en"}),
                      "missing required field 'caption'"),
    "empty_field": (json.dumps({"image": "images/a.png", "caption": "  ", "lang": "en"}),
                    "field 'caption' is empty"),
    "wrong_type": (json.dumps({"image": "images/a.png", "caption": "x", "lang": 7}),
                   "field 'lang' must be a string"),
    "labels_type": (json.dumps({"image": "images/a.png", "caption": "x", "lang": "en",
                                "labels": [1]}), "field 'labels' must be an object"),
    "escape_dotdot": (json.dumps({"image": "images/../../x.png", "caption": "x", "lang": "en"}),
                      "escapes the data folder"),
    "escape_absolute": (json.dumps({"image": "/etc/hosts", "caption": "x", "lang": "en"}),
                        "is absolute: give the path relative to the data folder"),
    "escape_drive": (json.dumps({"image": "C:\\x.png", "caption": "x", "lang": "en"}),
                     "is absolute: give the path relative to the data folder"),
    "nan": ('{"image": "images/a.png", "caption": "x", "lang": "en", "score": NaN}', "NaN is no JSON value"),
    "image_id": (json.dumps({"image": "images/a.png", "caption": "x", "lang": "en", "image_id": "img-zzz"}),
                 "field 'image_id' is set from 'image'"),
    "missing_image": (json.dumps({"image": "images/nope.png", "caption": "x", "lang": "en"}),
                      "image 'images/nope.png': image file not found"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_bad_line_names_file_and_line(tmp_path, kind):
    line, expected = BAD_LINES[kind]
    root = make_folder(tmp_path, [RECORDS[0], RECORDS[1], line, RECORDS[3]])
    with pytest.raises(DataFormatError) as info:
        load_pairs(root)
    msg = str(info.value)
    assert "captions.jsonl line 3: " in msg and expected in msg, msg
    assert info.value.line == 3 and info.value.path == root / "captions.jsonl"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_skip_bad_counts_and_warns(tmp_path, kind, caplog):
    line, _ = BAD_LINES[kind]
    root = make_folder(tmp_path, [RECORDS[0], RECORDS[1], line, RECORDS[3]])
    with caplog.at_level(logging.WARNING, logger="nobackfill.data.folder"):
        ds = load_pairs(root, skip_bad=True)
    assert ds.skipped == 1 and ds.caption_lines == [1, 2, 4]
    assert any("line 3" in r.getMessage() for r in caplog.records)


def test_invalid_utf8_line(tmp_path):
    root = make_folder(tmp_path, [RECORDS[0]])
    with open(root / "captions.jsonl", "ab") as fh:
        fh.write(b'{"image": "images/a.png", "caption": "\xff\xfe", "lang": "en"}\n')
    with pytest.raises(DataFormatError, match="line 2: not valid UTF-8"):
        load_pairs(root)


def test_corrupt_image_error_and_skip(tmp_path, monkeypatch):
    root = make_folder(tmp_path, RECORDS)
    (root / "images/a.png").write_bytes(b"this is not a png at all" * 10)
    with pytest.raises(DataFormatError) as info:
        load_pairs(root)
    assert "captions.jsonl line 1: " in str(info.value)
    assert "cannot decode image" in str(info.value)

    calls: list[Path] = []
    real = folder_mod.image_problem
    monkeypatch.setattr(folder_mod, "image_problem", lambda p: calls.append(p) or real(p))
    ds = load_pairs(root, skip_bad=True)
    assert ds.skipped == 2  # both captions of images/a.png (lines 1 and 3)
    assert ds.images == ["images/b.png", "images/c.png"]
    assert ds.caption_image.tolist() == [0, 1, 0]
    assert len(calls) == 3  # each image checked once, though a and b have two lines each


def test_truncated_png_is_corrupt(tmp_path):
    root = make_folder(tmp_path, RECORDS)
    data = (root / "images/b.png").read_bytes()
    (root / "images/b.png").write_bytes(data[:20])
    with pytest.raises(DataFormatError, match="line 2: image 'images/b.png': cannot decode"):
        load_pairs(root)


def test_missing_folder_or_captions(tmp_path):
    with pytest.raises(DataFormatError, match="nope: no such folder"):
        load_pairs(tmp_path / "nope")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataFormatError, match="afile: a file, not a data folder"):
        load_pairs(tmp_path / "afile")
    with pytest.raises(DataFormatError, match=r"captions\.jsonl not found"):
        load_pairs(tmp_path)


def test_empty_result_is_an_error(tmp_path):
    root = make_folder(tmp_path, ["", "not json"])
    with pytest.raises(DataFormatError, match="no valid captions"):
        load_pairs(root, skip_bad=True)
    with pytest.raises(DataFormatError, match="no valid captions in languages"):
        load_pairs(make_folder(tmp_path / "x", RECORDS), langs=["fr"])


# ----------------------------------------------------------------------------- dataset ops
def test_filter_langs(tmp_path):
    ds = load_pairs(make_folder(tmp_path, RECORDS))
    de = ds.filter_langs(["de"])
    assert de.images == ["images/a.png", "images/b.png"]
    assert de.captions == ["ein roter Kreis", "ein blaues Quadrat"]
    assert de.caption_image.tolist() == [0, 1]
    assert de.caption_lines == [3, 5] and de.languages() == ["de"]
    assert de.image_labels == [{"shape": "circle"}, {}]
    loaded = load_pairs(tmp_path, langs=["de"])
    assert (loaded.images, loaded.captions) == (de.images, de.captions)
    assert ds.filter_langs("en").num_captions == 3
    with pytest.raises(ValueError, match="no captions in languages"):
        ds.filter_langs(["fr"])


def test_subset_images(tmp_path):
    ds = load_pairs(make_folder(tmp_path, RECORDS))
    sub = ds.subset_images([2, 0])
    assert sub.images == ["images/c.png", "images/a.png"]
    assert sub.captions == ["a red circle", "ein roter Kreis", "a green star"]
    assert sub.caption_image.tolist() == [1, 1, 0]
    assert [sub.images[i] for i in sub.caption_image] == \
        [ds.images[i] for i in ds.caption_image[[0, 2, 3]]]
    assert sub.extra[2] == {"split": "val"}
    with pytest.raises(IndexError):
        ds.subset_images([3])
    with pytest.raises(ValueError, match="duplicate"):
        ds.subset_images([0, 0])


def test_dataset_length_check():
    with pytest.raises(ValueError, match="differ in length"):
        PairDataset(root=Path("."), images=["a"], image_labels=[{}], captions=["x", "y"],
                    langs=["en"], caption_image=np.zeros(2), caption_lines=[1, 2])


# ----------------------------------------------------------------------------- atomic write
def test_write_pairs_leaves_no_temp_file(tmp_path):
    out = write_pairs(tmp_path / "new", RECORDS)
    assert out == tmp_path / "new" / "captions.jsonl"
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["captions.jsonl"]
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(ln) for ln in lines] == RECORDS


def test_write_pairs_failure_keeps_old_file(tmp_path):
    write_pairs(tmp_path, RECORDS[:2])
    before = (tmp_path / "captions.jsonl").read_bytes()

    def records():
        yield RECORDS[0]
        raise RuntimeError("generator died")

    with pytest.raises(RuntimeError):
        write_pairs(tmp_path, records())
    with pytest.raises(DataFormatError, match="record 2: missing required field 'lang'"):
        write_pairs(tmp_path, [RECORDS[0], {"image": "images/a.png", "caption": "x"}])
    assert (tmp_path / "captions.jsonl").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captions.jsonl"]


def test_write_pairs_keeps_unicode(tmp_path):
    write_pairs(tmp_path, [{"image": "i.png", "caption": "猫が二匹", "lang": "ja"}])
    assert "猫が二匹" in (tmp_path / "captions.jsonl").read_text(encoding="utf-8")


@pytest.mark.parametrize("lines", [[], ["", "   "], ["not json", '{"caption": "no image"}']],
                         ids=["empty", "blank", "all-bad"])
def test_a_captions_file_with_no_valid_caption_leaves_a_collection_the_images(tmp_path, lines):
    """Trial J: an empty (or blank, or with --skip-bad all-bad) captions.jsonl refused the whole folder,
    though the same images without the file are added. A collection now adds them uncaptioned;
    training data (``load_pairs`` alone) still needs captions, and ``langs`` that none is in is refused."""
    from nobackfill.collection.ingest import folder_items

    root = make_folder(tmp_path / "data", lines)
    skip = bool(lines) and lines[0] == "not json"
    with pytest.raises(DataFormatError, match="no valid captions"):
        load_pairs(root, skip_bad=True)
    fi = folder_items(root, skip_bad=skip)
    assert fi.count("image") == 3 and fi.count("text") == 0 and fi.uncaptioned == 3
    assert fi.skipped == (2 if skip else 0)
    if skip:
        with pytest.raises(DataFormatError, match="invalid JSON"):  # without --skip-bad: the first bad line
            folder_items(root)
    with pytest.raises(DataFormatError, match=r"no valid captions in languages \['xx'\]"):
        folder_items(root, langs=["xx"], skip_bad=True)


def test_a_caption_id_that_is_an_images_id_names_its_line_and_can_be_skipped(tmp_path):
    """Trial J: a caption whose own ``id`` was an image's content id failed the whole add with
    ``id ... is given twice with different content``, naming no file or line, whatever --skip-bad."""
    from nobackfill.collection.ingest import folder_items, image_item

    root = make_folder(tmp_path / "data", [])
    img_id = image_item(root / "images" / "a.png").id
    (root / "captions.jsonl").write_text(
        json.dumps({"image": "images/a.png", "caption": "a red one", "lang": "en"}) + "\n"
        + json.dumps({"image": "images/b.png", "caption": "stolen id", "lang": "en", "id": img_id}) + "\n")
    with pytest.raises(DataFormatError, match=r"line 2.*is the id of an image of this folder"):
        folder_items(root)
    fi = folder_items(root, skip_bad=True)
    assert fi.skipped == 1 and fi.count("text") == 1 and img_id in {it.id for it in fi.items}


def test_an_images_labels_are_merged_from_all_its_lines_whatever_their_language(tmp_path, caplog):
    """trial V: labels on an image's second line were dropped without a word, so --filter missed it."""
    lines = [{"image": "images/a.png", "caption": "a red circle", "lang": "en"},
             {"image": "images/a.png", "caption": "ein roter Kreis", "lang": "de", "labels": {"class": "red circle"}},
             {"image": "images/b.png", "caption": "a blue square", "lang": "en", "labels": {"class": "blue square"}},
             {"image": "images/b.png", "caption": "another", "lang": "en", "labels": {"class": "navy", "size": "big"}}]
    root = make_folder(tmp_path, lines, images=("images/a.png", "images/b.png"))
    with caplog.at_level("WARNING", logger=folder_mod.logger.name):
        ds = load_pairs(root, langs=["en"])
    assert ds.image_labels == [{"class": "red circle"}, {"class": "blue square", "size": "big"}]
    assert "labels.class 'navy' (kept 'blue square')" in caplog.text and "line 4" in caplog.text


def test_a_null_label_is_filled_by_a_later_line_and_a_conflict_is_warned_on_every_path(tmp_path, caplog):
    """trial X: a first null kept the key null (the filter on the later value found nothing), and
    the conflict warning was not given where a collection reads the folder (warn=False)."""
    lines = [{"image": "images/a.png", "caption": "one", "lang": "en", "labels": {"class": None}},
             {"image": "images/a.png", "caption": "two", "lang": "en", "labels": {"class": "red circle"}},
             {"image": "images/a.png", "caption": "three", "lang": "en", "labels": {"class": "blue"}}]
    root = make_folder(tmp_path, lines, images=("images/a.png",))
    with caplog.at_level("WARNING", logger=folder_mod.logger.name):
        ds = load_pairs(root, warn=False)
    assert ds.image_labels == [{"class": "red circle"}]
    assert "labels.class 'blue' (kept 'red circle')" in caplog.text
