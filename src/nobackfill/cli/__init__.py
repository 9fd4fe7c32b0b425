"""The ``nobackfill`` command line: one typer app assembled from one module per command group.

Every command module imports only light modules at import time (heavy ones inside the commands),
and nothing outside this package imports it: the library never depends on its command line.

May import: ``_atomic``, ``_interrupts``, ``_logging``, ``bench``, ``catalog``, ``client``, ``collection``,
``compat``, ``config``, ``data``, ``demo``, ``encoders``, ``evaluate``, ``gallery``, ``late``, ``lifecycle``,
``lingual``, ``progress``, ``reco``, ``report``, ``search``, ``serve``, ``train``.
"""

from __future__ import annotations

import functools
import os
import sys

import typer
from typer.core import TyperGroup

from ._common import normalise_json_args
from .._interrupts import Terminated, terminated
from ._help import literal_tree, usage_error
from . import bench, collection, compat, data, demo, evaluate, gallery, late, lingual, reco, serve, upgrade, verify



class _Root(TyperGroup):
    """The root command group: accepts the old ``--json FILE.json`` spelling (now ``--out``), and its
    tree's help texts render as written (not as rich markup: :mod:`._help`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        literal_tree(self)  # typer builds the whole tree, subcommands first, on every run

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, normalise_json_args(list(args)))

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        """Run as a program: a usage error (a missing argument, an unknown option, a value out of
        range) is one line, ``error: ... (see 'nobackfill CMD --help')``, exit 2, like every other
        error (click's framed panel otherwise)."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        from typer._click import exceptions as click_errors  # typer's own click: its errors, not click's

        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as e:  # the help is printed already
            sys.exit(e.exit_code)
        except click_errors.ClickException as e:
            sys.exit(usage_error(e))
        except typer.Abort:
            print("aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        """Run the command; an output path of the wrong kind (a folder where a file goes, a file
        where a folder goes, a file that is there already) is one line, exit 2, not a traceback.
        Ctrl-C is one line too, exit 130: in a training loop, the step it reached and whether a rerun
        resumes it (:class:`nobackfill.train.loop.TrainingInterrupted`)."""
        from ._common import on_interrupt

        on_interrupt(None)  # (a command run before this one in the same process said its own)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            _end_at_once_on_signals()  # (a second Ctrl-C while this one is said and the program exits)
            from rich.markup import escape

            from ._common import console, interrupt_note

            loop = sys.modules.get("nobackfill.train.loop")  # not loaded: no loop ran (and torch stays unloaded)
            trained = loop is not None and isinstance(e, loop.TrainingInterrupted)
            by_sigterm = terminated(e)
            if trained:
                said = e.message() + (" (SIGTERM)" if by_sigterm else "")
            else:
                note = interrupt_note()
                said = "interrupted" + (" (SIGTERM)" if by_sigterm else "") + (f": {note}" if note else "")
            console.print(f"[yellow]{escape(said)}[/yellow]", markup=True)
            raise typer.Exit(code=143 if by_sigterm else 130) from None
        except (FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
            from ._common import fail

            what = {FileExistsError: "is there already", IsADirectoryError: "is a folder, not a file",
                    NotADirectoryError: "is a file, not a folder",
                    PermissionError: "cannot be written or read by this user"}[type(e)]
            fail(f"{e.filename}: {what} ({e.strerror or e})" if e.filename else str(e))
        except typer.Exit:  # (an error said already: fail's)
            raise
        except FloatingPointError as e:  # a training loop's loss that is not finite (loop.TrainingDiverged)
            from ._common import fail

            loop = sys.modules.get("nobackfill.train.loop")
            if loop is None or not isinstance(e, loop.TrainingDiverged):
                raise
            fail(str(e))
        except Exception as e:  # a full disk or a read-only one, met anywhere (a catalog, a chunk, a model)
            from ._common import fail, storage_refusal

            why = storage_refusal(e)
            if why is None:
                raise
            fail(why)


app = typer.Typer(cls=_Root, add_completion=False, no_args_is_help=True,
                  help="Cross-modal retrieval whose embedding model improves without re-embedding the gallery.")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"nobackfill {version('nobackfill')}")
        raise typer.Exit()


@app.callback()
def _root_options(verbose: bool = typer.Option(False, "--verbose", "-v",
                                               help="Also show the warnings of the libraries underneath "
                                                    "(transformers, huggingface_hub, pymilvus, milvus-lite) "
                                                    "and our own log."),
                  show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                                    help="Print the installed version and exit.")) -> None:
    from .._logging import set_verbose

    set_verbose(verbose)

# top-level commands
app.command("world")(data.world)
app.command("train")(data.train_cmd)
app.command("train-text")(data.train_text_cmd)
app.command("index")(gallery.index)
app.command("search")(gallery.search)
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("export-onnx")(serve.export_onnx)
app.command("verify")(verify.verify)

# groups
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate models and galleries.")
eval_app.command("retrieval")(evaluate.eval_retrieval)
eval_app.command("compat")(evaluate.eval_compat)
app.add_typer(eval_app, name="eval")

upgrade_app = typer.Typer(no_args_is_help=True,
                          help="Backfill-free upgrades: XBT and training-free bridges from a new model to an old space.")
upgrade_app.command("xbt")(upgrade.upgrade_xbt)
upgrade_app.command("xbt-text")(upgrade.upgrade_xbt_text)
upgrade_app.command("procrustes")(upgrade.upgrade_procrustes)
app.add_typer(upgrade_app, name="upgrade")

app.add_typer(collection.collection_app, name="collection")
app.add_typer(reco.reco_app, name="reco")
app.add_typer(late.late_app, name="late")
app.add_typer(compat.compat_app, name="compat")
app.add_typer(lingual.lingual_app, name="lingual")

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON for machines, tables/plots for people).")
bench_app.command("encode")(bench.bench_encode)
bench_app.command("world")(bench.bench_world)
bench_app.command("xbt")(bench.bench_xbt)
bench_app.command("xbt-text")(bench.bench_xbt_text)
bench_app.command("routes")(bench.bench_routes)
bench_app.command("backfill")(bench.bench_backfill)
bench_app.command("backfill-engine")(bench.bench_backfill_engine)
bench_app.command("fitted-bridge")(bench.bench_fitted_bridge)
bench_app.command("store")(bench.bench_store)
bench_app.command("serve")(bench.bench_serve)
bench_app.command("scale")(bench.bench_scale)
bench_app.command("import")(bench.bench_import)
bench_app.command("lingual-lambda")(bench.bench_lingual_lambda)
bench_app.command("merged")(bench.bench_merged)
bench_app.command("tables")(bench.bench_tables)
bench_app.command("compat-steps")(compat.bench_compat_steps)
bench_app.command("late")(late.bench_late)
bench_app.command("lingual-text")(lingual.bench_lingual_text)
bench_app.command("lingual-world")(lingual.bench_lingual_world)
bench_app.command("reco")(reco.bench_reco)
app.add_typer(bench_app, name="bench")


def _terminate(signum, frame) -> None:
    """SIGTERM (``kill``, ``timeout``, systemd, a container's stop), raised where the command stands
    so that it ends as after Ctrl-C: what a run tidies on an interrupt is tidied, one line is printed,
    exit 143 (trial V: ``lingual learn`` killed by ``timeout`` left its work folder and said nothing)."""
    raise Terminated()


#: whether this process is the ``nobackfill`` program (set by :func:`main`)
_AS_PROGRAM = False


def main() -> None:
    """The ``nobackfill`` program: the command line, with SIGTERM handled as Ctrl-C
    (:class:`nobackfill._interrupts.Terminated`)."""
    import signal

    global _AS_PROGRAM
    _AS_PROGRAM = True
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    finally:
        _skip_exit_collections()
        _end_at_once_on_signals()


def _end_at_once_on_signals() -> None:
    """The command has ended (or is saying how it was interrupted): a Ctrl-C or SIGTERM now (a second
    one, while the interpreter exits) ends the process at once, exit 130 / 143, not in a library's exit
    hook with a traceback (trials AB, AC). Only in the ``nobackfill`` program (:func:`main`; not where
    ``app`` runs inside another process), in its main thread."""
    import signal
    import threading

    if not _AS_PROGRAM or threading.current_thread() is not threading.main_thread():
        return
    for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        if callable(signal.getsignal(signum)):
            signal.signal(signum, functools.partial(_exit_now, code))


def _exit_now(code: int, signum: int, frame: object) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _skip_exit_collections() -> None:
    """The command's work is done: move every object to the collector's permanent generation, so
    that the interpreter's exit does not traverse them (``gc.freeze``). With torch, transformers and
    pymilvus loaded that traversal took 1.0-1.3 s of a cold ``collection search`` after its answer
    was printed (0.2 s with this). Objects are still freed by reference counting, files still closed
    and ``atexit`` handlers still run; only reference cycles left at exit go uncollected."""
    import gc

    gc.freeze()


__all__ = ["app", "main"]
