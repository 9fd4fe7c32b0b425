"""The API's types: request bodies (with every constraint the service enforces, so the OpenAPI
schema says what is validated), response bodies, the one error body, and the OpenAPI document built
from them (``GET /openapi.json``; ``schemathesis`` checks it against the running service).

Request models depend on the server's :class:`~nobackfill.serve.settings.Limits` (``k``, caption
length, batch size), so :func:`request_models` builds them per app. The response bodies live in
:mod:`~nobackfill.serve.responses` (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from ..client.upload import ID_HEADER, ID_PATTERN, ID_RULE, MAX_METADATA_BYTES, METADATA_HEADER, RESERVED_METADATA
from ..collection.collection import MAX_ID_LENGTH
from ..search.filters import MAX_FILTER_KEYS, MAX_FILTER_VALUES

from .responses import (AddResult, BackfillStatus, Deleted, Health, Hit, ImportResult, IndexBuilds, ItemOut,
                        Retired, Routes, SearchResults, SpaceStatus, Status, UpgradeResult, VerifyReport)

__all__ = ["ERROR_STATUSES", "FILTER_FIELD", "ID_HEADER", "ID_PATTERN", "IMAGE_TYPES", "METADATA_HEADER", "NONBLANK",
           "REL_PATH",
           "BackfillRequest", "CalibrateRequest", "ErrorBody", "ImportRequest", "RequestModels", "RetireRequest",
           "RouteRequest", "UpgradeRequest", "VerifyRequest", "any_request_errors", "errors", "finish_openapi",
           "form_encodings", "item_links", "json_or_form", "request_models",
           # the response bodies (:mod:`~nobackfill.serve.responses`)
           "AddResult", "BackfillStatus", "Deleted", "Health", "Hit", "ImportResult", "IndexBuilds", "ItemOut", "Retired", "Routes",
           "SearchResults", "SpaceStatus", "Status", "UpgradeResult", "VerifyReport"]

#: a text with at least one character that is white space neither to JSON Schema's regular
#: expressions (ECMA-262 ``\s``) nor to Python (``str.isspace``, what ``strip`` removes): the same
#: texts are blank to the schema, to its validators and to the service
NONBLANK = r"[^\t\n\x0b\x0c\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
#: a path relative to a root: segments of letters, digits, '_', '-', '+', '.' (at most 255), none
#: starting with '.'
REL_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_.+\-]{0,254}(/[A-Za-z0-9_][A-Za-z0-9_.+\-]{0,254})*$"
#: one such segment (a split's folder)
SEGMENT = r"^[A-Za-z0-9_][A-Za-z0-9_.+\-]{0,254}$"
MAX_ID = MAX_ID_LENGTH  # the collection's own limit
#: the image types a part may be declared as (the server reads any image Pillow decodes, whatever
#: the part's Content-Type says)
IMAGE_TYPES = "image/png, image/jpeg, image/gif, image/webp, image/tiff, image/bmp"

# A JSON object as a form field (``filter`` of an image search): flat, its values scalars or lists
# of scalars (dotted keys reach nested metadata). A regular language, so the schema's pattern is
# exactly what the server takes: JSON whitespace, strings with JSON escapes (no lone surrogates).
_WS = r"[ \t\n\r]*"
_STR = (r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CeEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})'
        r'|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})*"')
_NUM = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+\-]?[0-9]+)?"
_SCALAR = rf"(?:{_STR}|{_NUM}|true|false|null)"
_VALUE = rf"(?:{_SCALAR}|\[{_WS}(?:{_SCALAR}(?:{_WS},{_WS}{_SCALAR})*)?{_WS}\])"
_KEY = _STR[:-2] + '+"'  # a key is not empty
_PAIR = rf"{_KEY}{_WS}:{_WS}{_VALUE}"
FILTER_FIELD = rf"^{_WS}\{{{_WS}(?:{_PAIR}(?:{_WS},{_WS}{_PAIR})*)?{_WS}\}}{_WS}$"

_STRICT = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")


def _integral(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer; so does the service (3.5, "3" and true stay refused)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: an integer field, strict but for JSON numbers with a zero fraction
Integer = Annotated[int, BeforeValidator(_integral)]

ERROR_STATUSES = {
    400: "Malformed request: JSON or multipart that does not parse, a bad Content-Length, a path outside "
         "the allowed root.",
    401: "Missing or unknown API key (send `Authorization: Bearer KEY`).",
    403: "The key's role may not do this (writes need an admin key), or the server takes no such paths.",
    404: "No such item, model directory or data.",
    405: "The path exists but not with this method (`Allow` lists the methods).",
    409: "Conflicts with the collection's state: an id given twice with other content, an upgrade during a "
         "backfill, no backfill to pause.",
    413: "Body, image or image pixels over the server's limits.",
    415: "A Content-Type the operation does not take.",
    422: "Well-formed but invalid: a field out of range, an image that does not decode, an empty text.",
    500: "An error of the server (never expected; reported with the exception's type).",
    503: "The collection's storage (its PostgreSQL catalog, its Milvus server) does not answer; what was "
         "committed stays: try again once it answers.",
}


class ErrorBody(BaseModel):
    """Every error: a message naming the problem and, when one is to blame, the request field
    (``k``, ``items[2].text``, ``images[0]``, ``authorization``, ``id``...)."""

    model_config = ConfigDict(title="Error")
    detail: str = Field(..., description="What went wrong, naming the field or the problem.")
    field: Optional[str] = Field(..., description="The request field to blame, or null.")


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of an operation that may answer these error statuses (all with :class:`ErrorBody`)."""
    return {s: {"model": ErrorBody, "description": ERROR_STATUSES[s]} for s in statuses}


