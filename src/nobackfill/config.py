"""One config system: dataclasses loaded from TOML or YAML (or dicts), with errors that name the
file and the field. Nested dataclasses are filled recursively; unknown keys are refused.
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
        raise ConfigError(f"{path}: cannot parse: {e}") from None
    raise ConfigError(f"{path}: unknown config format (use .toml, .yaml or .yml)")


def _coerce(tp: Any, value: Any, where: str) -> Any:
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
                return _coerce(a, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is None and tp in (tuple, list, dict):  # bare annotations
        origin = tp
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
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
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{source}: field '{k}'") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {e}") from None


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
    return dataclasses.asdict(obj)
