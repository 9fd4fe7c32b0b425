"""Moved: ``nobackfill bench lingual-lambda`` (src/nobackfill/bench/lingual_lambda.py), same options."""
import typer

from nobackfill.cli.bench import bench_lingual_lambda
typer.run(bench_lingual_lambda)