# ----------------------------------------------------------------------------- requests
def form_encodings() -> dict[str, dict[str, Any]]:
    """The ``encoding`` of the multipart bodies: what each part carries."""
    item_id = {"description": f"The image's item id (default: one from its content): {ID_RULE}.",
               "required": False,
               "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID, "pattern": ID_PATTERN}}
    metadata = {"description": f"The image's metadata: a JSON object of at most {MAX_METADATA_BYTES} bytes (UTF-8; "
                               "ASCII, other characters escaped as \\uXXXX, is safest in a header), without the "
                               f"keys the server sets ({', '.join(RESERVED_METADATA)}); kept as the item's metadata, "
                               "which a search's filter reads (default: none; `filename` is the part's unless it "
                               "names one).",
                "required": False, "schema": {"type": "string", "maxLength": MAX_METADATA_BYTES}}
    return {"SearchByImage": {"image": {"contentType": IMAGE_TYPES}},
            "AddImages": {"images": {"contentType": IMAGE_TYPES,
                                     "headers": {ID_HEADER: item_id, METADATA_HEADER: metadata}}}}


_FILTER_SCALAR = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]
#: what a search's JSON ``filter`` takes (checked by :func:`~nobackfill.search.filters.check_filter`)
FILTER_JSON = {"anyOf": [{"type": "object", "maxProperties": MAX_FILTER_KEYS, "propertyNames": {"minLength": 1},
                          "additionalProperties": {"anyOf": [*_FILTER_SCALAR, {
                              "type": "array", "maxItems": MAX_FILTER_VALUES, "items": {"anyOf": _FILTER_SCALAR}}]}},
                         {"type": "null"}]}


@dataclass
class RequestModels:
    search: type[BaseModel]
    text_item: type[BaseModel]
    add_texts: type[BaseModel]
    search_form: dict[str, Any]
    add_form: dict[str, Any]


