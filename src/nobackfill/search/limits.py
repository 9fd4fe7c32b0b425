"""What one call may carry: the one set of limits the library, the command line and the service
validate against (the service also caps request bodies with it)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass
class Limits:
    """``max_k`` results per query; ``max_caption_chars`` per text query or added caption;
    ``max_batch`` items per add request; ``max_body_bytes`` / ``max_image_bytes`` /
    ``max_image_pixels`` bound what an HTTP request carries (decompression bombs included)."""

    max_body_bytes: int = 20 * 2**20
    max_image_bytes: int = 10 * 2**20
    max_image_pixels: int = 40_000_000
    max_caption_chars: int = 2000
    max_k: int = 1000
    max_batch: int = 256

    def check_k(self, k: int) -> int:
        """``k`` if it is an integer in [1, max_k], else ValueError naming k."""
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= self.max_k:
            raise ValueError(f"k must be an integer between 1 and {self.max_k}, got {k!r}")
        return int(k)  # (numpy's integers too)

    def check_text(self, text: str, what: str = "text") -> str:
        """``text`` if it is a string of at most max_caption_chars, else ValueError naming ``what``."""
        if not isinstance(text, str):
            raise ValueError(f"{what} must be a string, got {type(text).__name__}")
        if len(text) > self.max_caption_chars:
            raise ValueError(f"{what} is {len(text)} characters long; at most {self.max_caption_chars} are taken")
        return text
