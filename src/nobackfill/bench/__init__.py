"""Benchmarks (encoding throughput: ours vs plain transformers)."""

from .encode import format_encode_table, run_encode_bench, write_report

__all__ = ["run_encode_bench", "format_encode_table", "write_report"]
