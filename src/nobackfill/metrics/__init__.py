"""Retrieval evaluation: R@K, median rank and mAP for image<->text retrieval.

May import: nothing of nobackfill.
"""

from nobackfill.metrics.retrieval import (
    format_table,
    protocol_grid,
    retrieval_metrics,
    similarity,
)

__all__ = ["format_table", "protocol_grid", "retrieval_metrics", "similarity"]
