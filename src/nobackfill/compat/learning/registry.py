"""Compatibility-learning methods by name: ``@register`` on a :class:`~.base.CompatMethod` subclass
adds it; :func:`create_method` builds one from its name."""

from __future__ import annotations

from typing import Any, Callable

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: register ``cls`` under ``cls.name`` (names are unique)."""
    name = getattr(cls, "name", "")
    if not name or name in _REGISTRY:
        raise ValueError(f"method name {name!r} is empty or already registered")
    _REGISTRY[name] = cls
    return cls


def method_names() -> list[str]:
    """Registered names in registration order."""
    return list(_REGISTRY)


def method_class(name: str) -> type:
    if name not in _REGISTRY:
        raise ValueError(f"unknown compatibility-learning method {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of the method ``name`` checked (names, types, ranges) without building it."""
    from .base import checked_options

    cls = method_class(name)
    return checked_options(cls.name, cls.Config, options)


def create_method(name: str, **options: Any):
    """An instance of the method registered as ``name`` (``options`` override its config fields)."""
    return method_class(name)(**options)


MethodFactory = Callable[..., Any]
