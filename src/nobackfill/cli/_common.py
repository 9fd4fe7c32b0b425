"""What the command modules share: the stderr console, the error exit, atomic JSON output, and the
command line recorded in recipes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

#: messages go to stderr and never wrap: paths in messages stay whole at any width
console = Console(stderr=True, soft_wrap=True)


def fail(msg: str) -> NoReturn:
    """Print ``error: msg`` (as text: a path containing ``[...]`` is not rich markup) and exit 2."""
    console.print(f"[red]error:[/red] {escape(msg)}")
    raise typer.Exit(code=2)


def write_json(path: Optional[Path], obj: dict) -> None:
    """Write ``obj`` to ``path`` atomically (nothing when ``path`` is None) and say so."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)
    console.print(f"wrote {path}")


def command_line(name: str, **opts) -> str:
    """The command line that reproduces a run (recorded in an upgrade's or model's recipe)."""
    parts = [f"nobackfill {name}"]
    for k, v in opts.items():
        if v is None or v is False:
            continue
        parts.append(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}"))
    return " ".join(parts)


def multi30k_default() -> Path:
    """The shared Multi30K root (``$NOBACKFILL_SHARED/data/multi30k``, default ``../shared/...``)."""
    from ..data.multi30k import default_multi30k_dir

    return default_multi30k_dir()


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or a damaged store: a command prints them as one error line
    and exits 2 (``except user_errors() as e: fail(str(e))``)."""
    from ..index.collection import CollectionError
    from ..index.store import GalleryError

    return (ValueError, FileNotFoundError, FileExistsError, KeyError, CollectionError, GalleryError)
