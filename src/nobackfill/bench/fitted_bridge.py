"""``nobackfill bench fitted-bridge``: bridges fitted from a collection's own backfilled items, as
the backfill advances, chosen without labels.

(a) **World**: a collection of the train split (20,000 images and their English captions) embedded
by ``world-old`` and upgraded to ``world-new`` with no bridge; the backfill's first items are a
random (stratified: per modality) sample, so after ``N`` pairs of each modality the candidates
(:mod:`nobackfill.compat.fitted`: every family on image pairs, caption pairs, both) are fitted on
the pairs outside a held-out fifth and scored on it without labels; the chosen one is refitted on
all ``N`` and the route (bridge / fused / old-model) chosen by the same score. The queries and
gallery are the test split, items not yet backfilled (their old vectors). Per point and direction:
R@1 / R@10 of every candidate, the chosen bridge, the served route, old/old, the shipped trained
XBT, new/new; the choice again with the XBT among the candidates (``with_shipped``).

(b) **Multi30K** task 2: a collection of train captions 2 embedded by ``m30k-old-text``, upgraded to
all-MiniLM-L6-v2; evaluation: val caption 1 -> caption 2 (or ``--eval-dir``), the shipped text XBT.

Numbers are computed on the vectors (the same maths as the Searcher's exact search, without its
stores), so every family and point costs a matrix product; fit seconds and the query overhead of
each family (one query, microseconds) are measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..compat.fitted import FitConfig, HeldOut, choose_direction, fit_candidates, heldout_mask
from ..compat.fitted.agreement import BRIDGE, FUSED, OLD_MODEL
from ..metrics.retrieval import group_ranks, recall_from_ranks

Log = Callable[[str], None]


@dataclass
class FittedBridgeBenchConfig:
    """Models, data, the points of the curve and the fit."""

    models: Path = Path("models")
    world: Path = Path("data/world")
    upgrade: Path = Path("upgrades/world-old-to-new")
    text_old: Path = Path("models/m30k-old-text")
    text_new: str = "minilm"
    text_upgrade: Path = Path("upgrades/m30k-old-text-to-minilm")
    multi30k: Path | None = None
    eval_dir: Path | None = None
    cache_dir: Path = Path("runs/cache")
    points: tuple[int, ...] = (128, 256, 512, 1000, 2000, 5000)
    world_items: int | None = None  # train images of the collection (None: the whole split)
    text_items: int | None = None  # Multi30K train captions of the collection (None: all)
    heldout: float = 0.2
    margin: float = 0.0
    fit: FitConfig = field(default_factory=FitConfig)
    parts: tuple[str, ...] = ("world", "text")
    seed: int = 0

    @classmethod
    def quick(cls, **kw: Any) -> "FittedBridgeBenchConfig":
        """Every point; the MLPs capped at 1,500 steps."""
        return cls(**{"fit": FitConfig(max_steps=1500), **kw})


def _ranks(scores: np.ndarray, qg: np.ndarray, gg: np.ndarray) -> np.ndarray:
    return group_ranks(None, None, qg, gg, scores=scores)


def _r(scores: np.ndarray, qg: np.ndarray, gg: np.ndarray) -> dict[str, float]:
    r = recall_from_ranks(_ranks(scores, qg, gg), (1, 10))
    return {"r1": round(r["R@1"], 4), "r10": round(r["R@10"], 4)}


@dataclass
class Direction:
    """One direction's test data: new / old / shipped query vectors, the gallery's old and new
    vectors, relevance groups."""

    name: str
    q_new: np.ndarray
    q_old: np.ndarray
    q_shipped: np.ndarray | None
    g_old: np.ndarray
    g_new: np.ndarray
    qg: np.ndarray
    gg: np.ndarray

    def __post_init__(self) -> None:
        self.s_old = self.q_old @ self.g_old.T
        self.old_old = _r(self.s_old, self.qg, self.gg)
        self.new_new = _r(self.q_new @ self.g_new.T, self.qg, self.gg)
        self.s_shipped = self.q_shipped @ self.g_old.T if self.q_shipped is not None else None

    def bridged(self, bridge) -> np.ndarray:
        return bridge(self.q_new) @ self.g_old.T

    def route(self, route: str, w: float | None, s_bridge: np.ndarray | None) -> dict[str, float]:
        if route == OLD_MODEL or s_bridge is None:
            return self.old_old
        if route == BRIDGE:
            return _r(s_bridge, self.qg, self.gg)
        return _r((1 - w) * self.s_old + w * s_bridge, self.qg, self.gg)


@dataclass
class Pool:
    """The backfilled items' vectors of one modality (rows in backfill order), their keys."""

    new: np.ndarray
    old: np.ndarray
    keys: list[str]


