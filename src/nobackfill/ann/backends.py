"""Vector-index backends behind one interface, chosen by a spec string.

A spec is a faiss index factory string, optionally followed by search parameters:
``"Flat"``, ``"HNSW32"``, ``"HNSW32:efSearch=128"``, ``"IVF1024,PQ16:nprobe=32"`` (indexes that need
training are trained on the vectors of their first build; search parameters are set through
``faiss.ParameterSpace``). The hand-made spellings ``"flat"``, ``"hnsw"``, ``"hnsw:M=16,ef=64"``
keep working. Every backend scores by inner product, which is cosine similarity on the unit-norm
rows a :class:`~nobackfill.encoders.base.DualEncoder` produces.

Adding a backend (e.g. a Milvus collection) means subclassing :class:`VectorIndex`, declaring its
``options`` and calling :func:`register_backend`; backends that live outside this process return
``None`` from :meth:`VectorIndex.to_bytes` and the gallery simply does not cache them on disk.

The interface is :mod:`.vector_index`, the faiss backends :mod:`.faiss_indexes`, ``auto``
:mod:`.auto_index`; this module holds the registry and the spec strings, and is the one to
import.
"""

from __future__ import annotations

from typing import Any, Callable

from .auto_index import AUTO_GRAPH_AT, AutoIndex
from .faiss_indexes import _FACTORY_RE, FactoryIndex, FlatIndex, HNSWIndex
from .vector_index import VectorIndex

__all__ = [
    "VectorIndex",
    "FlatIndex",
    "HNSWIndex",
    "AutoIndex",
    "AUTO_GRAPH_AT",
    "parse_spec",
    "validate_spec",
    "make_index",
    "load_index",
    "register_backend",
    "known_backends",
]


_BACKENDS: dict[str, type[VectorIndex]] = {}


def register_backend(cls: type[VectorIndex]) -> type[VectorIndex]:
    """Make ``cls`` available under ``cls.kind`` (usable as a class decorator)."""
    _BACKENDS[cls.kind] = cls
    return cls


def known_backends() -> list[str]:
    """Registered backend kinds, sorted."""
    return sorted(_BACKENDS)


for _cls in (FlatIndex, HNSWIndex, FactoryIndex, AutoIndex):
    register_backend(_cls)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"hnsw:M=16,ef=64"`` -> ``("hnsw", {"M": 16, "ef": 64})``; a faiss factory string
    ``"IVF1024,PQ16:nprobe=32"`` -> ``("faiss", {"factory": "IVF1024,PQ16", "nprobe": 32})``
    (``"Flat"`` is the hand-made ``"flat"``); validates kind and options."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"backend spec must be a non-empty string, got {spec!r}")
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip()
    if kind.lower() not in _BACKENDS and _FACTORY_RE.match(kind):
        opts = dict(_parse_options(rest, FactoryIndex.options, "faiss", spec))
        opts.pop("factory", None)
        return "faiss", {"factory": kind, **opts}
    kind = kind.lower()
    if kind not in _BACKENDS:
        names = ", ".join(k for k in known_backends() if k != "faiss")
        raise ValueError(f"unknown index backend {kind!r} in {spec!r}; known: {names}, or a faiss index factory "
                         "string such as Flat, HNSW32, IVF1024,PQ16 (in faiss' capitals; search parameters after "
                         "':', e.g. HNSW32:efSearch=128)")
    return kind, _parse_options(rest, _BACKENDS[kind].options, kind, spec)


def _parse_options(rest: str, allowed: dict[str, type], kind: str, spec: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in allowed:
            known = ", ".join(allowed) or "none"
            raise ValueError(f"bad option {item!r} for backend {kind!r} in {spec!r}; options: {known}")
        if name in opts:  # (trial AM: the last one won, silently)
            raise ValueError(f"option {name!r} is given twice in {spec!r}")
        try:
            opts[name] = allowed[name](value.strip())
        except ValueError:
            extra = " (options are separated by ',', after one ':')" if ":" in value else ""
            raise ValueError(f"option {name!r} of {spec!r} must be {allowed[name].__name__}{extra}") from None
    return opts


def validate_spec(spec: str) -> str:
    """Checks ``spec`` without building anything (a faiss search parameter's range too); returns it
    normalised (``kind[:k=v,...]``, or the factory string with its search parameters)."""
    kind, opts = parse_spec(spec)
    if kind == "faiss":
        opts = dict(opts)
        factory = opts.pop("factory")
        FactoryIndex.check_params(factory, opts)
        return factory + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")
    return kind + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")


def check_buildable(spec: str, dim: int) -> None:
    """Refuse (``ValueError``) a spec whose index cannot be built for ``dim``-d vectors (a factory
    string faiss does not take, a product quantizer that does not divide ``dim``; auto's graph too),
    before anything is stored: trial U saw ``IVF9999,Zork`` accepted and every later search fail."""
    name, opts = parse_spec(spec)
    make_index(spec, dim)
    if name == "auto" and "graph" in opts:
        make_index(str(opts["graph"]), dim)


def make_index(kind: str, dim: int) -> VectorIndex:
    """A new empty index for spec ``kind`` (e.g. ``"flat"``, ``"hnsw:M=16,ef=64"``)."""
    name, opts = parse_spec(kind)
    return _BACKENDS[name](dim, **opts)


def load_index(kind: str, dim: int, data: "bytes | Callable[[int], bytes]") -> VectorIndex:
    """Restore an index written by :meth:`VectorIndex.to_bytes` (or :meth:`VectorIndex.write_to`)
    for the same spec; ``data``: its bytes, or a reader of them (called with a byte count)."""
    name, opts = parse_spec(kind)
    return _BACKENDS[name].from_bytes(data, dim, **opts)