def request_models(max_k: int, max_caption: int, max_batch: int, max_image_bytes: int) -> RequestModels:
    """The JSON and multipart request bodies of search and add under these limits."""

    class SearchRequest(BaseModel):
        """A text query."""

        model_config = _STRICT
        text: str = Field(..., min_length=1, max_length=max_caption, pattern=NONBLANK,
                          description="The query text (not blank).")
        k: Integer = Field(10, ge=1, le=max_k, description="Number of results.")
        target: Optional[Literal["image", "text"]] = Field(
            None, description="Modality of the results (default: images when the collection holds any).")
        filter: Annotated[Optional[dict[str, Any]], WithJsonSchema(FILTER_JSON)] = Field(
            None, description="Metadata filter {key: value | [values]}: every key must match; dotted keys reach "
                              "nested metadata; values are strings, numbers, booleans or null; "
                              f"at most {MAX_FILTER_KEYS} keys and {MAX_FILTER_VALUES} values a key.")
        merge: Optional[Literal["raw", "calibrated", "rank"]] = Field(
            None, description="How the spaces' lists are merged (default: the collection's).")

    class TextItem(BaseModel):
        """A caption; any other property is kept as the item's metadata."""

        model_config = ConfigDict(extra="allow", strict=True, regex_engine="python-re",
                                  json_schema_extra={"additionalProperties": True})
        text: str = Field(..., min_length=1, max_length=max_caption, pattern=NONBLANK,
                          description="The caption (not blank).")
        id: Optional[str] = Field(None, min_length=1, max_length=MAX_ID, pattern=ID_PATTERN,
                                  description=f"The item's id (default: one from its text): {ID_RULE}.")

    class AddTexts(BaseModel):
        """Captions to add (idempotent by id)."""

        model_config = _STRICT
        items: list[TextItem] = Field(..., min_length=1, max_length=max_batch)

    image_part = {"type": "string", "format": "binary", "minLength": 1,
                  "description": "An image file (PNG, JPEG, GIF, WebP, TIFF, BMP...): any image Pillow decodes, "
                                 f"of at most {max_image_bytes} bytes and the server's pixel limit (413 beyond)."}
    search_form = {
        "type": "object", "title": "SearchByImage", "required": ["image"], "additionalProperties": False,
        "properties": {
            "image": image_part,
            "k": {"type": "integer", "minimum": 1, "maximum": max_k, "default": 10},
            "target": {"type": "string", "enum": ["image", "text"],
                       "description": "Modality of the results (default: texts when the collection holds any)."},
            "filter": {"type": "string", "pattern": FILTER_FIELD,
                       "description": "The metadata filter as a JSON object {key: value | [values]} whose values "
                                      "are strings, numbers, booleans, null or lists of them (dotted keys reach "
                                      "nested metadata)."},
        }}
    add_form = {
        "type": "object", "title": "AddImages", "required": ["images"], "additionalProperties": False,
        "properties": {
            "images": {"type": "array", "minItems": 1, "maxItems": max_batch, "items": image_part,
                       "description": f"The images, one file part each; a part's `{ID_HEADER}` header gives "
                                      "its item's id (default: one from the image's content), its "
                                      f"`{METADATA_HEADER}` header the item's metadata as a JSON object (at most "
                                      f"{MAX_METADATA_BYTES} bytes; not "
                                      f"{', '.join(f'`{k}`' for k in RESERVED_METADATA)}, which the server sets; "
                                      "`filename` defaults to the part's)."},
        }}
    return RequestModels(SearchRequest, TextItem, AddTexts, search_form, add_form)


class BackfillRequest(BaseModel):
    """How to backfill: the order items are re-embedded in, and an optional rate cap."""

    model_config = _STRICT
    order: Literal["sequential", "random", "uncertainty"] = "uncertainty"
    rate: Optional[float] = Field(None, gt=0, allow_inf_nan=False, description="Items per second at most (a resume "
                                  "without one keeps the cap of the run it resumes).")
    engine: Literal["local", "ray"] = Field("local", description="Who embeds: the server's own worker (local) "
                                            "or a Ray Data pipeline on the server's Ray cluster (ray; the server "
                                            "must be started with --ray-address).")
    actors: Optional[Annotated[int, Field(ge=1, le=4096), BeforeValidator(_integral)]] = Field(
        None, description="Ray: embedding actors (default 2; not used by engine 'local').")
    gpus_per_actor: Optional[float] = Field(None, ge=0, le=64, allow_inf_nan=False,
                                            description="Ray: GPUs per embedding actor (default 0: CPU; not used by engine 'local').")