def _held(direction: str, qpool: Pool, gpool: Pool, n: int, qmask: np.ndarray, same: bool) -> HeldOut:
    """Queries: the held-out backfilled items of the query modality (never fitted on); gallery: every
    backfilled item of the gallery modality (a bridge maps queries only, so a gallery item it was
    fitted on is no leak, and the larger gallery tells the candidates apart)."""
    qi = np.flatnonzero(qmask[:n])
    return HeldOut(direction, qpool.new[qi], gpool.new[:n], gpool.old[:n], qpool.old[qi], qi if same else None)


def run_point(n: int, pools: Mapping[str, Pool], dirs: Mapping[str, Direction], masks: Mapping[str, np.ndarray],
              shipped_held: Mapping[str, np.ndarray], total: int, cfg: FittedBridgeBenchConfig) -> dict[str, Any]:
    """Fit, choose and measure after ``n`` pairs of each modality of ``pools``."""
    fit_pairs = {m: (p.new[:n][~masks[m][:n]], p.old[:n][~masks[m][:n]]) for m, p in pools.items()}
    all_pairs = {m: (p.new[:n], p.old[:n]) for m, p in pools.items()}
    t0 = time.perf_counter()
    cands = fit_candidates(fit_pairs, cfg.fit)
    fit_s = {k: m.meta["fit_s"] for k, m in cands.items()}
    out: dict[str, Any] = {}
    for name, d in dirs.items():
        qmod, gmod = {"t2i": ("text", "image"), "i2t": ("image", "text"), "t2t": ("text", "text")}[name]
        held = _held(name, pools[qmod], pools[gmod], n, masks[qmod], qmod == gmod)
        qi = np.flatnonzero(masks[qmod][:n])
        families = {k: {**_r(d.bridged(m), d.qg, d.gg)} for k, m in cands.items()}
        ch = choose_direction(held, cands, pairs=all_pairs, cfg=cfg.fit, margin=cfg.margin)
        for k, sc in ch.scores.items():
            families[k].update(heldout=sc["r1"], overlap10=sc["overlap10"])
        s_bridge = d.bridged(ch.bridge) if ch.bridge is not None else None
        bridge = _r(s_bridge, d.qg, d.gg) if s_bridge is not None else None
        w_fused = ch.routes.get(FUSED, {}).get("w")
        fused = d.route(FUSED, w_fused, s_bridge) if w_fused is not None else None
        served = d.route(ch.route, ch.routes.get("w"), s_bridge)
        best = max(families, key=lambda k: families[k]["r1"]) if families else None
        row = {"pairs": n, "fraction": round(2 * n / total, 5), "families": families, "chosen": ch.chosen,
               "heldout": ch.heldout, "heldout_sizes": ch.sizes, "route_scores": {
                   k: v for k, v in ch.routes.items() if k not in ("route", "w")},
               "served_route": ch.route, "w": ch.routes.get("w"), "served_r1": served["r1"], "served_r10": served["r10"],
               "bridge_r1": bridge["r1"] if bridge else None, "bridge_r10": bridge["r10"] if bridge else None,
               "fused_r1": fused["r1"] if fused else None, "fused_w": w_fused,
               "old_old_r1": d.old_old["r1"], "new_new_r1": d.new_new["r1"],
               "best_family": best, "best_family_r1": families[best]["r1"] if best else None,
               "choice_gap": round(families[best]["r1"] - families[ch.chosen]["r1"], 4) if best else None}
        if d.s_shipped is not None:
            shipped = _r(d.s_shipped, d.qg, d.gg)
            row["shipped_r1"] = shipped["r1"]
            given = {"shipped": shipped_held[qmod][:len(qi)]}  # held-out items nest: a prefix of the largest point's
            ch2 = choose_direction(held, cands, given=given, pairs=all_pairs, cfg=cfg.fit, margin=cfg.margin)
            s2 = d.s_shipped if ch2.chosen == "shipped" else (d.bridged(ch2.bridge) if ch2.bridge is not None else None)
            served2 = d.route(ch2.route, ch2.routes.get("w"), s2)
            w2 = ch2.routes.get(FUSED, {}).get("w")
            row["with_shipped"] = {"chosen": ch2.chosen, "heldout": ch2.heldout, "served_route": ch2.route,
                                   "w": ch2.routes.get("w"), "served_r1": served2["r1"],
                                   "shipped_heldout": ch2.scores["shipped"]["r1"],
                                   "fused_shipped_r1": d.route(FUSED, w2, d.s_shipped)["r1"] if w2 is not None else None}
        out[name] = row
    out["_fit_s"] = {"all": round(time.perf_counter() - t0, 2), **fit_s}
    return out


