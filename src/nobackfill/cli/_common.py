"""What the command modules share: the stderr console, the error exit, atomic JSON output, and the
command line recorded in recipes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, NoReturn, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from .._atomic import atomic_write_text, file_above
from ..catalog.schema import redact
from ..report import json_finite

if TYPE_CHECKING:
    from ..bench.runner import Report

T = TypeVar("T")


class _Console(Console):
    """A rich console whose printed text never shows a catalog's password: every string printed has
    its ``postgresql://USER:PASSWORD@`` part shown as ``USER:***@`` (a command echoes the collection
    URI it was given in many messages). Text prints as written: no rich markup and no emoji codes
    unless a call passes ``markup=True`` (its interpolated parts escaped), so a collection named
    ``[bold]demo`` or ``p:thumbs_up:``, a path, a caption print whole (trial AI D6)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"markup": False, "emoji": False, **kwargs})

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().print(*(redact(o) if isinstance(o, str) else o for o in objects), **kwargs)


#: progress, warnings, logs and errors go to stderr and never wrap: paths in messages stay whole at any width
console = _Console(stderr=True, soft_wrap=True)
#: a command's results for a person (what ``--json`` prints as JSON) go to stdout: ``... | wc -c``
results = _Console(soft_wrap=True)


#: what an interrupt of the running command leaves (:func:`on_interrupt`)
_interrupt_note: list[str] = []
#: the note of a command that writes its results only at its end (an evaluation)
NOTHING_WRITTEN = "nothing was written (the results are written at the end): the same command starts again"


def on_interrupt(note: Optional[str]) -> None:
    """Say ``note`` (what is left, what a rerun does) if the running command is interrupted from now
    on, after ``interrupted:``: a bare "interrupted" said nothing of it (trial Y). A training loop's
    interrupt says where it stood instead. None: nothing (each command starts so)."""
    _interrupt_note[:] = [note] if note else []


def interrupt_note() -> Optional[str]:
    """The running command's :func:`on_interrupt` note, if it gave one."""
    return _interrupt_note[0] if _interrupt_note else None


def fail(msg: "str | BaseException") -> NoReturn:
    """Print ``error: msg`` (as text: a path containing ``[...]`` is not rich markup) and exit 2. An
    exception is its message: a client's refusal by its detail (no HTTP status: the command line
    speaks in its own words)."""
    if isinstance(msg, BaseException):  # a full or read-only disk is said so
        msg = storage_refusal(msg) or msg
    if isinstance(msg, BaseException):
        status = getattr(msg, "status", None)
        msg = getattr(msg, "detail", None) or str(msg)
        if status in (401, 403):  # a server's key: the command line reads it from the environment
            msg = msg.replace("(send Authorization: Bearer KEY)", "").rstrip() + \
                ": the command line sends the key in NOBACKFILL_API_KEY" + (" (an admin key)" if status == 403 else "")
    console.print(f"[red]error:[/red] {escape(in_flags(msg))}", markup=True)
    raise typer.Exit(code=2)


def in_flags(msg: str) -> str:
    """``msg`` (often the library's, in its argument names) in the running command's option names:
    ``batch_size`` -> ``--batch-size``, ``engine='ray'`` -> ``--engine ray``, and a first word that
    is an option's argument (``rate must be ...``) -> ``--rate``. Only names the command has."""
    import re

    from typer._click.globals import get_current_context  # typer's own click

    if "--set" in msg or "--config" in msg:  # a config's own keys (--set batch_size=...): named as the user wrote them
        return msg
    ctx = get_current_context(silent=True)
    flags = {p.name: max(p.opts, key=len) for p in getattr(ctx and ctx.command, "params", [])
             if getattr(p, "opts", None) and p.opts[0].startswith("-") and p.name}
    if not flags:
        return msg

    def kw(m: "re.Match[str]") -> str:
        return f"{flags[m.group(1)]} {m.group(2)}" if m.group(1) in flags else m.group(0)

    msg = re.sub(r"^(?:[A-Z]\w*(?:Config|Spec)|Preset): (?:field '\w+': )*", "", msg)  # a config's class, table
    msg = re.sub(r"(?<![\w.-])([a-z][a-z0-9_]*)='([^']*)'", kw, msg)
    msg = re.sub(r"(?<![\w.=/'\"-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b(?![(=/'\"])",
                 lambda m: flags.get(m.group(1), m.group(0)), msg)
    first = re.match(r"([a-z]+) (must|should|is|needs?) ", msg)
    if first and first.group(1) in flags:
        msg = flags[first.group(1)] + msg[len(first.group(1)):]
    return msg


def storage_refusal(e: BaseException) -> str | None:
    """One line for an error that a full or read-only disk caused (``e`` or what it was raised from:
    ``ENOSPC``, SQLite's "database or disk is full", ``EROFS``, "readonly database"); None for any
    other. Every write is atomic, so what was committed before it stays."""
    import errno

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text, code = str(e), getattr(e, "errno", None)
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        if code in (errno.ENOSPC, errno.EDQUOT) or "database or disk is full" in text:
            return (f"the disk is full{where}: nothing past the last commit was kept; free some space and run the "
                    "same command again")
        if code == errno.EROFS or "readonly database" in text or "read-only file system" in text.lower():
            return (f"the collection's files cannot be written{where}: a read-only file system, or files this user "
                    "may not write; nothing was changed")
        e = e.__cause__ or e.__context__
    return None


