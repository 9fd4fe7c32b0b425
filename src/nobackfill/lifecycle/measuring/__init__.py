"""Measuring a collection as its users query it while it is upgraded and backfilled: the query sets
and collections the measurements share (:mod:`.measure`) and the backfill's R@1 curve by order and
merge (:mod:`.backfill_curve`, what ``bench backfill`` and ``make demo``'s live upgrade plot).

May import: ``collection``, ``evaluate``, ``lifecycle``, ``metrics``, ``search``.
"""
