"""``nobackfill bench fitted-bridge``: bridges fitted from a collection's own backfilled items, as
the backfill advances, chosen without labels.

(a) **World**: a collection of the train split (20,000 images and their English captions) embedded
by ``world-old`` and upgraded to ``world-new`` with no bridge; the backfill's first items are a
random sample of scenes (an image and its captions, both modalities: stratified), so after ``N``
scenes (``N`` image pairs, ``2N`` caption pairs) the candidates
(:mod:`nobackfill.compat.fitted`: every family on image pairs, caption pairs, both) are fitted on
the pairs outside a held-out fifth and scored on it without labels; the chosen one is refitted on
all ``N`` and the route (bridge / fused / old-model) chosen by the same score. The queries and
gallery are the test split, items not yet backfilled (their old vectors). Per point and direction:
R@1 / R@10 of every candidate, the chosen bridge, the served route, old/old, the shipped trained
XBT, new/new; the choice again with the XBT among the candidates (``with_shipped``).

``t2i-images``: the same world collection without its captions (images alone), t2i scored on
``given_queries`` captions of ``given_split`` as the query texts a user gives (no labels; texts
that describe no image of the collection), the candidates fitted on the image pairs.

(b) **Multi30K** task 2: a collection of train captions 1 and 2 embedded by ``m30k-old-text``,
upgraded to all-MiniLM-L6-v2 (a point: ``N`` images' two captions); evaluation: val caption 1 ->
caption 2 (or ``--eval-dir``), the shipped text XBT; and again on another split, val caption 3 -> caption
4 (``also_captions``; other queries and other gallery texts, the same collection; not with
``--eval-dir``): ``text_val34``.

Why scenes: the label-free score needs held-out queries whose matches are among the backfilled
items (a caption's image, a caption's sibling); with independent samples per modality a held-out
caption's image is almost never backfilled, the new model's top-1 is a near tie, and the score
hardly tells the families apart (measured: rank correlation with the true R@1 0.49 against 0.94).

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

from .host import shipped_path
from ..compat.fitted import FitConfig, choose_direction, fit_candidates
from ..compat.fitted.choose import split_name
from ..compat.fitted.agreement import FUSED
from ..compat.fitted.families import ENSEMBLE
from .fitted_bridge_rows import (Direction, Pool, held_out, heldout_masks, masked_shipped, query_overhead_us,
                                 recall_r)
from .world_collection import UpgradeInputs

Log = Callable[[str], None]


@dataclass
class FittedBridgeBenchConfig(UpgradeInputs):
    """Models, data, the points of the curve and the fit."""

    cache_dir: Path = Path("runs/cache")
    points: tuple[int, ...] = (128, 256, 512, 1000, 2000, 5000)
    world_items: int | None = None  # train images of the collection (None: the whole split)
    text_items: int | None = None  # Multi30K train captions of the collection (None: all)
    heldout: float = 0.2
    heldout_by: str = "scene"  # "scene": an image and its captions held out together; "item": each alone
    heldout_queries: str = "match-heldout"  # the scored queries: those whose new-model match is held out, or "all"
    world_split: str = "test"  # the world split of the queries and gallery ("val" to design on)
    given_queries: int = 2000  # t2i-images: a collection of the images alone, scored on this many query texts
    given_split: str = "val"  # ... the captions of this world split (not the evaluated one; no labels used)
    margin: float = 0.0
    fit: FitConfig = field(default_factory=FitConfig)
    parts: tuple[str, ...] = ("world", "text")
    also_captions: tuple[int, ...] = (3, 4)  # the text part again on val caption a -> b (empty, or --eval-dir: not)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.heldout_by not in ("scene", "item") or self.heldout_queries not in ("match-heldout", "all"):
            raise ValueError(f"heldout_by must be 'scene' or 'item' (got {self.heldout_by!r}), heldout_queries "
                             f"'match-heldout' or 'all' (got {self.heldout_queries!r})")
        if self.also_captions and (len(self.also_captions) != 2 or len(set(self.also_captions)) != 2
                                   or not all(1 <= k <= 5 for k in self.also_captions)):
            raise ValueError(f"also_captions: two different Multi30K caption numbers in 1..5 (query, gallery), "
                             f"or none; got {list(self.also_captions)}")

    @classmethod
    def quick(cls, **kw: Any) -> "FittedBridgeBenchConfig":
        """Every point; the MLPs capped at 1,500 steps."""
        return cls(**{"fit": FitConfig(max_steps=1500), **kw})


@dataclass
class GivenQueries:
    """A direction scored on given query texts (``pool``: their new / old vectors, every one held
    out), its candidates fitted on one modality's pairs alone (``pairs``: a collection of the images
    alone), the shipped bridge's queries for them (``shipped``)."""

    pool: Pool
    pairs: str
    shipped: np.ndarray | None = None


