"""The tail every benchmark command shares: run the benchmark on its resolved config, write its JSON
and its table / plots beside it, show the table and say what was written. A command only parses
its arguments into a config and calls :func:`run_bench` with the benchmark's ``run`` and
``report``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

Log = Callable[[str], None]


@dataclass(frozen=True)
class Report:
    """How a benchmark reports: ``write(result, json_path)`` writes the JSON at ``json_path`` and its
    other outputs beside it (the ``siblings``' suffixes) and returns the text to show (a table)."""

    write: Callable[[Any, Path], str]
    siblings: Sequence[str] = (".md",)


def markdown_report(markdown: Callable[[dict], str]) -> Report:
    """The usual report: the JSON, and ``markdown(result)`` beside it (``.md``), which is shown."""
    from ..report import write_json_and_markdown

    return Report(lambda result, path: write_json_and_markdown(result, path, markdown(result)))


def run_bench(config: Any, run: Callable[[Any, Log], Any], report: Report, *, out: Path,
              log: Log = print, echo: Log = print) -> Any:
    """``run(config, log)`` (a dict result gains ``host``: CPU model, torch's CPU code path and threads,
    package versions: trial Y could not say why an encode speed-up did not reproduce, the result
    naming the CPU "x86_64"), its ``report`` written at ``out`` (JSON) and beside it, the report's text
    passed to ``echo``, and what was written (in how long) to ``log``; returns the result. Errors
    of ``run`` (bad input, a missing model) propagate: the command line turns them into one line."""
    t0 = time.time()
    result = run(config, log)
    if isinstance(result, dict) and "host" not in result:  # the CPU and versions a number depends on
        from .host import host_info

        result["host"] = host_info()
    text = report.write(result, Path(out))
    if text:
        echo(text)
    extra = f" (+ {', '.join(report.siblings)})" if report.siblings else ""
    seconds = result.get("seconds", time.time() - t0) if isinstance(result, dict) else time.time() - t0
    log(f"wrote {out}{extra} in {seconds:.0f}s")
    return result


__all__ = ["Log", "Report", "markdown_report", "run_bench"]
