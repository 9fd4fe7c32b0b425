"""What the service shows of a file system path: relative to the collection or to a root the server
was started with (uploads, data, models, upgrades), never the server's own absolute path.

Every response and error message goes through :class:`PublicPaths`: a path under a known root
becomes its path relative to that root (``uploads/3fa1….img``, ``images/p0.png``, ``world-new``);
any other absolute path becomes its last component. A collection kept outside the file system is
shown by its name (``aliases``): its storage URI names the server's hosts, ports and database user
(trial Z). A client of any role learns the names it may use in requests, nothing about where the
server keeps them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

__all__ = ["PublicPaths"]

# an absolute POSIX path inside free text (after an optional URI scheme): starts at a '/' that does
# not continue a word or a relative path, and runs to whitespace, a quote, a bracket or a separator;
# the service's own endpoints (``POST /v1/backfill/start``) are no file system path
_ABS_IN_TEXT = re.compile(r"(?<![\w.~\-/])(?P<scheme>[A-Za-z][\w+.\-]*:)?"
                          r"(?!/v1/|/metrics\b|/healthz\b|/docs\b|/openapi\.json)(?P<path>/[^\s'\"`,;:()<>\[\]{}|]+)")


class PublicPaths:
    """``roots``: ``(directory, prefix)`` pairs; a path under ``directory`` is shown as ``prefix``
    followed by its path relative to the directory. The deepest matching root wins."""

    def __init__(self, roots: Iterable[tuple[str | Path | None, str]],
                 aliases: Mapping[str, str] | None = None) -> None:
        #: exact strings shown as another (a storage URI as the collection's name), the longest first
        self._aliases = sorted(((k, v) for k, v in (aliases or {}).items() if k), key=lambda kv: -len(kv[0]))
        seen: dict[str, str] = {}
        for root, prefix in roots:
            if root is None:
                continue
            for form in _forms(Path(root)):
                seen.setdefault(form, prefix)
        self._roots = sorted(seen.items(), key=lambda kv: -len(kv[0]))

    # ------------------------------------------------------------------ one path
    def path(self, value: str) -> str:
        """``value`` as a client may see it (unchanged unless it is an absolute path or an alias)."""
        for alias, shown in self._aliases:
            if value == alias:
                return shown
        if not isinstance(value, str) or not value.startswith("/"):
            return value
        norm = _norm(value)
        public = self._under(norm)
        return public if public is not None else PurePosixPath(norm).name

    def known(self, value: str) -> bool:
        """Whether ``value`` is an absolute path under one of the roots."""
        return isinstance(value, str) and value.startswith("/") and self._under(_norm(value)) is not None

    def _under(self, norm: str) -> str | None:
        """The public form of normalised absolute path ``norm`` under the deepest root, or None."""
        for root, prefix in self._roots:
            if norm == root:
                return prefix.rstrip("/") or PurePosixPath(root).name
            if norm.startswith(root.rstrip("/") + "/"):
                return prefix + norm[len(root.rstrip("/")) + 1:]
        return None

    # ------------------------------------------------------------------ structures and text
    def text(self, message: str) -> str:
        """Every alias and absolute path inside ``message`` replaced by its public form."""
        if not isinstance(message, str):
            return message
        for alias, shown in self._aliases:
            message = message.replace(alias, shown)
        if "/" not in message:
            return message
        return _ABS_IN_TEXT.sub(self._in_text, message)

    def _in_text(self, m: re.Match) -> str:
        scheme, raw = m.group("scheme") or "", m.group("path")
        if scheme and raw.startswith("//") and not raw.startswith("///"):
            return m.group(0)  # a URI with a host (milvus://host:port/db): no path of this server
        tail = ""
        while raw and raw[-1] in ".!?":
            raw, tail = raw[:-1], raw[-1] + tail
        return scheme + (self.path(raw) if raw else "") + tail

    def metadata(self, meta: Mapping[str, Any], modality: str = "image") -> dict[str, Any]:
        """An item's metadata with the paths the server stored (an image's ``path``, or any value
        under a known root) made public; other values, a client's own data, are left as they are
        (a caption's own ``path`` is its data: trial K saw ``/etc/passwd`` come back as ``passwd``)."""
        out = {}
        for k, v in meta.items():
            if isinstance(v, str) and v.startswith("/") and ((k == "path" and modality == "image") or self.known(v)):
                v = self.path(v)
            out[k] = v
        return out

    def deep(self, value: Any) -> Any:
        """Every string of a structure the server built (status, plans) made public: absolute paths
        by :meth:`path`, paths inside messages by :meth:`text`."""
        if isinstance(value, str):
            if any(value == alias for alias, _ in self._aliases):
                return self.path(value)
            whole = value.startswith("/") and (" " not in value or self.known(value))
            return self.path(value) if whole else self.text(value)
        if isinstance(value, Mapping):
            return {k: self.deep(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.deep(v) for v in value]
        return value


def _norm(value: str) -> str:
    """An absolute path normalised (POSIX keeps a leading '//': one '/' here)."""
    norm = os.path.normpath(value)
    return "/" + norm.lstrip("/") if norm.startswith("//") else norm


def _forms(p: Path) -> list[str]:
    """The spellings of a directory a path may arrive in: as given (absolute) and resolved."""
    out = []
    for q in (p.absolute(), p.resolve()):
        s = os.path.normpath(str(q))
        if s not in out:
            out.append(s)
    return out
