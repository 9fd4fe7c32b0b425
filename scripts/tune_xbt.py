"""Hyper-parameter search for XBT on the world VAL split (never the test split).

    python scripts/tune_xbt.py stage1 --grid "lr=1e-4,1e-3 noise=0,0.02,0.05 steps=1500"
    python scripts/tune_xbt.py stage2 --grid "lr=1e-4,1e-3 steps=300 phi_train=layernorm,all"
    python scripts/tune_xbt.py direct --grid "lr=1e-3 steps=300" --mode base

Every run prints t2i / i2t R@1 of new-model queries against the old model's val gallery and is
appended to ``runs/tune/xbt_val.jsonl``. Stage 2 and Direct runs start from the stage-1 phi
trained with ``--stage1`` settings (cached under runs/tune/).
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from nobackfill.evaluate import Embedded, cross_retrieval
from nobackfill.compat.bridges import PhiBridge
from nobackfill.compat.data import dedupe, world_eval_set, world_pairs
from nobackfill.compat.direct import train_direct
from nobackfill.compat.phi import Projection
from nobackfill.compat.upgrade import space_info
from nobackfill.compat.xbt import Stage1Config, XBTConfig, train_phi, train_xbt
from nobackfill.data.world import WorldSpec, load_world_spec, world_corpus
from nobackfill.encoders import load_encoder
from nobackfill.config import updated

OUT = Path("runs/tune")


def _cross_arrays(q_texts, q_images, g_texts, g_images, c2i):
    return cross_retrieval(Embedded("q", q_images, q_texts), Embedded("g", g_images, g_texts), c2i)


def parse_grid(text: str) -> list[dict]:
    axes = {}
    for part in text.split():
        k, v = part.split("=")
        axes[k] = [type_of(k)(x) for x in v.split(",")]
    keys = list(axes)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(axes[k] for k in keys))]


def type_of(key: str):
    return {"phi_train": str, "steps": int, "batch_size": int, "n_pairs": int, "corpus_size": int}.get(key, float)


def log(rec: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "xbt_val.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k not in ("config",)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["stage1", "stage2", "direct"])
    ap.add_argument("--grid", default="")
    ap.add_argument("--stage1", default="", help="stage-1 settings for stage2/direct runs, e.g. 'lr=1e-3 steps=1500'")
    ap.add_argument("--mode", default="base")
    ap.add_argument("--models", default="models")
    ap.add_argument("--n-pairs", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = load_world_spec("data/world") or WorldSpec()
    ev = world_eval_set(spec, "val", 1000)
    old, new = load_encoder(f"{args.models}/world-old"), load_encoder(f"{args.models}/world-new")
    E_old = {"images": old.encode_images(ev.images), "texts": old.encode_texts(ev.captions)}
    E_new = {"images": new.encode_images(ev.images), "texts": new.encode_texts(ev.captions)}
    base = {"old_old": _cross_arrays(E_old["texts"], E_old["images"], E_old["texts"], E_old["images"], ev.caption_image),
            "new_new": _cross_arrays(E_new["texts"], E_new["images"], E_new["texts"], E_new["images"], ev.caption_image)}
    print("val old/old R@1", base["old_old"]["t2i"]["R@1"], base["old_old"]["i2t"]["R@1"],
          "new/new", base["new_new"]["t2i"]["R@1"], base["new_new"]["i2t"]["R@1"], flush=True)

    def score(q: dict) -> dict:
        r = _cross_arrays(q["texts"], q["images"], E_old["texts"], E_old["images"], ev.caption_image)
        return {"t2i_R@1": r["t2i"]["R@1"], "i2t_R@1": r["i2t"]["R@1"], "t2i_R@5": r["t2i"]["R@5"],
                "i2t_R@5": r["i2t"]["R@5"]}

    cache = OUT / f"corpus-{new.space_id}-{old.space_id}.npz"
    if cache.is_file():
        z = np.load(cache)
        w_new, w_old = z["new"], z["old"]
    else:
        texts = dedupe(world_corpus(spec, 40000, split="train"))
        t0 = time.time()
        w_new, w_old = new.encode_texts(texts), old.encode_texts(texts)
        print(f"embedded {len(texts)} captions in {time.time() - t0:.0f}s", flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        np.savez(cache, new=w_new, old=w_old)

    def stage1(settings: dict) -> tuple[Projection, Stage1Config, float]:
        s = dict(settings)
        noise = s.pop("noise", 0.02)
        n = int(s.pop("corpus_size", len(w_new)))
        cfg = updated(Stage1Config(noise_std=noise, corpus_size=n), **s)
        key = OUT / ("phi-" + "-".join(f"{k}{v}" for k, v in sorted(asdict(cfg).items())))
        t0 = time.time()
        if (key / "phi_config.json").is_file():
            return Projection.load(key), cfg, 0.0
        phi, _ = train_phi(w_new[:n], w_old[:n], cfg, key)
        return phi, cfg, time.time() - t0

    def parse_kv(text: str) -> dict:
        return {k: type_of(k)(v) for k, v in (p.split("=") for p in text.split())} if text else {}

    if args.what == "stage1":
        for g in parse_grid(args.grid):
            phi, cfg, sec = stage1(g)
            pb = PhiBridge(phi, "new", "old")
            log({"what": "stage1", **g, "seconds": round(sec, 1), **score({k: pb(E_new[k]) for k in E_new}),
                 "config": asdict(cfg)})
        return
    phi0, s1cfg, _ = stage1(parse_kv(args.stage1))
    pairs = world_pairs(spec, args.n_pairs, "train")
    for g in parse_grid(args.grid):
        cfg = updated(XBTConfig(), **{k: v for k, v in g.items() if k != "n_pairs"})
        n = int(g.get("n_pairs", args.n_pairs))
        fresh = load_encoder(f"{args.models}/world-new")
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            if args.what == "stage2":
                phi = _copy(phi0)
                up, res = train_xbt(fresh, phi, pairs.subset(n), cfg, tmp, target=space_info(old))
            else:
                up, res = train_direct(fresh, old, pairs.subset(n), args.mode, cfg, tmp)
        sec = time.time() - t0
        q = {"images": up.encode_images(ev.images), "texts": up.encode_texts(ev.captions)}
        nn_ = _cross_arrays(q["texts"], q["images"], q["texts"], q["images"], ev.caption_image)
        log({"what": args.what if args.what == "stage2" else f"direct-{args.mode}", **g, "stage1": args.stage1,
             "seconds": round(sec, 1), "loss": res.last_loss, **score(q),
             "on_on_t2i_R@1": nn_["t2i"]["R@1"], "config": cfg.to_dict()})


def _copy(phi: Projection) -> Projection:
    import copy

    return copy.deepcopy(phi)


if __name__ == "__main__":
    main()
