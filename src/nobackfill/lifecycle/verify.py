"""``nobackfill verify``: check what is stored, and repair what can be repaired.

One entry point for every kind of directory the project writes:

* a **gallery** (``manifest.json``): every committed chunk re-hashed against the manifest, shapes,
  ids; the cached indexes against their stamps (:meth:`~nobackfill.gallery.gallery.Gallery.verify`).
  ``repair`` rebuilds the indexes and drops damaged chunks, listing the ids to add again;
* a **collection** (``catalog.sqlite``, a previous-format ``collection.json``, or a storage URI): the
  catalog database's own check (``PRAGMA quick_check``) and its invariants, and every space's store;
  ``repair`` repairs each local space store; items whose vectors were lost in the current space are
  re-embedded by ``nobackfill collection backfill`` (their sources are in the catalog);
* an **upgrade** (``upgrade.json``): every file against the sha256 its manifest keeps, and its
  tensors loadable;
* a **model** (``config.json``): loadable, and its weights still give the space id that
  ``nobackfill.json`` records.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PathReport", "verify_path"]


@dataclass
class PathReport:
    """What :func:`verify_path` found (``problems``: stored data; ``derived``: caches, never served)."""

    path: str
    kind: str
    problems: list[str] = field(default_factory=list)
    derived: list[str] = field(default_factory=list)
    repaired: dict[str, Any] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    #: ``--model-check``: per space, the model check's verdict
    model_check: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _kind(path: str) -> str:
    if "://" in path or path.startswith("milvus-lite:") or "?catalog=" in path:
        return "collection"
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    for marker, kind in (("catalog.sqlite", "collection"), ("collection.json", "collection"), ("manifest.json", "gallery"), ("upgrade.json", "upgrade"),
                         ("config.json", "model")):
        if (p / marker).is_file():
            return kind
    raise ValueError(f"{p}: not a gallery, collection, upgrade or model directory (none of catalog.sqlite, "
                     "collection.json, manifest.json, upgrade.json, config.json)")


def verify_path(path: str | Path, repair: bool = False, model_check: bool = False, *, pool: Any = None) -> PathReport:
    """Check ``path`` (kind detected from its files); with ``repair``, rebuild what is derived and
    take what is damaged out of service first, then check again. ``model_check`` (a collection):
    also re-embed a sample of each space's items with its model and compare with the stored
    vectors (:func:`check_models`; ``pool``: the :class:`ModelPool` to load them from)."""
    path = str(path)
    kind = _kind(path)
    report = PathReport(path, kind)
    {"gallery": _gallery, "collection": _collection, "upgrade": _upgrade, "model": _model}[kind](path, report, repair)
    if model_check:
        if kind != "collection":
            raise ValueError(f"{path}: --model-check checks a collection's spaces; this is a {kind}")
        from ..collection.collection import Collection

        for sid, verdict in check_models(Collection.open(path), pool=pool).items():
            report.model_check[sid] = verdict
            if not verdict["accepted"]:
                report.problems.append(f"space {sid}: {verdict['message']}")
    return report


def check_models(collection: Any, samples: int = 64, seed: int = 0, pool: Any = None) -> dict[str, dict[str, Any]]:
    """Per live space: the model check of a random sample of the items it serves (re-embedded with
    the space's model, compared with the stored vectors), as JSON; a space serving no item with a
    readable source is reported as not checked (accepted, ``n`` 0)."""
    from ..adopt.model_check import DEFAULT_THRESHOLD, check_model, collection_samples
    from ..search.models import ModelPool

    pool = pool or ModelPool()
    out: dict[str, dict[str, Any]] = {}
    served = collection.served_counts()["served"]
    for sid in collection.space_ids():
        space = collection.space(sid)
        picked = collection_samples(collection, sid, samples, seed)
        if not picked:  # (trial AL: an emptied space was said to lack readable sources)
            what = "serves no item with a readable source" if sum(served.get(sid, {}).values()) else "holds no item now"
            out[sid] = {"model": space.model, "n": 0, "accepted": True, "message": f"not checked: space {sid} {what}"}
            continue
        enc = pool.get(space.model, sid, what=f"model of space {space.label}")
        # vectors imported from a lossy index are checked with the threshold their import's check measured
        lossy = [imp["model_check"] for imp in space.imports if (imp.get("model_check") or {}).get("lossy")]
        threshold = min([DEFAULT_THRESHOLD] + [float(mc["threshold"]) for mc in lossy])
        out[sid] = check_model(enc, picked, model=space.model, threshold=threshold).to_json()
        if lossy:
            out[sid]["message"] += (f" (threshold {threshold:g}: its vectors were imported from a lossy "
                                    f"{lossy[0]['lossy'].get('index', '')} index, checked then at that threshold)")
    return out


def _gallery(path: str, report: PathReport, repair: bool) -> None:
    from ..gallery.gallery import Gallery
    from ..gallery.types import GalleryError

    try:
        g = Gallery.open(path)
    except GalleryError as e:
        report.problems.append(str(e))
        return
    if repair:
        r = g.repair()
        report.repaired = {"rebuilt": r.rebuilt, "lost_chunks": r.lost_chunks, "lost_counts": r.lost_counts}
        lost = {m: ids for m, ids in r.lost_ids.items() if ids}
        if lost:
            report.repaired["lost_ids"] = lost
            report.advice.append(f"{sum(r.lost_counts.values())} item(s) were in damaged chunks (moved to "
                                 f"{Path(path) / 'lost'}): add them again with `nobackfill index` (their ids are "
                                 "listed under lost_ids)")
    v = g.verify()
    report.problems += v.problems
    report.derived += v.derived
    if v.derived and not repair:
        report.advice.append(f"`nobackfill verify {path} --repair` rebuilds the derived files")
    if v.problems and not repair:
        report.advice.append(f"`nobackfill verify {path} --repair` takes the damaged chunks out and lists their ids")


def _collection(path: str, report: PathReport, repair: bool) -> None:
    from ..collection.collection import Collection, CollectionError
    from ..gallery.gallery import Gallery
    from ..gallery.types import GalleryError

    try:
        c = Collection.open(path)
    except (CollectionError, GalleryError) as e:
        report.problems.append(str(e))
        return
    if repair:
        for sid in c.space_ids():
            try:
                g = c.gallery(sid)
            except (CollectionError, GalleryError) as e:
                report.problems.append(str(e))
                continue
            if isinstance(g, Gallery):
                r = g.repair()
                if r.lost_chunks or r.rebuilt:
                    report.repaired[sid] = {"rebuilt": r.rebuilt, "lost_chunks": r.lost_chunks,
                                            "lost_counts": r.lost_counts}
                if r.lost_chunks:
                    report.advice.append(f"space {sid}: {sum(r.lost_counts.values())} vector(s) lost; "
                                         f"`nobackfill collection backfill {path}` re-embeds the current space's "
                                         "from the items' sources")
        c = Collection.open(path)
        if report.repaired:  # rows were dropped: which row serves which item is worked out again
            lost = c.rebuild_serving()
            if lost:
                report.advice.append(f"{lost} item(s) have no vector in any space now; `nobackfill collection "
                                     f"backfill {path}` re-embeds them from their sources")
    report.problems += [p for p in c.verify() if p not in report.problems]  # (a space repair could not open: once)
    storeless = [p for p in report.problems if " is not a gallery" in p or "manifest" in p or " holds space " in p]
    if report.problems and len(storeless) < len(report.problems) and not repair:
        report.advice.append(f"`nobackfill verify {path} --repair` takes damaged vector chunks out of service")
    if storeless:  # no chunk to take out: the space's own description is gone or damaged (trial T)
        report.advice.append("a space whose manifest.json is missing or damaged cannot be read, nor mended by "
                             "--repair: restore the space's folder from a backup (an older space: `nobackfill "
                             "collection backfill` re-embeds its items into the current space, then `collection "
                             "retire` drops it)")


def _upgrade(path: str, report: PathReport, repair: bool) -> None:
    from safetensors.torch import load_file

    from ..compat.upgrade import load_upgrade

    try:
        up = load_upgrade(path)
    except (ValueError, FileNotFoundError) as e:
        report.problems.append(str(e))
        return
    report.problems += up.check_files()
    if not up.manifest.get("files"):
        report.advice.append(f"{path}/upgrade.json keeps no file hashes (saved by an older nobackfill): only "
                             "loadability was checked")
    for f in sorted(Path(path).glob("*.safetensors")):
        try:
            load_file(str(f))
        except Exception as e:  # SafetensorError and friends
            report.problems.append(f"{f}: unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
    for f in sorted(Path(path).glob("*config.json")):
        try:
            json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            report.problems.append(f"{f}: unreadable ({type(e).__name__}: {e})")
    if up.is_bridge and not report.problems:
        try:
            up.bridge()
        except (ValueError, FileNotFoundError) as e:
            report.problems.append(str(e))
    report.problems = list(dict.fromkeys(report.problems))


def _model(path: str, report: PathReport, repair: bool) -> None:
    from ..encoders import load_encoder

    try:
        enc = load_encoder(path)
    except (ValueError, FileNotFoundError) as e:  # (without the advice to run verify: this is it)
        report.problems.append(str(e).split("; `nobackfill verify")[0])
        return
    meta_path = Path(path) / "nobackfill.json"
    try:
        recorded = json.loads(meta_path.read_text(encoding="utf-8")).get("space_id")
    except (OSError, ValueError):
        recorded = None
    if recorded and recorded != enc.space_id:
        report.problems.append(f"{path}: its weights give space {enc.space_id} but {meta_path} records {recorded}: "
                               "the model files were changed after it was saved")
