"""The catalog's JSON of a parquet chunk's sources and metadata written column by column in Arrow
(its compute kernels run in C++, without the GIL), for the common cases: the text equals what
:func:`~nobackfill.catalog.items.rows_json` writes for the dicts that the row rules of
:mod:`nobackfill.adopt.sources` make (keys sorted, compact, strings as written). Every function
returns None where a chunk holds anything else (a string that JSON escapes, a float, a nested
value, a path that needs normalising, ...): its caller then makes the dicts row by row."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import orjson

from ...catalog.items import JsonRows

#: a string holding one of these is escaped by JSON (a quote, a backslash, a control character)
_ESCAPED = r'["\\\x00-\x1f]'


def _arrow() -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa, pc


def _plain_strings(col: Any) -> bool:
    """Whether ``col`` is strings that JSON writes between quotes as they are (nulls allowed)."""
    pa, pc = _arrow()
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return False
    return not pc.any(pc.match_substring_regex(col, _ESCAPED)).as_py()


def _utf8(col: Any) -> Any:
    """``col`` as Arrow ``string`` (a ``large_string`` chunk of a batch fits it)."""
    pa, pc = _arrow()
    return pc.cast(col, pa.string()) if pa.types.is_large_string(col.type) else col


def _quoted(text: str) -> str:
    """``text`` inside a JSON string, escaped as orjson escapes it (without the quotes)."""
    return orjson.dumps(text).decode("utf-8")[1:-1]


def _scalar(text: str) -> Any:
    """An Arrow string scalar made from its bytes (``pa.scalar``, as any conversion of Python values,
    imports pandas: half a second)."""
    pa, _ = _arrow()
    data = text.encode("utf-8")
    return pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, len(data)], np.int32)), pa.py_buffer(data))[0]


def _join(*parts: Any) -> Any:
    """Arrow strings and Python constants joined element by element (null where one is)."""
    _, pc = _arrow()
    return pc.binary_join_element_wise(*[_scalar(p) if isinstance(p, str) else p for p in parts], _scalar(""))


def image_sources_json(paths: Any, root: str) -> tuple[JsonRows, Any] | None:
    """The sources of image rows from their path cells ``paths`` (an Arrow column; no url column):
    a url (``://``) gives ``{"path": "", "url": cell}``, an absolute path ``{"path": cell}``, a
    relative one ``{"path": root + cell}`` (``root`` ends with the separator) -- the column-wise
    rules of :meth:`~nobackfill.adopt.sources.import_source.ImportSource._image_sources` for cells
    that need no normalising: no ``//``, no ``/.``, and a first character that is an ASCII
    letter or digit (or the separator, for an absolute path). With them, what each says in the
    item's metadata (:func:`sourced_metadata_json`'s ``said``: its path, or its url)."""
    pa, pc = _arrow()
    if os.sep != "/" or paths.null_count or not _plain_strings(paths):
        return None
    if not len(paths):
        return JsonRows([]), None
    paths = _utf8(paths)
    url = pc.match_substring(paths, "://")
    normal = pc.invert(pc.or_(pc.match_substring(paths, "//"), pc.match_substring(paths, "/.")))
    absolute = pc.and_(pc.starts_with(paths, "/"), normal)
    relative = pc.and_(pc.ascii_is_alnum(pc.utf8_slice_codeunits(paths, 0, 1)), normal)
    ok = pc.or_(url, absolute)
    if "/." not in root and "//" not in root:  # root + a relative path needs no normalising
        ok = pc.or_(ok, relative)
    if not pc.all(ok).as_py():
        return None
    head = pc.if_else(url, _scalar('{"path":"","url":"'),
                      pc.if_else(absolute, _scalar('{"path":"'), _scalar('{"path":"' + _quoted(root))))
    made = JsonRows(_join(head, paths, '"}').to_pylist())
    said = [(None, {"path": _join(pc.if_else(absolute, _scalar('"'), _scalar('"' + _quoted(root))), paths, '"')})]
    if pc.any(url).as_py():
        said.append((url, {"url": _join('"', paths, '"')}))
    return made, said


def text_sources_json(texts: Any) -> tuple[JsonRows, Any] | None:
    """The sources ``{"text": cell}`` of caption rows from their text cells (an Arrow column), for
    cells that hold an ASCII letter or digit (never blank: kept as written, spaces included); with
    them, each text as a JSON value (as :func:`image_sources_json`)."""
    pa, pc = _arrow()
    if texts.null_count or not _plain_strings(texts):
        return None
    if not len(texts):
        return JsonRows([]), None
    texts = _utf8(texts)
    if not pc.all(pc.match_substring_regex(texts, "[A-Za-z0-9]")).as_py():
        return None
    return JsonRows(_join('{"text":"', texts, '"}').to_pylist()), [(None, {"text": _join('"', texts, '"')})]


def _value_json(col: Any) -> Any | None:
    """A column's cells as JSON values (Arrow strings; None when a cell is not an integer, a
    boolean, a null or a plain string)."""
    pa, pc = _arrow()
    t = col.type
    null = _scalar("null")
    if pa.types.is_null(t) or pa.types.is_integer(t) or pa.types.is_boolean(t):
        return pc.coalesce(pc.cast(col, pa.string()), null)
    if _plain_strings(col):
        return pc.coalesce(_join('"', _utf8(col), '"'), null)
    return None


def metadata_json(table: Any, keys: Sequence[str]) -> JsonRows | None:
    """Each row's metadata ``{key: cell}`` over the columns ``keys`` of the Arrow ``table``
    (:func:`~nobackfill.adopt.sources.items._chunk_metas`' dicts), for keys of plain ASCII and
    cells :func:`_value_json` takes."""
    made = _metadata(table, keys, {})
    return None if made is None else JsonRows(made if isinstance(made, list) else made.to_pylist())


def sourced_metadata_json(table: Any, keys: Sequence[str], said: Sequence[tuple[Any, dict[str, Any]]]
                          ) -> JsonRows | None:
    """:func:`metadata_json` with what each row's source says (``said``, from
    :func:`image_sources_json` / :func:`text_sources_json`: per kind of row, where it holds (None:
    every row, before the next kinds) and its keys' JSON values) under the columns of the same
    name: :func:`~nobackfill.adopt.sources.items.with_sources`' dicts."""
    _, pc = _arrow()
    if not said:  # sources that say nothing
        return metadata_json(table, keys)
    out = None
    for where, extra in said:
        made = _metadata(table, keys, extra)
        if made is None:
            return None
        if isinstance(made, list):  # no key at all: "{}" each
            return JsonRows(made)
        out = made if out is None else pc.if_else(where, made, out)
    return None if out is None else JsonRows(out.to_pylist())


def _metadata(table: Any, keys: Sequence[str], extra: dict[str, Any]) -> Any:
    """The rows' JSON (Arrow strings, or a list of "{}" without a key), or None (see
    :func:`metadata_json`); ``extra``: more keys with their JSON values, beneath the columns."""
    extra = {k: v for k, v in extra.items() if k not in keys}
    every = [*keys, *extra]
    if len(set(keys)) != len(keys) or not all(k.isascii() and k.isprintable() and '"' not in k and "\\" not in k
                                              for k in every):
        return None
    if not every:
        return ["{}"] * table.num_rows
    parts: list[Any] = []
    for i, key in enumerate(sorted(every)):  # orjson's sorted keys: ASCII keys sort as Python sorts them
        value = extra[key] if key in extra else _value_json(table.column(key))
        if value is None:
            return None
        parts += [("{" if i == 0 else ",") + f'"{key}":', value]
    return _join(*parts, "}")


__all__ = ["image_sources_json", "metadata_json", "sourced_metadata_json", "text_sources_json"]
