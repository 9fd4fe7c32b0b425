"""Multi30K readers on a tiny fake layout (gzip files written to tmp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _fake_multi30k import caption, fake_multi30k, write_gz, write_task2
from nobackfill.data.multi30k import default_multi30k_dir, read_lines, read_task1, read_task2, shared_dir


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return fake_multi30k(tmp_path / "m30k", n_train=10, n_val=4)


def test_task2_reads_five_aligned_columns(root):
    cs = read_task2(root, "train")
    assert cs.n_images == 10 and cs.n_per_image == 5
    assert cs.column(1)[3] == caption(3, 1) and cs.column(5)[9] == caption(9, 5)
    texts, images = cs.flat()
    assert len(texts) == 50 and images[:6] == [0, 0, 0, 0, 0, 1]  # image-major
    assert texts[5] == caption(1, 1)
    assert read_task2(root, "val", ks=(1, 2), limit=3).captions == [[caption(10_000 + i, k) for i in range(3)]
                                                                    for k in (1, 2)]
    with pytest.raises(ValueError, match="out of range"):
        cs.column(6)


def test_task1_translations(root):
    assert read_task1(root, "val", "de")[2] == "de " + caption(2, 1)


def test_missing_file_is_named(root):
    (root / "task2" / "raw" / "val.3.en.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"val\.3\.en\.gz"):
        read_task2(root, "val")
    with pytest.raises(FileNotFoundError, match=r"test_2016_flickr\.fr\.gz"):
        read_task1(root, "test_2016_flickr", "fr")
    with pytest.raises(FileNotFoundError, match="eval dir"):
        read_task2(root, "val", eval_dir=root / "nope")


def test_eval_dir_overrides_val(root, tmp_path):
    ev = tmp_path / "other_val"
    write_task2(ev, "val", 3, offset=500)
    cs = read_task2(root, "val", eval_dir=ev)
    assert cs.n_images == 3 and cs.column(2)[0] == caption(500, 2)
    assert cs.source == ev


def test_misaligned_files_refused(root):
    write_gz(root / "task2" / "raw" / "val.2.en.gz", ["only one line"])
    with pytest.raises(ValueError, match="same image"):
        read_task2(root, "val")


def test_plain_text_and_shared_dir(tmp_path, monkeypatch):
    p = tmp_path / "a.txt"
    p.write_text("x\r\ny\n")
    assert read_lines(p) == ["x", "y"]
    monkeypatch.setenv("NOBACKFILL_SHARED", str(tmp_path))
    assert shared_dir() == tmp_path and default_multi30k_dir() == tmp_path / "data" / "multi30k"
    monkeypatch.delenv("NOBACKFILL_SHARED")
    repo = Path(__file__).resolve().parents[1]
    assert shared_dir() == repo.parent / "shared"


def test_real_shared_copy_if_present():
    root = default_multi30k_dir()
    if not (root / "task2" / "raw" / "val.1.en.gz").is_file():
        pytest.skip(f"{root}: Multi30K not present")
    cs = read_task2(root, "val", ks=(1, 2))
    assert cs.n_images == 1014
