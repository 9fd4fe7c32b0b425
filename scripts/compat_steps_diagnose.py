"""Why BCT / CoReS / d-Simplex-HOC miss AC = 1 at T = 2 on the world (issue 4): for one setting
(val split), each method's self-tests C[1,1], C[2,2] and cross-test C[2,1] under both Ms (top-1
search, pair verification), and how often the top-1 neighbour of a query shares its background (a
nuisance factor of the world's images) in the old self-test vs the cross-test, and C[1,1] / C[2,1]
when every query searches only the gallery items of its own background (the nuisance held fixed).

    python scripts/compat_steps_diagnose.py --methods baseline,bct,cores,dsimplex-hoc,cl2r [--seed 1]
        [--first-fraction 0.25] [--epochs 40] [--backbone A+B --step-backbones A,A+B] [--open-set shapes]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from nobackfill.compat.learning import DataConfig, SequenceConfig, load_class_data, run_method
from nobackfill.compat.learning.base import to_numpy
from nobackfill.data.scene import BACKGROUND_RGB
from nobackfill.metrics.class_search import neighbour_agreement, within_group_search_accuracy


def backgrounds(pixels: np.ndarray) -> np.ndarray:
    """Background id of each image: the background colour nearest to its top-left 3x3 corner."""
    ref = np.array(list(BACKGROUND_RGB.values()), float)
    corner = pixels[:, :3, :3].reshape(len(pixels), -1, 3).mean(1)
    return np.argmin(((corner[:, None] - ref[None]) ** 2).sum(-1), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="baseline,bct,cores,dsimplex-hoc,cl2r")
    ap.add_argument("--epochs", type=float, default=12)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first-fraction", type=float, default=0.0, help="0: T equal tasks")
    ap.add_argument("--backbone", default="randconv+models/world-new")
    ap.add_argument("--step-backbones", default="")
    ap.add_argument("--n-render-train", type=int, default=24000, help="rendered training items (1/3 single-object)")
    ap.add_argument("--open-set", default="classes", help="classes (unseen combinations) or shapes (unseen shapes)")
    ap.add_argument("--options", default='{"bct": {"influence_weight": 3.0, "init_from_previous": true}}',
                    help="per-method options (JSON), the bench's defaults")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = DataConfig(eval_split="val", backbone=args.backbone, step_backbones=args.step_backbones,
                     open_set=args.open_set, n_render_train=args.n_render_train)
    data = load_class_data(cfg, progress=False)
    pixels = np.load(f"{cfg.cache_dir}/pixels_val_{cfg.world_seed}_{cfg.n_render_eval}.npz")["pixels"]
    g_bg, q_bg = backgrounds(pixels[data.gallery_index]), backgrounds(pixels[data.query_index])
    seq = SequenceConfig(steps=2, epochs=args.epochs, batch_size=256, lr=args.lr, seed=args.seed,
                         first_fraction=args.first_fraction)
    options = json.loads(args.options)
    print("method         M      C[1,1]  C[2,2]  C[2,1]  | top-1 neighbour shares the background: self 1/1, "
          "cross 2/1 | same-background gallery: C[1,1] C[2,1]")
    for name in args.methods.split(","):
        r = run_method(name, data, seq, f"runs/compat_steps/diagnose/{name}", options=options.get(name),
                       keep_models=True)
        old, new = r["models"]
        gallery = to_numpy(old(torch.from_numpy(data.gallery_x)))
        queries = [to_numpy(m(torch.from_numpy(data.query_x))) for m in (old, new)]
        agree = [neighbour_agreement(q, gallery, q_bg, g_bg) for q in queries]
        same_bg = [within_group_search_accuracy(q, gallery, data.query_y, data.gallery_y, q_bg, g_bg) for q in queries]
        for metric, res in (("search", r), ("verif.", r["verification"])):
            c = res["C"]
            print(f"{name:14s} {metric:6s} {c[0][0]:.3f}   {c[1][1]:.3f}   {c[1][0]:.3f}   |"
                  + (f" {agree[0]:.3f}  {agree[1]:.3f} | {same_bg[0]:.3f}  {same_bg[1]:.3f}" if metric == "search"
                     else ""), flush=True)


if __name__ == "__main__":
    main()
