"""``nobackfill bench import``: adopting vectors embedded elsewhere (``collection import``).

Four parts, each a key of the JSON:

* ``identical``: the world test split (English captions) embedded by ``world-old`` and written in
  clip-retrieval's layout (our writer, float32: bit for bit), imported with
  :func:`~nobackfill.adopt.importing.import_source` (model check on); the same items added with
  :func:`~nobackfill.collection.ingest.add_items` into another collection. Every test caption (t2i) and
  every test image (i2t) searches both through the :class:`~nobackfill.search.Searcher` (k = 10):
  the same ids in the same order (hits of equal score, within the tolerance, may trade places) and
  scores within 1e-6. The same for the Multi30K val captions (all five columns) embedded by
  ``m30k-old-text`` (t2t; a text-only clip-retrieval folder: ``text_emb`` and a ``caption`` column).
* ``throughput``: N rows of random unit float32 vectors (``dim`` 128) in an ``.npy`` with a parquet
  table (``id``; ``image_path``: a file that does not exist on even rows, a url on odd rows;
  ``group``: metadata), opened and imported (``trust_model``, backend ``Flat``: no index is built by
  the import) in a fresh process: rows/s and that process's peak RSS (``VmHWM``; ``ru_maxrss`` is
  reported too, but Linux carries the parent's high-water mark over fork + exec into it, so for a
  small N it reads the parent's size) beside the vectors' size.
* ``model_check``: :func:`~nobackfill.adopt.importing.run_model_check` over ``trials`` sample
  seeds (each a different random sample of rows) per case. Right model declared (must accept):
  world-old vectors as world-old (float32, and float16 as clip-retrieval writes by default),
  m30k-old-text vectors of the Multi30K captions as m30k-old-text. Wrong model declared (must
  refuse): world-new vectors as world-old and MiniLM vectors as m30k-old-text (widths differ: a
  refusal naming the widths), world-old vectors with their rows shuffled against the table, the
  image and caption vectors swapped (``img_emb`` <-> ``text_emb``), and world-new vectors cut to
  world-old's 64 dimensions and renormalised (a different model at the declared width: the check
  must compare cosines, not widths).
* ``milvus_in_place``: a user's own Milvus collection (the world test images embedded by world-old, their
  schema and HNSW / COSINE index) adopted in place, searched, upgraded to world-new with the shipped
  bridge, backfilled, searched, its space retired: its row count and a checksum of its vectors before
  and after (:mod:`.import_milvus`; milvus-lite, or a Milvus server with a PostgreSQL catalog: ``shared``
  starts both on 127.0.0.1, ``milvus_uri`` / ``catalog`` name running ones).

The settings are in :mod:`.import_config`, the data and folders in :mod:`.import_data`, the
throughput rows in :mod:`.import_rows`, the model-check trials in :mod:`.import_checks`, the Milvus
flow in :mod:`.import_milvus`, the tables in :mod:`.import_report`.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from .import_checks import run_model_checks
from .import_config import ImportBenchConfig
from .import_data import Text, World, embeddings, load_text, load_world
from .import_milvus import run_milvus_in_place
from .import_report import format_markdown
from .import_rows import run_throughput

#: the score tolerance of "identical" hits
SCORE_TOL = 1e-6


# ----------------------------------------------------------------------------- identical
def same_hits(a: Sequence[Any], b: Sequence[Any], k: int, tol: float = SCORE_TOL) -> tuple[bool, bool, float]:
    """Compare two hit lists: ``(equal, ties_reordered, max |score difference|)``. Equal: the same
    length, scores within ``tol`` rank by rank, and the same ids in the same order, except that
    hits whose scores are equal within ``tol`` may trade places (and, in a full list of ``k``, the
    last such group may hold different items of that same score)."""
    if len(a) != len(b):
        return False, False, float("inf")
    sa, sb = [float(h.score) for h in a], [float(h.score) for h in b]
    diff = max((abs(x - y) for x, y in zip(sa, sb)), default=0.0)
    ia, ib = [h.id for h in a], [h.id for h in b]
    if ia == ib:
        return diff <= tol, False, diff
    i = 0
    while i < len(ia):
        j = i
        while j + 1 < len(ia) and abs(sa[j + 1] - sa[i]) <= tol:
            j += 1
        if set(ia[i:j + 1]) != set(ib[i:j + 1]) and not (j == len(ia) - 1 and len(ia) == k and j > i):
            return False, False, diff
        i = j + 1
    return diff <= tol, True, diff


def _compare(ca: Any, cb: Any, pool: Any, *, texts: Sequence[str] | None = None,
             images: Sequence[Path] | None = None, target: str, k: int = 10) -> dict[str, Any]:
    """Search both collections with the same queries; how their answers compare."""
    from ..search import Searcher

    cache: dict = {}  # one query embedding for both collections
    kw = {"texts": list(texts)} if texts is not None else {"images": list(images or [])}
    ra = Searcher(ca, pool=pool).search_batch(k=k, target=target, cache=cache, **kw)
    rb = Searcher(cb, pool=pool).search_batch(k=k, target=target, cache=cache, **kw)
    equal = reordered = 0
    diff = 0.0
    for x, y in zip(ra, rb):
        eq, tie, d = same_hits(x.hits, y.hits, k)
        equal += eq
        reordered += eq and tie
        diff = max(diff, d)
    return {"queries": len(ra), "equal": equal, "ties_reordered": reordered, "max_score_diff": diff,
            "identical": equal == len(ra) and len(ra) > 0 and diff <= SCORE_TOL}


def _pair(path: Path, ref: str, pool: Any, items: list[Any], spec: str, say: Callable[[str], None]
          ) -> tuple[Any, Any, dict[str, Any]]:
    """A collection built with ``add_items`` and one imported from ``spec``; their item sets."""
    from ..collection.collection import Collection
    from ..adopt.importing import import_source
    from ..collection.ingest import add_items
    from ..adopt.sources import open_source

    enc = pool.get(ref)
    for d in ("added", "imported"):
        shutil.rmtree(path / d, ignore_errors=True)
    added = Collection.create(path / "added", space_id=enc.space_id, dim=enc.embed_dim, model=ref,
                              name=getattr(enc, "name", ""), modalities=enc.modalities)
    t0 = time.perf_counter()
    add_items(added, enc, items, progress=False)
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = import_source(path / "imported", open_source(spec), enc, model=ref, progress=False)
    import_s = time.perf_counter() - t0
    imported = Collection.open(path / "imported")
    ia, ib = set(added.items()), set(imported.items())
    info = {"items_added": len(ia), "items_imported": len(ib), "same_items": ia == ib,
            "add_s": round(add_s, 2), "import_s": round(import_s, 2),
            "model_check": rep.model_check.get("message"), "warnings": list(rep.warnings)}
    say(f"  {path.name}: add {len(ia)} items in {add_s:.1f}s, import {len(ib)} in {import_s:.1f}s "
        f"({rep.model_check.get('message')})")
    return added, imported, info


def run_identical(cfg: ImportBenchConfig, pool: Any, w: World, t: Text, emb: dict[str, Any],
                  say: Callable[[str], None]) -> dict[str, Any]:
    """World t2i / i2t and Multi30K t2t: import vs add, hit for hit."""
    from ..collection.ingest import text_item

    say(f"identical: world {len(w.image_queries)} images / {len(w.captions)} captions, Multi30K "
        f"{len(t.unique)} captions")
    added, imported, world_info = _pair(cfg.work / "identical-world", emb["old_ref"], pool, w.items,
                                        f"clip-retrieval:{emb['world_f32']}", say)
    t2i = _compare(added, imported, pool, texts=w.captions, target="image")
    i2t = _compare(added, imported, pool, images=w.image_queries, target="text")
    added_t, imported_t, text_info = _pair(cfg.work / "identical-text", emb["text_ref"], pool,
                                           [text_item(c) for c in t.unique], f"clip-retrieval:{emb['text_f32']}", say)
    t2t = _compare(added_t, imported_t, pool, texts=t.unique, target="text")
    out = {"t2i": bool(t2i["identical"] and world_info["same_items"]),
           "i2t": bool(i2t["identical"] and world_info["same_items"]),
           "t2t": bool(t2t["identical"] and text_info["same_items"]),
           "max_score_diff": max(t2i["max_score_diff"], i2t["max_score_diff"], t2t["max_score_diff"]),
           "tolerance": SCORE_TOL,
           "details": {"t2i": t2i, "i2t": i2t, "t2t": t2t, "world": world_info, "text": text_info}}
    say(f"  t2i {out['t2i']}, i2t {out['i2t']}, t2t {out['t2t']}, max score diff {out['max_score_diff']:.2e}")
    return out



def run_import_bench(cfg: ImportBenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every part of ``cfg.parts``; the JSON of the issue (see the module doc)."""
    from ..search import ModelPool

    say = log or (lambda _m: None)
    t_all = time.time()
    cfg.work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    n: dict[str, Any] = {}
    pool: Any = None
    w: World | None = None
    if "identical" in cfg.parts or "model_check" in cfg.parts:
        pool = ModelPool()
        w = load_world(cfg, say)
        t = load_text(cfg)
        n = {"world_test_dir": str(w.test_dir), "world_images": len(w.image_queries),
             "world_captions": len(w.captions), "multi30k_captions": len(t.captions),
             "multi30k_unique_captions": len(t.unique)}
        emb = embeddings(cfg, pool, w, t, say)
        if "identical" in cfg.parts:
            out["identical"] = run_identical(cfg, pool, w, t, emb, say)
    if "throughput" in cfg.parts:
        out["throughput"] = run_throughput(cfg, say)
    if "model_check" in cfg.parts:
        say(f"model check: {cfg.trials} trials per case, {cfg.samples} samples, threshold {cfg.threshold}")
        out["model_check"] = run_model_checks(cfg, pool, w, t, emb, say)
    if "milvus_in_place" in cfg.parts:
        try:
            out["milvus_in_place"] = run_milvus_in_place(cfg, say, pool=pool, world=w)
        except Exception as e:  # a refusal or a server that does not start is a result, not a crash
            say(f"milvus in place: {type(e).__name__}: {e}")
            out["milvus_in_place"] = {"adopted": False, "error": f"{type(e).__name__}: {e}"}
    out["data"] = n
    out["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    out["machine"] = {"cpus": os.cpu_count()}
    out["seconds"] = round(time.time() - t_all, 1)
    return out



__all__ = ["ImportBenchConfig", "SCORE_TOL", "format_markdown", "run_import_bench", "same_hits"]