class FitSample(BaseModel):
    """The first sample a backfill that fits bridges takes of each modality."""

    model_config = _STRICT
    fraction: Optional[float] = Field(None, gt=0, le=1, allow_inf_nan=False,
                                      description="The share of each modality's items (default 0.01).")
    min_pairs: Optional[Annotated[int, Field(ge=1, le=10_000_000), BeforeValidator(_integral)]] = Field(
        None, description="At least this many items of a modality (default 512).")
    max_pairs: Optional[Annotated[int, Field(ge=1, le=10_000_000), BeforeValidator(_integral)]] = Field(
        None, description="At most this many (default 20,000; not below min_pairs).")


class UpgradeRequest(BaseModel):
    """A new model, its bridges from the older spaces and optional calibration data."""

    model_config = _STRICT
    model: str = Field(..., max_length=1024, pattern=REL_PATH,
                       description="The new model: a directory relative to --models-root.")
    bridges: list[Annotated[str, Field(max_length=1024, pattern=REL_PATH)]] = Field(
        default_factory=list, max_length=64, description="Upgrade directories (bridges) relative to --upgrades-root.")
    calibrate: Optional[str] = Field(None, max_length=1024, pattern=REL_PATH,
                                     description="Calibration data relative to --data-root.")
    calibrate_split: str = Field("val", max_length=255, pattern=SEGMENT,
                                 description="The split of a world data root (a folder name).")
    calibrate_limit: Optional[Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_integral)]] = None
    calibrate_langs: str = Field("en", max_length=255, pattern=r"^[a-z]{2,3}(,[a-z]{2,3})*$",
                                 description="Caption languages of the calibration data, comma-separated.")
    fit_bridges: Optional[bool] = Field(None, description="Fit bridges from the backfill's own pairs (default: "
                                                          "when no bridge is given). False with no bridge: the "
                                                          "old-model route serves, and the merge's score maps are "
                                                          "still fitted from the pairs.")
    queries: list[Annotated[str, Field(max_length=300)]] = Field(
        default_factory=list, max_length=2000, description="Example search texts (no labels, at most 300 "
                                                           "characters each; blank ones and repeats are left out) "
                                                           "the fitted bridges for text queries are scored on: the "
                                                           "only text queries of a collection of images alone.")
    fit_sample: Optional[FitSample] = Field(None, description="The first sample of a backfill that fits bridges.")


class RouteRequest(BaseModel):
    """Pin the route one older space is reached through for one direction (``route`` null: unpin)."""

    # w only with the fused route (another route takes no weight: refused, 422 on w)
    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re", json_schema_extra={
        "anyOf": [{"properties": {"route": {"const": "fused"}}, "required": ["route"]},
                  {"properties": {"w": {"type": "null"}}}]})
    space: str = Field(..., max_length=255, description="An older space id (see /v1/status).")
    direction: Literal["t2i", "i2t", "t2t", "i2i"]
    route: Optional[Literal["old-model", "bridge", "fused"]] = Field(None, description="null removes the pin.")
    w: Optional[float] = Field(None, ge=0, le=1, allow_inf_nan=False,
                               description="Weight of the bridge score of a fused route (default: the "
                                           "calibrated weight, else 0.5); only with route fused.")


class CalibrateRequest(BaseModel):
    """Labelled data under --data-root to choose routes, fused weights and the merge on."""

    model_config = _STRICT
    data: str = Field(..., max_length=1024, pattern=REL_PATH, description="A data folder / world root or a "
                                                                          "Multi30K root, relative to --data-root.")
    split: str = Field("val", max_length=255, pattern=SEGMENT, description="Never the split evaluated on.")
    limit: Optional[Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(_integral)]] = None
    langs: str = Field("en", max_length=255, pattern=r"^[a-z]{2,3}(,[a-z]{2,3})*$")


class RetireRequest(BaseModel):
    """An old space to drop once the current space serves every item."""

    model_config = _STRICT
    space: str = Field(..., max_length=255, description="The old space id (see /v1/status).")
    drop_unsourced: bool = Field(False, description="Delete the items without a source it serves, with it.")


class VerifyRequest(BaseModel):
    """Check every stored file of the collection (read only: repairs are made offline with
    `nobackfill verify --repair`)."""

    model_config = _STRICT
    model_check: bool = Field(False, description="Also re-embed a sample of each space with its model.")


