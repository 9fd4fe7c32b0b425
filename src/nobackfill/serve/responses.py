"""The API's response bodies: a model for every 2xx JSON reply (``response_model`` of each operation),
open (``extra="allow"``) where the collection may add fields a client should pass through.

Re-exported by :mod:`~nobackfill.serve.schema`, which holds the request bodies and the document."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AddResult", "BackfillStatus", "Deleted", "Health", "Hit", "ImportResult", "ItemOut", "Retired", "Routes",
           "SearchResults", "SpaceStatus", "Status", "UpgradeResult", "VerifyReport"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Hit(_Open):
    """One result; ``metadata`` is the item's metadata, whole (``text`` of a caption, ``path`` of an
    image relative to the collection or to a root the server was started with, such as its data root;
    an image stored elsewhere by its file name only: the service never shows the server's own
    absolute paths). Its keys are also flattened in beside the
    hit's own fields, as earlier releases gave them, but for those named rank, score, id, space,
    route or metadata: read ``metadata``."""

    rank: int = Field(description="1-based rank in the merged list.")
    score: float = Field(description=(
        "The score under the route that answered, in the space that answered (a cosine; a fused route's "
        "weighted sum). Scores of different spaces are not on one scale: during a backfill the hits of "
        "several spaces are ordered by the collection's merge (its score maps or ranks), so this column "
        "need not fall with the rank."))
    id: str = Field(description="The item's id.")
    space: str = Field(description="The space whose vector answered.")
    route: str = Field(description="The route that reached that space: native, bridge, fused or old-model.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="The item's metadata, every key of it.")


class SearchResults(_Open):
    query: str
    modality: Literal["image", "text"]
    hits: list[Hit]


class AddResult(_Open):
    """What an add did; every item given is in exactly one of ``added``, ``unchanged``,
    ``metadata_updated``, ``recovered`` or ``skipped`` (an id given twice with the same content:
    once)."""

    added: int = Field(description="Embedded and committed: new ids, or new content under an id held.")
    replaced: int = Field(0, description="Of `added`: new content under an id the collection held (an upsert: "
                                         "the item was embedded again).")
    unchanged: int = Field(description="Already in the collection with the same content and metadata.")
    metadata_updated: int = Field(description="Same content, new metadata: stored without embedding it again.")
    recovered: int = Field(description=(
        "Committed without embedding: their vectors were found stored already (an interrupted add's, or a "
        "deleted item's added again): searchable like `added`."))
    skipped: int = Field(description="Not added: unreadable (with skip_bad).")
    ids: list[str] = Field(description="The id of each item given, in order.")


class ItemOut(BaseModel):
    id: str
    modality: Literal["image", "text"]
    metadata: dict[str, Any]
    space: Optional[str]


class Deleted(BaseModel):
    deleted: str


class BackfillStatus(_Open):
    done: int
    total: int
    fraction: float
    state: str = Field(..., description="none | starting (a worker draws the job's order) | running | paused | "
                                        "idle (no worker runs: see `note`) | done")
    order: Optional[str] = None
    target: Optional[str] = None
    shards: Optional[int] = Field(None, description="The job's shards: at most this many workers (processes, "
                                                    "machines) share it; set by the run that started it.")
    no_source: int = Field(0, description="Items the backfill skips: no source to embed them from.")
    unreadable: int = Field(0, description="Items whose source this backfill could not read (a file gone or corrupt): "
                                           "left in the old space, tried again by the next run.")
    unreadable_items: dict[str, str] = Field(default_factory=dict,
                                             description="The first unreadable items: {id: why}.")
    workers: int = 0
    rate: float = Field(0.0, description="Items per second, every live worker together.")
    engine: Optional[str] = Field(None, description="Who embeds while workers run: local | ray (| local+ray).")
    actors: int = Field(0, description="Embedding processes of the live workers (a Ray worker's actors).")
    eta_s: Optional[float] = None
    per_modality: dict[str, dict[str, int]] = Field(default_factory=dict,
                                                    description="{modality: {done, total}} in the current space.")
    holders: list[dict[str, Any]] = Field(default_factory=list,
                                          description="Live workers: shard, owner, host, pid, since, rate (items/s at its last commit; a Ray driver: engine, actors).")
    phase: Optional[str] = Field(None, description="Uncertainty order: 'sample' until its sample is in, then 'order'.")
    sample: Optional[int] = Field(None, description="Items in the uncertainty order's training sample.")
    last_worker: Optional[dict[str, Any]] = Field(None, description="The last worker to stop, when none runs.")
    note: Optional[str] = Field(None, description="What to do when no worker runs.")
    worker: Optional[str] = Field(None, description="This server's worker: running | idle (after a pause or a cancel it "
                                                  "stays running until its batch is committed).")
    rate_cap: Optional[float] = Field(None, description="This server's worker: the items per second its run is capped "
                                                        "at while it runs (a resume keeps it unless given another); "
                                                        "null: no cap.")
    worker_stopped: Optional[str] = Field(None, description="Why this server's worker stopped, when it gave up.")
    error: Optional[str] = Field(None, description="The error that stopped this server's worker.")
    worker_run: Optional[dict[str, int]] = Field(None, description="This server's worker thread: {run (its number, from "
                                                                "1), committed (items it committed so far), "
                                                                "sample_committed (of them the training sample's)}.")


class SpaceStatus(_Open):
    name: str
    model: str
    dim: Optional[int]
    current: bool
    retired: bool
    modalities: list[str] = Field(default_factory=list, description="What the space's model embeds: image, text.")
    image: int = Field(0, description="Images this space serves.")
    text: int = Field(0, description="Captions this space serves.")
    index: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="{modality: {backend, in_use, building, count}}: the vector index that "
                                          "answers (auto: Flat while small, the graph past its threshold). Its "
                                          "count is of the vectors stored, which may include vectors of items "
                                          "deleted, replaced or served by another space (never returned); image "
                                          "and text count the items this space serves.")
    imports: list[dict[str, Any]] = Field(default_factory=list, description="Vectors imported into this space: "
                                                                            "from, items, model_check, at.")


class Status(_Open):
    name: str
    path: str = Field(..., description="The collection's name (never a path on the server).")
    generation: int
    items: dict[str, int]
    current: str
    spaces: dict[str, SpaceStatus]
    unserved: int
    unsourced: int = Field(0, description="Items with no source to embed them again from (imported without one): "
                                          "searched in their space, never backfilled.")
    backend: str
    routes: dict[str, Any]
    merge: str
    calibrated: bool = Field(..., description="Routes and merge chosen on labelled data (`--calibrate`). Routes "
                                              "chosen without labels, by an upgrade's fitted bridges, say so in "
                                              "their own `calibration` (`fitted`).")
    catalog: Optional[str] = Field(None, description="Where the catalog is kept: sqlite | postgresql.")
    fitted_bridges: dict[str, Any] = Field(default_factory=dict, description=(
        "An upgrade without a bridge: the bridges fitted from the backfill's own pairs (serving, fits, next, "
        "items, enabled; maps_only: fit_bridges was off, only the merge's score maps are fitted; fitting: "
        "{pairs, owner, since} while a fit runs; error when a fit failed)."))
    merge_without_labels: bool = Field(False, description="The merge's score maps were fitted without labels, by "
                                                          "the fits of an upgrade without a bridge (on the queries "
                                                          "where the old and the new model agree).")
    backfill: BackfillStatus
    limits: dict[str, int]


class ImportResult(BaseModel):
    source: str = Field(..., description="What was read: the format, the files (paths as this server shows "
                                         "them), the columns used.")
    items: int = Field(..., description="Items read from the source.")
    added: int = Field(..., description="Committed: new ids, or new vectors, sources or metadata under ids held.")
    unchanged: int = Field(..., description="Already held with the same vector, source and metadata.")
    stored: int = Field(0, description="Vectors this import wrote; the rest of `added` had theirs stored already "
                                       "(new metadata or source, an interrupted import's, a deleted item's).")
    replaced: int = Field(0, description="Of `added`: ids the collection held with another vector, replaced "
                                         "(an id holding an item of the other modality is refused: 409).")
    seconds: float
    model_check: dict[str, Any] = Field(..., description="The model check's verdict, or {skipped: true}.")
    warnings: list[str] = Field(default_factory=list)


class UpgradeResult(BaseModel):
    current: str
    spaces: list[str]
    merge: Optional[str]
    routes: dict[str, Any] = Field(default_factory=dict, description="Per older space and direction, its route.")


class Routes(BaseModel):
    routes: dict[str, Any] = Field(..., description="Per older space and direction: route, weight, calibration.")
    merge: Optional[str] = None


class Retired(BaseModel):
    retired: str
    dropped_unsourced: int
    already: bool = Field(False, description="The space was retired before this call (nothing was done).")


class VerifyReport(_Open):
    kind: str
    problems: list[str] = Field(..., description="Stored data that is wrong (empty: all checked files are sound).")
    derived: list[str] = Field(default_factory=list, description="Caches that are stale (never served; rebuilt).")
    advice: list[str] = Field(default_factory=list)
    model_check: dict[str, Any] = Field(default_factory=dict)


class IndexBuilds(BaseModel):
    indexes: list[dict[str, Any]] = Field(..., description=(
        "Each graph index an auto space past its threshold lacked (space, modality, count, graph, in_use, "
        "building): the server builds them in the background (searches stay exact until each is whole); "
        "/v1/status shows when one is in use. Empty: none is missing."))


class Health(BaseModel):
    ok: bool
    generation: int
    models: int
