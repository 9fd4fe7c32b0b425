"""Why BCT / CoReS / d-Simplex-HOC missed AC = 1 at T = 2 on the world before the junk rule (issue 4):
for one setting (val split), each method's self-tests C[1,1], C[2,2] and cross-test C[2,1] under every
M (top-1 search with near-duplicate renderings as junk, the same with them kept, pair verification),
and how often a query's top-1 neighbour (duplicates kept) shares its rendering group - the main
object's size, texture and background - in the old self-test and in the cross-test (chance: the
share of gallery items in the query's group).

    python scripts/compat_steps_diagnose.py --methods baseline,bct,cores,dsimplex-hoc,cl2r [--seeds 0,1,2]
        [--first-fraction 0.25] [--epochs 40] [--backbone A+B --step-backbones A,A+B] [--open-set shapes]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from nobackfill.bench.compat_steps import CompatStepsConfig
from nobackfill.compat.learning import DataConfig, SequenceConfig, load_class_data, run_method
from nobackfill.compat.learning.base import to_numpy
from nobackfill.metrics.class_search import neighbour_agreement

MS = ("search", "search-with-duplicates", "verification")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="baseline,bct,cores,dsimplex-hoc,cl2r")
    ap.add_argument("--epochs", type=float, default=12)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seeds", default="0", help="comma-separated; C entries are averaged over them")
    ap.add_argument("--first-fraction", type=float, default=0.0, help="0: T equal tasks")
    ap.add_argument("--backbone", default="randconv+models/world-new")
    ap.add_argument("--step-backbones", default="")
    ap.add_argument("--n-render-train", type=int, default=24000, help="rendered training items (1/3 single-object)")
    ap.add_argument("--open-set", default="classes", help="classes (unseen combinations) or shapes (unseen shapes)")
    ap.add_argument("--options", default=json.dumps(CompatStepsConfig().options),
                    help="per-method options (JSON); default: the bench's")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = DataConfig(eval_split="val", backbone=args.backbone, step_backbones=args.step_backbones,
                     open_set=args.open_set, n_render_train=args.n_render_train)
    data = load_class_data(cfg, progress=False)
    same_group = data.query_groups[:, None] == data.gallery_groups[None, :]
    print(f"{len(data.query_y)} queries, {len(data.gallery_y)} gallery items; a random gallery item shares the "
          f"query's rendering group {same_group.mean():.3f} of the time")
    options = json.loads(args.options)
    print("method        M                        C[1,1]  C[2,2]  C[2,1]  C[2,1]-C[1,1] per seed | top-1 neighbour "
          "(duplicates kept) shares the rendering group: self 1/1, cross 2/1")
    for name in args.methods.split(","):
        rows, agree = {m: [] for m in MS}, []
        for seed in (int(x) for x in args.seeds.split(",")):
            seq = SequenceConfig(steps=2, epochs=args.epochs, batch_size=256, lr=args.lr, seed=seed,
                                 first_fraction=args.first_fraction)
            r = run_method(name, data, seq, f"runs/compat_steps/diagnose/{name}", options=options.get(name),
                           keep_models=True)
            for m in MS:
                rows[m].append(np.array(r["C"] if m == r["metric"] else r[m]["C"], float))
            old, new = r["models"]
            gallery = to_numpy(old(torch.from_numpy(data.gallery_x)))
            queries = [to_numpy(mod(torch.from_numpy(data.query_x))) for mod in (old, new)]
            agree.append([neighbour_agreement(q, gallery, data.query_groups, data.gallery_groups) for q in queries])
        a = np.mean(agree, 0)
        for m in MS:
            c = np.mean(rows[m], 0)
            gaps = " ".join(f"{x[1, 0] - x[0, 0]:+.3f}" for x in rows[m])
            print(f"{name:13s} {m:24s} {c[0, 0]:.3f}   {c[1, 1]:.3f}   {c[1, 0]:.3f}   {gaps:22s}|"
                  + (f" {a[0]:.3f}  {a[1]:.3f}" if m == "search-with-duplicates" else ""), flush=True)


if __name__ == "__main__":
    main()
