"""The one face of nobackfill: :class:`Client`, in process or over HTTP with the same methods and
the same return types (in the manner of qdrant-client's local and remote modes).

    from nobackfill import Client
    photos = Client("photos")                                   # a path or storage URI: in process
    photos = Client("http://127.0.0.1:8000", api_key="...")     # a running `nobackfill serve`
    photos.search(text="a red circle", k=5).hits[0].id
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import ClientError, InvalidRequest, NotFound, Unreachable, as_client_error
from .types import AddResult, ImportResult, ItemInfo, SearchResults, UpgradeResult

__all__ = ["Client", "check_image_file", "check_item_id", "check_list", "check_path", "check_upgrade",
           "choose_implementation_with"]

#: the class that serves a target (set once by :mod:`nobackfill.client`, which knows the
#: implementations; this module imports none of them, as they subclass :class:`Client`)
_implementation: Callable[[str], type["Client"]] | None = None


def choose_implementation_with(choose: Callable[[str], type["Client"]]) -> None:
    """Make ``Client(target)`` an instance of ``choose(str(target))``."""
    global _implementation
    _implementation = choose


def check_image_file(image: Any) -> None:
    """:class:`~.errors.NotFound` for an image query given as a path that names no file (the same
    error in process and over HTTP)."""
    if isinstance(image, (str, Path)) and not Path(image).is_file():
        raise NotFound(404, f"image: {image} is a directory, not an image file" if Path(image).is_dir() else
                       f"image: no such file: {image}", "image")


def check_item_id(item_id: Any, call: str = "get") -> str:
    """``item_id`` if it is a string; else :class:`~.errors.NotFound` (no item has such an id),
    saying how ``call`` takes ids (the same error in process and over HTTP)."""
    if isinstance(item_id, str):
        return item_id
    hint = " (an id is a string" + ("; give several as separate arguments: delete('a', 'b'))"
                                    if call == "delete" else ")")
    raise NotFound(404, f"no item with id {item_id!r}{hint}", "id")


def check_list(value: Any, field: str, what: str, *, array_is_one: bool = False) -> list | None:
    """``value`` as a list (None stays None): :class:`~.errors.InvalidRequest` naming ``field`` for
    one string, path, mapping or other single value where a list of ``what`` is expected (a string
    would be read as one item per character); ``array_is_one``: an array is one item too (an image)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Path, Mapping)) or not isinstance(value, Iterable) or \
            array_is_one and hasattr(value, "shape"):
        raise InvalidRequest(422, f"{field}: a list of {what}, not one {type(value).__name__} (one item: [item])",
                             field)
    return list(value)


def check_path(value: Any, field: str, what: str = "a model directory or name") -> str | Path:
    """``value`` if it is a non-empty string or path, else :class:`~.errors.InvalidRequest` naming ``field``."""
    if isinstance(value, Path) or isinstance(value, str) and value.strip():
        return value
    raise InvalidRequest(422, f"{field}: {what}, got {value!r}", field)


def check_upgrade(model: Any, bridges: Any) -> list:
    """An upgrade's ``model`` and ``bridges`` checked (:func:`check_path`, :func:`check_list`): the bridges as a list."""
    check_path(model, "model")
    return [check_path(b, f"bridges[{i}]", "an upgrade directory")
            for i, b in enumerate(check_list(bridges, "bridges", "upgrade directories") or [])]


