"""Progress bars for long work (rich), switched off in tests and non-interactive runs."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n=1)``. A no-op when ``enabled`` is False or stderr is not a terminal. The
    bar is drawn on stderr: stdout holds a command's results (``... | wc -c`` counts no bar)."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), transient=False, console=Console(stderr=True)) as p:
        task = p.add_task(label, total=total)
        yield lambda n=1: p.advance(task, n)