def run_point(n: int, pools: Mapping[str, Pool], dirs: Mapping[str, Direction], masks: Mapping[str, np.ndarray],
              shipped_held: Mapping[str, np.ndarray], total: int, cfg: FittedBridgeBenchConfig,
              given: Mapping[str, GivenQueries] | None = None) -> dict[str, Any]:
    """Fit, choose and measure after ``n`` pairs of each modality of ``pools`` (a direction of
    ``given``: scored on its given queries, with the candidates of its one pair set)."""
    cnt = {m: p.count(n) for m, p in pools.items()}
    fit_pairs = {m: (p.new[:cnt[m]][~masks[m][:cnt[m]]], p.old[:cnt[m]][~masks[m][:cnt[m]]]) for m, p in pools.items()}
    all_pairs = {m: (p.new[:cnt[m]], p.old[:cnt[m]]) for m, p in pools.items()}
    t0 = time.perf_counter()
    cands = fit_candidates(fit_pairs, cfg.fit)
    fit_s = {k: m.meta["fit_s"] for k, m in cands.items()}
    refits: dict[str, Any] = {}  # the members refitted on all the pairs, shared by the directions
    out: dict[str, Any] = {}
    for name, d in dirs.items():
        g = (given or {}).get(name)
        qmod, gmod = {"t2i": ("text", "image"), "i2t": ("image", "text"), "t2t": ("text", "text")}[name.split("-")[0]]
        gmask = masks[gmod] if cfg.heldout_queries == "match-heldout" else None
        if g is None:
            held, kept = held_out(name, pools[qmod], pools[gmod], n, masks[qmod], qmod == gmod, gmask)
            qi = np.flatnonzero(masks[qmod][:cnt[qmod]])
            d_cands, d_pairs = cands, all_pairs
        else:  # every given query is held out; the candidates fitted on the one pair set
            held, kept = held_out(name, g.pool, pools[gmod], n, np.ones(len(g.pool.keys), bool), False, gmask)
            qi = np.arange(len(g.pool.keys))
            d_cands = {k: m for k, m in cands.items() if split_name(k)[1] == g.pairs}
            d_pairs = {g.pairs: all_pairs[g.pairs]}
        families = {k: {**recall_r(d.bridged(m), d.qg, d.gg)} for k, m in d_cands.items()}
        ch = choose_direction(held, d_cands, pairs=d_pairs, cfg=cfg.fit, margin=cfg.margin, refits=refits)
        if ENSEMBLE in ch.scores:  # the ensemble as scored: its members fitted outside the held-out fifth
            families[ENSEMBLE] = recall_r(d.bridged(ch.scored_map), d.qg, d.gg)
        single = max((k for k in families if k != ENSEMBLE), key=lambda k: families[k]["r1"], default=None)
        for k, sc in ch.scores.items():
            families[k].update(heldout=sc["r1"], overlap10=sc["overlap10"])
        s_bridge = d.bridged(ch.bridge) if ch.bridge is not None else None
        bridge = recall_r(s_bridge, d.qg, d.gg) if s_bridge is not None else None
        w_fused = ch.routes.get(FUSED, {}).get("w")
        fused = d.route(FUSED, w_fused, s_bridge) if w_fused is not None else None
        served = d.route(ch.route, ch.routes.get("w"), s_bridge)
        best = max(families, key=lambda k: families[k]["r1"]) if families else None
        row = {"pairs": n, "items": dict(cnt), "fraction": round(sum(cnt.values()) / total, 5), "families": families,
               "chosen": ch.chosen, "members": ch.members,
               "heldout": ch.heldout, "heldout_sizes": ch.sizes, "route_scores": {
                   k: v for k, v in ch.routes.items() if k not in ("route", "w")},
               "served_route": ch.route, "w": ch.routes.get("w"), "served_r1": served["r1"], "served_r10": served["r10"],
               "bridge_r1": bridge["r1"] if bridge else None, "bridge_r10": bridge["r10"] if bridge else None,
               "fused_r1": fused["r1"] if fused else None, "fused_w": w_fused,
               "old_old_r1": d.old_old["r1"], "new_new_r1": d.new_new["r1"],
               "best_family": best, "best_family_r1": families[best]["r1"] if best else None,
               "choice_gap": round(families[best]["r1"] - families[ch.chosen]["r1"], 4) if best else None,
               "best_single": single, "best_single_r1": families[single]["r1"] if single else None}
        if d.s_shipped is not None:
            shipped = recall_r(d.s_shipped, d.qg, d.gg)
            row["shipped_r1"] = shipped["r1"]
            # held-out items nest: a prefix of the largest point's; the queries the score kept
            q_shipped = shipped_held[qmod][:len(qi)] if g is None else g.shipped
            ch2 = choose_direction(held, d_cands, given={"shipped": q_shipped[kept]}, pairs=d_pairs, cfg=cfg.fit,
                                   margin=cfg.margin, refits=refits)
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
           total: int, cfg: FittedBridgeBenchConfig, log: Log, masks: Mapping[str, np.ndarray],
           given: Mapping[str, GivenQueries] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {d: [] for d in dirs}
    fit_s: dict[str, Any] = {}
    for n in cfg.points:
        if any(n > p.scenes for p in pools.values()):
            log(f"  {n} pairs: more than the collection holds, skipped")
            continue
        res = run_point(n, pools, dirs, masks, shipped_held, total, cfg, given)
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


