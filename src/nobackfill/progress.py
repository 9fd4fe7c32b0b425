"""Progress bars for long work (rich) on a terminal; a plain line now and then elsewhere (a log)."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Iterator

#: where stderr is not a terminal (nohup, a log file, a pipe): a plain progress line at most this often
PLAIN_EVERY_S = 30.0


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str, total: int | None, unit: str | None = None) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n=1)``; a no-op when ``enabled`` is False. The bar is drawn on stderr: stdout
    holds a command's results (``... | wc -c`` counts no bar). ``unit``: also show the rate
    (``12.3 items/s``). Where stderr is not a terminal, a plain line (``label: 400/4000 (10%), 12.3
    items/s, 2m31s``) every :data:`PLAIN_EVERY_S` seconds, the first after as long: a long run in a
    log said nothing at all (trial V), and a short one still adds no line. On a terminal ``advance.say``
    prints a line above the bar."""
    if not enabled:
        yield lambda n=1: None
        return
    if not sys.stderr.isatty():
        yield _plain_lines(label, total, unit)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    extra = [TextColumn(f"{{task.fields[rate]}} {unit}/s")] if unit else []
    # the label as written (it may name a collection or a file: "[bold]x" is not markup here)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), *extra,
                  TimeRemainingColumn(), transient=False, console=Console(stderr=True, emoji=False)) as p:
        task = p.add_task(label, total=total, rate="-")

        def advance(n: int = 1) -> None:
            p.advance(task, n)
            if unit:
                speed = p.tasks[task].speed
                p.update(task, rate=f"{speed:.1f}" if speed else "-")

        def say(message: str) -> None:
            """A line above the bar (printed through the bar's console: a line printed beside it, from
            another thread, was glued to a bar frame or left one behind: trial X)."""
            p.console.print(message, markup=False, highlight=False, soft_wrap=True)

        advance.say = say  # type: ignore[attr-defined]
        yield advance


def _plain_lines(label: str, total: int | None, unit: str | None) -> Callable[[int], None]:
    """``advance(n=1)`` printing a plain progress line at most every :data:`PLAIN_EVERY_S` seconds."""
    t0 = last = time.monotonic()
    done = 0

    def advance(n: int = 1) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if now - last < PLAIN_EVERY_S:
            return
        last = now
        of = f"/{total} ({100 * done / total:.0f}%)" if total else ""
        rate = f", {done / (now - t0):.1f} {unit}/s" if unit and now > t0 else ""
        mins, secs = divmod(int(now - t0), 60)
        print(f"{label}: {done}{of}{rate}, {mins}m{secs:02d}s", file=sys.stderr, flush=True)

    return advance
