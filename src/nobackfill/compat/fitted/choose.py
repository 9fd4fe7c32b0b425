"""Fit every candidate on the pairs, score it without labels per direction, choose.

Candidates are (family, pair set): each family of :mod:`.families` fitted on the image pairs, the
text pairs, or both together (``"mlp@image"``, ``"orthogonal@both"``, ...). Each is scored per
direction on held-out items (:mod:`.agreement`), so the t2i bridge may be a map fitted on image
pairs and the i2t one a map fitted on caption pairs. A user-given bridge (XBT, Procrustes) joins as
one more candidate through its outputs for the held-out queries. The chosen fitted candidate is
then refitted on all the pairs of its set (held-out items included), and the route (bridge, fused,
old-model) is chosen by the same score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .agreement import HeldOut, bridge_score, candidate_score, route_scores
from .families import FitConfig, FittedMap, fit_family

PAIR_SETS = ("image", "text", "both")


def candidate_name(family: str, pair_set: str) -> str:
    return f"{family}@{pair_set}"


def split_name(name: str) -> tuple[str, str]:
    family, _, pair_set = name.partition("@")
    return family, pair_set


def pair_set(pairs: Mapping[str, tuple[np.ndarray, np.ndarray]], which: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The (new, old) rows of one set: a modality's pairs, or ``both`` stacked (None if absent)."""
    mods = [m for m in (("image", "text") if which == "both" else (which,)) if m in pairs and len(pairs[m][0])]
    if not mods or (which == "both" and len(mods) < 2):
        return None
    return (np.concatenate([np.asarray(pairs[m][0], np.float32) for m in mods]),
            np.concatenate([np.asarray(pairs[m][1], np.float32) for m in mods]))


def fit_candidates(pairs: Mapping[str, tuple[np.ndarray, np.ndarray]], cfg: FitConfig | None = None,
                   sets: tuple[str, ...] = PAIR_SETS, min_pairs: int = 8) -> dict[str, FittedMap]:
    """Every family of ``cfg`` on every pair set that has at least ``min_pairs`` pairs."""
    cfg = cfg or FitConfig()
    out: dict[str, FittedMap] = {}
    for s in sets:
        xy = pair_set(pairs, s)
        if xy is None or len(xy[0]) < max(min_pairs, 8):
            continue
        for fam in cfg.families:
            out[candidate_name(fam, s)] = fit_family(fam, xy[0], xy[1], cfg)
    return out


@dataclass
class DirectionChoice:
    """What was chosen for one direction: every candidate's held-out score, the best one, its
    route choice (``route_scores``), and the bridge to serve (refitted on all pairs; None when the
    chosen candidate is a given bridge, or when no candidate exists)."""

    direction: str
    scores: dict[str, dict[str, float]]
    chosen: str | None
    routes: dict[str, Any]
    bridge: FittedMap | None = None
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def route(self) -> str:
        return self.routes["route"]

    @property
    def heldout(self) -> dict[str, float] | None:
        return self.scores.get(self.chosen) if self.chosen else None

    def to_json(self) -> dict[str, Any]:
        return {"direction": self.direction, "chosen": self.chosen, "heldout": self.heldout,
                "route": self.route, "w": self.routes.get("w"), "scores": self.scores,
                "routes": {k: v for k, v in self.routes.items() if k not in ("route", "w")}, "sizes": self.sizes}


def choose_direction(held: HeldOut, fitted: Mapping[str, FittedMap], *,
                     given: Mapping[str, np.ndarray] | None = None,
                     pairs: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                     cfg: FitConfig | None = None, margin: float = 0.0) -> DirectionChoice:
    """Score every candidate on ``held``, choose the best (agreement R@1 + overlap@10), choose
    the route with its outputs, and refit it on ``pairs`` (all pairs, when given)."""
    outputs = dict(given or {})  # first: on a tie the given (serving or user's) bridge stays
    outputs.update({name: m(held.q_new) for name, m in fitted.items()})
    scores = {name: bridge_score(q, held) for name, q in outputs.items()}
    chosen = max(scores, key=lambda n: candidate_score(scores[n])) if scores else None
    routes = route_scores(held, outputs[chosen] if chosen else None, margin=margin)
    bridge = None
    if chosen in fitted:
        bridge = fitted[chosen]
        family, ps = split_name(chosen)
        xy = pair_set(pairs, ps) if pairs is not None else None
        if xy is not None and len(xy[0]) > bridge.meta.get("pairs", 0):
            bridge = fit_family(family, xy[0], xy[1], cfg)
        bridge.meta.update(pair_set=ps, candidate=chosen)
    return DirectionChoice(held.direction, scores, chosen, routes, bridge, held.sizes)


def heldout_mask(keys, fraction: float = 0.2, salt: str = "heldout", min_count: int = 0) -> np.ndarray:
    """A deterministic split of items by key (the same item is always on the same side; items
    sharing a key, a scene, share a side): True for the held-out ``fraction``, never fitted on. Where
    that holds out fewer than ``min_count`` items, the keys of the smallest hashes are held out up
    to ``min_count`` items (at most half of them)."""
    import hashlib

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must lie in (0, 1), got {fraction}")
    h = np.array([int.from_bytes(hashlib.sha256(f"{salt}:{k}".encode()).digest()[:4], "big") for k in keys], np.int64)
    mask = h < int(fraction * 2 ** 32)
    want = min(int(min_count), len(h) // 2)
    if int(mask.sum()) < want:
        cut = np.sort(h)[want - 1]  # every item of a key at or below the want-th smallest hash
        mask = h <= cut
    return mask


__all__ = ["DirectionChoice", "PAIR_SETS", "candidate_name", "choose_direction", "fit_candidates", "heldout_mask",
           "pair_set", "split_name"]
