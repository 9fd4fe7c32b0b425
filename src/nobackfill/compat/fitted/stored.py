"""Fitted bridges kept in a collection's catalog, so every machine of a shared deployment reads them.

A fitted bridge is an upgrade directory (:mod:`.bridge`); its files are stored as catalog documents
``bridges/<name>/<file>`` (``upgrade.json`` and ``fitted.safetensors``), all in one catalog
transaction, under a name that is claimed once (``fitted-<space>-<direction>-v<k>``: a version is
never overwritten). The plan records such a bridge by the path ``catalog:bridges/<name>``
(:data:`PREFIX`). Before a plan's routes are built, :func:`resolve_plan` writes each stored bridge the
plan names into a local directory (:func:`materialize`: the collection's own ``bridges/`` folder for a
collection on local storage, a cache folder per catalog otherwise), once, atomically, and gives the
plan with those directories, which :func:`~nobackfill.compat.upgrade.load_upgrade` reads as any other
upgrade (checking the file hashes of the manifest).

The catalog is duck-typed: ``read_doc``, ``list_docs`` and ``writing()`` (whose writer has
``put_doc``) of :class:`nobackfill.catalog.catalog.Catalog`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

__all__ = ["DOC_DIR", "PREFIX", "bridge_cache", "collection_cache", "drop_stored", "is_stored", "materialize",
           "next_version", "resolve_collection_plan", "resolve_plan", "save_stored", "store_dir"]

DOC_DIR = "bridges"
PREFIX = "catalog:"


def is_stored(path: str) -> bool:
    """Whether an upgrade record's path names a bridge stored in the catalog."""
    return str(path).startswith(PREFIX)


def _name(path: str) -> str:
    name = str(path)[len(PREFIX):]
    if not name.startswith(DOC_DIR + "/") or "/" in name[len(DOC_DIR) + 1:] or ".." in name:
        raise ValueError(f"upgrade path {path!r}: a stored bridge is named {PREFIX}{DOC_DIR}/<name>")
    return name[len(DOC_DIR) + 1:]


def next_version(catalog: Any, stem: str) -> int:
    """1 + the highest version ``<stem>-v<k>`` stored so far (a name once used is never reused)."""
    pat = re.compile(re.escape(stem) + r"-v(\d+)/")
    found = [int(m.group(1)) for d in catalog.list_docs(f"{DOC_DIR}/{stem}-v") if (m := pat.match(d[len(DOC_DIR) + 1:]))]
    return 1 + max(found, default=0)


