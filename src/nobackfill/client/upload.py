"""What ``add`` reads from files, the same in process and over HTTP: a data folder (or a world
root's split) and a text file are read on the caller's machine into items with the ids an add
gives them; over HTTP those items are then uploaded (images as their bytes with their ids and
metadata in part headers, captions with their ids and metadata) in requests within the server's
limits, every id checked against the server's rule first, and the answers summed into one
:class:`~nobackfill.client.types.AddResult`."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..catalog.items import (ID_PATTERN, ID_RULE, MAX_IMAGE_METADATA_BYTES, added_id_problem, image_metadata_json,
                             metadata_json, row_json)
from .errors import ClientError, InvalidRequest, TooLarge
from .types import AddResult

__all__ = ["ID_HEADER", "ID_PATTERN", "ID_RULE", "MAX_METADATA_BYTES", "METADATA_HEADER", "RESERVED_METADATA",
           "added_id_problem", "check_ids", "check_metadata", "drop_oversized", "given_items", "load_calibration", "one_source", "read_files", "upload_items"]

#: the part headers of an uploaded image (multipart ``POST /v1/items``): its item id, and its
#: metadata as a JSON object (ASCII: part headers are no place for other bytes)
ID_HEADER, METADATA_HEADER = "X-Item-Id", "X-Item-Metadata"
#: the longest ``X-Item-Metadata`` header (its JSON, in bytes): what the server's multipart parser
#: takes in one header line (python-multipart: 4,224 bytes, the header's name included)
MAX_METADATA_BYTES = MAX_IMAGE_METADATA_BYTES
#: metadata keys an uploaded image cannot carry: the server sets them (``path``: where it keeps the file)
RESERVED_METADATA = ("path", "id", "sha256")


def one_source(texts: Any, images: Any, folder: Any = None, text_file: Any = None) -> None:
    """:class:`~.errors.InvalidRequest` unless exactly one of the four is given."""
    if sum(x is not None for x in (texts, images, folder, text_file)) != 1:
        raise InvalidRequest(422, "give exactly one of texts=, images=, folder= or text_file=", "texts")


def read_files(folder: str | Path | None, split: str, text_file: str | Path | None,
               langs: Sequence[str] | None, skip_bad: bool, max_chars: int | None = None) -> tuple[list, Any]:
    """The items of ``folder`` (a data folder, or a world root's ``split``) or of ``text_file``, and
    what reading them found (skipped lines and images, with ``skip_bad``). A caption longer than
    ``max_chars`` (the limit of an added text, :class:`~nobackfill.search.limits.Limits`) is a bad line
    like any other, named before anything is stored: the same rule in process and over HTTP, where it
    was refused by the server after the items before it were stored (trial W)."""
    from ..collection.ingest import folder_items, read_text_file
    from ..data.folder import CAPTIONS_FILE, DataFormatError, split_folder

    if text_file is not None:
        read, where = read_text_file(text_file, langs=langs, skip_bad=skip_bad), Path(text_file)
    else:
        root = split_folder(folder, split)  # type: ignore[arg-type]
        read, where = folder_items(root, langs=langs, skip_bad=skip_bad), Path(root).absolute() / CAPTIONS_FILE
    if max_chars is not None:
        keep = []
        for it in read.items:
            text = it.source.get("text") if it.modality == "text" else None
            if isinstance(text, str) and len(text) > max_chars:
                read.skip(DataFormatError(f"a caption of {len(text)} characters, longer than the {max_chars} a text "
                                          "may have (as a search text); the line is not added", where,
                                          read.lines.get(it.id), skippable=True), skip_bad)
                continue
            keep.append(it)
        if len(keep) < len(read.items) and text_file is None:  # an image whose captions were all too long
            captioned = {it.metadata.get("image_id") for it in keep if it.modality == "text"}
            read.uncaptioned = sum(it.modality == "image" and it.id not in captioned for it in keep)
        read.items = keep
    return read.items, read


#: what a request's multipart framing and headers add to an image's bytes, at most (a generous bound)
PART_OVERHEAD = 8192


def drop_oversized(items: list, read: Any, limits: dict[str, Any], skip_bad: bool) -> list:
    """``items`` without the images whose file cannot travel in one request to the server (its bytes
    over ``limits["max_body_bytes"]``, ``serve --max-body-mb``): each is refused naming its file
    before anything is sent (an ``images[n]`` of the call for items ``read`` is None for, a bad image
    of the folder or file read otherwise), or with ``skip_bad`` skipped with the captions of its
    folder that name it (trial AJ: a 23 MB camera JPEG failed the whole folder's upload, named by no
    file). In process there is no such limit."""
    from ..data.folder import DataFormatError

    limit = int(limits.get("max_body_bytes") or 0)
    if not limit:
        return items
    dropped: set[str] = set()
    for n, it in enumerate(x for x in items if x.modality == "image"):
        path = Path(it.source["path"])
        size = path.stat().st_size if path.is_file() else 0
        if size + PART_OVERHEAD <= limit:
            continue
        why = (f"{size} bytes, more than the server takes in one request ({limit} bytes: serve --max-body-mb); "
               "not uploaded")
        if read is None:
            raise TooLarge(413, f"images[{n}] ({path}): {why}; nothing was added", f"images[{n}]")
        read.skip(DataFormatError(f"image {path.name!r}: {why}", path, skippable=True), skip_bad)
        read.skipped_images[str(path)] = why
        dropped.add(it.id)
    for it in items:
        if it.modality == "text" and it.metadata.get("image_id") in dropped:
            line = read.lines.get(it.id)
            read.skip(DataFormatError(f"{'' if line is None else f'captions line {line}: '}a caption of the image "
                                      f"{it.metadata.get('image')!r}, which is not uploaded", skippable=True), skip_bad)
    if dropped and read is not None:  # (an image not uploaded is no image without captions either)
        captioned = {it.metadata.get("image_id") for it in items if it.modality == "text"}
        read.uncaptioned -= len(dropped - captioned)
    return [it for it in items if it.id not in dropped and it.metadata.get("image_id") not in dropped]


def given_items(texts: Any, images: Any, ids: Any, check_text: Callable[[Any, str], str] | None = None) -> list:
    """The items of ``texts`` (strings or ``{"text", "id", ...metadata}``) or ``images`` (paths or
    ``{"path", "id", "sha256" (if known), ...metadata}``), ``ids`` beside them; a row or id of
    another kind is :class:`~.errors.InvalidRequest` naming it (``texts[3]``, ``ids[0]``)."""
    from ..collection.ingest import image_item, text_item
    from .base import check_list

    name = "texts" if texts is not None else "images"
    rows = check_list(texts, "texts", "texts (strings or {\"text\", ...} rows)") if texts is not None else \
        check_list(images, "images", "image file paths (or {\"path\", ...} rows)", array_is_one=True)
    own = check_list(ids, "ids", "ids (None: an id from the content)") if ids is not None else [None] * len(rows)
    if len(own) != len(rows):
        raise InvalidRequest(422, f"{len(own)} ids for {len(rows)} {name}", "ids")
    for n, i in enumerate(own):
        if i is not None and (not isinstance(i, str) or not i):
            raise InvalidRequest(422, f"ids[{n}]: an id is a non-empty string (None: one from the content), got "
                                      f"{i!r}", f"ids[{n}]")
    own = [i if i is None else str(i) for i in own]  # (numpy's str_ as a plain str)
    out = []
    for n, (row, i) in enumerate(zip(rows, own)):
        at = f"{name}[{n}]"
        if images is not None:
            if isinstance(row, (str, Path)):
                row = {"path": row}
            if not isinstance(row, Mapping) or not isinstance(row.get("path"), (str, Path)):
                got = "a row without a path" if isinstance(row, Mapping) else type(row).__name__
                raise InvalidRequest(422, f"{at}: an image file's path, or a {{\"path\", ...}} row; got {got} (save an "
                                          "image in memory to a file first: the collection keeps where each image is, "
                                          "to embed it again after an upgrade)", at)
        else:
            if isinstance(row, str):
                row = {"text": row}
            if not isinstance(row, Mapping):
                raise InvalidRequest(422, f"{at}: a string or a {{\"text\", ...}} row, got {type(row).__name__}", at)
        row = dict(row)
        if row.get("id") == "":
            raise InvalidRequest(422, f"{at}.id: empty (leave it out for an id from the content)", f"{at}.id")
        if i is not None and row.get("id") not in (None, i):
            raise InvalidRequest(422, f"{at}: two ids given, {row['id']!r} in the row and {i!r} in ids[{n}]", at)
        item_id = row.pop("id", None) or i
        try:
            if images is not None:
                path, digest = Path(row.pop("path")), row.pop("sha256", None)
                out.append(image_item(path, id=item_id, metadata=row, sha256=digest))
                continue
            text = row.pop("text", None)
            if check_text is not None:
                text = check_text(text, at)
            out.append(text_item(text, id=item_id, metadata=row))
        except ValueError as e:
            raise InvalidRequest(422, f"{at}: {e}" if not str(e).startswith(at) else str(e), at) from None
    return out


def _plain_metadata(meta: Any) -> dict[str, Any]:
    """``meta`` as the plain JSON object the catalog stores for it in process (numpy values as
    numbers or lists, dates as ISO text: :func:`~nobackfill.catalog.items.row_json`), so an item
    added over HTTP keeps the metadata it would keep in process."""
    return json.loads(row_json(meta)) if meta else {}


def _text_row(it: Any) -> dict[str, Any]:
    """A caption item as a row of ``POST /v1/items``: its metadata, its text and its id."""
    meta = _plain_metadata({k: v for k, v in it.metadata.items() if k not in ("text", "id")})
    return {**meta, "text": it.source["text"], "id": it.id}


def upload_items(call: Callable[..., Any], items: Sequence[Any], limits: dict[str, Any], *, chunk_size: int = 256,
                 progress: bool = False) -> AddResult:
    """Add ``items`` read here through ``call`` (a :class:`~.remote.RemoteClient`'s request):
    images first (the captions name them), each request at most ``chunk_size`` items, the server's
    ``max_batch`` and, for images, half its body limit. Every id and image metadata is checked
    before the first request; a request refused later names its item as an index of the call
    (``texts[280]``, not ``items[24]`` of its request). Returns the answers summed."""
    from ..progress import progress_bar

    per = max(1, min(int(chunk_size), int(limits.get("max_batch") or chunk_size)))
    body = int(limits.get("max_body_bytes") or 2**60) // 2
    out = AddResult()
    images = [it for it in items if it.modality == "image"]
    texts = [it for it in items if it.modality == "text"]
    check_ids(items)
    check_metadata(items)
    headers = [_image_headers(it, f"images[{n}]") for n, it in enumerate(images)]
    with progress_bar(progress, "uploading", len(items)) as advance:
        batch: list[tuple[int, bytes]] = []

        def flush() -> None:
            files = [("images", (Path(images[n].source["path"]).name, data, "application/octet-stream", headers[n]))
                     for n, data in batch]
            _sum(out, _request(call, "images", "images", batch[0][0], batch[0][0], files=files,
                               files_of=[str(images[n].source["path"]) for n, _ in batch]))
            advance(len(batch))
            batch.clear()

        def size(n: int, data: bytes) -> int:
            return len(data) + len(headers[n].get(METADATA_HEADER, ""))

        for n, it in enumerate(images):
            data = Path(it.source["path"]).read_bytes()
            if batch and (len(batch) >= per or sum(size(*b) for b in batch) + size(n, data) > body):
                flush()
            batch.append((n, data))
        if batch:
            flush()
        for start in range(0, len(texts), per):
            rows = [_text_row(it) for it in texts[start:start + per]]
            _sum(out, _request(call, "items", "texts", start, len(images) + start, json={"items": rows}))
            advance(len(rows))
    out.ids = [it.id for it in items]
    return out


def check_items(items: Sequence[Any]) -> None:
    """:func:`check_ids` and :func:`check_metadata`: the ids the HTTP API can name, JSON metadata."""
    check_ids(items)
    check_metadata(items)


def unembeddable(e: Any, items: Sequence[Any], given: bool) -> InvalidRequest:
    """The refusal of an item an add could not embed (``e``: an
    :class:`~nobackfill.collection.ingest.UnembeddableItem`), naming it as ``images[n]`` /
    ``texts[n]`` of the items ``given`` (not read from a folder or file, whose message names it)."""
    at = None
    if given:
        same = [x.id for x in items if x.modality == e.item.modality]
        at = f"{'images' if e.item.modality == 'image' else 'texts'}[{same.index(e.item.id)}]"
    out = InvalidRequest(422, f"{at}: {e}" if at else str(e), at)
    out.skippable = True  # type: ignore[attr-defined]
    return out


def check_ids(items: Sequence[Any]) -> None:
    """:class:`~.errors.InvalidRequest` naming the first item (``images[n]`` / ``texts[n]``: its place
    among the items of its modality) whose id is not one an added item may have
    (:func:`~nobackfill.catalog.items.added_id_problem`: one the HTTP API can name), before anything
    is added, in process and over HTTP alike."""
    for name, modality in (("images", "image"), ("texts", "text")):
        for n, it in enumerate(x for x in items if x.modality == modality):
            if (problem := added_id_problem(it.id)) is not None:
                raise InvalidRequest(422, f"{name}[{n}].id: {problem}; nothing was added", f"{name}[{n}].id")


def check_metadata(items: Sequence[Any]) -> None:
    """:class:`~.errors.InvalidRequest` naming the first item (as :func:`check_ids` does) whose
    metadata is no JSON object of JSON values (a NaN or infinity, a set, bytes:
    :func:`~nobackfill.catalog.items.metadata_json`), before anything is added, in process and over
    HTTP alike."""
    for name, modality in (("images", "image"), ("texts", "text")):
        for n, it in enumerate(x for x in items if x.modality == modality):
            if not it.metadata:
                continue
            try:
                metadata_json(it.metadata)
            except ValueError as e:
                problem = str(e).removeprefix("not a JSON object of JSON values: ")
                raise InvalidRequest(422, f"{name}[{n}]: its metadata is not a JSON object of JSON values ({problem}); "
                                          "nothing was added", f"{name}[{n}]") from None


def _image_headers(it: Any, at: str) -> dict[str, str]:
    """The part headers of an image item: its id, and its metadata but what the server sets
    (:data:`RESERVED_METADATA`) as ASCII JSON; InvalidRequest naming ``at`` for metadata that is
    no JSON or is over :data:`MAX_METADATA_BYTES`."""
    out = {ID_HEADER: it.id}
    meta = {k: v for k, v in it.metadata.items() if k not in RESERVED_METADATA}
    if meta:
        try:
            text = image_metadata_json(meta)
        except (TypeError, ValueError) as e:
            raise InvalidRequest(422, f"{at}: its metadata is not a JSON object of JSON values ({e})", at) from None
        if len(text) > MAX_METADATA_BYTES:
            raise InvalidRequest(422, f"{at}: its metadata is {len(text)} bytes as JSON, at most "
                                      f"{MAX_METADATA_BYTES} are taken", at)
        out[METADATA_HEADER] = text
    return out


def _request(call: Callable[..., Any], part: str, name: str, start: int, done: int,
             files_of: Sequence[str] = (), **kw: Any) -> dict[str, Any]:
    """One ``POST /v1/items`` of the items ``name[start:]``; a refusal naming ``part[j]`` of this
    request is raised naming ``name[start + j]`` of the call (and in its message the file it was
    read from, ``files_of[j]``: the server knows only its upload), and says how many items of the
    call (``done``) were stored before it."""
    try:
        return call("POST", "/v1/items", **kw)
    except ClientError as e:
        def in_call(text: str, named: bool = False) -> str:
            seen: set[int] = set()

            def one(m: re.Match) -> str:
                j = int(m.group(1))
                first = named and j not in seen and j < len(files_of)
                seen.add(j)
                return f"{name}[{start + j}]" + (f" ({files_of[j]})" if first else "")

            return re.sub(rf"\b{part}\[(\d+)\]", one, text)

        stored = f" (the {done} items of this call sent before it are stored)" if done else ""
        raise type(e)(e.status, in_call(e.detail, True) + stored, e.field and in_call(e.field)) from None


def _sum(out: AddResult, answer: dict[str, Any]) -> None:
    """``out`` plus one request's answer: each count of :class:`AddResult` it holds, its problems."""
    for f in fields(out):
        if isinstance(getattr(out, f.name), int) and isinstance(answer.get(f.name), int):
            setattr(out, f.name, getattr(out, f.name) + answer[f.name])
    out.problems += list(answer.get("problems", []))


def load_calibration(data: str | Path, split: str = "val", limit: int | None = None,
                     langs: Sequence[str] | str = ("en",)) -> tuple[list[Any], str]:
    """Calibration tasks and their label from labelled data: a data folder / world root (t2i, i2t)
    or a Multi30K root (t2t: caption 1 -> caption 2 of ``split``). ``split`` is never the one
    evaluated on."""
    from ..evaluate import load_eval_data
    from ..lifecycle.calibrate import pair_tasks, text_pair_task

    data = Path(data)
    langs = [x for x in (langs.split(",") if isinstance(langs, str) else langs) if x]
    if (data / "task2" / "raw").is_dir():
        from ..data.multi30k import read_task2

        cs = read_task2(data, split, "en", ks=(1, 2), limit=limit)
        return [text_pair_task(cs.column(1), cs.column(2))], f"Multi30K {split} ({cs.n_images} caption pairs)"
    ds = load_eval_data(data, split, langs=langs, limit=limit)
    return pair_tasks(ds), f"{data.name} {split} ({len(ds)} images, {len(ds.captions)} captions)"
