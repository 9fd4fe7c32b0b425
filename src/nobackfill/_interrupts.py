"""What interrupted a run: Ctrl-C (SIGINT), or SIGTERM (``kill``, ``timeout``, a service manager, a
container's stop), which the ``nobackfill`` program raises as :class:`Terminated`, a
``KeyboardInterrupt``, so that every place that tidies after a Ctrl-C tidies after it too, and says
which it was. Cheap to import (stdlib only)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["Terminated", "held_interrupts", "interrupt_cause", "terminated"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program stands (``nobackfill.cli.main`` installs the handler)."""


def terminated(e: BaseException | None) -> bool:
    """Whether ``e`` (or the exception it was raised from or during) is a SIGTERM."""
    while e is not None:
        if isinstance(e, Terminated):
            return True
        e = e.__cause__ or e.__context__
    return False


def interrupt_cause(e: BaseException | None) -> str:
    """``"SIGTERM"`` or ``"Ctrl-C"``: what stopped a run (a status records it, a command says it)."""
    return "SIGTERM" if terminated(e) else "Ctrl-C"


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM inside the block are held until it ends, then handed to the handler they
    would have met (which raises ``KeyboardInterrupt`` or :class:`Terminated`). So a checkpoint or a
    log line being written is finished first, and a run stops with a whole file and says which step
    it holds, not with the error of a half-written zip (CI: SIGTERM inside ``torch.save`` ended a
    training with "unexpected pos", exit 1). A signal is held only where a Python handler meets it
    (the default SIGINT one, the program's SIGTERM one, a server's), and only in the main thread,
    where Python runs handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raising = [s for s in (signal.SIGINT, signal.SIGTERM) if callable(signal.getsignal(s))]
    before = {s: signal.getsignal(s) for s in raising}
    held: list[int] = []
    for s in raising:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    for signum in dict.fromkeys(held):
        before[signum](signum, None)
