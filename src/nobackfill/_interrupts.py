"""What interrupted a run: Ctrl-C (SIGINT), or SIGTERM (``kill``, ``timeout``, a service manager, a
container's stop), which the ``nobackfill`` program raises as :class:`Terminated`, a
``KeyboardInterrupt``, so that every place that tidies after a Ctrl-C tidies after it too, and says
which it was. Cheap to import (stdlib only)."""

from __future__ import annotations

__all__ = ["Terminated", "interrupt_cause", "terminated"]


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
