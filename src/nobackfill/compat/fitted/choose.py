"""Fit every candidate on the pairs, score it without labels per direction, choose.

Candidates are (family, pair set): each family of :mod:`.families` fitted on the image pairs, the
text pairs, or both together (``"mlp@image"``, ``"orthogonal@both"``, ...). Each is scored per
direction on held-out items (:mod:`.agreement`), so the t2i bridge may be a map fitted on image
pairs and the i2t one a map fitted on caption pairs. A user-given bridge (XBT, Procrustes) joins as
one more candidate through its outputs for the held-out queries.

What the fitted side offers is the **ensemble** of the ``FitConfig.ensemble`` (3) best-scored
candidates: the mean of their unit outputs (:func:`~.families.ensemble_map`). At a few hundred pairs
the single best-scored candidate is a noisy pick (the held-out fifth holds a few dozen queries, and
which family wins on them need not win on the collection), while the average of the best few is
better than any one of them: on the design splits of ``bench fitted-bridge`` (world val, Multi30K
train captions 3 -> 4) it was at or above the best single family at 22 of 24 points and within
0.005 at the other two, where the single best-scored pick missed the best family by up to 0.12
(rechecked on three samples of scenes: within 0.01 of the best family at all 72 points, where the
best two, the best four, or a size chosen by the held-out score missed at 3, 12 and 6). The
ensemble then competes with the given bridges on the same score. The chosen fitted bridge is
refitted on all the pairs of its members' sets (held-out items included), and the route (bridge,
fused, old-model) is chosen by the same score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .agreement import HeldOut, bridge_score, candidate_score, route_scores
from .families import ENSEMBLE, FitConfig, FittedMap, ensemble_map, fit_family

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
    """What was chosen for one direction: every candidate's held-out score (the ensemble's under
    ``"ensemble"``), the chosen one, its route choice (``route_scores``), the bridge to serve
    (refitted on all pairs; None when the chosen candidate is a given bridge, or when no candidate
    exists), the fitted candidate as scored (``scored_map``, before the refit) and its members."""

    direction: str
    scores: dict[str, dict[str, float]]
    chosen: str | None
    routes: dict[str, Any]
    bridge: FittedMap | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    scored_map: FittedMap | None = None
    members: list[str] = field(default_factory=list)

    @property
    def route(self) -> str:
        return self.routes["route"]

    @property
    def heldout(self) -> dict[str, float] | None:
        return self.scores.get(self.chosen) if self.chosen else None

    def to_json(self) -> dict[str, Any]:
        return {"direction": self.direction, "chosen": self.chosen, "members": self.members, "heldout": self.heldout,
                "route": self.route, "w": self.routes.get("w"), "scores": self.scores,
                "routes": {k: v for k, v in self.routes.items() if k not in ("route", "w")}, "sizes": self.sizes}


def choose_direction(held: HeldOut, fitted: Mapping[str, FittedMap], *,
                     given: Mapping[str, np.ndarray] | None = None,
                     pairs: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                     cfg: FitConfig | None = None, margin: float = 0.0,
                     refits: dict[str, FittedMap] | None = None) -> DirectionChoice:
    """Score every candidate on ``held`` (agreement R@1 + overlap@10), average the best
    ``cfg.ensemble`` fitted ones (module doc), choose between that and the ``given`` bridges (on a
    tie the given one, serving or the user's, stays), choose the route with its outputs, and refit
    the chosen fitted bridge on ``pairs`` (all pairs, when given). ``refits``: candidates already
    refitted on the same ``pairs`` (by name; filled here), so directions sharing a member fit it once."""
    cfg = cfg or FitConfig()
    outputs = dict(given or {})
    fitted_out = {name: m(held.q_new) for name, m in fitted.items()}
    scores = {name: bridge_score(q, held) for name, q in {**outputs, **fitted_out}.items()}
    ranked = sorted(fitted, key=lambda n: candidate_score(scores[n]), reverse=True)
    members = ranked[:cfg.ensemble]
    scored_map = None
    if len(members) > 1:
        scored_map = ensemble_map([(n, fitted[n]) for n in members])
        outputs[ENSEMBLE] = scored_map(held.q_new)
        scores[ENSEMBLE] = bridge_score(outputs[ENSEMBLE], held)
    elif members:
        scored_map, outputs[members[0]] = fitted[members[0]], fitted_out[members[0]]
    chosen = max(outputs, key=lambda n: candidate_score(scores[n])) if outputs else None
    routes = route_scores(held, outputs[chosen] if chosen else None, margin=margin)
    bridge = None
    if chosen is not None and chosen not in (given or {}):
        done = {} if refits is None else refits
        for n in members:
            if n not in done:
                done[n] = _refit(n, fitted[n], pairs, cfg)
        bridge = ensemble_map([(n, done[n]) for n in members]) if len(members) > 1 else done[chosen]
        bridge.meta.update(candidate=" + ".join(members))
    else:
        members = []
    return DirectionChoice(held.direction, scores, chosen, routes, bridge, held.sizes, scored_map, members)


def _refit(name: str, m: FittedMap, pairs: Mapping[str, tuple[np.ndarray, np.ndarray]] | None,
           cfg: FitConfig) -> FittedMap:
    """Candidate ``name`` (``family@set``) refitted on all the pairs of its set, where more are given."""
    family, ps = split_name(name)
    xy = pair_set(pairs, ps) if pairs is not None else None
    out = fit_family(family, xy[0], xy[1], cfg) if xy is not None and len(xy[0]) > m.meta.get("pairs", 0) else m
    out.meta.update(pair_set=ps, candidate=name)
    return out


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
