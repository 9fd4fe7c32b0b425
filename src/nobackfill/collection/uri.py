"""Storage URIs: :func:`parse_uri` reads one, :func:`open_storage` opens the storage it names (a
directory: :class:`~nobackfill.storage.local.LocalStorage`; Milvus:
:class:`~nobackfill.milvus.MilvusStorage`)."""

from __future__ import annotations

from pathlib import Path

from ..storage.base import Storage
from ..storage.local import LocalStorage

__all__ = ["open_storage", "parse_uri"]


def parse_uri(uri: str | Path) -> tuple[str, dict[str, str]]:
    """``("local", {"path"})``, ``("milvus-lite", {"path", "name"})`` or ``("milvus", {"uri", "db",
    "name"})``, each with ``"catalog"`` when the URI ends in ``?catalog=postgresql://...``. A
    collection in Milvus is named by the URI's fragment (``#photos``; default ``default``):
    ``milvus-lite:/data/m.db#photos``, ``milvus://127.0.0.1:19530/db1#photos?catalog=postgresql://
    nb@db-host:5432/nb``. A Milvus collection's PostgreSQL catalog is named by the same fragment
    (unless the catalog URL names its own): two collections may share one database."""
    s = str(uri)
    s, sep, catalog = s.partition("?catalog=")
    extra = {"catalog": catalog} if sep else {}
    if sep and not catalog.startswith(("postgresql://", "postgres://")):
        raise ValueError(f"{uri}: the catalog must be a postgresql:// URL, got {catalog!r}")
    if s.startswith("milvus-lite:"):
        rest = s[len("milvus-lite:"):]
        path, _, name = rest.partition("#")
        if not path:
            raise ValueError(f"{s}: a milvus-lite URI needs a path (milvus-lite:PATH#NAME)")
        if not path.endswith(".db"):  # milvus-lite's own rule for a local file
            raise ValueError(f"{s}: a milvus-lite database is a file whose name ends in .db, got {path!r}")
        return "milvus-lite", {"path": path, "name": name or "default", **_named(extra, name)}
    if s.startswith("milvus://"):
        rest = s[len("milvus://"):]
        rest, _, name = rest.partition("#")
        hostport, _, db = rest.partition("/")
        if not hostport:
            raise ValueError(f"{s}: a milvus URI needs a host and port (milvus://HOST:PORT[/DB]#NAME)")
        return "milvus", {"uri": f"http://{hostport}", "db": db or "default", "name": name or "default",
                          **_named(extra, name)}
    if "://" in s:
        raise ValueError(f"{s}: unknown storage URI scheme (use a local path, milvus-lite:PATH#NAME or "
                         "milvus://HOST:PORT[/DB]#NAME, optionally ?catalog=postgresql://...)")
    if sep and "#" in s:  # DIR#NAME?catalog=URL, the order of the Milvus URIs (trial AH: a folder "DIR#NAME")
        s, _, name = s.rpartition("#")
        own = catalog.rpartition("#")[2] if "#" in catalog else None
        if not s or not name or (own is not None and own != name):
            raise ValueError(f"{uri}: name the collection once: DIR?catalog=postgresql://...#NAME (or DIR#NAME"
                             "?catalog=postgresql://...)")
        extra = _named(extra, name)
    return "local", {"path": s, **extra}


def _named(extra: dict[str, str], name: str) -> dict[str, str]:
    """``extra``'s catalog URL named ``#name`` when it names no catalog itself."""
    if "catalog" in extra and "#" not in extra["catalog"]:
        return {**extra, "catalog": f"{extra['catalog']}#{name or 'default'}"}
    return extra


def open_storage(uri: str | Path) -> Storage:
    """The storage a URI names (:func:`parse_uri`)."""
    kind, parts = parse_uri(uri)
    if kind == "local":
        return LocalStorage(parts["path"], parts.get("catalog"))
    from ..milvus import MilvusStorage

    return MilvusStorage.from_uri(str(uri), kind, parts)
