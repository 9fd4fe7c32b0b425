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
from typing import Any, Callable, Sequence

from ..catalog.items import ID_PATTERN, ID_RULE, added_id_problem, metadata_json, row_json
from .errors import ClientError, InvalidRequest
from .types import AddResult

__all__ = ["ID_HEADER", "ID_PATTERN", "ID_RULE", "MAX_METADATA_BYTES", "METADATA_HEADER", "RESERVED_METADATA",
           "added_id_problem", "check_ids", "check_metadata", "given_items", "load_calibration", "one_source", "read_files", "upload_items"]

#: the part headers of an uploaded image (multipart ``POST /v1/items``): its item id, and its
#: metadata as a JSON object (ASCII: part headers are no place for other bytes)
ID_HEADER, METADATA_HEADER = "X-Item-Id", "X-Item-Metadata"
#: the longest ``X-Item-Metadata`` header (its JSON, in bytes): what the server's multipart parser
#: takes in one header line (python-multipart: 4,224 bytes, the header's name included)
MAX_METADATA_BYTES = 4096
#: metadata keys an uploaded image cannot carry: the server sets them (``path``: where it keeps the file)
RESERVED_METADATA = ("path", "id", "sha256")


def one_source(texts: Any, images: Any, folder: Any = None, text_file: Any = None) -> None:
    """:class:`~.errors.InvalidRequest` unless exactly one of the four is given."""
    if sum(x is not None for x in (texts, images, folder, text_file)) != 1:
        raise InvalidRequest(422, "give exactly one of texts=, images=, folder= or text_file=", "texts")


def read_files(folder: str | Path | None, split: str, text_file: str | Path | None,
               langs: Sequence[str] | None, skip_bad: bool) -> tuple[list, Any]:
    """The items of ``folder`` (a data folder, or a world root's ``split``) or of ``text_file``, and
    what reading them found (skipped lines and images, with ``skip_bad``)."""
    from ..collection.ingest import folder_items, read_text_file

    if text_file is not None:
        ti = read_text_file(text_file, langs=langs, skip_bad=skip_bad)
        return ti.items, ti
    folder = Path(folder)  # type: ignore[arg-type]
    if not (folder / "captions.jsonl").is_file() and (folder / split).is_dir():
        folder = folder / split
    fi = folder_items(folder, langs=langs, skip_bad=skip_bad)
    return fi.items, fi


def given_items(texts: Any, images: Any, ids: Any, check_text: Callable[[Any, str], str] | None = None) -> list:
    """The items of ``texts`` (strings or ``{"text", "id", ...metadata}``) or ``images`` (paths or
    ``{"path", "id", "sha256" (if known), ...metadata}``), ``ids`` beside them."""
    from ..collection.ingest import image_item, text_item

    rows = list(texts if texts is not None else images)
    own = list(ids) if ids is not None else [None] * len(rows)
    if len(own) != len(rows):
        raise InvalidRequest(422, f"{len(own)} ids for {len(rows)} {'texts' if texts is not None else 'images'}",
                             "ids")
    if images is not None:
        out = []
        for row, i in zip(rows, own):
            row = {"path": row} if isinstance(row, (str, Path)) else dict(row)
            path, digest = Path(row.pop("path")), row.pop("sha256", None)
            out.append(image_item(path, id=row.pop("id", None) or i, metadata=row, sha256=digest))
        return out
    out = []
    for n, (row, i) in enumerate(zip(rows, own)):
        row = {"text": row} if isinstance(row, str) else dict(row)
        text = row.pop("text", None)
        if check_text is not None:
            text = check_text(text, f"texts[{n}]")
        out.append(text_item(text, id=row.pop("id", None) or i, metadata=row))
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
            _sum(out, _request(call, "images", "images", batch[0][0], batch[0][0], files=files))
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
            text = json.dumps(_plain_metadata(meta), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise InvalidRequest(422, f"{at}: its metadata is not a JSON object of JSON values ({e})", at) from None
        if len(text) > MAX_METADATA_BYTES:
            raise InvalidRequest(422, f"{at}: its metadata is {len(text)} bytes as JSON, at most "
                                      f"{MAX_METADATA_BYTES} are taken", at)
        out[METADATA_HEADER] = text
    return out


def _request(call: Callable[..., Any], part: str, name: str, start: int, done: int, **kw: Any) -> dict[str, Any]:
    """One ``POST /v1/items`` of the items ``name[start:]``; a refusal naming ``part[j]`` of this
    request is raised naming ``name[start + j]`` of the call, and says how many items of the call
    (``done``) were stored before it."""
    try:
        return call("POST", "/v1/items", **kw)
    except ClientError as e:
        def in_call(text: str) -> str:
            return re.sub(rf"\b{part}\[(\d+)\]", lambda m: f"{name}[{start + int(m.group(1))}]", text)

        stored = f" (the {done} items of this call sent before it are stored)" if done else ""
        raise type(e)(e.status, in_call(e.detail) + stored, e.field and in_call(e.field)) from None


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
