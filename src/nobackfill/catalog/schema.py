"""The catalog's tables and rows (see :mod:`nobackfill.catalog.catalog`): the schema and its
creation, the header row, :class:`Row` and the SQL that reads rows, the metadata filter
(:func:`filter_sql`) and the condition of items without a source (:func:`unsourced_sql`), on
SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Protocol, Sequence

from .plan import Plan

__all__ = ["CATALOG_FILE", "NAME_MAX", "PAGE", "CatalogError", "CatalogUnreachable", "Row", "check_collection_name",
           "filter_sql", "one_line", "redact", "rows_by_key", "unsourced_sql"]

CATALOG_FILE = "catalog.sqlite"
FORMAT = "nobackfill-catalog"
#: 3: items of stores without lasting rows have serving-page slots (older versions, which do not
#: write them, refuse a catalog of this version rather than leave readers a wrong page)
VERSION = 3
#: store rows per serving page (a page is PAGE int64 rids)
PAGE = 4096

_SCHEMA = """
CREATE TABLE IF NOT EXISTS header (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    format TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL, backend TEXT NOT NULL,
    created TEXT NOT NULL, updated TEXT NOT NULL, generation BIGINT NOT NULL, plan TEXT NOT NULL,
    plan_generation BIGINT NOT NULL, n_image BIGINT NOT NULL, n_text BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    rid {rid} PRIMARY KEY, id TEXT NOT NULL UNIQUE, modality TEXT NOT NULL, key TEXT NOT NULL,
    source TEXT NOT NULL, metadata TEXT NOT NULL, space TEXT, pos BIGINT, generation BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS items_served ON items (space, modality);
CREATE TABLE IF NOT EXISTS serving (
    space TEXT NOT NULL, modality TEXT NOT NULL, page BIGINT NOT NULL, generation BIGINT NOT NULL,
    data {blob} NOT NULL, PRIMARY KEY (space, modality, page));
CREATE INDEX IF NOT EXISTS serving_generation ON serving (generation);
CREATE TABLE IF NOT EXISTS docs (name TEXT PRIMARY KEY, data {blob} NOT NULL, version BIGINT NOT NULL);
"""


class CatalogDatabase(Protocol):
    """What a :class:`~nobackfill.catalog.writer.Writer` needs of its catalog (a
    :class:`~nobackfill.catalog.catalog.Catalog` is one): where it is, its SQL dialect, and the
    dialect's statement and error translation."""

    location: str
    dialect: str

    def _sql(self, sql: str) -> str: ...

    def _error(self, e: Exception) -> Exception: ...


class CatalogError(Exception):
    """The catalog database is missing, unreadable or inconsistent (the message names it)."""


class CatalogUnreachable(CatalogError, ConnectionError):
    """The catalog's database (or the vector server behind a collection) did not answer: down, a
    wrong address, a wrong password, no such database. The message names it and why."""


def catalog_error(e: Exception, location: str) -> Exception:
    """The error a catalog call's exception ``e`` means, named: a database gone mid-call (PostgreSQL
    shut down, restarted, cut off) or a vector server that did not answer is
    :class:`CatalogUnreachable` (run again); a Milvus error met inside a catalog read is Milvus'
    (trial Q saw it prefixed with the catalog); anything else the catalog's :class:`CatalogError`."""
    if isinstance(e, CatalogError) or type(e).__module__.startswith("nobackfill."):
        return e  # our own errors name their file (a space's store met inside a catalog read): not the catalog's
    if isinstance(e, ConnectionError):  # a vector server that did not answer stays a ConnectionError
        return e if getattr(e, "names_its_server", False) else CatalogUnreachable(f"catalog {location}: {one_line(e)}")
    if type(e).__module__.startswith("psycopg") and any(c.__name__ == "OperationalError" for c in type(e).__mro__):
        return CatalogUnreachable(f"the catalog {location} stopped answering ({type(e).__name__}: {one_line(e)}); "
                                  "what was committed stays: run the same command again once it answers")
    if type(e).__module__.startswith("pymilvus"):
        if milvus_lost(e):
            return CatalogUnreachable(milvus_lost_message(e))
        return CatalogError(f"Milvus: {type(e).__name__}: {one_line(e)}")
    return CatalogError(f"catalog {location}: {type(e).__name__}: {one_line(e)}")


RUN_AGAIN = "what was committed stays: run the same command again once it answers"


def one_line(text: object) -> str:
    """``text`` (a driver's message: libpq's hold a newline and a tab, trial Z) on one line, its runs
    of whitespace one space each: what an error line we build quotes."""
    return " ".join(str(text).split())


def milvus_lost_message(e: BaseException, then: str = RUN_AGAIN) -> str:
    """The one line for a Milvus server that did not answer (``e``, a pymilvus error), and ``then``:
    what the user does about it."""
    return f"the Milvus server did not answer ({one_line(getattr(e, 'message', None) or e)}); {then}"


def milvus_lost(e: BaseException) -> bool:
    """Whether ``e`` is a pymilvus error saying the server could not be reached (not a refused request)."""
    text = f"{getattr(e, 'message', '')} {e}".lower()
    return type(e).__module__.startswith("pymilvus") and \
        any(w in text for w in ("connect", "unavailable", "deadline exceeded", "server is not ready"))


#: a collection name: what names its PostgreSQL schema (``nb_<name>``) and its Milvus collections
#: (``nb_<name>_...``) as it is, so two names never share them
NAME_MAX = 50


def check_collection_name(name: str, *, lowercase: bool = False) -> str:
    """``name`` when it can name a collection's schema and Milvus collections unchanged: letters
    (lowercase for a PostgreSQL catalog, whose schema names fold case), digits and ``_``, at most
    :data:`NAME_MAX` characters; else a ``ValueError`` saying so (a name changed to fit would let two
    names open one collection)."""
    pattern = r"[a-z0-9_]+" if lowercase else r"[A-Za-z0-9_]+"
    if not re.fullmatch(pattern, name or "") or len(name) > NAME_MAX:
        what = "lowercase letters" if lowercase else "letters"
        raise ValueError(f"collection name {name!r}: use {what}, digits and _ only, at most {NAME_MAX} characters "
                         f"(the name is the #NAME of the URI{'; a PostgreSQL catalog folds case' if lowercase else ''})")
    return name


def redact(uri: str) -> str:
    """``uri`` with any password in a ``postgresql://USER:PASSWORD@HOST`` part replaced by ``***``
    (what messages, logs and status show)."""
    return re.sub(r"(postgres(?:ql)?://[^:@/?#]+):[^@/?#]*@", r"\1:***@", uri)


@dataclass(frozen=True)
class Row:
    """One live item as stored: ``rid`` (its row, never reused), the item's fields, and the space
    serving it with its row there (None: no space holds its vector)."""

    rid: int
    id: str
    modality: str
    key: str
    source: dict[str, Any]
    metadata: dict[str, Any]
    space: str | None
    pos: int | None


_ROW_COLS = "rid, id, modality, key, source, metadata, space, pos"


def _row(r: Sequence[Any]) -> Row:
    return Row(int(r[0]), r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6],
               None if r[7] is None else int(r[7]))


