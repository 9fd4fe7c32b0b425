"""The items of a collection (:class:`Item`: an image or a caption with what is needed to embed it
again, and the vector key of its version), their catalog rows in JSON, and the errors a collection
raises."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import orjson

from .schema import Row
from ..gallery.manifest import MODALITIES

__all__ = [
    "CollectionBusyError",
    "CollectionError",
    "CorruptCollectionError",
    "Item",
    "ItemNotFoundError",
    "JsonRows",
    "ID_PATTERN",
    "ID_RULE",
    "MAX_ID_LENGTH",
    "MAX_IMAGE_METADATA_BYTES",
    "image_metadata_json",
    "added_id_problem",
    "id_problem",
    "metadata_json",
    "metadata_problem",
    "plain_ids",
    "NotACollectionError",
    "row_json",
    "vector_key",
]

MAX_ID_LENGTH = 512


class CollectionError(Exception):
    """Base class for collection problems."""


class ServerUnreachable(CollectionError, ConnectionError):
    """A server holding a collection's vectors (Milvus) did not answer; the message names it."""

    names_its_server = True  # a catalog call that meets it passes it on as it is (not as the catalog's)


class NotACollectionError(CollectionError, FileNotFoundError):
    """The directory holds neither a collection nor a gallery."""


class CorruptCollectionError(CollectionError):
    """The catalog (or, when converting, ``collection.json`` or a log chunk) is unreadable or
    inconsistent."""


class ItemNotFoundError(CollectionError, KeyError):
    """No live item has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CollectionBusyError(CollectionError):
    """Another process holds the collection's ingest lock."""


def vector_key(item_id: str, rev: str) -> str:
    """The gallery row key of an item version: ``<id>#<rev>`` (``rev`` is hex, so unambiguous)."""
    return f"{item_id}#{rev}" if rev else item_id


def id_problem(item_id: object) -> str | None:
    """Why ``item_id`` cannot be an item's id (a non-empty string of at most
    :data:`MAX_ID_LENGTH` characters, none of them a control character), or None."""
    if not isinstance(item_id, str) or not item_id.strip():
        return f"id must be a non-empty string, got {item_id!r}"
    if len(item_id) > MAX_ID_LENGTH or (not item_id.isprintable() and any(ord(c) < 32 for c in item_id)):
        return f"id {item_id[:40]!r} is longer than {MAX_ID_LENGTH} characters or has control characters"
    return None


#: an id an item added through a client may have: one a URL path can name (no '/', '\\' or control
#: characters, not starting with '.' (no '.' / '..'), '[' or white space, so never blank to Python
#: or to a JSON schema). Imported and adopted items keep their ids as :func:`id_problem` allows.
ID_PATTERN = (r"^[^./\\\[\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
              r"[^/\\\x00-\x1f\x7f]*$")
#: the longest metadata of an image added through a client, as compact ASCII JSON: over HTTP it travels
#: in a part header (``X-Item-Metadata``), which the server's multipart parser takes up to ~4 KB; a
#: data folder's images are held to it in process too, so a folder adds alike on a path and a URL
MAX_IMAGE_METADATA_BYTES = 4096
ID_RULE = (f"1 to {MAX_ID_LENGTH} characters, no '/', '\\' or control characters, not starting with '.', '[' or "
           "a space")


def added_id_problem(item_id: object) -> str | None:
    """Why ``item_id`` cannot be the id of an item added through a client, in process or over HTTP
    (:data:`ID_PATTERN`), or None."""
    if isinstance(item_id, str) and len(item_id) <= MAX_ID_LENGTH and re.search(ID_PATTERN, item_id):
        return None
    return f"{item_id!r} is not a valid id ({ID_RULE})"


