"""What the command modules share: the stderr console, the error exit, atomic JSON output, and the
command line recorded in recipes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, NoReturn, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

T = TypeVar("T")

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


def config_option() -> Any:
    return typer.Option(None, "--config", help="A TOML or YAML file of this command's config fields (print them "
                                               "with --show-config); applied over the defaults / preset.")


def set_option() -> Any:
    return typer.Option(None, "--set", help="dotted.key=value (a TOML value), repeatable, applied last: "
                                            "--set stage2.lr=1e-4. Loop fields may skip 'loop.'.")


def show_config_option() -> Any:
    return typer.Option(False, "--show-config", help="Print the effective config as JSON and exit.")


def resolve_config(cls: type[T], base: T | None, config: Optional[Path], sets: Optional[List[str]],
                   flags: dict | None = None, show: bool = False) -> T:
    """The one way a command builds its config (:func:`nobackfill.config.build_config`): ``base``
    (defaults or a preset), then ``--config``, then the command's own flags that were given (not
    None), then ``--set``. A bad file or key exits with one error naming it; ``show`` prints the
    result and exits."""
    from ..config import ConfigError, build_config, to_dict, updated

    try:
        cfg = build_config(cls, base, file=config)
        given = _given(flags or {})
        if given:
            cfg = updated(cfg, **given)
        cfg = build_config(cls, cfg, sets=sets or ())
    except ConfigError as e:
        fail(str(e))
    if show:
        typer.echo(json.dumps(to_dict(cfg), indent=2, default=str))
        raise typer.Exit(0)
    return cfg


def _given(flags: dict) -> dict:
    """``flags`` without the options left unset (None), nested tables included."""
    out = {}
    for k, v in flags.items():
        v = _given(v) if isinstance(v, dict) else v
        if v is not None and v != {}:
            out[k] = v
    return out
