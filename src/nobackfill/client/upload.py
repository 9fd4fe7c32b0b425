"""What ``add`` reads from files, the same in process and over HTTP: a data folder (or a world
root's split) and a text file are read on the caller's machine into items with the ids an add
gives them; over HTTP those items are then uploaded (images as their bytes under their ids,
captions with their ids and metadata) in requests within the server's limits, and the answers
summed into one :class:`~nobackfill.client.types.AddResult`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from .errors import InvalidRequest
from .types import AddResult

__all__ = ["given_items", "load_calibration", "one_source", "read_files", "upload_items"]


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


def _text_row(it: Any) -> dict[str, Any]:
    """A caption item as a row of ``POST /v1/items``: its metadata, its text and its id."""
    return {**{k: v for k, v in it.metadata.items() if k not in ("text", "id")}, "text": it.source["text"], "id": it.id}


def upload_items(call: Callable[..., Any], items: Sequence[Any], limits: dict[str, Any], *, chunk_size: int = 256,
                 progress: bool = False, id_header: str = "X-Item-Id") -> AddResult:
    """Add ``items`` read here through ``call`` (a :class:`~.remote.RemoteClient`'s request):
    images first (the captions name them), each request at most ``chunk_size`` items, the server's
    ``max_batch`` and, for images, half its body limit. Returns the answers summed."""
    from ..progress import progress_bar

    per = max(1, min(int(chunk_size), int(limits.get("max_batch") or chunk_size)))
    body = int(limits.get("max_body_bytes") or 2**60) // 2
    out = AddResult()
    images = [it for it in items if it.modality == "image"]
    texts = [it for it in items if it.modality == "text"]
    with progress_bar(progress, "uploading", len(items)) as advance:
        batch: list[tuple[Any, bytes]] = []

        def flush() -> None:
            files = [("images", (Path(it.source["path"]).name, data, "application/octet-stream", {id_header: it.id}))
                     for it, data in batch]
            _sum(out, call("POST", "/v1/items", files=files))
            advance(len(batch))
            batch.clear()

        for it in images:
            data = Path(it.source["path"]).read_bytes()
            if batch and (len(batch) >= per or sum(len(b) for _, b in batch) + len(data) > body):
                flush()
            batch.append((it, data))
        if batch:
            flush()
        for start in range(0, len(texts), per):
            rows = [_text_row(it) for it in texts[start:start + per]]
            _sum(out, call("POST", "/v1/items", json={"items": rows}))
            advance(len(rows))
    out.ids = [it.id for it in items]
    return out


def _sum(out: AddResult, answer: dict[str, Any]) -> None:
    for k in ("added", "unchanged", "metadata_updated", "recovered", "skipped"):
        setattr(out, k, getattr(out, k) + int(answer.get(k, 0)))
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