def _chunks(seq: Sequence[Any], n: int = 4000) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def filter_sql(flt: Mapping[str, Any], dialect: str) -> tuple[str, list[Any]]:
    """A metadata filter (``{"key": value | [values]}``, dotted keys for nested objects) as a SQL
    condition on ``items.metadata`` (``?`` placeholders, as :meth:`Catalog.query` takes) and its
    parameters; every key must match (see
    :func:`nobackfill.search.filters.matches_filter`; its values as
    :func:`~nobackfill.search.filters.check_filter` leaves them: scalars or lists of scalars)."""
    conds, params = [], []
    for key, want in flt.items():
        parts = [str(p) for p in str(key).split(".")]
        wants = list(want) if isinstance(want, (list, tuple, set)) else [want]
        if any(isinstance(w, (dict, list, tuple, set)) for w in wants):
            raise ValueError(f"filter: {key}: values are scalars or a list of them")
        if dialect == "sqlite":
            path = "$" + "".join('."' + p.replace('"', '""') + '"' for p in parts)
            expr, ors = "json_extract(metadata, ?)", []
            for w in wants:
                if w is None:
                    ors.append(f"({expr} IS NULL)")
                    params.append(path)
                else:
                    ors.append(f"({expr} = ? AND json_type(metadata, ?) {_json_type_sql(w)})")
                    params += [path, int(w) if isinstance(w, bool) else w, path]
        else:
            ors = []
            for w in wants:
                if w is None:
                    ors.append("((metadata::jsonb #> ?) IS NULL OR (metadata::jsonb #> ?) = 'null'::jsonb)")
                    params += [parts, parts]
                else:
                    ors.append("((metadata::jsonb #> ?) = ?::jsonb)")
                    params += [parts, json.dumps(w)]
        conds.append("(" + " OR ".join(ors or ["0 = 1"]) + ")")
    return " AND ".join(conds) or "1 = 1", params


def unsourced_sql(dialect: str) -> str:
    """A condition on ``items`` true for an item with nothing to embed it again from (an image
    without a path, a text without a text: imported from a url or without a source column)."""
    if dialect == "sqlite":
        # text tests first, so that an insert parses the JSON of no item that the sorted JSON of
        # ours wrote: a source that opens with this key and an empty string has none, one that
        # opens with it and a non-empty string has one; any other is parsed
        def empty(key: str) -> str:
            head = f'{{"{key}":"'
            return (f"(substr(source, 1, {len(head) + 2}) = '{head}\",' OR "
                    f"(substr(source, 1, {len(head)}) <> '{head}' OR substr(source, {len(head) + 1}, 1) = '\"') "
                    f"AND coalesce(json_extract(source, '$.{key}'), '') = '')")
    else:
        def empty(key: str) -> str:
            return f"coalesce(source::jsonb ->> '{key}', '') = ''"
    return f"((modality = 'image' AND {empty('path')}) OR (modality = 'text' AND {empty('text')}))"


