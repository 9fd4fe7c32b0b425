"""Moved: ``nobackfill bench tables [--check]`` (src/nobackfill/bench/tables.py) refreshes the result tables."""
import typer

from nobackfill.cli.bench import bench_tables
typer.run(bench_tables)