def _curve(pools: Mapping[str, Pool], dirs: Mapping[str, Direction], shipped_held: Mapping[str, np.ndarray],
           total: int, cfg: FittedBridgeBenchConfig, log: Log, masks: Mapping[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {d: [] for d in dirs}
    fit_s: dict[str, Any] = {}
    for n in cfg.points:
        if any(n > len(p.keys) for p in pools.values()):
            log(f"  {n} pairs: more than the collection holds, skipped")
            continue
        res = run_point(n, pools, dirs, masks, shipped_held, total, cfg)
        fit_s[str(n)] = res.pop("_fit_s")
        for d, row in res.items():
            out[d].append(row)
            log(f"  {n:>5} pairs {d}: chosen {row['chosen']} (held-out {row['heldout']['r1']:.3f}) -> "
                f"{row['served_route']} R@1 {row['served_r1']:.3f} (bridge {row['bridge_r1']}, best family "
                f"{row['best_family']} {row['best_family_r1']:.3f}, old/old {row['old_old_r1']:.3f}"
                + (f", with shipped: {row['with_shipped']['served_route']} {row['with_shipped']['served_r1']:.3f}"
                   if "with_shipped" in row else "") + ")")
    out["fit_s"] = fit_s
    return out


def _masked_shipped(encode_fn, inputs: Sequence[Any], mask: np.ndarray, dim: int) -> np.ndarray:
    idx = np.flatnonzero(mask)
    return encode_fn([inputs[i] for i in idx]) if len(idx) else np.zeros((0, dim), np.float32)


def run_world(cfg: FittedBridgeBenchConfig, log: Log) -> dict[str, Any]:
    from ..encoders import load_encoder
    from ..evaluate import embed_dataset, load_eval_data
    from ..search.models import ModelPool, model_ref

    old, new = load_encoder(cfg.models / "world-old"), load_encoder(cfg.models / "world-new")
    xbt = ModelPool().upgraded(model_ref(cfg.models / "world-new"), cfg.upgrade)
    tr = load_eval_data(cfg.world, "train", langs=["en"], limit=cfg.world_items)
    te = load_eval_data(cfg.world, "test", langs=["en"])
    t0 = time.time()
    emb = {(m, s): embed_dataset(e, d, cache_dir=cfg.cache_dir) for m, e in (("old", old), ("new", new))
           for s, d in (("train", tr), ("test", te))}
    log(f"world: {len(tr)} train images, {len(tr.captions)} captions; test {len(te)} images "
        f"(embedded in {time.time() - t0:.0f}s)")
    rng = np.random.default_rng(cfg.seed)
    order = {"image": rng.permutation(len(tr)), "text": rng.permutation(len(tr.captions))}
    pools = {"image": Pool(emb["new", "train"].images[order["image"]], emb["old", "train"].images[order["image"]],
                           [f"image-{i}" for i in order["image"]]),
             "text": Pool(emb["new", "train"].texts[order["text"]], emb["old", "train"].texts[order["text"]],
                          [f"text-{i}" for i in order["text"]])}
    masks = {m: heldout_mask(p.keys, cfg.heldout) for m, p in pools.items()}
    top = max(cfg.points)
    paths = [str(p) for p in tr.image_paths()]
    shipped_held = {  # the shipped bridge's queries for the held-out items (what it is scored on)
        "text": _masked_shipped(xbt.encode_texts, [tr.captions[i] for i in order["text"][:top]], masks["text"][:top], 64),
        "image": _masked_shipped(xbt.encode_images, [paths[i] for i in order["image"][:top]], masks["image"][:top], 64)}
    c2i = np.asarray(te.caption_image)
    has = np.flatnonzero(np.bincount(c2i, minlength=len(te)) > 0)
    e_old, e_new = emb["old", "test"], emb["new", "test"]
    dirs = {"t2i": Direction("t2i", e_new.texts, e_old.texts, xbt.encode_texts(list(te.captions)), e_old.images,
                             e_new.images, c2i, np.arange(len(te))),
            "i2t": Direction("i2t", e_new.images[has], e_old.images[has],
                             xbt.encode_images([str(p) for p in np.asarray(te.image_paths(), object)[has]]),
                             e_old.texts, e_new.texts, has, c2i)}
    total = len(tr) + len(tr.captions)
    out = _curve(pools, dirs, shipped_held, total, cfg, log, masks)
    out["n"] = {"train_images": len(tr), "train_captions": len(tr.captions), "test_images": len(te),
                "test_captions": len(te.captions)}
    return out


def run_text(cfg: FittedBridgeBenchConfig, log: Log) -> dict[str, Any]:
    from ..data.multi30k import default_multi30k_dir, read_task2
    from ..encoders import load_encoder
    from ..evaluate import embed_texts_cached
    from ..search.models import ModelPool, model_ref

    root = cfg.multi30k or default_multi30k_dir()
    val = read_task2(root, "val", "en", ks=(1, 2), eval_dir=cfg.eval_dir)
    train = read_task2(root, "train", "en", ks=(1, 2), limit=cfg.text_items).column(2)
    pool = ModelPool()
    old, new = load_encoder(cfg.text_old), pool.get(model_ref(cfg.text_new))
    xbt = pool.upgraded(model_ref(cfg.text_new), cfg.text_upgrade)
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(train))
    top = min(max(cfg.points), len(train))
    sample = [train[i] for i in order[:top]]
    t0 = time.time()
    embed = {m: (lambda texts, e=e: embed_texts_cached(e, texts, cfg.cache_dir)) for m, e in (("old", old), ("new", new))}
    p = Pool(embed["new"](sample), embed["old"](sample), [f"caption-{i}" for i in order[:top]])
    q, g = val.column(1), val.column(2)
    d = Direction("t2t", embed["new"](q), embed["old"](q), xbt.encode_texts(q), embed["old"](g), embed["new"](g),
                  np.arange(len(q)), np.arange(len(g)))
    log(f"text: {len(train)} train captions (the collection), {top} embedded for the curve; val {len(q)} pairs "
        f"({cfg.eval_dir or 'Multi30K task2 val'}; {time.time() - t0:.0f}s)")
    masks = {"text": heldout_mask(p.keys, cfg.heldout)}
    shipped_held = {"text": _masked_shipped(xbt.encode_texts, sample, masks["text"], d.g_old.shape[1])}
    out = _curve({"text": p}, {"t2t": d}, shipped_held, 2 * len(train), cfg, log, masks)
    for row in out["t2t"]:
        row["fraction"] = round(row["pairs"] / len(train), 5)
    out["n"] = {"train_captions": len(train), "val_pairs": len(q), "eval": str(cfg.eval_dir or "val")}
    return out


def query_overhead_us(cfg: FittedBridgeBenchConfig, d_new: int = 128, d_old: int = 64, repeats: int = 2000) -> dict:
    """Microseconds to bridge one query, per family (fitted on random pairs of the world's widths)."""
    from ..compat.fitted import fit_family

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((600, d_new)).astype(np.float32), rng.standard_normal((600, d_old)).astype(np.float32)
    q = x[:1]
    out = {}
    for fam in cfg.fit.families:
        m = fit_family(fam, x, y, FitConfig(epochs=2, hidden=cfg.fit.hidden))
        m(q)
        t0 = time.perf_counter()
        for _ in range(repeats):
            m(q)
        out[fam] = round(1e6 * (time.perf_counter() - t0) / repeats, 1)
    return out


def run_fitted_bridge_bench(cfg: FittedBridgeBenchConfig, log: Log | None = None) -> dict[str, Any]:
    """The JSON of the issue: ``world`` (t2i, i2t), ``text`` (t2t), ``fit_s``, ``query_overhead_us``."""
    say = log or (lambda _m: None)
    t0 = time.time()
    out: dict[str, Any] = {}
    fit_s: dict[str, Any] = {}
    details: dict[str, Any] = {}
    if "world" in cfg.parts:
        w = run_world(cfg, say)
        fit_s["world"] = w.pop("fit_s")
        details["world"] = w.pop("n")
        out["world"] = w
    if "text" in cfg.parts:
        t = run_text(cfg, say)
        fit_s["text"] = t.pop("fit_s")
        details["text"] = t.pop("n")
        out["text"] = t
    out["fit_s"] = fit_s
    out["query_overhead_us"] = query_overhead_us(cfg)
    out["n"] = details
    out["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    out["seconds"] = round(time.time() - t0, 1)
    return out


__all__ = ["FittedBridgeBenchConfig", "run_fitted_bridge_bench", "run_point", "run_text", "run_world"]
