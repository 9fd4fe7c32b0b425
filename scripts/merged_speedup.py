"""Moved: ``nobackfill bench merged`` (src/nobackfill/bench/merged.py), same options."""
import typer

from nobackfill.cli.bench import bench_merged
typer.run(bench_merged)
