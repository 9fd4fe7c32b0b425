"""User data as a folder: image files plus ``captions.jsonl``.

Each non-blank line of ``captions.jsonl`` is one JSON object::

    {"image": "images/000001.png", "caption": "a red circle", "lang": "en",
     "labels": {"shape": "circle"}, "source": "..."}

``image`` (a path relative to the folder), ``caption`` and ``lang`` are required non-empty
strings; ``labels`` is an optional dict describing the image (the labels of all its lines are
merged; a key given two values keeps the first, with a warning);
any other key is kept in the caption's ``extra`` dict. Several lines may share one image.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
from PIL import Image

from .._atomic import write_atomically
from .images import open_rgb

logger = logging.getLogger(__name__)

CAPTIONS_FILE = "captions.jsonl"
_REQUIRED = ("image", "caption", "lang")
_KNOWN = (*_REQUIRED, "labels")
_MAX_LOGGED_SKIPS = 20


class DataFormatError(ValueError):
    """A data folder that does not follow the format; ``path`` and ``line`` locate the problem.
    ``skippable``: a bad line or unreadable image that ``skip_bad`` (``--skip-bad``) would skip."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None, *,
                 skippable: bool = False):
        self.path = None if path is None else Path(path)
        self.line = line
        self.skippable = skippable
        where = "" if path is None else f"{path}" + ("" if line is None else f" line {line}")
        super().__init__(f"{where}: {message}" if where else message)


class MissingDataError(DataFormatError, FileNotFoundError):
    """A data folder that is not there (a ``FileNotFoundError`` too: ``nobackfill.client.NotFound``)."""


