"""Bridges fitted from a collection's own backfilled items (no preparation for an upgrade).

* :mod:`.families` - the candidate maps fitted on (new, old) vector pairs: centred orthogonal, ridge,
  low-rank affine, a residual MLP (the Drift-Adapter families, arXiv 2509.23471).
* :mod:`.agreement` - the label-free score: agreement of bridged queries with the new model's own
  ranking of held-out backfilled items; the route choice (bridge / fused / old-model) by it.
* :mod:`.choose` - every candidate per pair set, scored and chosen per direction.
* :mod:`.bridge` - :class:`FittedBridge`, a vector bridge saved as an upgrade directory (kind ``fitted``).
* :mod:`.stored` - such directories kept as documents of the collection's catalog (every machine of a
  shared deployment reads them), written to a local folder before they are read.

May import: ``_safetensors``, ``encoders``.
"""

from __future__ import annotations

from .agreement import HeldOut, agreement, bridge_score, candidate_score, held_out_set, route_scores, t_critical
from .bridge import FittedBridge
from .choose import DirectionChoice, choose_direction, fit_candidates, heldout_mask
from .families import FAMILIES, FitConfig, FittedMap, fit_family

__all__ = ["FAMILIES", "DirectionChoice", "FitConfig", "FittedBridge", "FittedMap", "HeldOut", "agreement",
           "bridge_score", "candidate_score", "choose_direction", "fit_candidates", "fit_family", "held_out_set",
           "heldout_mask", "route_scores", "t_critical"]
