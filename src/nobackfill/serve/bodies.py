"""Request bodies as the service reads them: the Content-Type an operation takes, strict JSON, the
multipart forms of ``/v1/search`` and ``/v1/items`` (every part checked), uploaded images (decoded
with their limits, kept by content hash, thumbnailed), and :class:`LimitsAndMetrics`, the middleware
that refuses a body over the size limit before or while it is read.

Every refusal is an :class:`~nobackfill.serve.errors.ApiError` naming the field or part to blame.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from pathlib import Path
from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..client.errors import API_HEADER
from ..client.upload import MAX_METADATA_BYTES, METADATA_HEADER, RESERVED_METADATA, added_id_problem
from .errors import ApiError, error_response, validation_error
from .schema import FILTER_FIELD, ID_HEADER

__all__ = ["LimitsAndMetrics", "check_parts", "content_type", "decode_image", "form", "form_filter", "form_int",
           "form_json", "json_body", "keep_upload", "parse_json", "part_id", "part_metadata", "read_form",
           "thumbnail_png"]


# ----------------------------------------------------------------------------- content types, JSON
def content_type(request: Request, *, multipart: bool) -> str:
    """``json`` or ``multipart`` (where the operation takes it) from the Content-Type; 415 else. No
    Content-Type at all is read as JSON."""
    raw = request.headers.get("content-type")
    if raw is None:
        return "json"
    main = raw.split(";", 1)[0].strip().lower()
    if main == "application/json" or (main.startswith("application/") and main.endswith("+json")):
        return "json"
    if multipart and main == "multipart/form-data":
        return "multipart"
    takes = "application/json or multipart/form-data" if multipart else "application/json"
    raise ApiError(415, f"content-type: {main or raw!r} is not taken here (send {takes})", "content-type")


def parse_json(raw: bytes, *, constants: bool = False) -> Any:
    """Strict JSON (RFC 8259: UTF-8, no lone surrogates); 400 else. ``NaN`` / ``Infinity`` /
    ``-Infinity`` are refused unless ``constants``: then they read as floats (as ``1e400`` reads as
    infinity), so the validation after names the item and field that holds one."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=None if constants else constant)
        json.dumps(obj, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    except (ValueError, UnicodeError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(400, f"malformed JSON: {e}" if raw.strip() else "malformed JSON: the body is empty",
                       "body") from None
    return obj


async def json_body(request: Request, model: Any) -> Any:
    """The request's JSON body validated by ``model`` (strict: 400 malformed, 422 invalid)."""
    from pydantic import ValidationError

    obj = parse_json(await request.body(), constants=True)  # NaN is refused by the 422 naming its field
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


# ----------------------------------------------------------------------------- multipart forms
async def form(request: Request, *, files: dict[str, tuple[int, int]], fields: dict[str, int]):
    """The multipart form, every part checked: ``files`` (name -> (min, max) count) must be file
    parts, ``fields`` (name -> max count) plain fields; any other part is refused. 422 naming the part."""
    parts = await read_form(request)
    try:
        check_parts(parts, files, fields)
    except ApiError:
        await parts.close()
        raise
    return parts


def check_parts(form, files: dict[str, tuple[int, int]], fields: dict[str, int]) -> None:
    """422 for a part :func:`form` does not take, or one of the wrong kind or count."""
    allowed = [*files, *fields]
    for name in form.keys():
        if name not in allowed:
            raise ApiError(422, f"{name}: unknown part (this operation takes {', '.join(allowed)})", name)
    for name, (lo, hi) in files.items():
        parts = form.getlist(name)
        for i, part in enumerate(parts):
            if not isinstance(part, UploadFile):
                at = f"{name}[{i}]" if hi > 1 else name
                raise ApiError(422, f"{at}: must be a file part (a filename or an image Content-Type), not a "
                                    "plain field", at)
        if len(parts) < lo:
            raise ApiError(422, f"{name}: a file part named {name!r} is required", name)
        if len(parts) > hi:
            raise ApiError(422, f"{name}: {len(parts)} files, the limit is {hi} per request", name)
    for name, hi in fields.items():
        parts = form.getlist(name)
        for i, part in enumerate(parts):
            if not isinstance(part, str):
                at = f"{name}[{i}]" if hi > 1 else name
                raise ApiError(422, f"{at}: must be a plain field, not a file part", at)
        if len(parts) > hi:
            raise ApiError(422, f"{name}: given {len(parts)} times, at most {hi}", name)


async def read_form(request: Request):
    """The multipart body, a part counted as a file when it has a filename or a Content-Type other
    than text (RFC 7578: a part's type defaults to text/plain; data carries its own), so an image
    sent without a filename stays bytes. 400 for a body that does not parse."""
    from starlette.formparsers import MultiPartException, MultiPartParser, parse_options_header

    class Parser(MultiPartParser):
        ended = False

        def on_headers_finished(self) -> None:
            part = self._current_part
            ctype = dict(part.item_headers).get(b"content-type", b"").split(b";")[0].strip().lower()
            _, options = parse_options_header(part.content_disposition)
            if b"filename" not in options and ctype and not ctype.startswith(b"text/"):
                part.content_disposition += b'; filename=""'
            super().on_headers_finished()

        def on_end(self) -> None:
            self.ended = True

        def part_at(self) -> str | None:
            """The part being read, named as the request's errors name it (``images[1]``)."""
            _, options = parse_options_header(self._current_part.content_disposition)
            name = options.get(b"name", b"").decode("latin-1")
            return f"{name}[{sum(n == name for n, _ in self.items)}]" if name else None

    parser = Parser(request.headers, request.stream())
    try:
        parsed = await parser.parse()
    except MultiPartException as e:
        cause = str(e.__cause__ or "")
        if "header size" in cause:  # python-multipart's bound on one header line of a part
            at = parser.part_at()
            raise ApiError(422, f"{at or 'a part'}: a header line is too long ({METADATA_HEADER} holds at most "
                                f"{MAX_METADATA_BYTES} bytes)", at or "body") from None
        raise ApiError(400, f"malformed multipart body: {e.message}", "body") from None
    if not parser.ended:
        raise ApiError(400, "malformed multipart body: it ends before its closing boundary", "body")
    return parsed


def part_id(part: UploadFile, i: int) -> str | None:
    """The item id an image part names in its ``X-Item-Id`` header (None: one from its content)."""
    own = part.headers.get(ID_HEADER)
    if own is None:
        return None
    try:  # part headers arrive as bytes read as latin-1; an id is UTF-8
        own = own.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    if (problem := added_id_problem(own)) is not None:
        raise ApiError(422, f"images[{i}]: {ID_HEADER} {problem}", f"images[{i}]")
    return own


def part_metadata(part: UploadFile, i: int) -> dict[str, Any]:
    """The metadata an image part carries in its ``X-Item-Metadata`` header: a JSON object (strict
    UTF-8 JSON of at most :data:`MAX_METADATA_BYTES` bytes) without the keys the server sets
    (:data:`RESERVED_METADATA`); 422 naming the part."""
    raw = part.headers.get(METADATA_HEADER)
    if raw is None:
        return {}
    at, data = f"images[{i}]", raw.encode("latin-1")  # the header's bytes, as they came
    if len(data) > MAX_METADATA_BYTES:
        raise ApiError(422, f"{at}: {METADATA_HEADER} is {len(data)} bytes, at most {MAX_METADATA_BYTES}", at)
    try:
        meta = parse_json(data)  # (a NaN here: not valid JSON, 422 naming the part and the header)
    except ApiError:
        raise ApiError(422, f"{at}: {METADATA_HEADER} is not valid JSON", at) from None
    if not isinstance(meta, dict):
        raise ApiError(422, f"{at}: {METADATA_HEADER} must be a JSON object, got {json.dumps(meta)[:40]}", at)
    reserved = [k for k in RESERVED_METADATA if k in meta]
    if reserved:
        raise ApiError(422, f"{at}: {METADATA_HEADER} may not hold {', '.join(map(repr, reserved))} (the server "
                            f"sets them; an id goes in {ID_HEADER})", at)
    return meta


def form_int(value: Any, field: str, lo: int, hi: int) -> int:
    """An integer form field: its text as a JSON number with no fraction (``7``, ``7.0``, ``7e0``)."""
    try:
        number = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        number = None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool):
        raise ApiError(422, f"{field}: not an integer: {value!r}", field)
    if not lo <= number <= hi:
        raise ApiError(422, f"{field}: must be between {lo} and {hi}, got {number}", field)
    return number


def form_json(value: Any, field: str) -> Any:
    """A form field holding JSON (None when absent); 422 naming ``field`` when it is not JSON."""
    if value is None:
        return None
    try:
        return parse_json(value.encode("utf-8"))
    except (ApiError, UnicodeError):
        raise ApiError(422, f"{field}: not valid JSON", field) from None


def form_filter(value: str | None) -> dict | None:
    """The ``filter`` field of an image search: a flat JSON object (exactly the schema's pattern)."""
    if value is None:
        return None
    if not re.search(FILTER_FIELD, value):
        raise ApiError(422, "filter: a JSON object {key: value | [values]} whose values are strings, numbers, "
                            "booleans, null or lists of them", "filter")
    return form_json(value, "filter")


# ----------------------------------------------------------------------------- uploaded images
def decode_image(data: bytes, lim, field: str):
    """An RGB PIL image from uploaded bytes as a person sees it (:func:`~nobackfill.data.images.to_rgb`:
    EXIF orientation, every mode), refusing non-images, corrupt files and pixel bombs."""
    from PIL import Image

    from ..data.images import to_rgb

    if not data:
        raise ApiError(422, f"{field}: empty file", field)
    if len(data) > lim.max_image_bytes:
        raise ApiError(413, f"{field}: {len(data)} bytes, the limit is {lim.max_image_bytes}", field)
    try:
        im = Image.open(io.BytesIO(data))
        w, h = im.size
    except Image.DecompressionBombError as e:
        raise ApiError(413, f"{field}: too many pixels ({e}), the limit is {lim.max_image_pixels}", field) from None
    except Exception as e:
        raise ApiError(422, f"{field}: not an image ({type(e).__name__})", field) from None
    if w * h > lim.max_image_pixels:
        raise ApiError(413, f"{field}: {w}x{h} pixels, the limit is {lim.max_image_pixels}", field)
    try:
        im.load()
        out = to_rgb(im)
        out.load()
        return out
    except MemoryError:
        raise ApiError(413, f"{field}: too large to decode", field) from None
    except Exception as e:
        raise ApiError(422, f"{field}: corrupt image ({type(e).__name__}: {e})", field) from None


def keep_upload(folder: Path, data: bytes) -> tuple[Path, str, bool]:
    """Store an uploaded image by its content hash (atomic, idempotent): its item's source, the
    sha256 of its bytes (so the item need not read the file back to hash it) and whether this call
    created the file."""
    from ..gallery.atomic_files import atomic_write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest[:32]}.img"
    if path.exists():
        return path, digest, False
    atomic_write_bytes(path, data)
    return path, digest, True


