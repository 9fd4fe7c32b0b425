"""A small Python client of ``nobackfill serve`` (used by the tests and the load benchmark).

    from nobackfill.client import Client
    c = Client("http://127.0.0.1:8000", key="...")
    c.search(text="a red circle", k=10)["hits"]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import httpx

__all__ = ["Client", "ServiceError"]


#: the part header that names an uploaded image's item id
ID_HEADER = "X-Item-Id"


class ServiceError(RuntimeError):
    """A 4xx / 5xx answer: ``status`` and the server's ``detail`` and ``field`` (the request field to
    blame, or None)."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail, self.field = status, detail, field


class Client:
    """Calls of the v1 API with one API key."""

    def __init__(self, base_url: str, key: str, *, timeout: float = 60.0, http: httpx.Client | None = None) -> None:
        self.http = http or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)
        self.headers = {"Authorization": f"Bearer {key}"}

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = self.http.request(method, path, headers=self.headers, **kw)
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"detail": r.text}
            raise ServiceError(r.status_code, body.get("detail", ""), body.get("field"))
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.content

    def search(self, *, text: str | None = None, image: str | Path | bytes | None = None, k: int = 10,
               target: str | None = None, filter: dict | None = None) -> dict:
        """Hits of a text query, or of an image (a path or its bytes)."""
        if (text is None) == (image is None):
            raise ValueError("give exactly one of text= or image=")
        if text is not None:
            body: dict[str, Any] = {"text": text, "k": k}
            if target:
                body["target"] = target
            if filter:
                body["filter"] = filter
            return self._call("POST", "/v1/search", json=body)
        data = Path(image).read_bytes() if not isinstance(image, bytes) else image
        form = {"k": str(k), **({"target": target} if target else {}),
                **({"filter": json.dumps(_flat(filter), ensure_ascii=False)} if filter else {})}
        return self._call("POST", "/v1/search", files={"image": ("query.png", data)}, data=form)

    def add_texts(self, items: Sequence[dict]) -> dict:
        """``[{"text": .., "id": .. (optional), ...metadata}]``."""
        return self._call("POST", "/v1/items", json={"items": list(items)})

    def add_images(self, images: Sequence[str | Path], ids: Sequence[str | None] | None = None) -> dict:
        """Image files, each with its id from ``ids`` (None: the id from the image's content), sent
        as one part each with the id in the part's ``X-Item-Id`` header."""
        ids = list(ids) if ids is not None else [None] * len(images)
        if len(ids) != len(images):
            raise ValueError(f"{len(ids)} ids for {len(images)} images")
        files = [("images", (Path(p).name, Path(p).read_bytes(), "application/octet-stream",
                             {ID_HEADER: own} if own is not None else {}))
                 for p, own in zip(images, ids)]
        return self._call("POST", "/v1/items", files=files)

    def get(self, item_id: str) -> dict:
        return self._call("GET", f"/v1/items/{_segment(item_id)}")

    def thumbnail(self, item_id: str, size: int = 160) -> bytes:
        return self._call("GET", f"/v1/items/{_segment(item_id)}/thumbnail", params={"size": size})

    def delete(self, item_id: str) -> dict:
        return self._call("DELETE", f"/v1/items/{_segment(item_id)}")

    def status(self) -> dict:
        return self._call("GET", "/v1/status")

    def backfill_start(self, order: str = "uncertainty", rate: float | None = None) -> dict:
        return self._call("POST", "/v1/backfill/start", json={"order": order, **({"rate": rate} if rate else {})})

    def backfill_pause(self) -> dict:
        return self._call("POST", "/v1/backfill/pause")

    def backfill_resume(self, order: str = "uncertainty") -> dict:
        return self._call("POST", "/v1/backfill/resume", json={"order": order})

    def upgrade(self, model: str, bridges: Sequence[str] = (), calibrate: str | None = None,
                calibrate_split: str = "val", calibrate_limit: int | None = None) -> dict:
        """``model`` relative to the server's ``--models-root``, ``bridges`` to its ``--upgrades-root``,
        ``calibrate`` to its ``--data-root``."""
        body = {"model": model, "bridges": list(bridges), "calibrate": calibrate, "calibrate_split": calibrate_split,
                "calibrate_limit": calibrate_limit}
        return self._call("POST", "/v1/upgrade", json=body)

    def healthz(self) -> dict:
        return self._call("GET", "/healthz")


def _segment(item_id: str) -> str:
    """An item id as one URL path segment (every reserved character escaped: '?', '#', '%'...)."""
    from urllib.parse import quote

    return quote(item_id, safe="")


def _flat(flt: dict, prefix: str = "") -> dict:
    """A filter with nested objects as dotted keys (``{"labels": {"colour": "red"}}`` ->
    ``{"labels.colour": "red"}``): the form of an image search takes flat objects only."""
    out: dict = {}
    for key, value in flt.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
