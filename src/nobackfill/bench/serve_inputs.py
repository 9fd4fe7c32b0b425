"""Bad input against a live ``nobackfill serve`` (``bench serve``): every class of
:func:`bad_input_cases` must get a 4xx whose message names the problem and leave the collection
unchanged."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

READ_KEY, ADMIN_KEY = "bench-read-key-0001", "bench-admin-key-0001"


def png(size: tuple[int, int] = (16, 16), seed: int = 0, noise: bool = True) -> bytes:
    """A PNG of random pixels, or (``noise=False``) of one colour: a few hundred kB for a huge image."""
    from PIL import Image

    buf = io.BytesIO()
    img = (Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)) if noise
           else Image.new("RGB", size, (200, 30, 30)))
    img.save(buf, "PNG")
    return buf.getvalue()


def bad_input_cases(read_key: str, admin_key: str, *, max_k: int, max_caption: int, max_batch: int,
                    max_pixels: int, max_body: int) -> list[dict[str, Any]]:
    """Classes of bad input: each ``{"name", "method", "path", "kw" (httpx kwargs), "key" (or None),
    "status", "words"}``: the status and the words its message must contain."""
    side = int(max_pixels ** 0.5) + 8
    return [
        {"name": "no key", "method": "POST", "path": "/v1/search", "kw": {"json": {"text": "x"}}, "key": None,
         "status": 401, "words": ["API key"]},
        {"name": "wrong key", "method": "POST", "path": "/v1/search", "kw": {"json": {"text": "x"}},
         "key": "not-a-key-at-all", "status": 401, "words": ["API key"]},
        {"name": "read key writes", "method": "POST", "path": "/v1/items", "kw": {"json": {"items": [{"text": "x"}]}},
         "key": read_key, "status": 403, "words": ["admin"]},
        {"name": "malformed JSON", "method": "POST", "path": "/v1/search",
         "kw": {"content": b"{oops", "headers": {"content-type": "application/json"}}, "status": 400,
         "words": ["malformed JSON"]},
        {"name": "wrong type", "method": "POST", "path": "/v1/search", "kw": {"json": {"text": "x", "k": "many"}},
         "status": 422, "words": ["k"]},
        {"name": "missing field", "method": "POST", "path": "/v1/search", "kw": {"json": {"k": 3}}, "status": 422,
         "words": ["text"]},
        {"name": "unknown field", "method": "POST", "path": "/v1/search", "kw": {"json": {"text": "x", "kk": 3}},
         "status": 422, "words": ["kk"]},
        {"name": "empty query", "method": "POST", "path": "/v1/search", "kw": {"json": {"text": "   "}},
         "status": 422, "words": ["text", "empty"]},
        {"name": "k out of range", "method": "POST", "path": "/v1/search", "kw": {"json": {"text": "x", "k": max_k + 1}},
         "status": 422, "words": ["k", str(max_k)]},
        {"name": "unknown merge", "method": "POST", "path": "/v1/search",
         "kw": {"json": {"text": "x", "merge": "best"}}, "status": 422, "words": ["merge"]},
        {"name": "filter value of another type", "method": "POST", "path": "/v1/search",
         "kw": {"json": {"text": "x", "filter": {"labels.colour": [["red"]]}}}, "status": 422,
         "words": ["filter", "labels.colour"]},
        {"name": "filter object value", "method": "POST", "path": "/v1/search",
         "kw": {"json": {"text": "x", "filter": {"labels": {"colour": "red"}}}}, "status": 422,
         "words": ["filter", "dotted keys", "labels.colour"]},
        {"name": "filter too large", "method": "POST", "path": "/v1/search",
         "kw": {"json": {"text": "x", "filter": {f"k{i}": i for i in range(1000)}}}, "status": 422,
         "words": ["filter", "keys"]},
        {"name": "image search filter too large", "method": "POST", "path": "/v1/search",
         "kw": {"files": {"image": ("q.png", png())},
                "data": {"filter": '{"labels.n": [' + ", ".join(map(str, range(5000))) + "]}"}}, "status": 422,
         "words": ["filter", "values"]},
        {"name": "caption too long", "method": "POST", "path": "/v1/items",
         "kw": {"json": {"items": [{"text": "y" * (max_caption + 1)}]}}, "status": 422,
         "words": ["items[0].text", str(max_caption)]},
        {"name": "batch too big", "method": "POST", "path": "/v1/items",
         "kw": {"json": {"items": [{"text": f"t{i}"} for i in range(max_batch + 1)]}}, "status": 422,
         "words": ["items", str(max_batch)]},
        {"name": "same id, other content", "method": "POST", "path": "/v1/items",
         "kw": {"json": {"items": [{"text": "a", "id": "dup"}, {"text": "b", "id": "dup"}]}}, "status": 409,
         "words": ["'dup'"]},
        {"name": "not an image", "method": "POST", "path": "/v1/search",
         "kw": {"files": {"image": ("q.png", b"this is text")}}, "status": 422, "words": ["image", "not an image"]},
        {"name": "corrupt image", "method": "POST", "path": "/v1/items",
         "kw": {"files": {"images": ("q.png", png()[:60])}}, "status": 422, "words": ["images[0]"]},
        {"name": "image metadata not a JSON object", "method": "POST", "path": "/v1/items",
         "kw": {"files": [("images", ("a.png", png(seed=1), "image/png", {})),
                          ("images", ("b.png", png(seed=2), "image/png", {"X-Item-Metadata": "[1, 2]"}))]},
         "status": 422, "words": ["images[1]", "X-Item-Metadata"]},
        {"name": "image metadata naming the server's path", "method": "POST", "path": "/v1/items",
         "kw": {"files": [("images", ("a.png", png(seed=1), "image/png", {"X-Item-Metadata": '{"path": "/etc"}'}))]},
         "status": 422, "words": ["images[0]", "'path'"]},
        {"name": "pixel bomb", "method": "POST", "path": "/v1/search",
         "kw": {"files": {"image": ("q.png", png(size=(side, side), noise=False))}}, "status": 413, "words": ["image", "pixels"]},
        {"name": "oversize body", "method": "POST", "path": "/v1/items",
         "kw": {"files": {"images": ("q.png", b"x" * (max_body + 1000))}}, "status": 413, "words": ["body", "limit"]},
        {"name": "unknown id", "method": "DELETE", "path": "/v1/items/no-such-item", "kw": {}, "status": 404,
         "words": ["no-such-item"]},
        {"name": "path outside the models root", "method": "POST", "path": "/v1/upgrade",
         "kw": {"json": {"model": "../../etc"}}, "status": 400, "words": ["model", "outside"]},
        {"name": "missing model dir", "method": "POST", "path": "/v1/upgrade",
         "kw": {"json": {"model": "nothing-here"}}, "status": 404, "words": ["model"]},
        {"name": "not a model dir", "method": "POST", "path": "/v1/upgrade", "kw": {"json": {"model": "docs"}},
         "status": 422, "words": ["model", "config.json"]},
    ]


def _state(collection: Path) -> tuple:
    from ..collection.collection import Collection

    c = Collection.open(collection)
    st = c.status()
    return c.generation, st["items"], sorted(c.items())


def run_bad_inputs(url: str, collection: Path, limits: dict[str, int]) -> dict[str, Any]:
    """Every case of :func:`bad_input_cases` for the server's own ``limits`` (from ``/v1/status``)."""
    import httpx

    cases = bad_input_cases(READ_KEY, ADMIN_KEY, max_k=limits["max_k"], max_caption=limits["max_caption_chars"],
                            max_batch=limits["max_batch"], max_pixels=limits["max_image_pixels"],
                            max_body=limits["max_body_bytes"])
    out = {"tried": 0, "clear_4xx": 0, "store_unchanged": 0, "cases": []}
    with httpx.Client(base_url=url, timeout=60) as http:
        for case in cases:
            before = _state(collection)
            kw = dict(case["kw"])
            headers = dict(kw.pop("headers", {}))
            key = case.get("key", ADMIN_KEY)
            if key is not None:
                headers["Authorization"] = f"Bearer {key}"
            r = http.request(case["method"], case["path"], headers=headers, **kw)
            try:
                detail = r.json().get("detail", "")
            except ValueError:
                detail = r.text
            clear = r.status_code == case["status"] and all(w in detail for w in case["words"])
            same = _state(collection) == before
            out["tried"] += 1
            out["clear_4xx"] += clear
            out["store_unchanged"] += same
            out["cases"].append({"name": case["name"], "status": r.status_code, "detail": detail[:200],
                                 "clear": clear, "unchanged": same})
    return out


__all__ = ["ADMIN_KEY", "READ_KEY", "bad_input_cases", "png", "run_bad_inputs"]
