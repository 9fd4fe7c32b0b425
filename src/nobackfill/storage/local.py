"""A collection in a directory (:class:`LocalStorage`): ``catalog.sqlite`` (or a PostgreSQL catalog
named by the URI) and one crash-safe :class:`~nobackfill.gallery.gallery.Gallery` per space under
``spaces/<space>/``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..gallery.atomic_files import atomic_write_bytes, flock, lock_holder, record_holder
from ..gallery.gallery import Gallery
from ..gallery.manifest import MANIFEST as GALLERY_MANIFEST
from .base import MANIFEST_FILE, Storage
from .binding import STORE_MARK, bound_fill, check_binding, new_uid, wrong_store

if TYPE_CHECKING:
    from ..catalog.catalog import Catalog

__all__ = ["LocalStorage"]


class LocalStorage(Storage):
    """A collection in a directory: ``catalog.sqlite`` and ``spaces/<space>/`` galleries."""

    def __init__(self, root: str | Path, catalog_uri: str | None = None) -> None:
        self.root = Path(root)
        self.location = str(self.root)
        self._catalog_uri = catalog_uri  # a PostgreSQL catalog for a directory shared by several machines
        self._catalog: Catalog | None = None

    @property
    def catalog_in_database(self) -> bool:
        """The catalog is a database's (PostgreSQL), not ``catalog.sqlite`` in the directory."""
        return bool(self._catalog_uri)

    # catalog
    def _catalog_path(self) -> Path:
        from ..catalog.catalog import CATALOG_FILE

        return self.root / CATALOG_FILE

    def catalog(self) -> "Catalog | None":
        if self._catalog is not None:
            return self._catalog
        from ..catalog.catalog import open_catalog, sqlite_catalog

        if self._catalog_uri:
            cat = open_catalog(self._catalog_uri)
            if not cat.exists():
                return None
            self._check_bound(cat)
        elif self._catalog_path().is_file():
            cat = sqlite_catalog(self._catalog_path())
        else:
            return None
        self._catalog = cat
        return cat

    def create_catalog(self, header: dict[str, Any], fill: Any = None) -> "Catalog":
        from ..catalog.catalog import create_sqlite, open_catalog

        self.root.mkdir(parents=True, exist_ok=True)
        if self._catalog_uri:  # the catalog names these vectors (:mod:`.binding`): the mark first
            uid = new_uid()
            atomic_write_bytes(self.root / f".{STORE_MARK}", uid.encode())
            cat = open_catalog(self._catalog_uri)
            cat.create(header, bound_fill(fill, "directory", str(self.root.resolve()), uid))
        else:
            cat = create_sqlite(self._catalog_path(), header, fill)
        self._catalog = cat
        return cat

    def _check_bound(self, cat: "Catalog") -> None:
        """A database catalog is opened only with its own directory: one several machines mount,
        by whatever path, holds the catalog's mark (:mod:`.binding`)."""
        bound = check_binding(cat, self.location, "directory", str(self.root.resolve()), same_where=False)
        if bound is None:
            return
        uid = bound[0]
        mark = self.root / f".{STORE_MARK}"
        found = mark.read_text().strip() if mark.is_file() else None
        if found != uid:
            raise wrong_store(self.location, cat, f"the directory {self.root}", found)

    def migration_lock(self) -> contextlib.AbstractContextManager[bool]:
        return flock(self.root / ".migrate-lock") if self.root.is_dir() else contextlib.nullcontext(True)

    # the previous format
    def read_manifest(self) -> bytes | None:
        try:
            return (self.root / MANIFEST_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_chunk(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def read_doc(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def list_docs(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def retire_v1(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.root / MANIFEST_FILE, self.root / f"{MANIFEST_FILE}.v1")

    # spaces
    def create_space(self, directory: str, *, space_id: str, dim: int, model: str, backend: str) -> Gallery:
        return Gallery.create(self.root / directory, space_id=space_id, dim=int(dim), model=str(model), backend=backend)

    def open_space(self, directory: str) -> Gallery:
        return Gallery.open(self.root / directory)

    def has_space(self, directory: str) -> bool:
        return (self.root / directory / GALLERY_MANIFEST).is_file()

    def drop_space(self, directory: str) -> None:
        import shutil

        if directory in (".", ""):  # an old gallery that is the collection's root keeps its files
            return
        shutil.rmtree(self.root / directory, ignore_errors=True)

    # directory locks (a plain gallery's build; a collection's locks are its catalog's)
    def lock(self, name: str, blocking: bool = True) -> contextlib.AbstractContextManager[bool]:
        return flock(self.root / f".{name}-lock", blocking=blocking)

    def lock_holder(self, name: str) -> str:
        return lock_holder(self.root, name)

    def record_holder(self, name: str) -> None:
        record_holder(self.root, name)

    # existence
    def why_not_a_collection(self) -> str | None:
        return "it is a file; a collection is a directory" if self.root.is_file() else None

    def check_creatable(self) -> None:
        if self.root.is_file():
            raise FileExistsError(f"{self.root} is a file; a collection is a directory: choose a new location")

    def stray_entries(self, own_space_dir: str) -> list[str]:
        if not self.root.exists():
            return []
        if not self.root.is_dir():
            return [self.root.name]
        top, sub = own_space_dir.split("/", 1) if "/" in own_space_dir else (own_space_dir, "")
        stray = [p.name for p in self.root.iterdir() if not p.name.startswith(".") and p.name != top]
        if (self.root / top).is_dir() and sub:
            stray += [f"{top}/{p.name}" for p in (self.root / top).iterdir() if p.name != sub]
        return stray

    def legacy_gallery(self) -> Gallery | None:
        if (self.root / GALLERY_MANIFEST).is_file():
            return Gallery.open(self.root)
        return None

    def exists(self) -> bool:
        return self.catalog() is not None or (self.root / MANIFEST_FILE).is_file() or \
            (self.root / GALLERY_MANIFEST).is_file()

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
