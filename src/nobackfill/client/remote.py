"""The client over HTTP: every call of :class:`~nobackfill.client.Client` sent to a running
``nobackfill serve`` (``Client("http://127.0.0.1:8000", api_key=...)``). Paths (a model, a bridge,
an import's files, calibration data) are relative to the roots the server was started with."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import httpx

from .base import Client, check_image_file, check_item_id, check_upgrade
from .errors import (API_HEADER, API_KEY_VARIABLE, AlreadyExists, InvalidRequest, NotAServer, NotFound, ServerError,
                     Unreachable, as_client_error, backfill_refused, error_for, key_hint)
from .types import AddResult, ImportResult, ItemInfo, SearchResults, UpgradeResult

__all__ = ["PROBE_S", "RemoteClient"]

#: how long the first request of a client waits for any answer from the address (``GET /healthz``)
PROBE_S = 10.0


class RemoteClient(Client):
    """:class:`Client` over the v1 HTTP API with one API key (``api_key``; None: the key in the
    environment variable ``NOBACKFILL_API_KEY``, as the command line reads it; ``http``: an
    ``httpx.Client`` to use instead, e.g. FastAPI's TestClient)."""

    def __init__(self, target: str, api_key: str | None = None, *, timeout: float = 60.0,
                 http: httpx.Client | None = None) -> None:
        self.target = target.rstrip("/")
        self.http = http or httpx.Client(base_url=self.target, timeout=timeout)
        if api_key is None:
            api_key = os.environ.get(API_KEY_VARIABLE) or None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._limits: dict[str, Any] | None = None
        self._answered = False  # the address answered the first probe (see _probe)

    def __repr__(self) -> str:
        return f"RemoteClient({self.target!r})"

    def close(self) -> None:
        self.http.close()

    def _probe(self) -> None:
        """Before the first request: ``GET /healthz`` (cheap on a server, whatever it is doing), so that
        an address that takes the connection and never answers is said within :data:`PROBE_S` seconds
        (trial AC: the command waited for the request's own timeout, a minute); any answer will do
        (what answered is judged by the request itself)."""
        try:
            self.http.get("/healthz", timeout=PROBE_S)
        except httpx.TimeoutException:
            raise Unreachable(0, f"{self.target} took the connection but did not answer GET /healthz within "
                                 f"{PROBE_S:g} s: is this the address of `nobackfill serve`?") from None
        except httpx.TransportError:
            return  # (said by the request itself, naming why)
        self._answered = True

    def _call(self, method: str, path: str, *, backfill: bool = False, **kw: Any) -> Any:
        """One request; an error answer raises its :class:`~.errors.ClientError` class (``backfill``:
        a 409 is ``BackfillRefused``), no answer at all :class:`~.errors.Unreachable` naming the URL
        and why (an address that never answers: within :data:`PROBE_S` seconds, see :meth:`_probe`)."""
        if not self._answered:
            self._probe()
        try:
            r = self.http.request(method, path, headers=self.headers, **kw)
        except httpx.TransportError as e:
            why = " ".join(str(e).split()) or type(e).__name__
            raise Unreachable(0, f"cannot reach the server at {self.target} ({type(e).__name__}: {why})") from None
        if API_HEADER not in r.headers:  # trial AB/AC: a web server's HTML page printed as the error; a
            # redirect, another API's JSON or a 200 page ended in a traceback
            kind = r.headers.get("content-type", "no content type").split(";")[0]
            raise NotAServer(r.status_code, f"{self.target} does not answer as a nobackfill server: {method} {path} "
                                            f"got HTTP {r.status_code} ({kind}) without the API's header; is this the "
                                            "address of `nobackfill serve`?")
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"detail": r.text}
            conflict = backfill_refused() if backfill and r.status_code == 409 else None
            hint = key_hint(r.status_code, sent=bool(self.headers)) if r.status_code in (401, 403) else ""
            raise error_for(r.status_code, body.get("detail", ""), body.get("field"), conflict=conflict, hint=hint)
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.content

    def limits(self) -> dict[str, Any]:
        """The server's limits (``max_k``, ``max_batch``, ``max_body_bytes``...), read once."""
        if self._limits is None:
            self._limits = dict(self.status().get("limits") or {})
        return self._limits

    # ------------------------------------------------------------------ create / add / import
    def create(self, model: str | Path, *, backend: str = "auto") -> dict[str, Any]:
        raise AlreadyExists(409, "a server serves one existing collection: create it where it is stored "
                                 "(Client(path).create(...) or `nobackfill collection create PATH`)", "create")

    def add(self, *, texts: Sequence[str | Mapping[str, Any]] | None = None, images: Sequence[str | Path] | None = None,
            ids: Sequence[str | None] | None = None, folder: str | Path | None = None, split: str = "test",
            text_file: str | Path | None = None, langs: Sequence[str] | None = None, skip_bad: bool = False,
            wait: bool = False, chunk_size: int = 256, progress: bool = False, before_embed: Any = None,
            build_indexes: bool = False, log: Any = None) -> AddResult:
        """As in process: ``folder`` and ``text_file`` are read on this machine and uploaded in
        requests within the server's limits (:mod:`.upload`). The server embeds, waits for another
        adder and builds its indexes itself (``wait``, ``build_indexes``, ``log`` are not used;
        ``before_embed`` is not called: the server knows what it embeds)."""
        from .upload import drop_oversized, given_items, one_source, read_files, upload_items

        one_source(texts, images, folder, text_file)
        rows = texts if texts is not None else images
        if rows is not None and not len(rows):
            return AddResult()
        try:
            if rows is not None:
                items, read = given_items(texts, images, ids, self._server_limits().check_text), None
            else:
                items, read = read_files(folder, split, text_file, langs, skip_bad,
                                         self._server_limits().max_caption_chars)
            items = drop_oversized(items, read, self.limits(), skip_bad)
        except (OSError, ValueError) as e:
            raise as_client_error(e) or e
        out = upload_items(self._call, items, self.limits(), chunk_size=chunk_size, progress=progress)
        if read is not None:
            out.skipped += read.skipped
            out.problems = list(read.problems) + out.problems
            out.skipped_images, out.uncaptioned = dict(read.skipped_images), read.uncaptioned
        return out

    def import_(self, source: str, *, table: str | Path | None = None, id_column: str | None = None,
                source_column: str | None = None, modality: str | None = None, images_root: str | Path | None = None,
                model: str | Path | None = None, trust_model: bool = False, lossy: bool = False, samples: int = 64,
                metadata_columns: Sequence[str] | None = None,
                backend: str = "auto", wait: bool = False, progress: bool = False, build_indexes: bool = False,
                log: Any = None) -> ImportResult:
        """As in process, the files (``source``'s path, ``table``, ``images_root``) and ``model``
        named relative to the server's ``--data-root`` / ``--models-root`` (a name starting with the
        root's own folder name is taken too: ``data/vecs.npy`` under ``--data-root data``). The
        server's collection exists (``backend`` is its own); the server waits for another adder and
        builds its indexes (``wait``, ``progress``, ``build_indexes``, ``log`` are not used)."""
        fmt, sep, path = source.partition(":")
        if not sep:
            raise InvalidRequest(422, f"source must look like FORMAT:PATH (clip-retrieval:DIR, npy:FILE ...), got "
                                      f"{source!r}", "source")
        body = {"format": fmt, "path": path, "table": _str(table), "id_column": id_column,
                "source_column": source_column, "modality": modality, "images_root": _str(images_root),
                "trust_model": trust_model, "lossy": lossy, "model": _str(model),
                "samples": samples if samples != 64 else None,
                "metadata_columns": None if metadata_columns is None else list(metadata_columns)}
        return ImportResult.from_dict(self._call("POST", "/v1/import", json={k: v for k, v in body.items()
                                                                            if v is not None}))

    def adopt(self, source: str, **kw: Any) -> dict[str, Any]:
        """Not over HTTP: a Milvus collection is adopted where the collection is stored."""
        raise InvalidRequest(422, "adopting a Milvus collection in place is done where the collection is stored "
                                  "(Client(path).adopt(...) or `nobackfill collection import PATH --from milvus://...`),"
                                  " not through a server", "source")

    # ------------------------------------------------------------------ plan changes
    def upgrade(self, model: str | Path, *, bridges: Sequence[str | Path] = (), calibrate: str | Path | None = None,
                calibrate_split: str = "val", calibrate_limit: int | None = None,
                calibrate_langs: Sequence[str] | str = ("en",), log: Any = None,
                fit_bridges: bool | None = None, queries: Sequence[str] = (),
                fit_sample: Mapping[str, Any] | None = None) -> UpgradeResult:
        """(``log`` is not used: the server logs its upgrade.)"""
        bridges = check_upgrade(model, bridges)
        langs = calibrate_langs if isinstance(calibrate_langs, str) else ",".join(calibrate_langs)
        body = {"model": str(model), "bridges": [str(b) for b in bridges], "calibrate": _str(calibrate),
                "calibrate_split": calibrate_split, "calibrate_limit": calibrate_limit, "calibrate_langs": langs,
                "fit_bridges": fit_bridges, **({"queries": list(queries)} if queries else {}),
                **({"fit_sample": dict(fit_sample)} if fit_sample else {})}
        return UpgradeResult.from_dict(self._call("POST", "/v1/upgrade", json=body))

    def route(self, space: str, direction: str, route: str | None = None, *, w: float | None = None) -> dict[str, Any]:
        body = {"space": space, "direction": direction, "route": route, "w": w}
        return self._call("POST", "/v1/routes", json=body)["routes"]

    def calibrate(self, data: str | Path, *, split: str = "val", limit: int | None = None,
                  langs: Sequence[str] | str = ("en",)) -> dict[str, Any]:
        body = {"data": str(data), "split": split, "limit": limit,
                "langs": langs if isinstance(langs, str) else ",".join(langs)}
        return self._call("POST", "/v1/calibrate", json=body)

    def retire(self, space: str, *, drop_unsourced: bool = False) -> dict[str, Any]:
        return self._call("POST", "/v1/retire", json={"space": space, "drop_unsourced": drop_unsourced},
                          backfill=True)

    # ------------------------------------------------------------------ reads
    def search(self, *, text: str | None = None, image: Any = None, k: int = 10, target: str | None = None,
               filter: Mapping[str, Any] | None = None, merge: str | None = None) -> SearchResults:
        """As in process, and refused alike before anything is sent (the text, the image's file,
        ``k``, ``filter``); ``image``: a path, bytes or a PIL image (sent as PNG)."""
        if (text is None) == (image is None):
            raise InvalidRequest(422, "give exactly one of text= or image=", "text")
        if text is not None:
            self._check("check_text", text, "text")
        check_image_file(image)
        k, flt = self._check("check_k", k, "k"), _filter(filter)
        if text is not None:
            body: dict[str, Any] = {"text": text, "k": k, "target": target, "filter": flt, "merge": merge}
            return SearchResults.from_dict(self._call("POST", "/v1/search", json={k_: v for k_, v in body.items()
                                                                                  if v is not None}))
        if merge is not None:
            raise InvalidRequest(422, "merge is taken with a text query only", "merge")
        form = {"k": str(k), **({"target": target} if target else {}),
                **({"filter": json.dumps(flt, ensure_ascii=False)} if flt else {})}
        files = {"image": ("query.png", _image_bytes(image))}
        return SearchResults.from_dict(self._call("POST", "/v1/search", files=files, data=form))

    def _check(self, check: str, value: Any, field: str) -> Any:
        """``value`` passed by ``Limits.<check>`` as in process: the default limits first, and where
        they refuse it the server's own (read then); InvalidRequest naming ``field``."""
        from ..search.limits import Limits

        try:
            return getattr(Limits(), check)(value)
        except ValueError:
            pass
        try:
            return getattr(self._server_limits(), check)(value)
        except ValueError as e:
            raise InvalidRequest(422, str(e), field) from None

    def _server_limits(self) -> Any:
        """The server's limits as a :class:`~nobackfill.search.limits.Limits`, which checks an
        argument as the in-process client does."""
        import dataclasses

        from ..search.limits import Limits

        known = {f.name for f in dataclasses.fields(Limits)}
        return Limits(**{k: v for k, v in self.limits().items() if k in known})

    def get(self, item_id: str) -> ItemInfo:
        return ItemInfo.from_dict(self._call("GET", f"/v1/items/{_segment(item_id)}"))

    def thumbnail(self, item_id: str, size: int = 160) -> bytes:
        """A PNG of an image item, at most ``size`` pixels on its longer side."""
        return self._call("GET", f"/v1/items/{_segment(item_id)}/thumbnail", params={"size": size})

    def delete(self, *ids: str) -> int:
        """All or nothing, as in process: every id is looked up first, and an unknown one deletes
        none (NotFound); then each is deleted (the API deletes one item a request)."""
        unique = list(dict.fromkeys(check_item_id(i, "delete") for i in ids))
        for item_id in unique if len(unique) > 1 else ():  # one id: its DELETE is all or nothing
            try:
                self.get(item_id)
            except NotFound:
                raise NotFound(404, f"no item with id {item_id!r} in the served collection; nothing was deleted",
                               "id") from None
        for item_id in unique:
            self._call("DELETE", f"/v1/items/{_segment(item_id, 'delete')}")
        return len(unique)

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def index(self, *, log: Callable[[str], None] | None = None, progress: bool = False) -> dict[str, Any]:
        return self._call("POST", "/v1/index")

    def verify(self, *, repair: bool = False, model_check: bool = False) -> dict[str, Any]:
        if repair:
            raise InvalidRequest(422, "over HTTP, verify only reads: repair where the collection is stored "
                                      "(`nobackfill verify PATH --repair`)", "repair")
        return self._call("POST", "/v1/verify", json={"model_check": model_check})

    def healthz(self) -> dict[str, Any]:
        """Liveness: ``{"ok", "generation", "models"}`` (no key needed)."""
        return self._call("GET", "/healthz")

    # ------------------------------------------------------------------ the backfill
    def backfill_start(self, order: str = "uncertainty", rate: float | None = None, *, wait: bool = False,
                       resume: bool = False, limit: int | None = None, workers: int = 1, batch_size: int = 64,
                       progress: Callable[[int], None] | None = None, log: Any = None,
                       poll_s: float = 0.5, engine: str = "local", ray_address: str | None = None,
                       actors: int | None = None, gpus_per_actor: float = 0.0,
                       shards: int | None = None) -> dict[str, Any]:
        """Start (``resume``: resume a paused) backfill in the server, whose own worker does the
        work; ``wait``: follow it until it is done, paused or stopped (``progress(n)`` told of each
        item committed meanwhile) and return the run's report, as in process. ``limit``,
        ``workers`` and ``batch_size`` are the server's own (refused here), and so is the Ray cluster
        of ``engine="ray"`` (``nobackfill serve --ray-address``): ``ray_address`` is refused."""
        if limit is not None or workers != 1 or batch_size != 64 or shards is not None:
            raise InvalidRequest(422, "over HTTP the server's own worker does the backfill: limit, workers, shards "
                                      "and batch_size are taken where the collection is stored", "limit")
        if ray_address is not None:
            raise InvalidRequest(422, "over HTTP the server's Ray cluster is used (nobackfill serve --ray-address): "
                                      "ray_address is taken where the server runs", "ray_address")
        body = _backfill_body(order, rate, engine, actors, gpus_per_actor)
        before = self.backfill_status() if wait else None
        st = self._call("POST", f"/v1/backfill/{'resume' if resume else 'start'}", json=body,
                        backfill=True)
        return st if before is None else _follow(self, before, progress, poll_s, log)

    def backfill_pause(self) -> dict[str, Any]:
        return self._call("POST", "/v1/backfill/pause", backfill=True)

    def backfill_resume(self, order: str = "uncertainty", rate: float | None = None, *, engine: str = "local",
                        actors: int | None = None, gpus_per_actor: float = 0.0,
                       shards: int | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/backfill/resume", json=_backfill_body(order, rate, engine, actors, gpus_per_actor),
                          backfill=True)

    def backfill_cancel(self) -> dict[str, Any]:
        return self._call("POST", "/v1/backfill/cancel", backfill=True)

    def backfill_status(self) -> dict[str, Any]:
        return self.status()["backfill"]