def refusals(method: Callable) -> Callable:
    """A public method of an in-process client whose refusals raise the one hierarchy
    (:mod:`.errors`): a missing file :class:`~.errors.NotFound`, a collection already there
    :class:`~.errors.AlreadyExists`, a backfill refused ``BackfillRefused``, an invalid argument
    :class:`~.errors.InvalidRequest`, as over HTTP. A storage that stopped answering
    (:class:`~.errors.Unreachable`) also makes the client reconnect at its next call."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kw: Any) -> Any:
        try:
            return method(self, *args, **kw)
        except ClientError:
            raise
        except Exception as e:
            err = as_client_error(e)
            if err is None:
                raise
            if isinstance(err, Unreachable):
                getattr(self, "forget_storage", lambda: None)()
            raise err from e

    return call


def collection_removed(collection: Any) -> bool:
    """True once the directory of an open directory collection is gone, or holds another catalog
    file than the one opened (removed and made again: trial U); a write would create the folder
    anew, reads would answer from the deleted files."""
    st = getattr(collection, "storage", None)
    root = getattr(st, "root", None)
    if root is None or getattr(st, "catalog_in_database", False):
        return False
    try:
        found = st._catalog_path().stat()
        ident: tuple | None = (found.st_dev, found.st_ino)
    except OSError:
        ident = None
    opened = getattr(st, "_opened_catalog", False)
    if opened is False or (opened is None and ident is not None):  # first look; a gallery's catalog written since
        st._opened_catalog = ident
        return not root.is_dir()
    return ident != opened or not root.is_dir()


def ray_options(engine: str, address: str | None, actors: int | None, gpus: float) -> Any:
    """The backfill engine's options: None for the local engine (which takes none of them), else
    :class:`~nobackfill.lifecycle.cluster.ray_backfill.RayOptions` (0 actors refused)."""
    from ..lifecycle.backfill import ENGINES

    if engine not in ENGINES:
        raise InvalidRequest(422, f"engine must be one of {', '.join(ENGINES)}, got {engine!r}", "engine")
    if engine == "local":
        if address is not None or actors is not None or gpus:
            raise InvalidRequest(422, "ray_address, actors and gpus_per_actor need engine='ray'", "engine")
        return None
    from ..lifecycle.cluster.ray_backfill import RayOptions
    try:
        return RayOptions(address=address, gpus_per_actor=float(gpus), **({"actors": actors} if actors is not None else {}))
    except ValueError as e:
        raise InvalidRequest(422, str(e), "actors") from None


class Client:
    """A collection, in process (``target`` a directory or storage URI: ``milvus-lite:PATH#NAME``,
    ``milvus://HOST:PORT#NAME``, ``...?catalog=postgresql://...``) or served over HTTP (``target``
    an ``http(s)://`` URL of ``nobackfill serve``, with ``api_key``). ``Client(...)`` returns a
    :class:`~nobackfill.client.local.LocalClient` or a :class:`~nobackfill.client.remote.RemoteClient`;
    both have every method below, return the same types, take the same limits and raise the same
    errors: a refused call raises a :class:`~nobackfill.client.errors.ClientError` (a ValueError)
    of the class of its kind (:class:`~.errors.NotFound`, also a FileNotFoundError;
    :class:`~.errors.AlreadyExists`, also a FileExistsError; :class:`~.errors.Conflict`;
    :class:`~.errors.InvalidRequest`...), with the HTTP status it maps to."""

    def __new__(cls, target: str | Path = "", *args: Any, **kw: Any) -> "Client":
        if cls is Client:
            if _implementation is None:
                raise RuntimeError("no Client implementation is set: import nobackfill.client")
            check_path(target, "target", "a collection's directory, storage URI or http(s):// URL")
            return super().__new__(_implementation(str(target)))
        return super().__new__(cls)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release what the client holds (an HTTP connection pool)."""

    # every call a collection answers; the subclasses implement them
    def create(self, model: str | Path, *, backend: str = "auto") -> dict[str, Any]:
        """Create the collection with ``model`` as its current model; returns its status."""
        raise NotImplementedError

    def add(self, *, texts: Sequence[str | Mapping[str, Any]] | None = None, images: Sequence[str | Path] | None = None,
            ids: Sequence[str | None] | None = None, **kw: Any) -> AddResult:
        """Embed and add texts (strings, or ``{"text", "id", ...metadata}``; a caption's
        ``"image_id"`` links it to its image) or image files (paths, or ``{"path", "id",
        ...metadata}``; an image in memory: save it to a file first) with the current model; an id
        already there with the same content is left as it is. Both clients also take ``folder=`` (a
        data folder, or a world root with ``split=``) and ``text_file=``, read on the caller's
        machine (over HTTP: uploaded), ``chunk_size`` (items embedded and committed together: a call
        that fails part way keeps the chunks before, and its error says how many items), and an
        empty list (nothing added). In process also ``skip_bad`` (skip unreadable lines and images,
        reported) and ``wait`` (queue behind another process's add; without it such an add is
        refused at once, 409)."""
        raise NotImplementedError

    def import_(self, source: str, **kw: Any) -> ImportResult:
        """Import vectors embedded elsewhere (``clip-retrieval:DIR``, ``npy:F``, ``npz:F``,
        ``faiss:F`` with ``table=``), after the model check."""
        raise NotImplementedError

    def upgrade(self, model: str | Path, *, bridges: Sequence[str | Path] = (), calibrate: str | Path | None = None,
                calibrate_split: str = "val", calibrate_limit: int | None = None,
                calibrate_langs: Sequence[str] | str = ("en",), log: Any = None,
                fit_bridges: bool | None = None, queries: Sequence[str] = (),
                fit_sample: Mapping[str, Any] | None = None) -> UpgradeResult:
        """Make ``model`` the current model at once (nothing re-embedded): older spaces are reached
        through ``bridges``; ``calibrate`` chooses routes and the merge on labelled data (``log``:
        told of each step, in process). ``fit_bridges`` (default: when no bridge is given): the
        backfill fits bridges from its own pairs, a sample of each modality first; ``queries``:
        example search texts (no labels, at most 2,000 of 300 characters) the fits score text-query
        bridges on, the only text queries of a collection of images alone; ``fit_sample``:
        ``{"fraction", "min_pairs", "max_pairs"}`` of the first sample (default 0.01 of each
        modality, at least 512, at most 20,000)."""
        raise NotImplementedError

    def route(self, space: str, direction: str, route: str | None = None, *, w: float | None = None) -> dict[str, Any]:
        """Pin ``route`` (old-model | bridge | fused, ``w`` for fused) for ``direction`` (t2i | i2t |
        t2t | i2i) to the older ``space``; None unpins. Returns the route table."""
        raise NotImplementedError

    def calibrate(self, data: str | Path, *, split: str = "val", limit: int | None = None) -> dict[str, Any]:
        """Choose routes, fused weights and the merge on labelled ``data`` (never the evaluated split)."""
        raise NotImplementedError

    def search(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: Mapping[str, Any] | None = None, merge: str | None = None) -> SearchResults:
        """Top ``k`` items for a text or an image (a path, bytes, a PIL image; in process also an
        array), every space through its route, one merged list."""
        raise NotImplementedError

    def get(self, item_id: str) -> ItemInfo:
        """One item: modality, metadata, the space that serves it (NotFound if unknown)."""
        raise NotImplementedError

    def delete(self, *ids: str) -> int:
        """Delete items (all or nothing: an unknown id deletes none, NotFound); returns how many."""
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        """Spaces and their counts, the current model, routes, merge, the backfill, the limits."""
        raise NotImplementedError

    def backfill_start(self, order: str = "uncertainty", rate: float | None = None, **kw: Any) -> dict[str, Any]:
        """Start the progressive backfill into the current space (``resume=True``: resume a paused
        one); returns its status, or with ``wait=True`` the report of the run once its worker
        stopped (over HTTP the server's worker, followed)."""
        raise NotImplementedError

    def backfill_pause(self) -> dict[str, Any]:
        """Pause the backfill (workers stop after their batch)."""
        raise NotImplementedError

    def backfill_resume(self, order: str = "uncertainty", rate: float | None = None) -> dict[str, Any]:
        """Resume a paused backfill (none paused: start one, as ``backfill_start(resume=True)``);
        without ``rate`` the cap of the run it resumes in this client (or server) is kept."""
        raise NotImplementedError

    def backfill_cancel(self) -> dict[str, Any]:
        """Forget the backfill job (what was committed stays and is served)."""
        raise NotImplementedError

    def backfill_status(self) -> dict[str, Any]:
        """``{"done", "total", "fraction", "state", "order", ...}`` of the current space."""
        raise NotImplementedError

    def retire(self, space: str, *, drop_unsourced: bool = False) -> dict[str, Any]:
        """Drop an old space's vectors once every item has a vector in the current space (a space
        already retired: nothing changes, the same answer)."""
        raise NotImplementedError

    def index(self, *, log: Callable[[str], None] | None = None, progress: bool = False) -> dict[str, Any]:
        """Build the graph index of every ``auto`` space past its threshold that lacks it (an
        import returns before: its rows are searched exactly meanwhile). ``{"indexes": [...]}``:
        each index that was missing (``space``, ``modality``, ``count``, ``graph``, ``in_use``,
        ``building``); here it is built when this returns, over HTTP the server builds it in the
        background (``building``: true; ``status()`` shows when it is in use). ``progress``: a bar
        per index built here."""
        raise NotImplementedError

    def verify(self, *, repair: bool = False, model_check: bool = False) -> dict[str, Any]:
        """Check every stored file of the collection (``problems``: stored data; ``derived``: caches)."""
        raise NotImplementedError