class ImportRequest(BaseModel):
    """Vectors embedded elsewhere, under --data-root, imported into the collection (its current
    model must be the one that made them: checked on a sample unless ``trust_model``)."""

    model_config = _STRICT
    format: Literal["clip-retrieval", "npy", "npz", "faiss"] = Field(
        ..., description="clip-retrieval: its inference output folder; npy / npz / faiss: a vector file with a table.")
    path: str = Field(..., max_length=1024, pattern=REL_PATH, description="The folder or file, relative to --data-root.")
    table: Optional[str] = Field(None, max_length=1024, pattern=REL_PATH,
                                 description="Parquet / JSONL / CSV table of the rows, relative to --data-root.")
    id_column: Optional[str] = Field(None, max_length=255, description="The table's id column (none: ids from "
                                     "content, never from a column not named here).")
    metadata_columns: Optional[list[str]] = Field(None, max_length=1024, description=(
        "The table's columns each item keeps in its metadata (default: every other one), beside its source "
        "(an image's path / url, a caption's text)."))
    source_column: Optional[str] = Field(None, max_length=255,
                                         description="The table's column of image paths / urls or caption texts.")
    modality: Optional[Literal["image", "text"]] = Field(None, description="For a table without a modality column.")
    images_root: Optional[str] = Field(None, max_length=1024, pattern=REL_PATH,
                                       description="Where relative image paths resolve, relative to --data-root.")
    trust_model: bool = Field(False, description="Skip the model check (the plan records that it was skipped).")
    lossy: bool = Field(False, description="Accept a faiss index that stores vectors lossily (PQ, SQ).")
    model: Optional[str] = Field(None, max_length=1024, pattern=REL_PATH,
                                 description="The model that made the vectors, relative to --models-root (or an "
                                             "alias such as minilm): it must be the collection's current model "
                                             "(default: that model).")
    samples: Optional[Annotated[int, Field(ge=1, le=100_000), BeforeValidator(_integral)]] = Field(
        None, description="Items the model check re-embeds (default 64).")


# ----------------------------------------------------------------------------- the document
_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


def any_request_errors() -> dict[int | str, dict[str, Any]]:
    """``responses=`` of the app: what any request may get before it reaches its operation (a
    Content-Length that is no number, a body over the limit), JSON whatever the operation answers."""
    return {s: {"description": ERROR_STATUSES[s], "content": {"application/json": {"schema": dict(_ERROR_REF)}}}
            for s in (400, 413, 503)}


def json_or_form(json_model: str, form: str) -> dict[str, Any]:
    """``openapi_extra=`` of an operation that takes JSON (schema ``json_model``) or multipart (schema
    ``form``) on one path: its two request bodies, whose schemas :func:`finish_openapi` adds."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{json_model}"}},
        "multipart/form-data": {"schema": {"$ref": f"#/components/schemas/{form}"},
                                "encoding": form_encodings()[form]}}}}


def item_links(item_id: str) -> dict[str, Any]:
    """OpenAPI links from an added item to the operations on it (schemathesis' stateful phase)."""
    return {name: {"operationId": op, "parameters": {"item_id": item_id}}
            for name, op in (("GetItem", "get_item"), ("GetThumbnail", "thumbnail"), ("DeleteItem", "delete"))}


def finish_openapi(schema: dict[str, Any], models: RequestModels) -> dict[str, Any]:
    """FastAPI's document completed with what it cannot express: the per-app request models and the
    form bodies of the JSON-or-multipart operations (:func:`json_or_form`) under
    ``components/schemas`` (every ``$ref`` resolves), and FastAPI's own validation-error shapes gone
    (every error is :class:`ErrorBody`; 422 only where an operation can answer it)."""
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (models.search, models.text_item, models.add_texts):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(js.pop("$defs", {}))
        comps[model.__name__] = js
    comps["SearchByImage"] = models.search_form
    comps["AddImages"] = models.add_form
    for name in ("HTTPValidationError", "ValidationError"):
        comps.pop(name, None)
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            responses = op.get("responses", {}) if isinstance(op, dict) else {}
            for status, resp in list(responses.items()):
                ref = (((resp.get("content") or {}).get("application/json") or {}).get("schema") or {}).get("$ref", "")
                if ref.endswith("/HTTPValidationError"):
                    del responses[status]
    return schema
