"""Progress bars for long work (rich), switched off in tests and non-interactive runs."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str, total: int | None, unit: str | None = None) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n=1)``. A no-op when ``enabled`` is False or stderr is not a terminal. The
    bar is drawn on stderr: stdout holds a command's results (``... | wc -c`` counts no bar).
    ``unit``: also show the rate (``12.3 items/s``)."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    extra = [TextColumn(f"{{task.fields[rate]}} {unit}/s")] if unit else []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra,
                  TimeRemainingColumn(), transient=False, console=Console(stderr=True)) as p:
        task = p.add_task(label, total=total, rate="-")

        def advance(n: int = 1) -> None:
            p.advance(task, n)
            if unit:
                speed = p.tasks[task].speed
                p.update(task, rate=f"{speed:.1f}" if speed else "-")

        yield advance
