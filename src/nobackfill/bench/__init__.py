"""Benchmarks: one module per ``nobackfill bench`` command (encode, world, xbt, xbt_text,
compat_steps, lingual, reco, late). Nothing is imported here, so registering the CLI commands
does not load torch; import the module you need (e.g. ``nobackfill.bench.encode``)."""
