"""``cll_clip``: plain CLL-CLIP (Yang et al. 2024, Fig. 2a): only the token embeddings train, on Eq. 4."""

from __future__ import annotations

from .base import LingualMethod, register


@register
class CLLCLIP(LingualMethod):
    """Every hook is the base's: nothing beside the token table."""

    NAME = "cll_clip"


__all__ = ["CLLCLIP"]
