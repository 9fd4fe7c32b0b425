"""User data as collection items, and adding them (embedding only what is new).

Ids are stable, never line numbers:

* an image's id is ``img-`` + the first 20 hex digits of the sha256 of its bytes;
* a caption's id is its line's own ``"id"`` field when given, otherwise ``txt-`` + a hash of the
  caption text and its image's id (so inserting a line at the top of ``captions.jsonl`` changes
  nothing, and the same caption of another image is another item);
* a text from a plain text file: its own ``id`` (JSONL) or ``txt-`` + a hash of the text.

An item's vector key (:func:`~nobackfill.collection.collection.vector_key`) adds a hash of its content,
so editing a caption under the same id (an upsert) embeds it again, and re-adding unchanged content
embeds nothing. A data folder may hold images that no caption mentions, or no ``captions.jsonl`` at
all (a folder of photos): every readable image file is an item.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..catalog.items import MAX_IMAGE_METADATA_BYTES, added_id_problem, image_metadata_json
from ..data.folder import (CAPTIONS_FILE, DataFormatError, MissingDataError, check_data_folder, image_problem,
                           load_pairs, loads_json_line)
from ..encoders.base import encode
from ..progress import progress_bar
from .collection import Collection, Item, vector_key
from ..gallery.atomic_files import file_sha256
from ..gallery.manifest import MODALITIES
from ..gallery.types import DuplicateIdError, SpaceMismatchError, other_modality_error

if TYPE_CHECKING:  # importing the encoder module pulls in torch
    from ..encoders.base import DualEncoder

__all__ = ["IMAGE_SUFFIXES", "AddReport", "FolderItems", "UnembeddableItem", "add_items", "encode_readable", "folder_items", "image_id", "image_item",
           "index_folder", "index_pairs", "pair_ids", "read_text_file", "text_file_items", "text_id", "text_item"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def _hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def image_id(sha256: str) -> str:
    """The id of an image given none: ``img-`` and the start of the sha256 of its bytes."""
    return f"img-{sha256[:20]}"


def text_id(text: str, image: str = "") -> str:
    """The id of a caption given none: ``txt-`` and a hash of its text and its image's id."""
    return f"txt-{_hash(image, text)[:20]}"


def image_item(path: str | Path, *, id: str | None = None, metadata: dict[str, Any] | None = None,
               sha256: str | None = None) -> Item:
    """An image item (its id from its bytes unless ``id`` is given)."""
    p = Path(path).absolute()
    digest = sha256 or file_sha256(p)
    iid = id or image_id(digest)
    return Item(id=iid, modality="image", key=vector_key(iid, digest[:16]),
                source={"path": str(p), "sha256": digest}, metadata={"path": str(p), **(metadata or {})})


