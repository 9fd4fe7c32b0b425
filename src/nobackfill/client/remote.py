"""The client over HTTP: every call of :class:`~nobackfill.client.Client` sent to a running
``nobackfill serve`` (``Client("http://127.0.0.1:8000", api_key=...)``). Paths (a model, a bridge,
an import's files, calibration data) are relative to the roots the server was started with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import httpx

from .base import Client
from .types import AddResult, ClientError, ImportResult, ItemInfo, SearchResults, UpgradeResult

__all__ = ["ID_HEADER", "RemoteClient"]

#: the part header that names an uploaded image's item id
ID_HEADER = "X-Item-Id"


class RemoteClient(Client):
    """:class:`Client` over the v1 HTTP API with one API key (``http``: an ``httpx.Client`` to use
    instead, e.g. FastAPI's TestClient)."""

    def __init__(self, target: str, api_key: str | None = None, *, timeout: float = 60.0,
                 http: httpx.Client | None = None) -> None:
        self.target = target.rstrip("/")
        self.http = http or httpx.Client(base_url=self.target, timeout=timeout)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def __repr__(self) -> str:
        return f"RemoteClient({self.target!r})"

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, path, headers=self.headers, **kw)
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"detail": r.text}
            raise ClientError(r.status_code, body.get("detail", ""), body.get("field"))
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.content

    # ------------------------------------------------------------------ create / add / import
    def create(self, model: str | Path, *, backend: str = "auto") -> dict[str, Any]:
        raise ClientError(405, "a server serves one existing collection: create it where it is stored "
                               "(Client(path).create(...) or `nobackfill collection create`)", "create")

    def add(self, *, texts: Sequence[str | Mapping[str, Any]] | None = None, images: Sequence[str | Path] | None = None,
            ids: Sequence[str | None] | None = None, **kw: Any) -> AddResult:
        if kw:
            raise ClientError(422, f"over HTTP, add takes texts= or images= (and ids=); not {sorted(kw)}",
                              sorted(kw)[0])
        if (texts is None) == (images is None):
            raise ValueError("give exactly one of texts= or images=")
        rows = list(texts if texts is not None else images)
        own = list(ids) if ids is not None else [None] * len(rows)
        if len(own) != len(rows):
            raise ValueError(f"{len(own)} ids for {len(rows)} {'texts' if texts is not None else 'images'}")
        if texts is not None:
            items = []
            for row, i in zip(rows, own):
                row = {"text": row} if isinstance(row, str) else dict(row)
                if i is not None and "id" not in row:
                    row["id"] = i
                items.append(row)
            return AddResult.from_dict(self._call("POST", "/v1/items", json={"items": items}))
        files = [("images", (Path(p).name, Path(p).read_bytes(), "application/octet-stream",
                             {ID_HEADER: i} if i is not None else {}))
                 for p, i in zip(rows, own)]
        return AddResult.from_dict(self._call("POST", "/v1/items", files=files))

    def import_(self, source: str, *, table: str | Path | None = None, id_column: str | None = None,
                source_column: str | None = None, modality: str | None = None, images_root: str | Path | None = None,
                trust_model: bool = False, lossy: bool = False, **kw: Any) -> ImportResult:
        fmt, sep, path = source.partition(":")
        if not sep:
            raise ValueError(f"source must look like FORMAT:PATH (clip-retrieval:DIR, npy:FILE ...), got {source!r}")
        if kw:
            raise ClientError(422, f"over HTTP, import takes no {sorted(kw)}", sorted(kw)[0])
        body = {"format": fmt, "path": path, "table": _str(table), "id_column": id_column,
                "source_column": source_column, "modality": modality, "images_root": _str(images_root),
                "trust_model": trust_model, "lossy": lossy}
        return ImportResult.from_dict(self._call("POST", "/v1/import", json={k: v for k, v in body.items()
                                                                            if v is not None}))

    # ------------------------------------------------------------------ plan changes
    def upgrade(self, model: str | Path, *, bridges: Sequence[str | Path] = (), calibrate: str | Path | None = None,
                calibrate_split: str = "val", calibrate_limit: int | None = None,
                calibrate_langs: Sequence[str] | str = ("en",), log: Any = None,
                fit_bridges: bool | None = None) -> UpgradeResult:
        """(``log`` is not used: the server logs its upgrade.)"""
        langs = calibrate_langs if isinstance(calibrate_langs, str) else ",".join(calibrate_langs)
        body = {"model": str(model), "bridges": [str(b) for b in bridges], "calibrate": _str(calibrate),
                "calibrate_split": calibrate_split, "calibrate_limit": calibrate_limit, "calibrate_langs": langs,
                "fit_bridges": fit_bridges}
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
        return self._call("POST", "/v1/retire", json={"space": space, "drop_unsourced": drop_unsourced})

    # ------------------------------------------------------------------ reads
    def search(self, *, text: str | None = None, image: str | Path | bytes | None = None, k: int = 10,
               target: str | None = None, filter: Mapping[str, Any] | None = None,
               merge: str | None = None) -> SearchResults:
        if (text is None) == (image is None):
            raise ValueError("give exactly one of text= or image=")
        if text is not None:
            body: dict[str, Any] = {"text": text, "k": k, "target": target, "filter": filter, "merge": merge}
            return SearchResults.from_dict(self._call("POST", "/v1/search", json={k_: v for k_, v in body.items()
                                                                                  if v is not None}))
        if merge is not None:
            raise ClientError(422, "merge is taken with a text query only", "merge")
        data = Path(image).read_bytes() if not isinstance(image, bytes) else image
        form = {"k": str(k), **({"target": target} if target else {}),
                **({"filter": json.dumps(_flat(filter), ensure_ascii=False)} if filter else {})}
        return SearchResults.from_dict(self._call("POST", "/v1/search", files={"image": ("query.png", data)}, data=form))

    def get(self, item_id: str) -> ItemInfo:
        return ItemInfo.from_dict(self._call("GET", f"/v1/items/{_segment(item_id)}"))

    def thumbnail(self, item_id: str, size: int = 160) -> bytes:
        """A PNG of an image item, at most ``size`` pixels on its longer side."""
        return self._call("GET", f"/v1/items/{_segment(item_id)}/thumbnail", params={"size": size})

    def delete(self, *ids: str) -> int:
        if len(ids) != 1:  # the API deletes one item a request: all or nothing holds for one
            raise ClientError(422, "over HTTP, delete takes one id a call", "ids")
        self._call("DELETE", f"/v1/items/{_segment(ids[0])}")
        return 1

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def verify(self, *, repair: bool = False, model_check: bool = False) -> dict[str, Any]:
        if repair:
            raise ClientError(422, "over HTTP, verify only reads: repair offline with `nobackfill verify --repair`",
                              "repair")
        return self._call("POST", "/v1/verify", json={"model_check": model_check})

    def healthz(self) -> dict[str, Any]:
        """Liveness: ``{"ok", "generation", "models"}`` (no key needed)."""
        return self._call("GET", "/healthz")

    # ------------------------------------------------------------------ the backfill
    def backfill_start(self, order: str = "uncertainty", rate: float | None = None, **kw: Any) -> dict[str, Any]:
        if kw.pop("wait", False) or kw:
            raise ClientError(422, "over HTTP, the backfill runs in the server: start takes order= and rate=",
                              "wait")
        return self._call("POST", "/v1/backfill/start", json={"order": order, **({"rate": rate} if rate else {})})

    def backfill_pause(self) -> dict[str, Any]:
        return self._call("POST", "/v1/backfill/pause")

    def backfill_resume(self, order: str = "uncertainty", rate: float | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/backfill/resume", json={"order": order, **({"rate": rate} if rate else {})})

    def backfill_cancel(self) -> dict[str, Any]:
        return self._call("POST", "/v1/backfill/cancel")

    def backfill_status(self) -> dict[str, Any]:
        return self.status()["backfill"]


def _str(p: str | Path | None) -> str | None:
    return None if p is None else str(p)


def _segment(item_id: str) -> str:
    """An item id as one URL path segment (every reserved character escaped: '?', '#', '%'...)."""
    from urllib.parse import quote

    return quote(item_id, safe="")


def _flat(flt: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A filter with nested objects as dotted keys (``{"labels": {"colour": "red"}}`` ->
    ``{"labels.colour": "red"}``): the form of an image search takes flat objects only."""
    out: dict[str, Any] = {}
    for key, value in flt.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
