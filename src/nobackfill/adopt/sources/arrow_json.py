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


def image_sources_json(paths: Any, root: str) -> JsonRows | None:
    """The sources of image rows from their path cells ``paths`` (an Arrow column; no url column):
    a url (``://``) gives ``{"path": "", "url": cell}``, an absolute path ``{"path": cell}``, a
    relative one ``{"path": root + cell}`` (``root`` ends with the separator) -- the column-wise
    rules of :meth:`~nobackfill.adopt.sources.import_source.ImportSource._image_sources` for cells
    that need no normalising: no ``//``, no ``/.``, and a first character that is an ASCII
    letter or digit (or the separator, for an absolute path)."""
    pa, pc = _arrow()
    if os.sep != "/" or paths.null_count or not _plain_strings(paths):
        return None
    if not len(paths):
        return JsonRows([])
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
    return JsonRows(_join(head, paths, '"}').to_pylist())


def text_sources_json(texts: Any) -> JsonRows | None:
    """The sources ``{"text": cell}`` of caption rows from their text cells (an Arrow column), for
    cells that hold an ASCII letter or digit (never blank: kept as written, spaces included)."""
    pa, pc = _arrow()
    if texts.null_count or not _plain_strings(texts):
        return None
    if not len(texts):
        return JsonRows([])
    texts = _utf8(texts)
    if not pc.all(pc.match_substring_regex(texts, "[A-Za-z0-9]")).as_py():
        return None
    return JsonRows(_join('{"text":"', texts, '"}').to_pylist())


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
    if len(set(keys)) != len(keys) or not all(k.isascii() and k.isprintable() and '"' not in k and "\\" not in k
                                              for k in keys):
        return None
    n = table.num_rows
    if not keys:
        return JsonRows(["{}"] * n)
    parts: list[Any] = []
    for i, key in enumerate(sorted(keys)):  # orjson's sorted keys: ASCII keys sort as Python sorts them
        value = _value_json(table.column(key))
        if value is None:
            return None
        parts += [("{" if i == 0 else ",") + f'"{key}":', value]
    return JsonRows(_join(*parts, "}").to_pylist())


__all__ = ["image_sources_json", "metadata_json", "text_sources_json"]
