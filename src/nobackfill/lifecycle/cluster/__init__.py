"""The backfill's workers beyond the calling process: :mod:`.processes` the worker processes of this
machine (``workers=N``: their start, stop, progress and lines); :mod:`.ray_backfill` the backfill
job's re-embedding as a Ray Data pipeline (``engine="ray"``), with the job, shards, leases and the
one commit of :mod:`nobackfill.lifecycle.backfill_commit`, imported only when that engine is
chosen (Ray is an optional extra).

May import: ``_interrupts``, ``_logging``, ``collection``, ``encoders``, ``lifecycle``, ``search``.
"""
