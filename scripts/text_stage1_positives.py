"""Stage-1 positives of the text upgrade (``same``: Eq. 3 as written; ``sibling``: another caption of
the image), chosen on a DEV split carved from Multi30K task2 train (images 28000-28999 are held out
of both stages), with the fused route's weight also chosen on dev; val is printed beside it.

    python scripts/text_stage1_positives.py --cache-dir /work/cache --json runs/tune/text_stage1_positives.json

Measured (2026-11-24, one seed): dev fused R@1 same 0.520 (w 0.1) vs sibling 0.514 (w 0.1); old/old
dev 0.510. So the shipped upgrade keeps ``same``. Val at the dev weight: 0.485 / 0.486 (old/old 0.483).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from nobackfill.compat.text_upgrade import TextXBTConfig, TextXBTUpgradeConfig, train_text_upgrade
from nobackfill.compat.upgrade import load_upgrade
from nobackfill.data.multi30k import default_multi30k_dir, read_task2
from nobackfill.encoders import load_encoder
from nobackfill.encoders.minilm import MiniLMTextEncoder
from nobackfill.metrics.retrieval import group_ranks, recall_from_ranks

DEV = (28000, 29000)


def fused_curve(old, up, q, g) -> dict[float, float]:
    go, qo, qb = old.encode_texts(g), old.encode_texts(q), up.encode_texts(q)
    n = np.arange(len(q))
    s_old, s_br = qo @ go.T, qb @ go.T
    return {round(float(w), 1): recall_from_ranks(group_ranks(None, None, n, n, scores=(1 - w) * s_old + w * s_br),
                                                  (1,))["R@1"] for w in np.linspace(0, 1, 11)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--cache-dir", type=Path, default=Path("runs/cache"))
    ap.add_argument("--work", type=Path, default=Path("runs/tune/text_stage1_positives"))
    ap.add_argument("--json", type=Path, default=Path("runs/tune/text_stage1_positives.json"))
    args = ap.parse_args()
    root = args.data or default_multi30k_dir()
    train = read_task2(root, "train", "en", ks=(1, 2))
    dev = (train.column(1)[DEV[0]:DEV[1]], train.column(2)[DEV[0]:DEV[1]])
    val = read_task2(root, "val", "en", ks=(1, 2))
    old = load_encoder("models/m30k-old-text")
    out = {}
    for mode in ("same", "sibling"):
        cfg = TextXBTUpgradeConfig(stage1_images=DEV[0], xbt=TextXBTConfig(images=DEV[0]), stage1_positives=mode)
        train_text_upgrade("models/m30k-old-text", "pretrained", root, args.work / mode, cfg,
                           cache_dir=args.cache_dir, log=print)
        up = load_upgrade(args.work / mode).apply(MiniLMTextEncoder.pretrained())
        d, v = fused_curve(old, up, *dev), fused_curve(old, up, val.column(1), val.column(2))
        w = max(d, key=d.get)
        out[mode] = {"dev": d, "val": v, "dev_w": w, "dev_best": d[w], "val_at_dev_w": v[w]}
        print(mode, json.dumps(out[mode]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
