"""Measure a saved ``xbt-text`` upgrade, loaded from disk, on Multi30K task 2 val (caption 1 queries
caption 2 of all images; R@1/5/10):

* ``old_old`` - the old text model on both sides;
* ``new_new`` - MiniLM on both sides (also: the upgrade switched off, checked bit for bit);
* ``upgraded_old`` - ``load_upgrade(dir).apply(MiniLM)`` queries against the old gallery;
* ``fusion`` - score fusion over the old gallery, ``s = (1 - w) s_old_query + w s_upgraded_query``
  for ``w`` in 0, 0.1, ..., 1 (both scores are cosines in the old space, so this is the fused query
  ``(1 - w) old(q) + w phi(MiniLM'(q))`` against the gallery). A measurement on val only: nothing
  here is tuned and reported as a test number.

    python scripts/eval_xbt_text_upgrade.py --upgrade upgrades/m30k-old-text-to-minilm \\
        --cache-dir /work/cache --json runs/bench/xbt_text_upgrade_val.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from nobackfill.bench.xbt_text import caption_recall, load_val  # noqa: E402
from nobackfill.compat.upgrade import load_upgrade  # noqa: E402
from nobackfill.data.multi30k import default_multi30k_dir  # noqa: E402
from nobackfill.encoders.minilm import MiniLMTextEncoder  # noqa: E402
from nobackfill.evaluate import embed_texts_cached  # noqa: E402

KEYS = ("R@1", "R@5", "R@10")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upgrade", default="upgrades/m30k-old-text-to-minilm")
    ap.add_argument("--old", default="models/m30k-old-text")
    ap.add_argument("--new", default="pretrained", help="'pretrained' (all-MiniLM-L6-v2) or a model directory")
    ap.add_argument("--data", default=str(default_multi30k_dir()))
    ap.add_argument("--cache-dir", default="runs/cache", help="frozen-model embedding cache")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    def new_model() -> MiniLMTextEncoder:
        return MiniLMTextEncoder.pretrained() if a.new == "pretrained" else MiniLMTextEncoder.load(a.new)

    q, g = load_val(a.data)
    old, new = MiniLMTextEncoder.load(a.old), new_model()
    o_q, o_g = embed_texts_cached(old, q, a.cache_dir), embed_texts_cached(old, g, a.cache_dir)
    n_q, n_g = embed_texts_cached(new, q, a.cache_dir), embed_texts_cached(new, g, a.cache_dir)
    up = load_upgrade(a.upgrade).apply(new_model())  # from disk, onto a fresh MiniLM
    if up.space_id != old.space_id:
        raise SystemExit(f"{a.upgrade}: targets {up.space_id}, but {a.old} is {old.space_id}")
    u_q = up.encode_texts(q)
    with up.switched(False):
        off_diff = float(np.abs(up.encode_texts(q) - new.encode_texts(q)).max())

    rows = {"old_old": caption_recall(o_q, o_g), "new_new": caption_recall(n_q, n_g),
            "upgraded_old": caption_recall(u_q, o_g)}
    fusion = []
    for w in np.round(np.linspace(0.0, 1.0, 11), 1):
        r = caption_recall((1.0 - w) * o_q + w * u_q, o_g)  # s = (1-w) <old(q), g> + w <up(q), g>
        fusion.append({"w": float(w), **{k: r[k] for k in KEYS}})

    print(f"Multi30K task2 val ({len(q)} images): caption 1 -> caption 2, recall in %")
    print("| row | query | gallery | R@1 | R@5 | R@10 |\n|---|---|---|---:|---:|---:|")
    sides = {"old_old": ("old", "old"), "new_new": ("MiniLM", "MiniLM"), "upgraded_old": ("upgraded MiniLM", "old")}
    for name, r in rows.items():
        print(f"| {name} | {sides[name][0]} | {sides[name][1]} | " + " | ".join(f"{100 * r[k]:.1f}" for k in KEYS) + " |")
    print("\nfusion over the old gallery, s = (1-w) s_old + w s_upgraded:")
    print("| w | " + " | ".join(f"{f['w']:.1f}" for f in fusion) + " |")
    print("|---|" + "---:|" * len(fusion))
    print("| R@1 | " + " | ".join(f"{100 * f['R@1']:.1f}" for f in fusion) + " |")
    print(f"\nupgrade switched off vs MiniLM: max abs diff {off_diff}")
    if a.json:
        p = Path(a.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps({"upgrade": a.upgrade, "n_val": len(q), "split": "val",
                                   "task": "Multi30K task2 en, val: caption 1 -> caption 2",
                                   "rows": rows, "fusion": fusion, "off_max_abs_diff": off_diff,
                                   "spaces": {"old": old.space_id, "new": new.space_id}}, indent=2))
        tmp.replace(p)
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