def skip_bad_hint(e: BaseException) -> str:
    """``e``'s message (a client's refusal by its detail), plus that ``--skip-bad`` skips it for a
    bad line or unreadable image."""
    msg = getattr(e, "detail", None) or str(e)
    return msg + " (pass --skip-bad to skip it)" if getattr(e, "skippable", False) and "--skip-bad" not in msg \
        else msg


#: print as is: a file name is neither rich markup nor an :emoji: code
_PLAIN = dict(markup=False, emoji=False, highlight=False)


def report_skipped(count: int, images: Any = (), problems: Any = (), root: Optional[Path] = None,
                   limit: int = 20) -> None:
    """Say how much ``--skip-bad`` skipped: every skipped image file (relative to ``root``; a dict
    path -> why, or paths) and the first ``limit`` skipped-line messages."""
    if not count:
        return
    console.print(f"[yellow]skipped {count} bad line(s)/image(s)[/yellow]", markup=True)
    why = images if isinstance(images, dict) else dict.fromkeys(images, "")
    for path, reason in why.items():
        if root is not None and Path(path).is_absolute():
            try:
                path = Path(path).relative_to(Path(root).absolute()).as_posix()
            except ValueError:
                pass
        console.print(f"  skipped image {path}" + (f": {reason}" if reason else ""), **_PLAIN)
    listed = [f"image {Path(path).as_posix()!r}:" for path in why]  # a caption line of an image listed above
    lines = [p for p in problems if not p.startswith("image ") and not any(x in p for x in listed)]
    for p in lines[:limit]:
        console.print(f"  skipped {p}", **_PLAIN)
    if len(lines) > limit:
        console.print(f"  ... and {len(lines) - limit} more skipped line(s)")


def check_new_output(out: Path, *, sources: tuple = (), finished: str | None = None, what: str = "",
                     also: tuple = ()) -> None:
    """Exit 2 (one line) unless ``out`` can take a new model: not one of ``sources`` (what the command
    reads: its starting model), and not a file or a folder that holds files already (another model,
    a folder of models; ``finished``: the file naming a finished ``what``, said so). Checked before
    anything is read or trained, so nothing is overwritten (:func:`nobackfill.train.loop.check_output`
    for a command that never resumes; ``also``: globs of what its own killed run leaves and it takes up)."""
    from ..train.loop import check_output

    try:
        check_output(out, finished=finished, what=what, sources=sources, resumable=False, also=also)
    except ValueError as e:
        fail(e)


def check_json_out(path: Optional[Path]) -> None:
    """Exit 2 (one line) unless ``path`` (a ``--out`` JSON file; None: none) can be written: not a
    folder, and under a folder (the first that exists above it) that is one. A command checks it
    before its work: a folder given was refused after a whole evaluation (trial Y)."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{path}: is a folder; --out takes the path of a .json file")
    above = file_above(path)
    if above is not None:
        fail(f"--out {path}: {above} is a file, not a folder")
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    try:  # a read-only or pseudo file system (/proc) was found only when the results were written
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        fail(f"--out {path}: cannot be written in {folder} ({e.strerror or e})")


def write_json(path: Optional[Path], obj: dict) -> None:
    """Write ``obj`` to ``path`` atomically (nothing when ``path`` is None; its missing folders are
    made) and say so."""
    if path is None:
        return
    check_json_out(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(json_finite(obj), indent=2, allow_nan=False))
    except OSError as e:  # a folder that cannot be made or written (the results printed above stay)
        fail(f"--out {path}: cannot be written ({e.strerror or e})")
    console.print(f"wrote {path}")


def command_line(name: str, **opts) -> str:
    """The command line that reproduces a run (recorded in an upgrade's or model's recipe)."""
    parts = [f"nobackfill {name}"]
    for k, v in opts.items():
        if v is None or v is False:
            continue
        parts.append(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}"))
    return " ".join(parts)


def from_project(value: Any) -> Any:
    """An option's callback for a default naming the project's own files (``models``, ``data/world``,
    ``upgrades``): as given where it exists, else the project's (a benchmark run from another folder
    failed on its defaults: trial Y); else as given, for the command's own error to name it."""
    if value is None:
        return value
    from ..bench.host import shipped_path

    p = shipped_path(value)
    return p if isinstance(value, Path) else str(p) if p.exists() else value