def run_world(cfg: FittedBridgeBenchConfig, log: Log) -> dict[str, Any]:
    from ..encoders import load_encoder
    from ..evaluate import embed_dataset, embed_texts_cached, load_eval_data
    from ..search.models import ModelPool, model_ref

    old, new = load_encoder(cfg.models / "world-old"), load_encoder(cfg.models / "world-new")
    xbt = ModelPool().upgraded(model_ref(cfg.models / "world-new"), shipped_path(cfg.upgrade))
    tr = load_eval_data(cfg.world, "train", langs=["en"], limit=cfg.world_items)
    te = load_eval_data(cfg.world, cfg.world_split, langs=["en"])
    t0 = time.time()
    emb = {(m, s): embed_dataset(e, d, cache_dir=cfg.cache_dir) for m, e in (("old", old), ("new", new))
           for s, d in (("train", tr), ("test", te))}
    log(f"world: {len(tr)} train images, {len(tr.captions)} captions; test {len(te)} images "
        f"(embedded in {time.time() - t0:.0f}s)")
    rng = np.random.default_rng(cfg.seed)
    scene_order = rng.permutation(len(tr))  # the sample: scenes (an image and its captions) at random
    rank = np.empty(len(tr), np.int64)
    rank[scene_order] = np.arange(len(tr))
    cap_rank = rank[np.asarray(tr.caption_image)]
    order = {"image": scene_order, "text": np.argsort(cap_rank, kind="stable")}
    pools = {"image": Pool(emb["new", "train"].images[order["image"]], emb["old", "train"].images[order["image"]],
                           [f"image-{i}" for i in order["image"]], np.arange(len(tr))),
             "text": Pool(emb["new", "train"].texts[order["text"]], emb["old", "train"].texts[order["text"]],
                          [f"text-{i}" for i in order["text"]], cap_rank[order["text"]])}
    masks = heldout_masks(pools, cfg.heldout, cfg.heldout_by)
    top = {m: p.count(max(cfg.points)) for m, p in pools.items()}
    paths = [str(p) for p in tr.image_paths()]
    shipped_held = {  # the shipped bridge's queries for the held-out items (what it is scored on)
        "text": masked_shipped(xbt.encode_texts, [tr.captions[i] for i in order["text"][:top["text"]]],
                                masks["text"][:top["text"]], 64),
        "image": masked_shipped(xbt.encode_images, [paths[i] for i in order["image"][:top["image"]]],
                                 masks["image"][:top["image"]], 64)}
    c2i = np.asarray(te.caption_image)
    has = np.flatnonzero(np.bincount(c2i, minlength=len(te)) > 0)
    e_old, e_new = emb["old", "test"], emb["new", "test"]
    dirs = {"t2i": Direction("t2i", e_new.texts, e_old.texts, xbt.encode_texts(list(te.captions)), e_old.images,
                             e_new.images, c2i, np.arange(len(te))),
            "i2t": Direction("i2t", e_new.images[has], e_old.images[has],
                             xbt.encode_images([str(p) for p in np.asarray(te.image_paths(), object)[has]]),
                             e_old.texts, e_new.texts, has, c2i)}
    given = None
    if cfg.given_queries:
        if cfg.given_split == cfg.world_split:
            raise ValueError(f"given_split: the query texts come from a split other than the evaluated one "
                             f"({cfg.world_split!r})")
        texts = list(dict.fromkeys(load_eval_data(cfg.world, cfg.given_split, langs=["en"]).captions))
        texts = [texts[i] for i in sorted(rng.permutation(len(texts))[:cfg.given_queries])]
        q = {m: embed_texts_cached(e, texts, cfg.cache_dir) for m, e in (("new", new), ("old", old))}
        dirs["t2i-images"] = dirs["t2i"]
        given = {"t2i-images": GivenQueries(Pool(q["new"], q["old"], [f"query-{i}" for i in range(len(texts))],
                                                 np.zeros(len(texts), np.int64)), "image", xbt.encode_texts(texts))}
        log(f"t2i-images: a collection of the images alone, scored on {len(texts)} {cfg.given_split} captions as "
            "query texts (no labels)")
    total = len(tr) + len(tr.captions)
    out = _curve(pools, dirs, shipped_held, total, cfg, log, masks, given)
    out["n"] = {"train_images": len(tr), "train_captions": len(tr.captions), "test_images": len(te),
                "test_captions": len(te.captions)}
    return out