def thumbnail_png(path: Path, size: int) -> bytes:
    """A PNG of the image at ``path``, at most ``size`` pixels on its longer side; 404 if unreadable."""
    from PIL import Image

    from ..data.images import to_rgb

    try:
        with Image.open(path) as im:
            im.draft("RGB", (size * 2, size * 2))  # JPEG: decode at a reduced scale
            rgb = to_rgb(im)
            rgb = rgb.copy() if rgb is im else rgb
            rgb.thumbnail((size, size))
            buf = io.BytesIO()
            rgb.save(buf, format="PNG")
            return buf.getvalue()
    except (OSError, ValueError) as e:
        raise ApiError(404, f"the item's image is not readable here ({e.__class__.__name__})", "id") from None


# ----------------------------------------------------------------------------- the body limit
class _TooLarge(StarletteHTTPException):
    """A body that grows past the limit while it is read (chunked, or longer than it said)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body exceeds the limit of {limit} bytes")
        self.field = "body"


class LimitsAndMetrics:
    """Pure ASGI middleware (no per-request task, unlike ``@app.middleware``): refuses a body whose
    declared length is over the limit before it is read (and one that grows past it while read),
    answers 404 for a path whose segment holds an encoded '/' (it would route elsewhere once
    decoded), and records each request's count and latency by route for ``/metrics``."""

    def __init__(self, app, *, max_body: int, service) -> None:
        self.app, self.max_body, self.svc = app, int(max_body), service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _marked(send)
        refused = self._refused(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = {"code": 500}
        seen = {"bytes": 0}

        async def counted() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
                if seen["bytes"] > self.max_body:
                    raise _TooLarge(self.max_body)
            return message

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, counted, send_status)
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            self.svc.m_requests.labels(endpoint, scope["method"], str(status["code"])).inc()
            self.svc.m_latency.labels(endpoint).observe(time.perf_counter() - t0)

    def _refused(self, scope):
        """The error for a request refused before it is read (a Content-Length that is no number or
        over the limit, an encoded '/' in the path), or None."""
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return error_response(400, "content-length: not a number", "content-length")
            if int(length) > self.max_body:
                return error_response(413, f"body of {int(length)} bytes exceeds the limit of {self.max_body}",
                                      "body")
        if b"%2f" in (scope.get("raw_path") or b"").lower():
            return error_response(404, f"not found: {scope['method']} {scope['path']} (a path segment holds an "
                                       "encoded '/')", "path")
        return None


#: the header on every answer, by which a client knows it reached this API
_API_HEADER = (API_HEADER.encode(), b"v1")


def _marked(send):
    """``send`` adding :data:`_API_HEADER` to a response's start."""

    async def marked(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), _API_HEADER]}
        await send(message)

    return marked
