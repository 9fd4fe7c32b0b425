"""The baseline of the tutorial's tables: every step's model trained independently (fresh
initialisation, cross-entropy on the step's data, no link to the previous model)."""

from __future__ import annotations

from .base import CompatMethod
from .registry import register


@register
class Independent(CompatMethod):
    """Independent training per step (the tutorial's "Baseline" row)."""

    name = "baseline"
