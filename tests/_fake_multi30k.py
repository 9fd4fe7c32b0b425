"""A tiny fake Multi30K layout for tests (gzip files written into a temporary folder)."""

from __future__ import annotations

import gzip
from pathlib import Path

COLOURS = ["red", "blue", "green", "black", "white", "yellow", "brown", "pink"]
THINGS = ["dog", "man", "woman", "child", "cat", "horse", "bike", "ball"]
PLACES = ["park", "street", "beach", "field", "kitchen", "river", "store", "snow"]
VERBS = ["runs", "sits", "plays", "walks", "jumps", "stands"]
TEMPLATES = ["a {c} {t} {v} in the {p}", "the {t} in {c} {v} near a {p}", "{c} {t} at the {p}",
             "someone sees a {t} that {v} by the {p}", "a {p} with a {c} {t}"]


def caption(i: int, k: int) -> str:
    """Caption ``k`` (1..5) of fake image ``i``: five phrasings of the same attributes."""
    c, t = COLOURS[i % len(COLOURS)], THINGS[(i // len(COLOURS)) % len(THINGS)]
    p, v = PLACES[(i * 7 + 3) % len(PLACES)], VERBS[(i * 5 + 1) % len(VERBS)]
    return TEMPLATES[(k - 1) % len(TEMPLATES)].format(c=c, t=t, p=p, v=v) + f" number {i}"


def write_gz(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))
    return path


def write_task2(raw: Path, split: str, n: int, lang: str = "en", offset: int = 0) -> None:
    for k in range(1, 6):
        write_gz(raw / f"{split}.{k}.{lang}.gz", [caption(offset + i, k) for i in range(n)])


def fake_multi30k(root: Path, n_train: int = 48, n_val: int = 12) -> Path:
    """``root/task2/raw/{train,val}.{1..5}.en.gz`` and ``root/task1/raw/{train,val}.{en,de}.gz``."""
    raw = root / "task2" / "raw"
    write_task2(raw, "train", n_train)
    write_task2(raw, "val", n_val, offset=10_000)
    for lang in ("en", "de"):
        for split, n in (("train", n_train), ("val", n_val)):
            write_gz(root / "task1" / "raw" / f"{split}.{lang}.gz", [f"{lang} {caption(i, 1)}" for i in range(n)])
    return root
