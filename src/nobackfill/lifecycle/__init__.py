"""The life of a collection after it is created: changes to its serving plan (an upgrade, a pinned
route, a calibration), the progressive backfill and ``verify``.

* :mod:`.plan_changes` - ``upgrade_collection``, ``calibrate_collection``, ``pin_route``.
* :mod:`.calibrate` - routes, fused weights, score maps and the merge chosen on a calibration split.
* :mod:`.backfill` - start / pause / cancel / run the backfill, its status, ``retire_space``;
  :mod:`.backfill_order` its order policies, :mod:`.backfill_jobs` its job and lease store,
  :mod:`.backfill_commit` the steps every engine shares (the one commit); :mod:`.cluster` where
  its workers run beyond the calling process: worker processes of this machine (``processes``) and
  the ``ray`` engine (Ray Data; ray imported only when it is chosen).
* :mod:`.verify` - every stored file of a gallery or collection checked (and the model check).
* :mod:`.fit_bridges`, :mod:`.backfill_fit` - bridges and the merge's score maps fitted from the
  backfill's own pairs, as it advances (an upgrade without a bridge).
* :mod:`.measuring` - R@1 as users see it while a collection is upgraded and backfilled.

May import: ``_interrupts``, ``_logging``, ``adopt``, ``catalog``, ``collection``, ``compat``, ``encoders``, ``evaluate``, ``gallery``,
``metrics``, ``search``.
"""
