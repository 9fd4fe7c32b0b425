"""Benchmarks: one module per ``nobackfill bench`` command (encode, world, xbt, xbt_text,
compat_steps, lingual, lingual_lambda, merged, reco, late, routes, backfill, store, serve, scale,
importing; ``tables`` refreshes the README's result tables), their shared tail in ``runner``. What a
benchmark measures with lives in the library; nothing outside ``bench`` and the CLI imports this
package. Nothing is imported here, so registering the CLI commands does not load torch; import the
module you need (e.g. ``nobackfill.bench.encode``).

May import: ``_atomic``, ``adopt``, ``client``, ``collection``, ``compat``, ``config``, ``data``, ``encoders``,
``evaluate``, ``gallery``, ``late``, ``lifecycle``, ``lingual``, ``memory``, ``metrics``, ``milvus``,
``reco``, ``report``, ``search``, ``testing``, ``train``.
"""