def _backfill_body(order: str, rate: float | None, engine: str, actors: int | None,
                   gpus_per_actor: float) -> dict[str, Any]:
    """The JSON body of ``/v1/backfill/start`` and ``resume`` (the defaults left out)."""
    return {"order": order, **({"rate": rate} if rate else {}), **({"engine": engine} if engine != "local" else {}),
            **({"actors": actors} if actors is not None else {}),
            **({"gpus_per_actor": gpus_per_actor} if gpus_per_actor else {})}


def _fit_lines(client: RemoteClient) -> list[tuple[Any, str]]:
    """What the collection's bridge fits said so far, each line with a key that tells it from the
    others (the merge maps' early lines, refitted at each doubling until the first bridge fit, by
    their text; a fit's by its place)."""
    fb = client.status().get("fitted_bridges") or {}
    return [*((("maps", m), m) for m in fb.get("merge_maps_said", [])),
            *(((i, j), m) for i, f in enumerate(fb.get("fits", [])) for j, m in enumerate(f.get("said", [])))]


def _follow(client: RemoteClient, before: dict[str, Any], progress: Callable[[int], None] | None,
            poll_s: float, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The server's backfill followed until its worker stops: the report a run in process gives
    (``committed``, ``seconds``, ``stopped``); ServerError if the worker failed. ``log`` hears what
    the bridge fits of the server's worker say, as a run in process does (trial AF: nothing)."""
    t0, seen = time.monotonic(), 0  # committed by the worker so far (trial AM: done, 947/900, counted adds)
    told = {key for key, _ in _fit_lines(client)} if log is not None else set()
    while True:
        st = client.backfill_status()
        if log is not None:
            for key, line in _fit_lines(client):
                if key not in told:
                    told.add(key)
                    log(line)
        now = _committed(before, st)["committed"]
        if progress is not None and now > seen:
            progress(now - seen)
        seen = max(seen, now)
        if st.get("error"):
            raise ServerError(500, f"the server's backfill worker stopped: {st['error']}", "backfill")
        if st["state"] in ("paused", "none") or st.get("worker") == "idle":
            break  # (done: once the server's worker has also run the last bridge fit, as a run in process does)
        time.sleep(poll_s)
    stopped = "done" if st["state"] == "done" else st.get("worker_stopped") or st["state"]
    return {**st, **_committed(before, st), "seconds": round(time.monotonic() - t0, 2), "stopped": stopped, "busy": []}


def _committed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """What the server's worker committed between the statuses ``before`` and ``after`` (the same
    thread's counts then and now, or the whole run of one started since), as a run in process
    reports it; from a server without ``worker_run``: the growth of ``done`` (which counts items
    added meanwhile too)."""
    run, was = after.get("worker_run"), before.get("worker_run")
    if not run:
        return {"committed": after["done"] - before["done"], "sample_committed": 0}
    base = was if was and was["run"] == run["run"] else {"committed": 0, "sample_committed": 0}
    return {k: run[k] - base[k] for k in ("committed", "sample_committed")}


def _str(p: str | Path | None) -> str | None:
    return None if p is None else str(p)


def _segment(item_id: Any, call: str = "get") -> str:
    """An item id as one URL path segment (every reserved character escaped: '?', '#', '%'...);
    NotFound for what is no string, as in process (no item has such an id)."""
    from urllib.parse import quote

    return quote(check_item_id(item_id, call), safe="")


def _filter(flt: Any) -> dict[str, Any] | None:
    """A search's metadata filter checked as in process, nested objects as dotted keys
    (``{"labels": {"colour": "red"}}`` -> ``{"labels.colour": "red"}``: the form of an image search
    takes flat objects only); InvalidRequest naming ``filter``."""
    from ..search.filters import check_filter

    try:
        return check_filter(flt)
    except ValueError as e:
        raise InvalidRequest(422, str(e), "filter") from None


def _image_bytes(image: Any) -> bytes:
    """An image query's bytes: a file's, bytes as given, a PIL image as PNG."""
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if isinstance(image, (str, Path)):
        return Path(image).read_bytes()
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise InvalidRequest(422, f"image: a path, bytes or a PIL image, got {type(image).__name__}", "image")
    buf = io.BytesIO()
    try:
        image.save(buf, format="PNG")
    except (OSError, ValueError):  # a mode PNG does not store (CMYK...)
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="PNG")
    return buf.getvalue()
