"""One config system: dataclasses loaded from TOML or YAML (or dicts), with errors that name the
file and the field. Nested dataclasses are filled recursively; unknown keys are refused.

Every train / upgrade / bench command builds its config the same way (:func:`build_config`): the
dataclass defaults (or a preset such as ``quick``), then ``--config FILE`` (TOML/YAML), then each
``--set dotted.key=value`` in order. A method config holds its optimisation settings in one
``loop: LoopConfig`` field; the loop's keys may be written one level up for short
(``stage2.lr=1e-4`` is ``stage2.loop.lr=1e-4``).
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or dict does not match its dataclass."""


def read_mapping(path: str | Path) -> dict:
    """Parse a TOML (.toml) or YAML (.yaml/.yml) file into a dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    import yaml

    try:
        if path.suffix == ".toml":
            return tomllib.loads(path.read_text(encoding="utf-8"))
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: top level must be a mapping")
            return data
    except (tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{path}: cannot parse: {_one_line(e)}") from None
    raise ConfigError(f"{path}: unknown config format (use .toml, .yaml or .yml)")


def _one_line(e: BaseException) -> str:
    """A parser's error as one line with its place, like TOML's ``... (at line 1, column 8)``: PyYAML's
    own message spans lines (the snippet, a caret, ``in "<unicode string>"``)."""
    mark = getattr(e, "problem_mark", None)
    if mark is None or not getattr(e, "problem", None):
        return " ".join(str(e).split())
    where = f"at line {mark.line + 1}, column {mark.column + 1}"
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context:
        where += f"; {context}" + (f" from line {cmark.line + 1}, column {cmark.column + 1}" if cmark else "")
    return f"{e.problem} ({where})"


def coerce(tp: Any, value: Any, where: str) -> Any:
    """``value`` as type ``tp`` (a config field's type: numbers, strings, bools, Optional, Literal,
    lists, nested dataclasses); a ConfigError naming ``where`` when it is not one."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table/mapping, got {type(value).__name__}")
        return from_dict(tp, value, where)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(a, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is typing.Literal:  # the docstring's promise: a value outside the literal's is refused
        if value in args:
            return value
        raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
    if origin is None and tp in (tuple, list, dict):  # bare annotations
        origin = tp
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [coerce(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"{where}: expected a path, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected float, got {value!r}")
    if tp in (int, str, bool) and not (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict, source: str = "<config>") -> T:
    """Build dataclass ``cls`` from ``data``; ``source`` prefixes every error (file name)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table/mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    data = _route_loop_keys(cls, hints, names, data)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {unknown}; known: {sorted(names)}")
    kwargs = {k: coerce(hints[k], v, f"{source}: field '{k}'") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {e}") from None


def _route_loop_keys(cls: type, hints: dict, names: set[str], data: dict) -> dict:
    """Move keys of a ``loop`` dataclass field given one level up (``lr`` for ``loop.lr``) into it;
    they win over the same key inside ``loop`` (only a user writes the short form)."""
    loop_tp = hints.get("loop")
    if "loop" not in names or not dataclasses.is_dataclass(loop_tp):
        return data
    loop_names = {f.name for f in dataclasses.fields(loop_tp) if f.init}
    short = {k: v for k, v in data.items() if k not in names and k in loop_names}
    if not short:
        return data
    rest = {k: v for k, v in data.items() if k not in short}
    loop = rest.get("loop", {})
    rest["loop"] = {**(to_dict(loop) if dataclasses.is_dataclass(loop) else loop), **short}
    return rest


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal (``1e-4``, ``true``, ``"a b"``, ``[1, 2]``), else the text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignments(assignments: typing.Sequence[str]) -> dict:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}``; a malformed item names itself."""
    out: dict = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise ConfigError(f"--set {item!r}: expected dotted.key=value")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is set to a value and used as a table")
        node[path[-1]] = parse_value(value.strip())
    return out


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``, tables merged key by key (neither is modified)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_config(cls: type[T], base: T | None = None, file: str | Path | None = None,
                 sets: typing.Sequence[str] = (), section: str | None = None) -> T:
    """``base`` (default: ``cls()``), then ``file`` (its ``section`` if given), then ``--set`` items.

    Each layer is checked on its own, so an error names the file or ``--set`` it came from."""
    cfg = cls() if base is None else base
    if file is not None:
        data = read_mapping(file)
        source = str(file)
        if section is not None:
            if section not in data:
                raise ConfigError(f"{file}: missing section [{section}]")
            data, source = data[section], f"{file} [{section}]"
        cfg = from_dict(cls, deep_merge(to_dict(cfg), data), source)
    if sets:
        cfg = from_dict(cls, deep_merge(to_dict(cfg), parse_assignments(sets)), "--set")
    return cfg


def updated(cfg: T, **changes: Any) -> T:
    """A copy of ``cfg`` with ``changes`` (nested tables merged, short loop keys allowed), checked
    like a config file: ``updated(XBTConfig(), steps=60, batch_size=32)``."""
    return from_dict(type(cfg), deep_merge(to_dict(cfg), to_dict(changes)), type(cfg).__name__)


def load_config(cls: type[T], path: str | Path, section: str | None = None) -> T:
    """Load dataclass ``cls`` from a TOML/YAML file (optionally one top-level ``section``)."""
    data = read_mapping(path)
    if section is not None:
        if section not in data:
            raise ConfigError(f"{path}: missing section [{section}]")
        data = data[section]
        return from_dict(cls, data, f"{path} [{section}]")
    return from_dict(cls, data, str(path))


def to_dict(obj: Any) -> dict:
    """A dataclass as a dict of its init fields, nested dataclasses as dicts (what ``from_dict`` takes)."""
    def walk(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: walk(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v
    return walk(obj)


def warmup_warnings(cfg: Any, key: str = "") -> list[str]:
    """A line for each table of the config ``cfg`` (a dataclass, walked through its fields; ``key``: its
    dotted name) whose ``steps`` all fall in its ``warmup`` (:func:`nobackfill.train.loop.lr_factor`): the
    learning rate never reaches its peak, or only at the last step, and never decays. Commands print
    them at the start (trial Y: ``train --steps 40`` over a 100-step warm-up said nothing), naming
    the key that shortens it (``--set train.warmup=N``). Only for configs whose ``steps`` are optimiser
    steps wherever a ``warmup`` is beside them (``compat train``'s ``sequence.steps`` counts models: give
    it its :class:`~nobackfill.train.loop.LoopConfig` with ``key="sequence"``)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        return []
    out = []
    steps, warmup = getattr(cfg, "steps", None), getattr(cfg, "warmup", None)
    if isinstance(steps, int) and isinstance(warmup, int) and 0 < steps <= warmup:
        name = f"{key}.warmup" if key else "warmup"
        lr = getattr(cfg, "lr", None)
        peak = f"its peak{f' {lr:g}' if isinstance(lr, (int, float)) else ''}"
        peak = f"never reaches {peak}" if steps < warmup else f"reaches {peak} at the last step only"
        out.append(f"{name} is {warmup} steps and the run is {steps}: every step is in the warm-up (the learning rate "
                   f"{peak}{' and never decays' if getattr(cfg, 'schedule', 'cosine') == 'cosine' else ''}); "
                   f"shorten it with --set {name}=N (e.g. {max(1, steps // 10)})")
    for f in dataclasses.fields(cfg):
        out += warmup_warnings(getattr(cfg, f.name, None), f"{key}.{f.name}" if key else f.name)
    return out


def warn_warmup(cfg: Any, key: str = "") -> list[str]:
    """Log (a warning each, ``warning: ...`` on the command line) and return :func:`warmup_warnings` of ``cfg``."""
    import logging

    lines = warmup_warnings(cfg, key)
    for line in lines:
        logging.getLogger(__name__).warning("%s", line)
    return lines
