"""``nobackfill bench xbt-text``: XBT on real text (Multi30K task 2, caption-to-caption retrieval).

Task: on the val split, caption 1 of every image queries the captions 2 of all images; the
caption 2 of the same image is the one match (R@1/5/10).

* **old** - a small text encoder trained from scratch on all task-2 train captions until its val
  R@1 stopped improving (``nobackfill train-text``; shipped in ``models/m30k-old-text``). It embeds
  the gallery (captions 2).
* **new** - the real all-MiniLM-L6-v2.

Rows:

* ``old_old`` / ``new_new`` - each model on both sides.
* ``phi_stage1_new_old`` - MiniLM query through a phi trained *only* with stage 1 (Eq. 3):
  ``L_c(phi(w_new + eps), w_old)`` on train captions (both encoders frozen; embeddings cached).
* ``xbt_new_old`` - the XBT recipe applied to text (Eq. 4-5 with a second caption in place of the
  image): ``L_c(phi(w_new(cap_a)), phi(w_new(cap_b)))`` over pairs of two different captions of one
  train image; trainable LoRA (rank 16, alpha 16, dropout 0.1, via peft) on MiniLM's attention
  projections, MiniLM's LayerNorms, and phi (starting from the stage-1 phi). The old model is not
  loaded in this stage: its gallery embeddings are computed before and the model object is freed
  (checked with a weak reference, reported as ``xbt_old_model_alive``).

The method (both stages, the ``xbt-text`` upgrade directory) is
:func:`nobackfill.compat.text_upgrade.train_text_upgrade`; this module only orchestrates it and
reports. The ``xbt_new_old`` row is computed with the trained upgraded encoder, which equals the
upgrade directory written to ``save_upgrade`` (``load_upgrade(dir).apply(MiniLM)``).

Embeddings of frozen models are cached on disk keyed by the model's space id and the text content
(:func:`nobackfill.evaluate.embed_texts_cached`), so a second run only trains.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .._atomic import atomic_write_text
from ..compat.text_upgrade import DEFAULT_OLD_MODEL, TextXBTConfig, TextXBTUpgradeConfig
from .runner import Report

ROWS = ("old_old", "new_new", "phi_stage1_new_old", "xbt_new_old")
KS = (1, 5, 10)


def load_val(data: str | Path, eval_dir: str | Path | None = None, limit: int | None = None) -> tuple[list[str], list[str]]:
    """Queries (caption 1) and gallery (caption 2) of the val split (or of ``eval_dir``)."""
    from ..data.multi30k import read_task2

    cs = read_task2(data, "val", "en", ks=(1, 2), eval_dir=eval_dir, limit=limit)
    return cs.column(1), cs.column(2)


def caption_recall(query: np.ndarray, gallery: np.ndarray) -> dict[str, float]:
    """R@1/5/10 (+ median rank, mAP) of ``query[i] -> gallery[i]``."""
    from ..train.text_pairs import caption_retrieval

    m = caption_retrieval(query, gallery, KS)
    return {k: float(m[k]) for k in (*[f"R@{k}" for k in KS], "median_rank", "mAP")}


def format_markdown(result: dict) -> str:
    lines = ["| row | query | gallery | R@1 | R@5 | R@10 |", "|---|---|---|---:|---:|---:|"]
    sides = {"old_old": ("old", "old"), "new_new": ("MiniLM", "MiniLM"),
             "phi_stage1_new_old": ("phi_stage1(MiniLM)", "old"), "xbt_new_old": ("phi_xbt(MiniLM+LoRA)", "old")}
    for name in ROWS:
        r = result["rows"].get(name)
        if r is None:
            continue
        q, g = sides[name]
        lines.append(f"| {name} | {q} | {g} | " + " | ".join(f"{100 * r[f'R@{k}']:.1f}" for k in KS) + " |")
    lines.append("")
    lines.append(f"Multi30K task2 val ({result.get('n_val')} images): caption 1 -> caption 2, recall in %.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the benchmark
def run_xbt_text(data: str | Path, *, eval_dir: str | Path | None = None, quick: bool = False,
                 old_model: str | Path = DEFAULT_OLD_MODEL, new_model: str | Path | None = None,
                 cache_dir: str | Path | None = "runs/cache", work_dir: str | Path = "runs/xbt-text",
                 config: TextXBTUpgradeConfig | None = None, save_upgrade: str | Path | None = None,
                 command: str | None = None, progress: bool = False,
                 log: Callable[[str], None] | None = None) -> dict:
    """Run every row; return the result dict (``{"rows": {...}, ...}``). The trained ``xbt-text``
    upgrade is written to ``save_upgrade`` (default: ``<work_dir>/<run key>/upgrade``); the
    ``xbt_new_old`` row is what that directory gives, reloaded and applied to the new model."""
    from ..compat import text_upgrade

    say = log or (lambda s: None)
    cfg = config or (TextXBTUpgradeConfig.quick() if quick else TextXBTUpgradeConfig())
    t_all = time.time()
    q_val, g_val = load_val(data, eval_dir)

    # ---- frozen models (the old one is loaded once, here, and freed before training)
    trainer = text_upgrade.TextUpgradeTrainer(old_model, new_model, data, cfg, cache_dir=cache_dir,
                                              embed={"val_q": q_val, "val_g": g_val}, progress=progress, log=say)
    o_q, o_g = trainer.old_embeddings["val_q"], trainer.old_embeddings["val_g"]
    n_q, n_g = trainer.new_embeddings["val_q"], trainer.new_embeddings["val_g"]
    rows = {"old_old": caption_recall(o_q, o_g), "new_new": caption_recall(n_q, n_g)}
    say(f"old_old R@1 {rows['old_old']['R@1']:.3f}  new_new R@1 {rows['new_new']['R@1']:.3f}")

    def evaluate(up) -> dict:  # the loop evaluates in eval mode (dropout off)
        r = caption_recall(up.encode_texts(q_val), o_g)
        return {"R@1": r["R@1"], "R@5": r["R@5"], "R@10": r["R@10"]}

    # ---- stage 1 + stage 2 (the library); the upgrade directory is written
    run_dir = Path(work_dir) / trainer.work_key()
    out = Path(save_upgrade) if save_upgrade is not None else run_dir / "upgrade"
    res = trainer.run(out, work_dir=work_dir, evaluate=evaluate, command=command)
    rows["phi_stage1_new_old"] = caption_recall(res.phi_stage1.project(n_q), o_g)
    rows["xbt_new_old"] = caption_recall(res.upgraded.encode_texts(q_val), o_g)
    say(f"phi_stage1_new_old R@1 {rows['phi_stage1_new_old']['R@1']:.3f}  "
        f"xbt_new_old R@1 {rows['xbt_new_old']['R@1']:.3f}")
    timings = dict(res.timings, total_s=time.time() - t_all)

    curve = [{"step": r["step"], "loss": round(r["loss"], 4), "seconds": r["seconds"],
              **{k[5:]: round(v, 4) for k, v in r.items() if k.startswith("eval/")}}
             for r in res.xbt.history if "eval/R@1" in r]
    return {
        "rows": {k: {m: rows[k][m] for m in ("R@1", "R@5", "R@10")} for k in ROWS},
        "rows_detail": rows,
        "n_val": len(q_val),
        "task": "Multi30K task2 en, val: caption 1 -> caption 2",
        "eval_dir": str(eval_dir) if eval_dir else None,
        "quick": bool(quick),
        "old": {"path": str(old_model), "space_id": res.target["space_id"], "dim": res.target["embed_dim"]},
        "new": {"name": res.source["name"], "space_id": res.source["space_id"], "dim": int(n_q.shape[1])},
        "upgrade": str(out),
        "stage1": {"corpus_size": res.corpus_size, "steps": res.stage1.steps, "seconds": round(res.stage1.seconds, 1),
                   "last_loss": res.stage1.last_loss},
        "xbt": {"pairs_images": res.pair_images, "steps": res.xbt.steps, "seconds": round(res.xbt.seconds, 1),
                "last_loss": res.xbt.last_loss, "trainable": res.trainable, "val_curve": curve},
        "xbt_old_model_alive": res.old_model_alive,
        "config": cfg.to_dict(),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "cache": {"dir": str(cache_dir) if cache_dir else None, "blocks": res.cache},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version()},
    }


def write_outputs(result: dict, json_path: str | Path | None) -> str:
    """Write ``json_path`` and the markdown table next to it (``.md``); return the markdown."""
    md = format_markdown(result)
    if json_path is not None:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, json.dumps(result, indent=2, default=float))
        p.with_suffix(".md").write_text(md)
    return md


#: the JSON and its table beside it (``.md``), shown
REPORT = Report(write_outputs)

__all__ = ["REPORT", "run_xbt_text", "TextXBTUpgradeConfig", "TextXBTConfig", "format_markdown", "write_outputs", "load_val",
           "caption_recall", "ROWS"]