@dataclass
class PairDataset:
    """Images and their captions loaded from a data folder (indices are into ``images``)."""

    root: Path
    images: list[str]
    image_labels: list[dict]
    captions: list[str]
    langs: list[str]
    caption_image: np.ndarray
    caption_lines: list[int]
    skipped: int = 0
    extra: list[dict] = field(default_factory=list)
    #: with ``skip_bad``: every skipped image file (path relative to ``root``) -> why
    skipped_images: dict[str, str] = field(default_factory=dict)
    #: with ``skip_bad``: one message per skipped line (naming the file and the line)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.caption_image = np.asarray(self.caption_image, dtype=np.int64)
        if not self.extra:
            self.extra = [{} for _ in self.captions]
        n = len(self.captions)
        sizes = {len(self.langs), self.caption_image.size, len(self.caption_lines), len(self.extra)}
        if sizes != {n} or len(self.image_labels) != len(self.images):
            raise ValueError("PairDataset: per-caption / per-image lists differ in length")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_captions(self) -> int:
        return len(self.captions)

    def image_paths(self) -> list[Path]:
        """Absolute path of every image."""
        root = self.root.absolute()
        return [root / p for p in self.images]

    def languages(self) -> list[str]:
        """Distinct caption languages, in order of first appearance."""
        return list(dict.fromkeys(self.langs))

    def captions_of(self, image: int) -> list[int]:
        """Caption indices of image ``image``."""
        return np.flatnonzero(self.caption_image == image).tolist()

    def filter_langs(self, langs: Sequence[str]) -> PairDataset:
        """Keep only captions in ``langs`` and the images that still have a caption."""
        wanted = set([langs] if isinstance(langs, str) else langs)
        keep = np.array([lang in wanted for lang in self.langs], dtype=bool)
        if not keep.any():
            raise ValueError(f"no captions in languages {sorted(wanted)}; "
                             f"dataset has {self.languages()}")
        kept_images = np.unique(self.caption_image[keep])  # ascending = original order
        return self._select(kept_images, keep)

    def subset_images(self, idx: Sequence[int] | np.ndarray) -> PairDataset:
        """The images ``idx`` (in that order) with all of their captions."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise IndexError(f"image index out of range for {len(self)} images")
        idx = idx % max(len(self), 1)
        if np.unique(idx).size != idx.size:
            raise ValueError("subset_images: duplicate image indices")
        return self._select(idx, np.ones(len(self.captions), dtype=bool))

    def _select(self, image_idx: np.ndarray, caption_mask: np.ndarray) -> PairDataset:
        """New dataset with images ``image_idx`` (new order) and their captions in ``caption_mask``."""
        new_of_old = np.full(len(self.images), -1, dtype=np.int64)
        new_of_old[image_idx] = np.arange(image_idx.size)
        keep = np.flatnonzero(caption_mask & (new_of_old[self.caption_image] >= 0))
        return PairDataset(
            root=self.root,
            images=[self.images[i] for i in image_idx],
            image_labels=[dict(self.image_labels[i]) for i in image_idx],
            captions=[self.captions[j] for j in keep],
            langs=[self.langs[j] for j in keep],
            caption_image=new_of_old[self.caption_image[keep]],
            caption_lines=[self.caption_lines[j] for j in keep],
            skipped=self.skipped,
            extra=[dict(self.extra[j]) for j in keep],
            skipped_images=dict(self.skipped_images),
            problems=list(self.problems),
        )

    def to_records(self) -> Iterator[dict]:
        """One ``captions.jsonl`` record per caption (inverse of :func:`load_pairs`)."""
        labelled: set[int] = set()
        for j, caption in enumerate(self.captions):
            i = int(self.caption_image[j])
            rec: dict[str, Any] = {"image": self.images[i], "caption": caption,
                                   "lang": self.langs[j]}
            if self.image_labels[i] and i not in labelled:
                rec["labels"] = self.image_labels[i]
            labelled.add(i)
            rec.update(self.extra[j])
            yield rec


# ----------------------------------------------------------------------------- validation
def check_data_folder(folder: str | os.PathLike) -> Path:
    """``folder`` as an absolute path, if it is a folder; else :class:`DataFormatError` saying what it
    is: no such folder, or a file (trial Y: a missing folder read as one without its captions file)."""
    root = Path(folder).absolute()
    if not root.is_dir():
        if root.exists():
            raise DataFormatError("a file, not a data folder", root)
        raise MissingDataError("no such folder", root)
    return root


def split_folder(folder: str | os.PathLike, split: str) -> Path:
    """The folder to read of ``folder`` given ``split``: itself when it holds a captions file (or is
    a folder of images); its ``split`` subfolder for a world root. A world root (``world.json``, or
    subfolders with a captions file) without that split is ``FileNotFoundError`` naming its splits:
    read as a folder of images, it would add every split's images, uncaptioned."""
    folder = Path(folder)
    if (folder / CAPTIONS_FILE).is_file():
        return folder
    if not split or split in (".", "..") or "/" in split or "\\" in split:  # ('' and '.' named the root itself)
        raise FileNotFoundError(f"split must name one split of a world root (train, val, test), got {split!r}")
    if (folder / split).is_dir():
        return folder / split
    splits = sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / CAPTIONS_FILE).is_file()) \
        if folder.is_dir() else []
    if splits or (folder / "world.json").is_file():
        raise FileNotFoundError(f"{folder}: a world root with no split {split!r} (its splits: "
                                f"{', '.join(splits) or 'none'})")
    return folder