def text_item(text: str, *, id: str | None = None, image_id: str = "", metadata: dict[str, Any] | None = None) -> Item:
    """A caption / text item (its id from its text and its image's id unless ``id`` is given)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a text item needs a non-empty text, got {text!r}")
    iid = id or text_id(text, image_id)
    return Item(id=iid, modality="text", key=vector_key(iid, _hash(text)[:16]), source={"text": text},
                metadata={"text": text, **(metadata or {})})


def pair_ids(data: Any) -> tuple[list[str], list[str]]:
    """The stable ids (those ``collection add`` gives) of a
    :class:`~nobackfill.data.folder.PairDataset`'s images and captions, in its order: an image's
    from its bytes, a caption's from its line's own ``id`` or its text and its image."""
    images = [image_id(file_sha256(p)) for p in data.image_paths()]
    caps = [str(extra["id"]) if isinstance(extra.get("id"), str) and extra["id"].strip()
            else text_id(cap, images[int(i)])
            for cap, i, extra in zip(data.captions, data.caption_image, data.extra)]
    return images, caps


def index_pairs(encoder: "DualEncoder", data: Any, out: str | Path, *, model_ref: str, backend: str = "flat",
                progress: bool = True, wait: bool = False):
    """Embed a data folder's images and captions into a single-space gallery under their stable ids
    (:func:`pair_ids`; rows with the same id are embedded once). Resumable."""
    from ..gallery.build import build_gallery

    img_ids, cap_ids = pair_ids(data)
    images = list({i: (i, str(p)) for i, p in zip(img_ids, data.image_paths())}.values())
    texts = list({t: (t, cap, {"lang": lang, "image": data.images[int(i)], "image_id": img_ids[int(i)]})
                  for t, cap, lang, i in zip(cap_ids, data.captions, data.langs, data.caption_image)}.values())
    return build_gallery(encoder, out, images=images, texts=texts, model_ref=model_ref, backend=backend,
                         progress=progress, wait=wait)


def index_folder(encoder: "DualEncoder", read: "FolderItems", out: str | Path, *, model_ref: str,
                 backend: str = "flat", progress: bool = True, wait: bool = False,
                 before_embed: Callable[["FolderItems"], None] | None = None) -> Any:
    """Embed a data folder as read for ``collection add`` (``read``: the client's ``read_files``, its
    captioned images and captions, every other image too, the caption limit applied) into a
    single-space gallery, under the same ids, the images' labels kept. Resumable. Returns the
    gallery; ``before_embed(read)`` is told first."""
    from ..gallery.build import build_gallery

    if before_embed is not None:
        before_embed(read)
    images = {it.id: (it.id, it.source["path"], {k: v for k, v in it.metadata.items() if k != "path"})
              for it in read.items if it.modality == "image"}  # (its labels, as a collection keeps them)
    texts = {it.id: (it.id, it.source["text"], {k: v for k, v in it.metadata.items() if k != "text"})
             for it in read.items if it.modality == "text"}
    return build_gallery(encoder, out, images=list(images.values()), texts=list(texts.values()), model_ref=model_ref,
                         backend=backend, progress=progress, wait=wait)


class UnembeddableItem(ValueError):
    """An item an add could not embed (a corrupt image, a file gone): ``item``, and ``stored``, how
    many items of the call were committed before it (a call commits chunk by chunk); ``skip_bad``
    skips such items."""

    skippable = True

    def __init__(self, message: str, item: Item, stored: int) -> None:
        super().__init__(message)
        self.item, self.stored = item, stored


@dataclass
class FolderItems:
    """What a data folder holds: items, and what was skipped (with ``skip_bad``)."""

    items: list[Item]
    skipped: int = 0
    uncaptioned: int = 0
    #: one message per skipped line or image
    problems: list[str] = field(default_factory=list)
    #: every skipped image file (path relative to the folder) -> why
    skipped_images: dict[str, str] = field(default_factory=dict)
    #: each caption item's line in captions.jsonl (by id)
    lines: dict[str, int] = field(default_factory=dict)

    def count(self, modality: str) -> int:
        return sum(1 for it in self.items if it.modality == modality)

    def skip(self, err: DataFormatError, skip_bad: bool) -> None:
        """Raise ``err`` (a bad line), or with ``skip_bad`` count it and keep its message."""
        if not skip_bad:
            raise err
        self.skipped += 1
        self.problems.append(str(err))


def folder_items(folder: str | Path, *, langs: Sequence[str] | None = None, skip_bad: bool = False,
                 uncaptioned: bool = True) -> FolderItems:
    """Items of a data folder: its captioned images and captions (``captions.jsonl``, validated
    line by line as :func:`~nobackfill.data.folder.load_pairs` does), plus, with ``uncaptioned``,
    every other image file under the folder. Bad lines or unreadable images raise
    :class:`~nobackfill.data.folder.DataFormatError` naming the file (and line), or are skipped,
    counted and named (``problems``, ``skipped_images``) with ``skip_bad``."""
    root = check_data_folder(folder)
    out = FolderItems(items=[])
    referenced: set[str] = set()
    if (root / CAPTIONS_FILE).is_file():
        # a file with no valid caption leaves the folder's images, added uncaptioned (trial J: an empty
        # captions.jsonl refused the whole folder, though a folder without one is added)
        ds = load_pairs(root, langs=langs, skip_bad=skip_bad, allow_empty=uncaptioned, warn=False)  # (its caller reports)
        out.skipped += ds.skipped
        out.problems.extend(ds.problems)
        out.skipped_images.update(ds.skipped_images)
        image_ids: list[str] = []
        captions: dict[str, Item] = {}
        too_large = _labels_too_large(ds)
        for rel, labels in zip(ds.images, ds.image_labels):  # load_pairs decoded each one already
            it = image_item(root / rel, metadata={"labels": labels} if labels else {})
            referenced.add(rel)
            image_ids.append(it.id)
            if rel not in too_large:
                out.items.append(it)
        image_set = set(image_ids)
        for j, caption in enumerate(ds.captions):
            i = int(ds.caption_image[j])
            if ds.images[i] in too_large:  # each of its lines is a bad line, as an unreadable image's are
                out.skipped_images[ds.images[i]] = too_large[ds.images[i]]
                out.skip(DataFormatError(f"image {ds.images[i]!r}: {too_large[ds.images[i]]}", root / CAPTIONS_FILE,
                                         ds.caption_lines[j], skippable=True), skip_bad)
                continue
            extra = dict(ds.extra[j])
            own_id = extra.pop("id", None)
            if own_id is not None and (not isinstance(own_id, str) or not own_id.strip()):
                out.skip(DataFormatError(f"field 'id' must be a non-empty string, got {own_id!r}", root / CAPTIONS_FILE,
                                         ds.caption_lines[j], skippable=True), skip_bad)
                continue
            if own_id is not None and (problem := added_id_problem(own_id)) is not None:  # (as a text file's line)
                out.skip(DataFormatError(f"field 'id': {problem}", root / CAPTIONS_FILE, ds.caption_lines[j],
                                         skippable=True), skip_bad)
                continue
            meta = {"lang": ds.langs[j], "image": ds.images[i], "image_id": image_ids[i], **extra}
            it = text_item(caption, id=own_id, image_id=image_ids[i], metadata=meta)
            if own_id is not None and own_id in image_set:  # an image's content id: two items cannot share it
                out.skip(DataFormatError(f"id {own_id!r} is the id of an image of this folder (an image's id is "
                                         "its content's); give the caption another id", root / CAPTIONS_FILE,
                                         ds.caption_lines[j], skippable=True), skip_bad)
                continue
            prev = captions.get(it.id)
            if prev is not None and prev.key != it.key:
                out.skip(DataFormatError(f"id {it.id!r} is given again with another caption (first on line "
                                         f"{out.lines[it.id]})", root / CAPTIONS_FILE, ds.caption_lines[j],
                                         skippable=True), skip_bad)
                continue
            captions[it.id] = it
            out.items.append(it)
            out.lines.setdefault(it.id, ds.caption_lines[j])
    elif langs:
        raise DataFormatError(f"{CAPTIONS_FILE} not found, so there are no captions in languages {list(langs)}",
                              root / CAPTIONS_FILE)
    if uncaptioned:
        for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
            rel = path.relative_to(root).as_posix()
            if rel in referenced or rel in out.skipped_images \
                    or any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            problem = image_problem(path)
            if problem:
                if not skip_bad:
                    raise DataFormatError(f"image {rel!r}: {problem}", path, skippable=True)
                out.skipped += 1
                out.problems.append(f"image {rel!r}: {problem}")
                out.skipped_images[rel] = problem
                continue
            out.items.append(image_item(path))
            out.uncaptioned += 1
    if not out.items:
        raise DataFormatError("no images and no captions found (a data folder holds image files and/or "
                              f"a {CAPTIONS_FILE})", root)
    return out


def _labels_too_large(ds: Any) -> dict[str, str]:
    """The images of ``ds`` (a :class:`~nobackfill.data.folder.PairDataset`) whose labels, the
    metadata their item gets, are over :data:`~nobackfill.catalog.items.MAX_IMAGE_METADATA_BYTES` as
    compact ASCII JSON -> why: what the HTTP API takes with an image, held in process too so that a
    folder adds alike on a path and a URL (trial AJ: the whole add failed over HTTP, named by an index)."""
    out = {}
    for rel, labels in zip(ds.images, ds.image_labels):
        if labels and (n := len(image_metadata_json({"labels": labels}))) > MAX_IMAGE_METADATA_BYTES:
            out[rel] = f"its labels are {n} bytes as JSON, at most {MAX_IMAGE_METADATA_BYTES} are kept with an image"
    return out


def text_file_items(path: str | Path, *, limit: int | None = None) -> list[Item]:
    """Text items from a file (see :func:`read_text_file`); any bad line raises."""
    return read_text_file(path, limit=limit).items


def read_text_file(path: str | Path, *, limit: int | None = None, langs: Sequence[str] | None = None,
                   skip_bad: bool = False) -> FolderItems:
    """Text items from a file: ``.jsonl`` lines ``{"text": .., "id": .. (optional), "lang": ..
    (optional), ...}`` (other keys are metadata) or any other file, one text per non-blank line.
    ``langs``: keep only JSONL lines whose ``lang`` is one of them (a plain text file has no
    languages: refused). A bad line, or an id given again with other text, raises
    :class:`~nobackfill.data.folder.DataFormatError` naming the file and line(s), or with
    ``skip_bad`` is skipped, counted and named (``problems``)."""
    p = Path(path)
    if not p.is_file():  # (a missing one: NotFound, as a missing data folder is; trial AF)
        if p.exists():  # (a pipe or a device is no folder either: trial AH read "a folder" for /dev/stdin)
            raise DataFormatError(("a folder, not a text file" if p.is_dir() else "not a regular file (a pipe or a "
                                   "device): give a text file") + " (one text a line, or .jsonl)", p)
        raise MissingDataError("no such text file", p)
    jsonl = p.suffix == ".jsonl"
    wanted = set(langs) if langs else None
    if wanted is not None and not jsonl:
        raise DataFormatError(f"languages {sorted(wanted)} asked for, but a plain text file has none (one text a "
                              "line); give a .jsonl file whose lines carry a 'lang' field, or leave out --langs", p)
    out = FolderItems(items=[])
    seen_langs: set[str] = set()
    by_id: dict[str, Item] = {}

    def bad(no: int, message: str) -> None:
        out.skip(DataFormatError(message, p, no, skippable=True), skip_bad)

    with open(p, encoding="utf-8-sig") as fh:  # a byte-order mark is not part of the first line
        try:
            lines = list(fh)
        except UnicodeDecodeError as e:
            raise DataFormatError(f"not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start}); "
                                  "a text file takes one text a line, or JSONL", p) from None
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if limit is not None and len(out.items) >= limit:
            break
        if not jsonl:
            it = text_item(line.rstrip("\r\n"))
        else:
            try:
                obj = loads_json_line(line.strip())
            except ValueError as e:  # (json.JSONDecodeError too)
                bad(no, f"invalid JSON: {e}")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
                bad(no, "each line needs a non-empty string field 'text'")
                continue
            own = obj.pop("id", None)
            if own is not None and (not isinstance(own, str) or not own.strip()):
                bad(no, f"field 'id' must be a non-empty string, got {own!r}")
                continue
            if own is not None and (problem := added_id_problem(own)) is not None:  # (named by line, skippable)
                bad(no, f"field 'id': {problem}")
                continue
            if wanted is not None:
                lang = obj.get("lang")
                seen_langs.add(str(lang))
                if lang not in wanted:
                    continue
            it = text_item(obj.pop("text"), id=own, metadata=obj)
        prev = by_id.get(it.id)
        if prev is not None:
            if prev.key != it.key:
                bad(no, f"id {it.id!r} is given again with other text (first on line {out.lines[it.id]})")
            continue  # the same text again: once is enough
        by_id[it.id] = it
        out.lines[it.id] = no
        out.items.append(it)
    if not out.items:
        if wanted is not None and seen_langs:
            raise DataFormatError(f"no texts in languages {sorted(wanted)}; the file has "
                                  f"{sorted(x for x in seen_langs if x != 'None') or 'no lang field'}", p)
        raise DataFormatError("no texts in the file", p)
    return out


@dataclass
class AddReport:
    """What :func:`add_items` did."""

    added: int = 0  # embedded and committed (new ids, or new content under an existing id)
    replaced: int = 0  # of ``added``: new content under an id the collection held (an upsert)
    unchanged: int = 0  # already in the collection with the same content and metadata
    metadata_updated: int = 0  # same content, new metadata: no embedding
    recovered: int = 0  # vectors found in the store from an interrupted run: not embedded again
    skipped: int = 0  # unreadable at embedding time (with skip_bad)
    problems: list[str] = field(default_factory=list)
    skipped_images: dict[str, str] = field(default_factory=dict)  # image path (as given) -> why

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "replaced": self.replaced, "unchanged": self.unchanged,
                "metadata_updated": self.metadata_updated, "recovered": self.recovered, "skipped": self.skipped}


def add_items(collection: Collection, encoder: "DualEncoder", items: Sequence[Item], *, chunk_size: int = 256,
              skip_bad: bool = False, progress: bool = True, wait: bool = False,
              on_commit: Callable[[int], None] | None = None,
              before_embed: Callable[[list[Item]], None] | None = None) -> AddReport:
    """Add or update ``items``: embed, with the collection's current model (``encoder``), only what
    the collection does not hold yet, in chunks committed one at a time (a killed run resumes where
    it stopped, embedding nothing twice). One adder at a time (:meth:`Collection.ingesting`).

    Raises :class:`SpaceMismatchError` if ``encoder`` is not the current model, ``ValueError`` if it
    cannot embed a modality of ``items`` (before anything is written), :class:`DuplicateIdError`
    for one id given twice with different content, or for an id the collection holds as an item of
    the other modality (nothing is written). An id held with other content of its modality is
    replaced (re-embedded): an upsert. ``on_commit(n)``: called after the run's n-th
    chunk is committed. ``before_embed(items)``: called once with the items that will be embedded
    (none of those already held), before the first is.
    """
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    current = collection.current_space
    entry = collection.space(current)
    if encoder.space_id != current:
        raise SpaceMismatchError(current, encoder.space_id, f"add items to collection {collection.path}",
                                 what="given model's embeddings",
                                 hint=f"embed new items with the collection's current model ({entry.name}: "
                                      f"{entry.model})")
    wanted = {it.modality for it in items}
    can = set(getattr(encoder, "modalities", ("image", "text"))) & set(entry.modalities)
    if wanted - can:
        what = ", ".join(sorted(wanted - can))
        raise ValueError(f"the current model of collection {collection.path} ({entry.name}) embeds only "
                         f"{', '.join(sorted(can)) or 'nothing'}: cannot add {what} items")
    by_id: dict[str, Item] = {}
    for it in items:
        prev = by_id.get(it.id)
        if prev is not None and (prev.key != it.key or prev.modality != it.modality):
            raise DuplicateIdError(f"id {it.id!r} is given twice with different content")
        by_id.setdefault(it.id, it)
    report = AddReport()
    with collection.ingesting(wait=wait):
        live = collection.get_many(by_id)
        gallery = collection.gallery(current)
        held = {m: set(gallery.positions(m, [it.key for it in by_id.values() if it.modality == m]))
                for m in MODALITIES}  # vectors already stored (e.g. by a run killed before its commit)
        quick: list[Item] = []
        todo: dict[str, list[Item]] = {"image": [], "text": []}
        other = [(it, live[it.id]) for it in by_id.values() if it.id in live and live[it.id].modality != it.modality]
        if other:  # before anything is written: an image's id never silently becomes a caption's (or back)
            it, old = other[0]
            raise other_modality_error(it.id, old.modality, it.modality, len(other) - 1)
        for it in by_id.values():
            old = live.get(it.id)
            if old is not None and _same_content(old, it):
                if dict(old.metadata) == dict(it.metadata):
                    report.unchanged += 1
                else:  # same content: keep the stored vector (and its key)
                    quick.append(dataclasses.replace(it, key=old.key))
                    report.metadata_updated += 1
            elif it.key in held[it.modality]:
                quick.append(it)
                report.recovered += 1
            else:  # new, or new content of a stored item of its modality (an upsert: re-embedded)
                todo[it.modality].append(it)
        collection.commit(quick)
        if before_embed is not None and (todo["image"] or todo["text"]):
            before_embed(todo["image"] + todo["text"])
        committed = 0
        for modality, rows in todo.items():
            if not rows:
                continue
            with progress_bar(progress, f"embedding {modality}s", len(rows)) as advance:
                for start in range(0, len(rows), int(chunk_size)):
                    chunk = rows[start:start + int(chunk_size)]
                    chunk, vectors = _embed_chunk(encoder, modality, chunk, skip_bad, report, len(quick))
                    if chunk:
                        collection.put_vectors(current, modality, [it.key for it in chunk], vectors)
                        collection.commit(chunk)  # <- the items become visible here
                        report.added += len(chunk)
                        report.replaced += sum(it.id in live for it in chunk)
                    committed += 1
                    advance(len(rows[start:start + int(chunk_size)]))
                    if on_commit is not None:
                        on_commit(committed)  # after the run's n-th committed chunk
    return report


def _same_content(old: Item, it: Item) -> bool:
    """Whether stored ``old`` and ``it`` (the same id) are one item: the same modality and content
    (a plain gallery's row, whose id names its content, matches any content of its modality)."""
    return old.modality == it.modality and (old.key == it.key or old.key == old.id)


def encode_readable(encoder: Any, items: Sequence[Item]) -> tuple[list[Item], dict[str, np.ndarray], dict[str, str]]:
    """The vectors of the items whose sources can be read, per modality (in their order): the items
    kept, their vectors, and the others (id -> why: a file gone, corrupt...). Where the batch fails,
    each item is embedded alone to find which (only that batch pays for it). What an add and the
    backfill embed with."""
    try:
        return list(items), {m: encode(encoder, m, [it.payload for it in items if it.modality == m])
                             for m in ("image", "text") if any(it.modality == m for it in items)}, {}
    except (OSError, ValueError, SyntaxError):
        pass
    keep: list[Item] = []
    rows: dict[str, list[np.ndarray]] = {"image": [], "text": []}
    bad: dict[str, str] = {}
    for it in items:
        try:
            v = encode(encoder, it.modality, [it.payload])[0]
        except (OSError, ValueError, SyntaxError) as e:
            bad[it.id] = f"{type(e).__name__}: {e}"
            continue
        keep.append(it)
        rows[it.modality].append(v)
    return keep, {m: np.stack(v) for m, v in rows.items() if v}, bad


def _embed_chunk(encoder: "DualEncoder", modality: str, chunk: list[Item], skip_bad: bool,
                 report: AddReport, quick: int) -> tuple[list[Item], np.ndarray]:
    """Vectors of ``chunk``; an item that fails to embed is :class:`UnembeddableItem` (saying how
    many of the call's items are stored: ``quick`` committed without embedding, and the chunks
    before), or skipped with ``skip_bad``."""
    keep, vecs, bad = encode_readable(encoder, chunk)
    for it in chunk:
        if it.id in bad:
            why = f"cannot embed {modality} ({bad[it.id]})"
            msg = f"{it.payload if modality == 'image' else it.id}: {why}"
            if not skip_bad:
                stored = quick + report.added
                raise UnembeddableItem(msg + (f"; {stored} item(s) of this call before it are stored (the same call "
                                              "again embeds only what is missing)" if stored else ""), it, stored)
            report.skipped += 1
            report.problems.append(msg)
            if modality == "image":
                report.skipped_images[str(it.payload)] = why
    return keep, vecs.get(modality, np.zeros((0, int(getattr(encoder, "embed_dim"))), np.float32))
