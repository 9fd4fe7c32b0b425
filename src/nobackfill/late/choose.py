"""Choosing how to re-rank on a validation split, and scoring one model with that choice: per
direction, the candidate pair score (``directional``: Eq. 4 for text queries, Eq. 3 for image
queries; ``symmetric``: their mean) and the fusion weight ``w`` of ``global + w * CMLI`` (``w = 0``:
re-ranking off, ``inf``: CMLI alone) with the best val R@1; never chosen on test."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from .rerank import RerankSet, rerank_metrics, rerank_pairs

INF = float("inf")
#: the candidate pair scores, in tie-break order
SCORE_VARIANTS = ("directional", "symmetric")

Choice = dict  # direction -> (variant, weight); None = global scoring


def choose_rerank(val_scored: Sequence[tuple[dict, RerankSet]], weights: Sequence[float],
                  variants: Sequence[str] = SCORE_VARIANTS) -> tuple[Choice, dict]:
    """Per direction, the (score variant, fusion weight) with the best R@1 averaged over the val
    sets (ties: the earlier variant, then the smaller weight). Returns the choice and the table."""
    variants = tuple(variants)
    grid = [(v, w) for v in variants for w in weights]
    table: dict[str, dict] = {"t2i": {}, "i2t": {}}
    for v, w in grid:
        ms = [rerank_metrics(s, d, {"t2i": (v, w), "i2t": (v, w)}) for s, d in val_scored]
        for d in table:
            table[d][(v, w)] = float(np.mean([m[d]["R@1"] for m in ms]))
    choice = {d: max(grid, key=lambda vw: (t[vw], -variants.index(vw[0]), -vw[1])) for d, t in table.items()}
    readable = {d: {f"{v}@{w}": round(x, 4) for (v, w), x in t.items()} for d, t in table.items()}
    return choice, readable


def evaluate_reranking(encoder, tests: Mapping[str, RerankSet], vals: Sequence[RerankSet], *, rerank_k: int,
                       weights: Sequence[float], variants: Sequence[str] = SCORE_VARIANTS) -> dict:
    """Global, re-ranked (score variant and weight chosen on ``vals``) and CMLI-only metrics of one
    model on each test set, with the choice and its val table."""
    val_scored = [(rerank_pairs(encoder, v, rerank_k), v) for v in vals]
    choice, table = choose_rerank(val_scored, weights, variants)
    cmli_only = {"t2i": ("directional", INF), "i2t": ("directional", INF)}
    out: dict = {"choice": {d: {"score": v, "weight": w if math.isfinite(w) else "inf"} for d, (v, w) in choice.items()},
                 "val_r1_by_choice": table}
    for name, data in tests.items():
        s = rerank_pairs(encoder, data, rerank_k)
        out[name] = {"global": rerank_metrics(s, data, None), "rerank": rerank_metrics(s, data, choice),
                     "cmli_only": rerank_metrics(s, data, cmli_only)}
    return out


__all__ = ["INF", "SCORE_VARIANTS", "choose_rerank", "evaluate_reranking"]