def _parse_record(obj: Any) -> tuple[str, str, str, dict, dict]:
    """Check one record; return (image path normalised, caption, lang, labels, extra).

    Raises ``ValueError`` with a message that does not yet say where the record came from.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in _REQUIRED:
        if key not in obj:
            raise ValueError(f"missing required field {key!r}")
        value = obj[key]
        if not isinstance(value, str):
            raise ValueError(f"field {key!r} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise ValueError(f"field {key!r} is empty")
    labels = obj.get("labels")
    if labels is None:
        labels = {}
    elif not isinstance(labels, dict):
        raise ValueError(f"field 'labels' must be an object, got {type(labels).__name__}")
    if "image_id" in obj:  # (it was kept, and replaced the link to the line's image: trial AJ)
        raise ValueError("field 'image_id' is set from 'image' (the id of that image's item); leave it out")
    extra = {k: v for k, v in obj.items() if k not in _KNOWN}
    return _normalise_image_path(obj["image"]), obj["caption"], obj["lang"], labels, extra


def _normalise_image_path(image: str) -> str:
    """``image`` as a normalised POSIX path inside the folder (a lexical check: symlinks in
    the folder may point elsewhere)."""
    posix = image.replace("\\", "/")
    norm = posixpath.normpath(posix)
    if posix.startswith("/") or PureWindowsPath(image).drive:
        raise ValueError(f"image path {image!r} is absolute: give the path relative to the data folder")
    if norm in (".", "..") or norm.startswith("../"):
        raise ValueError(f"image path {image!r} escapes the data folder "
                         "(must be a relative path to a file inside it)")
    return norm


def image_problem(path: Path) -> str | None:
    """Why ``path`` is not an image that decodes completely, or None if it is fine: the checksums
    (``verify``) and then the whole pixel stream (``load``; a PNG whose chunks are intact but whose
    stream is cut short passes ``verify`` and would abort the embedding later)."""
    if not path.is_file():
        return "image file not found"
    try:
        with Image.open(path) as im:
            im.verify()
        open_rgb(path)  # the whole stream, converted as it will be embedded
    except Exception as exc:  # Pillow raises many types for corrupt data
        exc = exc.__cause__ or exc  # open_rgb's ImageReadError wraps Pillow's error
        return f"cannot decode image ({type(exc).__name__}: {exc})"
    return None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is no JSON value (a number must be finite; write null for a missing one)")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        _not_json(f"{text} (infinite as a float)")
    return value


def loads_json_line(text: str) -> Any:
    """``json.loads(text)`` of one line of a data file, refusing what JSON is not and what cannot be
    stored as metadata: ``NaN`` / ``Infinity`` (Python's reader takes them) and a number too large
    for a float (``ValueError``: the line is a bad line, named by file and line)."""
    return json.loads(text, parse_constant=_not_json, parse_float=_finite)


def _read_lines(path: Path) -> Iterator[tuple[int, str | None, str | None]]:
    """Yield ``(line_no, text, decode_error)`` for each line of ``path`` (1-based)."""
    with open(path, "rb") as fh:
        for no, raw in enumerate(fh, start=1):
            if no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield no, raw.decode("utf-8"), None
            except UnicodeDecodeError as exc:
                yield no, None, f"not valid UTF-8 ({exc})"


# ----------------------------------------------------------------------------- load / write
def load_pairs(
    folder: str | os.PathLike,
    *,
    langs: Sequence[str] | None = None,
    skip_bad: bool = False,
    check_images: bool = True,
    limit: int | None = None,
    allow_empty: bool = False,
    warn: bool = True,
) -> PairDataset:
    """Load and validate a data folder.

    Args:
        folder: the folder holding ``captions.jsonl`` and the images.
        langs: keep only captions in these languages (other lines are ignored, not "skipped").
        skip_bad: skip bad lines / images (counted in ``skipped``, named in ``problems`` and
            ``skipped_images``, logged as warnings) instead of raising :class:`DataFormatError`.
        check_images: check each image exists and decodes (``PIL.Image.verify``, once per
            image). ``False`` reads captions only.
        limit: keep at most this many images (the first ones in file order) with all their
            captions; lines for further images are ignored.
        allow_empty: a file with no valid caption (empty, blank, or every line skipped) gives an
            empty dataset rather than an error (a collection adds the folder's images uncaptioned);
            not where ``langs`` asked for captions that none is in.
        warn: log each skip as a warning as it goes (a caller that reports what was skipped itself,
            as ``collection add`` does, passes False: trial J saw each problem printed three times).

    Raises:
        DataFormatError: on a missing folder / file, a bad line or image (unless ``skip_bad``),
            or when nothing valid is left. Messages name the file and the line.
    """
    root = check_data_folder(folder)
    path = root / CAPTIONS_FILE
    if not path.is_file():
        raise DataFormatError(f"{CAPTIONS_FILE} not found in the data folder", path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    wanted = None if langs is None else set([langs] if isinstance(langs, str) else langs)

    image_index: dict[str, int] = {}
    images: list[str] = []
    captions: list[str] = []
    caption_langs: list[str] = []
    caption_image: list[int] = []
    caption_lines: list[int] = []
    extras: list[dict] = []
    problems: dict[str, str | None] = {}  # image path -> problem (checked once)
    skipped_images: dict[str, str] = {}
    skipped_lines: list[str] = []
    skipped = 0
    merged_labels: dict[str, dict] = {}  # image path -> the labels of all its lines
    label_conflicts: list[str] = []

    def bad(line: int, message: str) -> None:
        nonlocal skipped
        err = DataFormatError(message, path, line, skippable=True)
        if not skip_bad:
            raise err
        skipped += 1
        skipped_lines.append(str(err))
        if warn and skipped <= _MAX_LOGGED_SKIPS:
            logger.warning("skipping %s", err)

    for no, text, decode_error in _read_lines(path):
        if decode_error is not None:
            bad(no, decode_error)
            continue
        if not text.strip():
            continue
        try:
            obj = loads_json_line(text.strip())  # a line's newline is not part of its JSON
        except ValueError as exc:  # (json.JSONDecodeError too)
            bad(no, f"invalid JSON: {exc}")
            continue
        try:
            image, caption, lang, labels, extra = _parse_record(obj)
        except ValueError as exc:
            bad(no, str(exc))
            continue
        if labels:  # an image's labels, from any of its lines (whatever their language)
            _merge_labels(merged_labels.setdefault(image, {}), labels, image, no, label_conflicts)
        if wanted is not None and lang not in wanted:
            continue
        if image not in image_index and limit is not None and len(images) >= limit:
            continue
        if check_images:
            if image not in problems:
                problems[image] = image_problem(root / image)
            if problems[image] is not None:
                bad(no, f"image {image!r}: {problems[image]}")
                skipped_images[image] = problems[image]
                continue
        if image not in image_index:
            image_index[image] = len(images)
            images.append(image)
        captions.append(caption)
        caption_langs.append(lang)
        caption_image.append(image_index[image])
        caption_lines.append(no)
        extras.append(extra)

    image_labels = [merged_labels.get(image, {}) for image in images]
    if label_conflicts:  # (whatever ``warn`` says of skipped lines: its callers report those, not these)
        logger.warning("%s: %d label(s) given other values on a later line of the same image; the first value is "
                       "kept: %s%s", path, len(label_conflicts), "; ".join(label_conflicts[:3]),
                       " ..." if len(label_conflicts) > 3 else "")
    if warn and skipped > _MAX_LOGGED_SKIPS:
        logger.warning("%s: skipped %d bad lines in total", path, skipped)
    if warn and skipped_images:
        logger.warning("%s: skipped %d unreadable image file(s): %s", root, len(skipped_images),
                       ", ".join(skipped_images))
    if not captions and not (allow_empty and wanted is None):
        what = "" if wanted is None else f" in languages {sorted(wanted)}"
        raise DataFormatError(f"no valid captions{what} (skipped {skipped} bad lines)", path)
    return PairDataset(root=root, images=images, image_labels=image_labels, captions=captions,
                       langs=caption_langs, caption_image=np.asarray(caption_image, np.int64),
                       caption_lines=caption_lines, skipped=skipped, extra=extras,
                       skipped_images=skipped_images, problems=skipped_lines)


def _merge_labels(into: dict, labels: dict, image: str, line: int, conflicts: list[str]) -> None:
    """Add ``labels`` (of a line of ``image``) to ``into``, the image's labels so far: a new key is
    added; a key it holds with another value keeps the first value, and the conflict is noted."""
    for key, value in labels.items():
        if into.get(key) is None:  # new, or null so far (a null names no value to keep)
            into[key] = value
        elif value is not None and into[key] != value:
            conflicts.append(f"{image} line {line}: labels.{key} {value!r} (kept {into[key]!r})")


def write_pairs(folder: str | os.PathLike, records: Iterable[dict]) -> Path:
    """Write ``records`` as ``folder/captions.jsonl`` atomically; return the file's path.

    Each record is validated like a loaded line (images are not checked). The file is written
    atomically (:mod:`nobackfill._atomic`): readers see either the old or the new file, never a
    partial one, and a bad record leaves the old file as it was.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    target = root / CAPTIONS_FILE

    def fill(fh) -> None:
        for n, rec in enumerate(records, start=1):
            try:
                _parse_record(rec)
            except ValueError as exc:
                raise DataFormatError(f"record {n}: {exc}") from None
            fh.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))

    write_atomically(target, fill, tmp_prefix=".")
    return target