def plain_ids(ids: list) -> bool:
    """Whether every id is a printable string of 1 to :data:`MAX_ID_LENGTH` characters, not all
    spaces (so :func:`id_problem` has nothing to say), tested on the ids joined by spaces, in C
    (an import's batch, of thousands of ids): a non-string fails the join; after the printable
    test, the only whitespace left is the space, so an empty or all-space id shows as two spaces in
    a row or a space at either end (a single empty id: nothing joined). False may also mean good
    ids with spaces at their ends or characters that are not printable but allowed (the caller
    then asks each id)."""
    try:
        joined = " ".join(ids)
    except TypeError:
        return False
    return bool(joined) and joined.isprintable() and "  " not in joined and joined[0] != " " and \
        joined[-1] != " " and max(map(len, ids)) <= MAX_ID_LENGTH


@dataclass(frozen=True)
class Item:
    """One gallery item: an image or a caption, with what is needed to embed it again.

    ``source`` is ``{"path": absolute image path, "sha256": hash of its bytes}`` for an image and
    ``{"text": caption}`` for a text; ``key`` is the gallery row key of this version of the item
    (:func:`vector_key`)."""

    id: str
    modality: str
    key: str
    source: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "modality": self.modality, "key": self.key, "source": dict(self.source),
                "metadata": dict(self.metadata)}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "Item":
        if not isinstance(obj, dict):
            raise CorruptCollectionError(f"{where}: item must be an object, got {type(obj).__name__}")
        try:
            item = cls(id=obj["id"], modality=obj["modality"], key=obj["key"], source=obj["source"],
                       metadata=obj.get("metadata") or {})
        except KeyError as e:
            raise CorruptCollectionError(f"{where}: item is missing field {e}") from None
        problem = item.problem()
        if problem:
            raise CorruptCollectionError(f"{where}: {problem}")
        return item

    def problem(self) -> str | None:
        """Why this item is not valid, or None."""
        problem = id_problem(self.id)
        if problem:
            return f"item {problem}"
        if self.modality not in MODALITIES:
            return f"item {self.id!r}: modality must be one of {MODALITIES}, got {self.modality!r}"
        if not isinstance(self.key, str) or not self.key:
            return f"item {self.id!r}: empty vector key"
        if not isinstance(self.source, (dict, Mapping)):  # dict first: the ABC check is slow
            return f"item {self.id!r}: source must be an object"
        want = "path" if self.modality == "image" else "text"
        if not isinstance(self.source.get(want), str):  # may be empty for rows of an old gallery
            return f"item {self.id!r}: a {self.modality} source needs a string {want!r}"
        if not isinstance(self.metadata, (dict, Mapping)):
            return f"item {self.id!r}: metadata must be an object"
        return None

    @property
    def sourced(self) -> bool:
        """Whether there is something to embed this item again from (an image's path, a caption's
        text; :func:`~nobackfill.catalog.schema.unsourced_sql` is the catalog's form of the converse)."""
        return bool(self.source.get("path" if self.modality == "image" else "text"))

    @property
    def payload(self) -> str:
        """What an encoder embeds: the image path or the caption text."""
        return self.source["path"] if self.modality == "image" else self.source["text"]


def _item(r: Row) -> Item:
    return Item(id=r.id, modality=r.modality, key=r.key, source=r.source, metadata=r.metadata)


def row_json(obj: Mapping[str, Any]) -> str:
    """The JSON of an item's source or metadata in rows given to :meth:`Collection.commit_rows`
    (orjson, keys sorted: canonical, so equal objects give equal text; a NaN becomes null). What
    orjson cannot write but JSON can (an integer beyond 64 bits) is written by the standard
    library, as compact and sorted."""
    if not obj:
        return "{}"
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
    except TypeError as e:  # orjson.JSONEncodeError
        try:
            return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            raise ValueError(f"not a JSON object of JSON values: {e}") from None


