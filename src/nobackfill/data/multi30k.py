"""Readers for the Multi30K caption files (text only; Elliott et al., 2016).

Layout under a Multi30K root (gzip, one caption a line; line ``i`` of every file of a split is the
same image)::

    task1/raw/{split}.{lang}.gz        translations (en, de, fr, cs); split = train | val | test_2016_flickr
    task2/raw/{split}.{k}.{lang}.gz    five independent captions per image, k = 1..5 (en, de)

The shared copy lives at ``$NOBACKFILL_SHARED/data/multi30k`` (``NOBACKFILL_SHARED`` defaults to
``<repo>/../shared``); it is read in place and never copied into the repository.

An *eval dir* is a folder laid out like ``task2/raw`` holding ``val.{1..5}.en.gz``; passed as
``eval_dir`` it replaces the shared val split (so another held-out set needs no code change).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

TASK2_CAPTIONS = 5
TASK1_LANGS = ("en", "de", "fr", "cs")
TASK2_LANGS = ("en", "de")


def shared_dir() -> Path:
    """``$NOBACKFILL_SHARED``, else ``<repo root>/../shared`` (the repo is three levels above this
    package's ``data`` folder: ``<repo>/src/nobackfill/data``)."""
    env = os.environ.get("NOBACKFILL_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared"


def default_multi30k_dir() -> Path:
    """Where the shared Multi30K copy is expected: ``shared_dir() / "data" / "multi30k"``."""
    return shared_dir() / "data" / "multi30k"


def read_lines(path: str | Path) -> list[str]:
    """The lines of a gzip (or plain) text file, stripped of the line break; a clear error naming
    the file when it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: Multi30K file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [line.rstrip("\r\n") for line in fh]


def task1_path(root: str | Path, split: str, lang: str) -> Path:
    return Path(root) / "task1" / "raw" / f"{split}.{lang}.gz"


def task2_path(raw_dir: str | Path, split: str, k: int, lang: str) -> Path:
    """``raw_dir/{split}.{k}.{lang}.gz`` (``raw_dir`` is ``task2/raw`` or an eval dir)."""
    return Path(raw_dir) / f"{split}.{k}.{lang}.gz"


def read_task1(root: str | Path, split: str = "train", lang: str = "en") -> list[str]:
    """Task 1 (translations): one caption per image of ``split`` in ``lang``."""
    return read_lines(task1_path(root, split, lang))


@dataclass
class CaptionSet:
    """``captions[k][i]``: the ``k``-th caption (0-based) of image ``i``; every list has
    :attr:`n_images` entries."""

    captions: list[list[str]]
    source: Path

    @property
    def n_images(self) -> int:
        return len(self.captions[0]) if self.captions else 0

    @property
    def n_per_image(self) -> int:
        return len(self.captions)

    def column(self, k: int) -> list[str]:
        """Caption ``k`` (1-based, as in the file names) of every image."""
        if not 1 <= k <= self.n_per_image:
            raise ValueError(f"caption index {k} out of range 1..{self.n_per_image}")
        return self.captions[k - 1]

    def flat(self) -> tuple[list[str], list[int]]:
        """Every caption once, image-major, with its image index."""
        texts, images = [], []
        for i in range(self.n_images):
            for col in self.captions:
                texts.append(col[i])
                images.append(i)
        return texts, images


def read_task2(root: str | Path, split: str = "train", lang: str = "en",
               ks: Sequence[int] = tuple(range(1, TASK2_CAPTIONS + 1)), *,
               eval_dir: str | Path | None = None, limit: int | None = None) -> CaptionSet:
    """Task 2 (independent descriptions): caption ``k`` of every image for each ``k`` in ``ks``.

    ``root`` is the Multi30K root (files under ``root/task2/raw``). With ``eval_dir`` the files
    are read from that folder instead (it is laid out like ``task2/raw``). ``limit`` keeps the
    first ``limit`` images. All files must have the same number of lines."""
    raw = Path(eval_dir) if eval_dir is not None else Path(root) / "task2" / "raw"
    if eval_dir is not None and not raw.is_dir():
        raise FileNotFoundError(f"{raw}: eval dir not found")
    cols: list[list[str]] = []
    for k in ks:
        path = task2_path(raw, split, int(k), lang)
        lines = read_lines(path)
        if cols and len(lines) != len(cols[0]):
            raise ValueError(f"{path}: {len(lines)} lines, but {task2_path(raw, split, int(ks[0]), lang)} "
                             f"has {len(cols[0])} (line i of every file must be the same image)")
        cols.append(lines)
    if limit is not None:
        cols = [c[:int(limit)] for c in cols]
    return CaptionSet(cols, raw)


__all__ = ["CaptionSet", "read_task1", "read_task2", "read_lines", "shared_dir", "default_multi30k_dir",
           "task1_path", "task2_path", "TASK2_CAPTIONS"]