def run_text(cfg: FittedBridgeBenchConfig, log: Log, captions: tuple[int, int] = (1, 2)) -> dict[str, Any]:
    """The Multi30K part, evaluated on val caption ``captions[0]`` -> ``captions[1]`` (of ``--eval-dir``
    when given)."""
    from ..data.multi30k import default_multi30k_dir, read_task2
    from ..encoders import load_encoder
    from ..evaluate import embed_texts_cached
    from ..search.models import ModelPool, model_ref

    root = cfg.multi30k or default_multi30k_dir()
    val = read_task2(root, "val", "en", ks=tuple(captions), eval_dir=cfg.eval_dir)
    train = read_task2(root, "train", "en", ks=(1, 2), limit=cfg.text_items)
    pool = ModelPool()
    old, new = load_encoder(cfg.text_old), pool.get(model_ref(cfg.text_new))
    xbt = pool.upgraded(model_ref(cfg.text_new), cfg.text_upgrade)
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(train.n_images)  # the sample: images at random, both their captions
    top = min(max(cfg.points), train.n_images)
    c1, c2 = train.column(1), train.column(2)
    sample = [c for i in order[:top] for c in (c1[i], c2[i])]
    t0 = time.time()
    embed = {m: (lambda texts, e=e: embed_texts_cached(e, texts, cfg.cache_dir)) for m, e in (("old", old), ("new", new))}
    p = Pool(embed["new"](sample), embed["old"](sample), [f"caption-{i}-{k}" for i in order[:top] for k in (1, 2)],
             np.repeat(np.arange(top), 2))
    q, g = val.column(1), val.column(2)  # the columns read, in order
    d = Direction("t2t", embed["new"](q), embed["old"](q), xbt.encode_texts(q), embed["old"](g), embed["new"](g),
                  np.arange(len(q)), np.arange(len(g)))
    log(f"text: {2 * train.n_images} train captions 1 and 2 (the collection), {len(sample)} embedded for the curve; "
        f"val {len(q)} pairs, caption {captions[0]} -> {captions[1]} "
        f"({cfg.eval_dir or 'Multi30K task2 val'}; {time.time() - t0:.0f}s)")
    masks = heldout_masks({"text": p}, cfg.heldout, cfg.heldout_by)
    shipped_held = {"text": masked_shipped(xbt.encode_texts, sample, masks["text"], d.g_old.shape[1])}
    out = _curve({"text": p}, {"t2t": d}, shipped_held, 2 * train.n_images, cfg, log, masks)
    out["n"] = {"train_captions": 2 * train.n_images, "val_pairs": len(q), "eval": str(cfg.eval_dir or "val"),
                "captions": list(captions)}
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
        evals = {"text": (1, 2)}
        if cfg.also_captions and not cfg.eval_dir:
            a, b = cfg.also_captions
            evals[f"text_val{a}{b}"] = (a, b)
        for key, caps in evals.items():
            t = run_text(cfg, say, caps)
            fit_s[key] = t.pop("fit_s")
            details[key] = t.pop("n")
            out[key] = t
    out["fit_s"] = fit_s
    out["query_overhead_us"] = query_overhead_us(cfg)
    out["n"] = details
    out["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    out["seconds"] = round(time.time() - t0, 1)
    return out


__all__ = ["FittedBridgeBenchConfig", "run_fitted_bridge_bench", "run_point", "run_text", "run_world"]