def metadata_problem(meta: Any, at: str = "") -> str | None:
    """What makes ``meta`` (an item's metadata) no JSON value: the first NaN or infinity in it,
    named by its place (``'score'``, ``'boxes'[2]``); None where there is none. JSON has no such
    numbers: over HTTP they are refused, so an added item's metadata is refused for them in process
    too (and not written as null, which would change it silently)."""
    if isinstance(meta, float) or (hasattr(meta, "dtype") and getattr(meta, "ndim", None) == 0):
        try:
            finite = math.isfinite(float(meta))
        except (TypeError, ValueError):
            return None
        return None if finite else f"{at or 'the value'} is {float(meta)}, not a JSON number"
    if isinstance(meta, Mapping):
        for k, v in meta.items():
            if (p := metadata_problem(v, f"{at}[{k!r}]" if at else repr(k))) is not None:
                return p
    elif isinstance(meta, (list, tuple)) or (hasattr(meta, "tolist") and hasattr(meta, "dtype")):
        for i, v in enumerate(meta.tolist() if hasattr(meta, "tolist") else meta):
            if (p := metadata_problem(v, f"{at}[{i}]")) is not None:
                return p
    return None


def image_metadata_json(meta: Mapping[str, Any]) -> str:
    """An image's metadata as the compact ASCII JSON it travels in over HTTP (``X-Item-Metadata``),
    measured against :data:`MAX_IMAGE_METADATA_BYTES` in process and over HTTP alike; ``ValueError``
    for what is no JSON value."""
    plain = json.loads(row_json(meta)) if meta else {}
    return json.dumps(plain, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def metadata_json(meta: Mapping[str, Any]) -> str:
    """:func:`row_json` of an added item's metadata; ``ValueError`` naming what is no JSON value (a
    NaN or infinity: :func:`metadata_problem`; a set, bytes: the writer's message)."""
    text = row_json(meta if type(meta) is dict else dict(meta))
    if "null" in text and (problem := metadata_problem(meta)) is not None:  # orjson writes NaN as null
        raise ValueError(problem)
    return text


_DUMPS = functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


class JsonRows(Sequence[dict]):
    """Rows of JSON objects held as the text :func:`rows_json` writes for them (a reader that
    makes that text column by column, without a dict per row, hands it over as it is); read as a
    sequence of dicts, each decoded when it is read."""

    __slots__ = ("texts",)

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return JsonRows(self.texts[i])
        return orjson.loads(self.texts[i])

    def __iter__(self) -> Any:
        return map(orjson.loads, self.texts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JsonRows):
            return self.texts == other.texts
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"JsonRows({self.texts!r})"

    def where(self, keep: Sequence[bool]) -> "JsonRows":
        """The rows where ``keep`` is true."""
        return JsonRows([t for t, k in zip(self.texts, keep) if k])


def rows_json(objs: Sequence[Mapping[str, Any]]) -> list[str]:
    """:func:`row_json` of many objects (the JSON written in C, one call for the lot; a Mapping
    that is not a dict, or a value orjson refuses, goes through :func:`row_json`, which names it).
    The lot is written as one array and cut between its objects: orjson writes ``},{`` between
    two, so as many pieces as objects means no string held that text and the cuts are exact. The
    cut marks each place with a NUL first (which orjson never writes raw: it escapes control
    characters), so each piece keeps its braces without a string built per object. Rows given as
    :class:`JsonRows` are that text already."""
    if isinstance(objs, JsonRows):
        return list(objs.texts)
    objs = objs if isinstance(objs, list) else list(objs)
    try:
        if objs and set(map(type, objs)) == {dict}:
            parts = _DUMPS(objs).decode("utf-8")[1:-1].replace("},{", "}\x00{").split("\x00")
            if len(parts) == len(objs):
                return parts
        return list(map(bytes.decode, map(_DUMPS, objs)))
    except TypeError:
        return [row_json(o if type(o) is dict else dict(o)) for o in objs]


def _row_json(r: Row) -> tuple[str, str, str, str, str]:
    """A stored row in the form :meth:`Collection.commit_rows` takes."""
    return r.id, r.modality, r.key, row_json(r.source), row_json(r.metadata)


def _item_json(it: Item) -> tuple[str, str, str, str, str]:
    """The catalog row of an item: ``(id, modality, key, source JSON, metadata JSON)``."""
    src = it.source if type(it.source) is dict else dict(it.source)
    try:
        meta_json = metadata_json(it.metadata)
    except ValueError as e:
        raise ValueError(f"item {it.id!r}: {e}") from None
    return it.id, it.modality, it.key, row_json(src), meta_json