def multi30k_default() -> Path:
    """The shared Multi30K root (``$NOBACKFILL_SHARED/data/multi30k``, default ``../shared/...``)."""
    from ..data.multi30k import default_multi30k_dir

    return default_multi30k_dir()


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or a damaged store: a command prints them as one error line
    and exits 2 (``except user_errors() as e: fail(e)``)."""
    from ..client import ClientError
    from ..catalog.catalog import CatalogError
    from ..collection.collection import CollectionError
    from ..gallery.types import GalleryError

    return (ValueError, FileNotFoundError, FileExistsError, KeyError, CollectionError, CatalogError, GalleryError,
            ClientError)


def config_option() -> Any:
    return typer.Option(None, "--config", help="A TOML or YAML file of this command's config fields (print them "
                                               "with --show-config); applied over the defaults / preset.")


def set_option(loop: bool = True) -> Any:
    """``--set``; ``loop``: the command's config has a training loop table, whose fields may skip ``loop.``."""
    return typer.Option(None, "--set", help="dotted.key=value (a TOML value; a dot enters a section), repeatable, "
                                            "applied last; the keys are those --show-config prints."
                                            + (" Loop fields may skip 'loop.'." if loop else ""))


def show_config_option() -> Any:
    return typer.Option(False, "--show-config", help="Print the effective config as JSON and exit.")


def resolve_config(cls: type[T], base: T | None, config: Optional[Path], sets: Optional[List[str]],
                   flags: dict | None = None, show: bool = False,
                   check: Optional[Callable[[T], Any]] = None) -> T:
    """The one way a command builds its config (:func:`nobackfill.config.build_config`): ``base``
    (defaults or a preset), then ``--config``, then the command's own flags that were given (not
    None), then ``--set``. Then ``check(cfg)``: the command's own checks of the values (a
    ValueError for one its run would refuse), so that ``--show-config`` refuses what the run
    refuses, with the same line. A bad file, key or value exits 2 with one error naming it;
    ``show`` prints the result and exits."""
    from ..config import ConfigError, build_config, to_dict, updated

    try:
        cfg = build_config(cls, base, file=config)
        given = _given(flags or {})
        if given:
            cfg = updated(cfg, **given)
        cfg = build_config(cls, cfg, sets=sets or ())
        if check is not None:
            check(cfg)
    except (ConfigError, ValueError, KeyError) as e:
        fail(e.args[0] if isinstance(e, KeyError) and e.args else str(e))
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


def warn_truncated(encoder, texts, where=None) -> int:
    """Warn (with the count and the longest) about captions longer than the model's token limit."""
    cut = encoder.truncated(texts) if hasattr(encoder, "truncated") and texts else []
    if cut:
        longest = max(cut, key=lambda i: len(texts[i]))
        place = f" ({where[longest]})" if where else ""
        console.print(f"[yellow]warning: {len(cut)} caption(s) exceed the model's {encoder.max_length} tokens and are "
                      f"embedded truncated; the longest has {len(texts[longest])} characters{escape(place)}[/yellow]",
                      markup=True)
    return len(cut)


def json_flag() -> Any:
    return typer.Option(False, "--json", help="Print the result as JSON on stdout (instead of the table); "
                                              "--out FILE writes it to a file.")


def quiet(as_json: bool):
    """``typer.echo``, or a no-op when the command prints JSON instead (stdout stays parseable)."""
    return (lambda *a, **k: None) if as_json else typer.echo


def emit_json(obj: Any, as_json: bool) -> None:
    """Print ``obj`` as JSON on stdout when ``--json`` was given: strict JSON (a NaN as null), as
    ``--out FILE`` writes it (a catalog password shown as ``***``, as every message does); text as
    it is (a caption in Japanese readable, not ``\\u65e5...``)."""
    if as_json:
        typer.echo(redact(json.dumps(json_finite(obj), indent=2, default=str, allow_nan=False, ensure_ascii=False)))


def _bench(cfg: Any, run: Callable[[Any, Callable[[str], None]], Any], report: "Report", json_out: Path, as_json: bool,
           errors: tuple[type[BaseException], ...] = ()) -> None:
    """The tail of every ``bench`` command: :func:`nobackfill.bench.runner.run_bench` on the console.
    A user error (or one of ``errors``) ends the command with its one line; ``--json`` prints the
    result instead of the table."""
    from ..bench.runner import run_bench

    check_json_out(json_out)
    try:
        result = run_bench(cfg, run, report, out=json_out, log=lambda m: console.print(m), echo=quiet(as_json))
    except (*user_errors(), *errors) as e:
        fail(e)
    emit_json(result, as_json)


def normalise_json_args(args: list[str]) -> list[str]:
    """The one JSON convention: ``--json`` prints to stdout and ``--out FILE`` writes. The old
    spelling ``--json FILE.json`` (and ``--json=FILE.json``) still works: it means ``--out``."""
    # ``demo --out`` is its output folder: there the old spelling becomes the hidden --json-file
    dest = "--json-file" if args[:1] == ["demo"] else "--out"
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--json" and i + 1 < len(args) and args[i + 1].endswith(".json") and not args[i + 1].startswith("-"):
            out += [dest, args[i + 1]]
            i += 2
            continue
        if a.startswith("--json=") and a.endswith(".json"):
            a = dest + "=" + a[len("--json="):]
        out.append(a)
        i += 1
    return out


def langs_option() -> Any:
    return typer.Option("", help="Comma-separated caption languages, e.g. en,de (default: every language in the "
                                 "data; the same default in every command).")
