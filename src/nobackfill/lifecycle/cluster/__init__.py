"""The backfill on a cluster: :mod:`.ray_backfill` runs the backfill job's re-embedding as a Ray
Data pipeline (``engine="ray"``), with the job, shards, leases and the one commit of
:mod:`nobackfill.lifecycle.backfill_commit`. Nothing here is imported unless that engine is chosen
(Ray is an optional extra).

May import: ``_logging``, ``collection``, ``encoders``, ``lifecycle``, ``search``.
"""
