"""Stage-1 (Eq. 3) settings for ``bench xbt-text``, chosen on a DEV split carved from Multi30K
task2 *train* (the last ``--dev`` images; phi trains on the captions of the others), never on val.

    python scripts/tune_xbt_text.py --json runs/tune/xbt_text_stage1.jsonl

Each line: the setting and dev caption-1 -> caption-2 R@1 of old/old and phi(MiniLM)/old."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from nobackfill.bench.xbt_text import caption_recall
from nobackfill.compat.text_upgrade import load_text_encoder
from nobackfill.compat.xbt import Stage1Config, train_phi
from nobackfill.data.multi30k import CaptionSet, default_multi30k_dir, read_task2
from nobackfill.evaluate import embed_texts_cached
from nobackfill.config import updated


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(default_multi30k_dir()))
    ap.add_argument("--old", default="models/m30k-old-text")
    ap.add_argument("--dev", type=int, default=1000)
    ap.add_argument("--steps", default="3000")
    ap.add_argument("--noise", default="0.0,0.02,0.05")
    ap.add_argument("--lr", default="0.001")
    ap.add_argument("--scale", default="2.6592")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="runs/tune/xbt_text_stage1.jsonl")
    ap.add_argument("--stage2", default="", help="stage-1 tag to start from: tune stage 2 on dev instead")
    ap.add_argument("--phi-train", default="all,none")
    ap.add_argument("--s2-lr", default="0.0001")
    ap.add_argument("--s2-steps", default="60")
    ap.add_argument("--s2-batch", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cs = read_task2(a.data, "train", "en")
    n = cs.n_images
    fit = CaptionSet([c[: n - a.dev] for c in cs.captions], cs.source)
    flat, _ = fit.flat()
    dev_q, dev_g = cs.column(1)[n - a.dev:], cs.column(2)[n - a.dev:]
    old, new = load_text_encoder(a.old), load_text_encoder(None)
    cache = "runs/cache"
    o_train, n_train = embed_texts_cached(old, flat, cache), embed_texts_cached(new, flat, cache)
    o_g, o_q = embed_texts_cached(old, dev_g, cache), embed_texts_cached(old, dev_q, cache)
    n_q = embed_texts_cached(new, dev_q, cache)
    base = {"old_old_dev_R@1": caption_recall(o_q, o_g)["R@1"], "new_new_dev_R@1": caption_recall(n_q, embed_texts_cached(new, dev_g, cache))["R@1"]}
    print(base)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.stage2:
        return tune_stage2(a, cs, n, new, o_g, dev_q, out, base)
    for steps, noise, lr, scale in itertools.product([int(s) for s in a.steps.split(",")],
                                                     [float(x) for x in a.noise.split(",")],
                                                     [float(x) for x in a.lr.split(",")],
                                                     [float(x) for x in a.scale.split(",")]):
        cfg = updated(Stage1Config(), steps=steps, noise_std=noise, lr=lr, log_logit_scale=scale, threads=a.threads)
        tag = f"s{steps}-n{noise}-lr{lr}-sc{scale}"
        phi, res = train_phi(n_train, o_train, cfg, Path("runs/tune/xbt_text") / tag)
        r = caption_recall(phi.project(n_q), o_g)
        row = {"tag": tag, "steps": steps, "noise": noise, "lr": lr, "log_logit_scale": scale,
               "dev_R@1": r["R@1"], "dev_R@5": r["R@5"], "seconds": round(res.seconds, 1), **base}
        print(json.dumps(row))
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def tune_stage2(a, cs, n, new, o_g, dev_q, out, base) -> None:
    """Stage 2 (text XBT) from a stage-1 phi of this script, on the non-dev train images."""
    import copy

    from nobackfill.compat.phi import Projection
    from nobackfill.compat.text_upgrade import TextXBTConfig, train_text_xbt

    phi1 = Projection.load(Path("runs/tune/xbt_text") / a.stage2)
    train_caps = [c[: n - a.dev] for c in cs.captions]
    for pt, lr, steps in itertools.product(a.phi_train.split(","), [float(x) for x in a.s2_lr.split(",")],
                                           [int(x) for x in a.s2_steps.split(",")]):
        cfg = updated(TextXBTConfig(), images=n - a.dev, steps=steps, batch_size=a.s2_batch, lr=lr, phi_train=pt,
                            eval_every=steps)
        enc = copy.deepcopy(new)
        tag = f"s2-{a.stage2}-{pt}-lr{lr}-st{steps}-b{a.s2_batch}"
        up, res, _ = train_text_xbt(enc, phi1, train_caps, cfg, Path("runs/tune/xbt_text") / tag,
                                    target={"space_id": "old", "name": a.old, "embed_dim": phi1.out_dim},
                                    threads=a.threads)
        r = caption_recall(up.encode_texts(dev_q), o_g)
        row = {"tag": tag, "phi_train": pt, "lr": lr, "steps": steps, "dev_R@1": r["R@1"], "dev_R@5": r["R@5"],
               "seconds": round(res.seconds, 1), **base}
        print(json.dumps(row))
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