#: the partial index of items without a source (SQLite: the name of the one with the text tests;
#: the first write to a catalog made before it replaces the older ones)
UNSOURCED_INDEX = {"sqlite": "items_unsourced_v3", "postgresql": "items_unsourced"}
_OLDER_UNSOURCED_INDEXES = ("items_unsourced", "items_unsourced_v2")


def _index_upgrades(dialect: str) -> list[str]:
    """The statements that bring a catalog's indexes to this version (run at its first write): the
    partial index of the items without a source (counting them reads only those) replaces an older
    one, and the index of keys that older catalogs kept goes (keys are found through ids)."""
    name = UNSOURCED_INDEX.get(dialect, "items_unsourced")
    older = [f"DROP INDEX IF EXISTS {old}" for old in _OLDER_UNSOURCED_INDEXES if old != name]
    return older + ["DROP INDEX IF EXISTS items_key",
                    f"CREATE INDEX IF NOT EXISTS {name} ON items (modality) WHERE {unsourced_sql(dialect)}"]


def _json_type_sql(w: Any) -> str:
    """The JSON types that equal Python value ``w`` (1 == 1.0 == True, as in Python)."""
    if isinstance(w, str):
        return "= 'text'"
    return "IN ('integer', 'real', 'true', 'false')"


def rows_by_key(query: Any, keys: Sequence[str]) -> list[Row]:
    """The live rows of item versions ``keys``, found by id: a key is its item's id, or the id,
    ``#`` and a hex version (:func:`~nobackfill.catalog.items.vector_key`), so the id index
    serves (the catalog keeps no index of keys)."""
    want = set(keys)
    ids = {k.rpartition("#")[0] for k in want if "#" in k} | want
    return [r for r in _rows_by(query, "id", sorted(ids)).values() if r.key in want]


def _rows_by(query: Any, column: str, values: Sequence[str]) -> dict[str, Row]:
    out: dict[str, Row] = {}
    for part in _chunks(list(values)):
        sql = f"SELECT {_ROW_COLS} FROM items WHERE {column} IN ({','.join('?' * len(part))})"
        for r in map(_row, query(sql, list(part))):
            out[getattr(r, column)] = r
    return out


def _header(r: Sequence[Any], where: str) -> dict[str, Any]:
    keys = ("format", "version", "name", "backend", "created", "updated", "generation", "plan", "plan_generation",
            "n_image", "n_text")
    h = dict(zip(keys, r))
    if h["format"] != FORMAT:
        raise CatalogError(f"catalog {where}: not a {FORMAT} database")
    if not isinstance(h["version"], int) or not 1 <= h["version"] <= VERSION:
        raise CatalogError(f"catalog {where}: unsupported version {h['version']!r} (this nobackfill reads <= {VERSION})")
    try:
        h["plan"] = Plan.from_json(json.loads(h["plan"]))
    except ValueError as e:
        raise CatalogError(f"catalog {where}: unreadable plan ({e})") from e
    for k in ("generation", "plan_generation", "n_image", "n_text"):
        h[k] = int(h[k])
    return h


def _create_tables(conn: Any, dialect: str, header: Mapping[str, Any]) -> None:
    ddl = _SCHEMA.format(rid="INTEGER" if dialect == "sqlite" else "BIGSERIAL",
                         blob="BLOB" if dialect == "sqlite" else "BYTEA")
    if dialect == "sqlite":
        ddl = ddl.replace("rid INTEGER PRIMARY KEY", "rid INTEGER PRIMARY KEY AUTOINCREMENT")
    for stmt in [s for s in ddl.split(";") if s.strip()]:
        conn.execute(stmt)
    for stmt in _index_upgrades(dialect):
        conn.execute(stmt)
    ph = "?" if dialect == "sqlite" else "%s"
    conn.execute(f"INSERT INTO docs (name, data, version) VALUES ({ph}, {ph}, 1)", ("serving/keyed-slots", b"1"))
    conn.execute(f"INSERT INTO header (id, format, version, name, backend, created, updated, generation, plan, "
                 f"plan_generation, n_image, n_text) VALUES (1, {', '.join([ph] * 11)})",
                 (FORMAT, VERSION, header["name"], header["backend"], header["created"], header["updated"],
                  int(header.get("generation", 0)), json.dumps(header["plan"].to_json(), sort_keys=True), 0, 0, 0))
