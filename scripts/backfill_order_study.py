"""Why the ``uncertainty`` backfill order is built the way it is (``nobackfill.lifecycle.backfill``).

On the world test split (the collection of ``bench backfill``: world-old items upgraded to world-new,
routes calibrated on val) every item's gain from being backfilled is measured: for an image, how
many of its captions' text->image queries turn right (native new vs the calibrated route); for a
caption, whether its image's image->text query turns right. Orders are then simulated (a query is
answered natively once its relevant item is backfilled, through the route before; merges ignored):

* random, and the oracle (true gain, modalities interleaved);
* heads ``h(v_old)`` fitted on a random 5 % / 10 % sample, predicting either FastFill's
  transformation error ``1 - cos(psi(v_old), v_new)`` or the route failure measured with the
  collection's own pairs; the head is ridge regression, a one-hidden-layer MLP or kNN;
* with the modalities interleaved in proportion and the captions one per image first.

    python scripts/backfill_order_study.py --json runs/tune/backfill_order_study.json

Measured (2026-11-24, world test, AUC of R@1 over 0/5/10/20/40/60/80/100 %; random t2i 0.586 /
i2t 0.755; oracle 0.678 / 0.799): the transformation-error heads never beat random on i2t; the
route-failure ridge head with interleaving and caption cover reached 0.605 / 0.781 (5 % sample),
so that is the shipped order.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from nobackfill.bench.backfill import FRACTIONS
from nobackfill.bench.routes import RoutesBenchConfig
from nobackfill.bench.world_collection import embedded_collection, upgraded_world_collection, world_eval
from nobackfill.search import ModelPool, Searcher
from nobackfill.lifecycle.backfill_order import _cover_images_first, _cross_fit_targets, _fit_head, _interleave
from nobackfill.search.models import model_ref


def _mlp(x, y):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))
    for _ in range(400):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(xt).squeeze(1), yt).backward()
        opt.step()
    return lambda v: net(torch.from_numpy(np.asarray(v, np.float32))).squeeze(1).detach().numpy()


def _knn(x, y, k=7):
    return lambda v: y[np.argsort(-(np.asarray(v) @ x.T), axis=1)[:, :k]].mean(axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=Path, default=Path("data/world"))
    ap.add_argument("--work", type=Path, default=Path("runs/tune/backfill_order"))
    ap.add_argument("--json", type=Path, default=Path("runs/tune/backfill_order_study.json"))
    args = ap.parse_args()
    cfg = RoutesBenchConfig(world=args.world, calib_images=500)
    pool = ModelPool()
    ev = world_eval(args.world / "test")
    base, plan, _ = upgraded_world_collection(cfg, pool, ev, args.work / "base", print)
    new = embedded_collection(args.work / "new", pool, model_ref(cfg.models / "world-new"), ev.items, print)
    r_old, r_new = ev.measure(Searcher(base, pool=pool)), ev.measure(Searcher(new, pool=pool))
    gain: dict[str, float] = {}
    fail: dict[str, list[float]] = {}
    for rel, ro, rn in zip(ev.t2i_rel, r_old["t2i"], r_new["t2i"]):
        i = next(iter(rel))
        gain[i] = gain.get(i, 0.0) + float(rn == 1) - float(ro == 1)
        fail.setdefault(i, []).append(float(ro != 1))
    for rel, ro, rn in zip(ev.i2t_rel, r_old["i2t"], r_new["i2t"]):
        for j in rel:
            gain[j] = (float(rn == 1) - float(ro == 1)) / len(rel)
            fail[j] = [float(ro != 1)]
    route_fail = {i: float(np.mean(v)) for i, v in fail.items()}
    ids = [it.id for it in ev.items]
    mod = {it.id: it.modality for it in ev.items}
    by_id = {it.id: it for it in ev.items}
    snap_b, snap_n = base.snapshot(), new.snapshot()
    old_sid = next(s for s in snap_b.preference() if s != snap_b.current_space)
    vo, vn = {}, {}
    for m in ("image", "text"):
        for snap, sid, out in ((snap_b, old_sid, vo), (snap_n, snap_n.current_space, vn)):
            view = snap.views(m)[sid]
            vecs = np.asarray(view.gallery.vectors(m))
            out.update({iid: vecs[p] for p, iid in enumerate(view.item_ids) if iid})
    t2i = [(next(iter(rel)), ro == 1, rn == 1) for rel, ro, rn in zip(ev.t2i_rel, r_old["t2i"], r_new["t2i"])]
    i2t = [(rel, ro == 1, rn == 1) for rel, ro, rn in zip(ev.i2t_rel, r_old["i2t"], r_new["i2t"])]

    def auc(order: list[str]) -> dict[str, float]:
        pos = {i: k for k, i in enumerate(order)}
        out = {"t2i": [], "i2t": []}
        for f in FRACTIONS:
            cut = round(f * len(order))
            out["t2i"].append(np.mean([rn if pos[i] < cut else ro for i, ro, rn in t2i]))
            out["i2t"].append(np.mean([rn if any(pos[j] < cut for j in rel) else ro for rel, ro, rn in i2t]))
        return {d: round(float(np.mean(v)), 4) for d, v in out.items()}

    rng = np.random.default_rng(0)
    rows = {"random": auc([ids[i] for i in rng.permutation(len(ids))]),
            "oracle (interleaved)": auc(_interleave({m: sorted((i for i in ids if mod[i] == m), key=lambda i: -gain[i])
                                                     for m in ("image", "text")}))}
    for frac in (0.05, 0.1):
        for target in ("transformation_error", "route_failure"):
            for head in ("ridge", "mlp", "knn"):
                for rules in (False, True):
                    per, samples, scored = {}, [], []
                    for m in ("image", "text"):
                        mids = [i for i in ids if mod[i] == m]
                        perm = [mids[i] for i in np.random.default_rng(1).permutation(len(mids))]
                        n = max(32, int(frac * len(mids)))
                        sample, rest = perm[:n], perm[n:]
                        x = np.stack([vo[i] for i in sample])
                        y = (_cross_fit_targets(x, np.stack([vn[i] for i in sample])) if target == "transformation_error"
                             else np.array([route_fail[i] for i in sample]))
                        fit = {"ridge": _fit_head, "mlp": _mlp, "knn": _knn}[head](x, y)
                        pred = fit(np.stack([vo[i] for i in rest]))
                        ranked = [rest[k] for k in np.argsort(-pred, kind="stable")]
                        samples += sample
                        scored += list(zip(rest, pred))
                        if rules and m == "text":
                            ranked = [it.id for it in _cover_images_first([by_id[i] for i in ranked],
                                                                           {by_id[i].metadata["image_id"] for i in sample})]
                        per[m] = sample + ranked
                    # without the rules: samples first, then every item by its predicted score
                    order = _interleave(per) if rules else samples + [i for i, _ in sorted(scored, key=lambda t: -t[1])]
                    name = f"{head} on {target}, {int(frac * 100)}% sample" + (", interleaved + cover" if rules else "")
                    rows[name] = auc(order)
                    print(f"{name}: {rows[name]}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    for name, r in rows.items():
        print(f"{r['t2i']:.3f} {r['i2t']:.3f}  {name}")


if __name__ == "__main__":
    main()
