"""The numbers of one XBT table row (``bench xbt``): R@1/5/10 both directions of new-model
queries against the old gallery, R@1 on images of concepts the old model saw, the Eq. 1 criterion
rates (XBT paper, Iscen et al. 2023), zero-shot accuracy, and the summary a reader compares first."""

from __future__ import annotations

import numpy as np

from ..encoders.base import l2_normalise
from ..evaluate import Embedded
from ..metrics.retrieval import r1_by_image_subset
from ..metrics.zero_shot import zero_shot_accuracy
from ..search.compat_report import report_row


def cross(q_texts, q_images, g_texts, g_images, c2i) -> dict:
    """R@1/5/10 both directions of the query embeddings against the gallery's."""
    return report_row(Embedded("query", q_images, q_texts), Embedded("gallery", g_images, g_texts), c2i,
                      criterion=False)


def prompt_zero_shot(images: np.ndarray, prompts: np.ndarray, labels: np.ndarray) -> float:
    """Zero-shot accuracy of ``images`` against class ``prompts`` (NaN when the widths differ)."""
    if images.shape[1] != prompts.shape[1]:
        return float("nan")
    return zero_shot_accuracy(l2_normalise(images), l2_normalise(prompts), labels)


def row_metrics(q: dict, old: dict, c2i: np.ndarray, n_unpaired: int, seed: int, seen: np.ndarray | None = None) -> dict:
    """One table row: the compatibility report's row (:func:`~nobackfill.search.compat_report.report_row`)
    of ``q`` against ``old``, and R@1 by seen concept."""
    r = report_row(Embedded("query", q["images"], q["texts"]), Embedded("old", old["images"], old["texts"]), c2i,
                   n_unpaired=n_unpaired, seed=seed)
    if seen is not None and q["texts"].shape[1] == old["images"].shape[1]:
        r["by_concept"] = r1_by_image_subset(q["texts"], q["images"], old["texts"], old["images"], c2i, seen)
    return r


def summary(result: dict) -> dict:
    """The measured numbers a reader compares first: XBT against old/old per direction, its gap
    closure, XBT against Direct-Base per pair budget, what stage 2 loaded, on/off difference."""
    rows = result["rows"]
    out: dict = {}
    if "xbt" in rows:
        x, o = rows["xbt"], rows["old_old"]
        out["xbt_vs_old_old_R@1"] = {d: [x[d]["R@1"], o[d]["R@1"]] for d in ("t2i", "i2t")}
        out["gap_closure"] = {d: x["gap_closure"][d] for d in ("t2i", "i2t")}
    sw = result.get("sweep", {})
    budgets = sorted({int(k.split("@")[1]) for k in sw})
    per = {n: {d: [sw[f"xbt@{n}"][d]["R@1"], sw[f"direct_base@{n}"][d]["R@1"]] for d in ("t2i", "i2t")}
           for n in budgets if f"xbt@{n}" in sw and f"direct_base@{n}" in sw}
    if per:
        out["xbt_vs_direct_base_R@1"] = per
    c = result.get("cost", {}).get("xbt stage 2")
    if c is not None:
        out["xbt_stage2_loaded_models"] = c["loaded_models"]
    out["onoff_max_abs_diff"] = result["onoff_max_abs_diff"]
    return out
