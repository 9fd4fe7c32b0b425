"""Metadata filters of a search: :func:`check_filter` reads one as a search runs it (nested objects
as dotted keys, values checked, limits), :func:`matches_filter` tests an item's metadata against it
in Python (the catalog runs the same filter in SQL:
:func:`~nobackfill.catalog.schema.filter_sql`)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["MAX_FILTER_KEYS", "MAX_FILTER_VALUES", "check_filter", "matches_filter"]

#: the most keys a filter may have, and values a key may accept (the filter runs as one SQL condition)
MAX_FILTER_KEYS, MAX_FILTER_VALUES = 64, 256
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def check_filter(flt: Mapping[str, Any] | None, *, nested: bool = True) -> dict[str, Any] | None:
    """A metadata filter as a search runs it, or ``ValueError`` naming the key at fault. ``flt`` maps
    metadata keys (dotted for nested objects: ``labels.colour``) to a value or a list of accepted
    values; a nested mapping is the same as dotted keys (``{"labels": {"colour": "red"}}`` is
    ``{"labels.colour": "red"}``, as an image search's form takes it). Values are strings, numbers
    (an integer beyond 64 bits compares as a float, as a database holds it; an infinite one matches
    nothing), booleans or null; at most :data:`MAX_FILTER_KEYS` keys and :data:`MAX_FILTER_VALUES`
    values a key. None or empty: no filter. ``nested=False``: a nested mapping is refused, naming the
    dotted key to use instead (the HTTP API's filter is flat, as its schema says)."""
    if flt is None:
        return None
    if not isinstance(flt, Mapping):
        raise ValueError(f"filter: a JSON object {{key: value | [values]}}, got {type(flt).__name__}")
    out: dict[str, Any] = {}

    def walk(m: Mapping[str, Any], prefix: str) -> None:
        for key, want in m.items():
            if not isinstance(key, str):
                raise ValueError(f"filter: keys are strings, got {key!r}")
            if not key:
                raise ValueError(f"filter: an empty key{' in ' + prefix[:-1] if prefix else ''}: a key names a "
                                 "metadata field")
            name = prefix + key
            if isinstance(want, Mapping):
                if not nested:
                    raise ValueError(f"filter: {name}: values are strings, numbers, booleans or null (or a list of "
                                     f"them); for nested metadata use dotted keys ({name}.{next(iter(want), 'name')})")
                walk(want, name + ".")
                continue
            if len(out) >= MAX_FILTER_KEYS:
                raise ValueError(f"filter: at most {MAX_FILTER_KEYS} keys")
            wants = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
            if len(wants) > MAX_FILTER_VALUES:
                raise ValueError(f"filter: {name}: at most {MAX_FILTER_VALUES} values, got {len(wants)}")
            for i, w in enumerate(wants):
                if isinstance(w, int) and not isinstance(w, bool) and not _INT64[0] <= w <= _INT64[1]:
                    wants[i] = w = float(w)  # as a database holds such a number (and JSON readers do)
                if not (w is None or isinstance(w, (str, bool, int, float))):
                    raise ValueError(f"filter: {name}: values are strings, numbers, booleans or null (or a list of "
                                     f"them); {str(w)[:40]!r} is a {type(w).__name__}")
            # a number past a double's range (JSON's 1e999 reads as infinity) equals no stored value
            kept = [w for w in wants if not (isinstance(w, float) and not np.isfinite(w))]
            out[name] = kept if isinstance(want, (list, tuple, set, frozenset)) or len(kept) != 1 else kept[0]

    walk(flt, "")
    return out


def matches_filter(metadata: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether ``metadata`` passes ``flt`` (:func:`check_filter`): every key's value is the one
    given, or one of the list given."""
    for key, want in (check_filter(flt) or {}).items():
        value: Any = metadata
        for part in str(key).split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(want, list):
            if value not in want:
                return False
        elif value != want:
            return False
    return True
