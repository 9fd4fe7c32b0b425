"""Where the warnings of the libraries we use go: Python logging, quiet unless asked for.

transformers, huggingface_hub and pymilvus each install a stderr handler of their own when first
imported (pymilvus also prints a warning per query iterator on milvus-lite and an error line per
failed call, which our errors name anyway). :func:`tame_library_loggers` takes those handlers off so
their records propagate to Python logging like any other, at a level set by :func:`set_verbose`:
errors only by default (pymilvus: nothing), warnings with ``nobackfill -v``. Cheap to import: no
library is imported here.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["LIBRARY_LOGGERS", "set_verbose", "tame_library_loggers"]

#: loggers of the libraries whose records are shown only when verbose
LIBRARY_LOGGERS = ("transformers", "huggingface_hub", "pymilvus", "milvus_lite", "grpc", "urllib3", "filelock",
                   "ray", "py.warnings")
#: their level when not verbose (pymilvus logs every failed call at ERROR: our own error says it; the
#: in-process server of milvus-lite logs, with a traceback, each call it fails or does not implement,
#: on loggers ``milvus_lite`` and ``grpc._server``, and the client's error, or ours, says it too)
_QUIET = {"pymilvus": logging.CRITICAL, "milvus_lite": logging.CRITICAL, "grpc": logging.CRITICAL}
_ENV = {"transformers": "TRANSFORMERS_VERBOSITY", "huggingface_hub": "HF_HUB_VERBOSITY"}
_OWN = "_NOBACKFILL_SET_"  # marks a variable above as set by us (not by the user)

_verbose = False


class _Said(logging.Handler):
    """Records on the stderr of the moment: at WARNING and above as the program's own lines are
    (``warning: ...``, ``error: ...``: the default's bare message did not say it was a warning), or
    when verbose every record that reaches it, with its level and logger."""

    def __init__(self, verbose: bool) -> None:
        super().__init__(logging.NOTSET if verbose else logging.WARNING)
        self.verbose = verbose

    def emit(self, record: logging.LogRecord) -> None:
        try:
            head = f"{record.levelname} {record.name}: " if self.verbose else f"{record.levelname.lower()}: "
            print(head + self.format(record), file=sys.stderr, flush=True)
        except Exception:  # a closed stderr: as logging's own handlers do
            self.handleError(record)


def _level(name: str) -> int:
    return logging.WARNING if _verbose else _QUIET.get(name, logging.ERROR)


def tame_library_loggers(names: tuple[str, ...] = LIBRARY_LOGGERS) -> None:
    """Route the loggers ``names`` to Python logging (their own stderr handlers removed) at the
    current level. Call again after a library is first imported: pymilvus re-configures its
    loggers then."""
    for name in names:
        lg = logging.getLogger(name)
        lg.setLevel(_level(name))
        if name == "py.warnings":
            continue
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
        for child_name, child in list(logging.root.manager.loggerDict.items()):
            if child_name.startswith(name + ".") and isinstance(child, logging.Logger):
                for h in list(child.handlers):  # pymilvus.milvus_client, pymilvus.bulk_writer, ...
                    child.removeHandler(h)
                child.propagate = True
                child.setLevel(logging.NOTSET)
    tf = sys.modules.get("transformers.utils.logging")
    if tf is not None:  # imported already: its handler is gone; keep it from coming back
        tf._default_handler = tf._default_handler or logging.NullHandler()


def set_verbose(verbose: bool) -> None:
    """Show the libraries' warnings (``verbose``, on stderr, with level and logger) or only their
    errors, and ours as ``warning: ...`` lines. For libraries not imported yet, their environment
    variables carry the level (unless the user set them)."""
    global _verbose
    _verbose = bool(verbose)
    for var in _ENV.values():  # read when the library is first imported
        if var not in os.environ or os.environ.get(_OWN + var):  # the user's own setting wins
            os.environ[var] = "warning" if _verbose else "error"
            os.environ[_OWN + var] = "1"
    logging.captureWarnings(True)  # warnings.warn of the libraries: the py.warnings logger
    tame_library_loggers()
    for h in [h for h in logging.root.handlers if isinstance(h, _Said)]:
        logging.root.removeHandler(h)
    logging.root.addHandler(_Said(_verbose))
    logging.getLogger("nobackfill").setLevel(logging.INFO if _verbose else logging.NOTSET)