def store_dir(catalog: Any, directory: Path, name: str) -> str:
    """Store the files of the upgrade directory ``directory`` as the documents of ``name``, in one
    catalog transaction (``upgrade.json`` included: a reader sees all of them or none). Refuses a
    name already stored (``FileExistsError``; nothing written). Returns the plan path."""
    files = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}
    if "upgrade.json" not in files:
        raise ValueError(f"{directory}: not an upgrade directory (no upgrade.json)")
    prefix = f"{DOC_DIR}/{name}/"
    with catalog.writing() as w:
        taken = w.execute("SELECT 1 FROM docs WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)).fetchone()
        if taken is not None:
            raise FileExistsError(f"catalog document {prefix}: bridge {name} is stored already")
        for f, data in files.items():
            w.put_doc(prefix + f, data)
    return PREFIX + DOC_DIR + "/" + name


def drop_stored(catalog: Any, stem: str, cache: Path | None = None) -> int:
    """Delete every stored bridge whose name starts with ``stem`` (all its versions: the documents
    ``bridges/<stem>...`` in one transaction), and their local copies in ``cache``; the number of
    documents deleted."""
    import shutil

    prefix = f"{DOC_DIR}/{stem}"
    if not stem or "/" in stem or ".." in stem:
        raise ValueError(f"stored bridges to drop: a name stem, got {stem!r}")
    with catalog.writing() as w:
        n = w.execute("DELETE FROM docs WHERE substr(name, 1, ?) = ? RETURNING name", (len(prefix), prefix)).fetchall()
    if cache is not None and Path(cache).is_dir():
        for d in Path(cache).glob(f"{stem}*"):
            shutil.rmtree(d, ignore_errors=True)
    return len(n)


def bridge_cache(local_root: Path | None, location: str) -> Path:
    """Where stored bridges are written to be read: ``<collection>/bridges`` for a collection on
    local storage, else ``$NOBACKFILL_CACHE`` (default ``~/.cache/nobackfill``)
    ``/bridges/<hash of the collection's location>``."""
    if local_root is not None:
        return Path(local_root) / DOC_DIR
    from ...encoders.meta import cache_dir

    return cache_dir() / DOC_DIR / hashlib.sha256(location.encode()).hexdigest()[:16]


def materialize(catalog: Any, path: str, cache: Path) -> Path:
    """The local directory of the stored bridge ``path`` (written from the catalog when missing).
    ``FileNotFoundError`` naming the documents when the catalog holds none."""
    from ..upgrade_files import UPGRADE_FILE, atomic_dir

    name = _name(path)
    directory = Path(cache) / name
    if (directory / UPGRADE_FILE).is_file():
        return directory
    prefix = f"{DOC_DIR}/{name}/"
    docs = {d[len(prefix):]: catalog.read_doc(d) for d in catalog.list_docs(prefix)}
    if UPGRADE_FILE not in docs or any(v is None for v in docs.values()):
        raise FileNotFoundError(f"{path}: the catalog holds no complete bridge under documents {prefix}")

    def write(tmp: Path) -> None:
        for f, data in docs.items():
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp / f).write_bytes(data)

    try:
        return atomic_dir(directory, write)
    except OSError:
        if (directory / UPGRADE_FILE).is_file():  # another process of this machine wrote it meanwhile
            return directory
        raise


def resolve_plan(plan: Any, catalog: Any, cache: Path, *, on_error: Callable[[str, Exception], None] | None = None) -> Any:
    """``plan`` with every stored bridge's path replaced by its local directory (:func:`materialize`).
    A bridge that cannot be read keeps its path (routes through it then fail when built, naming it);
    ``on_error(path, error)`` hears of it."""
    if not any(is_stored(u.path) for u in plan.upgrades):
        return plan
    ups = []
    for u in plan.upgrades:
        if is_stored(u.path):
            try:
                u = dataclasses.replace(u, path=str(materialize(catalog, u.path, cache)))
            except (OSError, ValueError) as e:
                if on_error is not None:
                    on_error(u.path, e)
        ups.append(u)
    return dataclasses.replace(plan, upgrades=tuple(ups))


def save_stored(catalog: Any, name: str, save: Callable[[Path], Any]) -> str:
    """Write an upgrade directory with ``save(directory)`` into a temporary folder and store it as
    ``name`` (:func:`store_dir`); the plan path."""
    with tempfile.TemporaryDirectory(prefix="nobackfill-bridge-") as tmp:
        directory = Path(tmp) / name
        save(directory)
        return store_dir(catalog, directory, name)


def collection_cache(collection: Any) -> Path:
    """:func:`bridge_cache` of a :class:`~nobackfill.collection.collection.Collection`."""
    return bridge_cache(collection.path if isinstance(collection.path, Path) else None, str(collection.path))


def resolve_collection_plan(collection: Any, plan: Any = None, *,
                            on_error: Callable[[str, Exception], None] | None = None) -> Any:
    """:func:`resolve_plan` of ``collection``'s plan (or ``plan``), read from its catalog; a bridge
    that cannot be read is logged (default ``on_error``)."""
    plan = collection.plan if plan is None else plan
    if not any(is_stored(u.path) for u in plan.upgrades):
        return plan
    return resolve_plan(plan, collection.catalog, collection_cache(collection), on_error=on_error or (
        lambda p, e: logging.getLogger(__name__).warning("fitted bridge %s unreadable (%s): routes through it fail",
                                                          p, e)))
