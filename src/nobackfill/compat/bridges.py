"""Bridges between embedding spaces as first-class objects.

A bridge maps query vectors of space ``source`` into space ``target`` (the
:class:`nobackfill.gallery.Bridge` protocol: ``.source``, ``.target``, ``__call__(vectors)``).
A :class:`BridgeRegistry` knows spaces and bridges; a query from space B reaches a gallery of
space A only through a registered bridge chain B -> ... -> A (:meth:`BridgeRegistry.resolve`,
shortest chain, composed with :class:`ComposedBridge`), otherwise it is refused with
:class:`NoBridgeError` naming both space ids.

Vector bridges here:

* :class:`PhiBridge` - XBT's text-only pretrained phi (Eq. 3) applied to raw new embeddings.
* :class:`ProcrustesBridge` - orthogonal Procrustes, training-free (newer public work): the
  (semi-)orthogonal ``W`` minimising ``||X W - Y||_F`` over paired text embeddings ``X`` (new)
  and ``Y`` (old); ``W = U V^T`` from the SVD ``X^T Y = U S V^T``. With ``d_new > d_old`` ``W`` has
  orthonormal columns.
* :class:`SlerpBridge` - spherical interpolation between the old model's query and the aligned
  new query, ``slerp(q_old, align(q_new), t)`` (``t = 0``: the old query, ``t = 1``: the aligned
  new one). Its source is the *paired* space of both models (:func:`paired_space_id`): the query
  is embedded by both (:class:`PairedEncoder`), concatenated ``[new | old]``.

An XBT upgrade with adapters is not a vector bridge (it changes how the new model embeds its
inputs); see :mod:`nobackfill.compat.upgrade`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import numpy as np

from ..encoders.base import DualEncoder, l2_normalise
from ..gallery.types import SpaceMismatchError

T = TypeVar("T")


class NoBridgeError(SpaceMismatchError):
    """No registered bridge chain connects the query space to the gallery space."""

    def __init__(self, source: str, target: str, known: Sequence[str] = ()) -> None:
        hint = ("no registered bridge chain connects them"
                + (f" (bridges: {', '.join(known)})" if known else " (no bridges registered)"))
        super().__init__(target, source, f"bridge queries from {source} to {target}", what="queries", hint=hint)
        self.source, self.target = source, target


# ----------------------------------------------------------------------------- maths
def procrustes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The orthogonal Procrustes solution: ``W`` (``d_x x d_y``, orthonormal columns if
    ``d_x >= d_y``, orthonormal rows otherwise) minimising ``||x W - y||_F``."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"procrustes needs row-aligned 2-D arrays, got {x.shape} and {y.shape}")
    if x.shape[0] < 2:
        raise ValueError("procrustes needs at least 2 pairs")
    u, _, vt = np.linalg.svd(x.T @ y, full_matrices=False)
    return (u @ vt).astype(np.float32)


def slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """Row-wise spherical linear interpolation between unit vectors ``a`` (t=0) and ``b`` (t=1).
    Rows are normalised first; nearly parallel rows fall back to (normalised) linear
    interpolation."""
    a = l2_normalise(np.asarray(a, np.float32)).astype(np.float64)
    b = l2_normalise(np.asarray(b, np.float32)).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"slerp needs equal shapes, got {a.shape} and {b.shape}")
    cos = np.clip((a * b).sum(-1, keepdims=True), -1.0, 1.0)
    omega = np.arccos(cos)
    so = np.sin(omega)
    small = so < 1e-6
    safe = np.where(small, 1.0, so)
    wa = np.where(small, 1.0 - t, np.sin((1.0 - t) * omega) / safe)
    wb = np.where(small, t, np.sin(t * omega) / safe)
    return l2_normalise((wa * a + wb * b).astype(np.float32))


def paired_space_id(new: str, old: str) -> str:
    """The id of the space of concatenated ``[new | old]`` query embeddings."""
    return f"pair({new},{old})"


# ----------------------------------------------------------------------------- bridges
class VectorBridge:
    """Base class: ``source``/``target`` space ids, optional dims, ``__call__`` on float arrays."""

    kind = "bridge"

    def __init__(self, source: str, target: str, source_dim: int | None = None,
                 target_dim: int | None = None, name: str = "") -> None:
        self.source, self.target = source, target
        self.source_dim, self.target_dim = source_dim, target_dim
        self.name = name or self.kind

    def _check(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, np.float32)
        if q.ndim != 2:
            raise ValueError(f"{self.name}: queries must be 2-D, got shape {q.shape}")
        if self.source_dim is not None and q.shape[1] != self.source_dim:
            raise ValueError(f"{self.name}: queries have dim {q.shape[1]}, the bridge expects {self.source_dim}")
        return q

    def __call__(self, queries: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source} -> {self.target})"


class IdentityBridge(VectorBridge):
    kind = "identity"

    def __init__(self, space: str) -> None:
        super().__init__(space, space)

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        return np.asarray(queries, np.float32)


class PhiBridge(VectorBridge):
    """phi (a :class:`~nobackfill.compat.phi.Projection`) on raw new-space vectors."""

    kind = "phi"

    def __init__(self, phi, source: str, target: str, name: str = "") -> None:
        super().__init__(source, target, phi.in_dim, phi.out_dim, name)
        self.phi = phi.eval()

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        return self.phi.project(self._check(queries))


@dataclass
class ProcrustesConfig:
    """``upgrade procrustes``: the most distinct captions of the corpus the bridge is fitted on."""

    corpus_size: int = 40000

    def __post_init__(self) -> None:
        if self.corpus_size < 2:
            raise ValueError("corpus_size must be at least 2")


class ProcrustesBridge(VectorBridge):
    """``normalise(q W)`` with the Procrustes ``W`` (see :func:`procrustes`)."""

    kind = "procrustes"

    def __init__(self, w: np.ndarray, source: str, target: str, name: str = "") -> None:
        w = np.asarray(w, np.float32)
        super().__init__(source, target, w.shape[0], w.shape[1], name)
        self.w = w

    @classmethod
    def fit(cls, new: np.ndarray, old: np.ndarray, source: str, target: str) -> "ProcrustesBridge":
        """Fit on row-paired embeddings (e.g. the same captions embedded by both text encoders)."""
        return cls(procrustes(l2_normalise(np.asarray(new, np.float32)),
                              l2_normalise(np.asarray(old, np.float32))), source, target)

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        return l2_normalise(self._check(queries) @ self.w)

    def save(self, directory: str | Path) -> None:
        from .._safetensors import save_tensors

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_tensors({"w": np.ascontiguousarray(self.w)}, str(d / "procrustes.safetensors"))

    @classmethod
    def load(cls, directory: str | Path, source: str, target: str) -> "ProcrustesBridge":
        from safetensors.numpy import load_file

        return cls(load_file(str(Path(directory) / "procrustes.safetensors"))["w"], source, target)


class SlerpBridge(VectorBridge):
    """``slerp(q_old, aligned(q_new), t)`` on concatenated ``[q_new | q_old]`` queries."""

    kind = "slerp"

    def __init__(self, aligned: VectorBridge, t: float = 0.5, name: str = "") -> None:
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"slerp t must lie in [0, 1], got {t}")
        if aligned.source_dim is None or aligned.target_dim is None:
            raise ValueError("the aligning bridge must declare its dims")
        super().__init__(paired_space_id(aligned.source, aligned.target), aligned.target,
                         aligned.source_dim + aligned.target_dim, aligned.target_dim, name)
        self.aligned, self.t = aligned, float(t)

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        q = self._check(queries)
        d_new = self.aligned.source_dim
        return slerp(q[:, d_new:], self.aligned(q[:, :d_new]), self.t)

    def blend(self, new_queries: np.ndarray, old_queries: np.ndarray) -> np.ndarray:
        return self(np.concatenate([new_queries, old_queries], axis=1))


class ComposedBridge(VectorBridge):
    """Bridges applied in sequence; each one's target must be the next one's source."""

    kind = "chain"

    def __init__(self, bridges: Sequence) -> None:
        bridges = list(bridges)
        if not bridges:
            raise ValueError("a bridge chain needs at least one bridge")
        for a, b in zip(bridges, bridges[1:]):
            if a.target != b.source:
                raise ValueError(f"cannot compose {a!r} with {b!r}: {a.target} != {b.source}")
        super().__init__(bridges[0].source, bridges[-1].target, getattr(bridges[0], "source_dim", None),
                         getattr(bridges[-1], "target_dim", None),
                         " -> ".join(getattr(b, "name", type(b).__name__) for b in bridges))
        self.bridges = bridges

    def __call__(self, queries: np.ndarray) -> np.ndarray:
        q = np.asarray(queries, np.float32)
        for b in self.bridges:
            q = np.asarray(b(q), np.float32)
        return q


# ----------------------------------------------------------------------------- registry
def shortest_chain(edges: Callable[[str], Iterable[tuple[str, T]]], start: str, target: str) -> list[T] | None:
    """The labels of a shortest path ``start -> target`` in a graph of spaces (breadth first;
    ``edges(space)`` gives ``(next space, label)`` pairs), [] when they are equal, None when no
    path exists. The one chain search of bridges and of a collection's registered upgrades."""
    if start == target:
        return []
    prev: dict[str, tuple[str, T]] = {}
    seen, queue = {start}, deque([start])
    while queue:
        s = queue.popleft()
        for nxt, label in edges(s):
            if nxt in seen:
                continue
            prev[nxt] = (s, label)
            if nxt == target:
                chain, node = [], target
                while node != start:
                    node, lab = prev[node]
                    chain.append(lab)
                return chain[::-1]
            seen.add(nxt)
            queue.append(nxt)
    return None



@dataclass
class SpaceInfo:
    space_id: str
    name: str = ""
    dim: int | None = None


class BridgeRegistry:
    """Spaces and the bridges between them; resolves a query space to a gallery space along the
    shortest chain of registered bridges, or refuses."""

    def __init__(self) -> None:
        self.spaces: dict[str, SpaceInfo] = {}
        self._out: dict[str, list] = {}

    def add_space(self, space_id: str, name: str = "", dim: int | None = None) -> SpaceInfo:
        info = self.spaces.get(space_id)
        if info is None:
            info = self.spaces[space_id] = SpaceInfo(space_id, name, dim)
        else:
            if dim is not None and info.dim is not None and dim != info.dim:
                raise ValueError(f"space {space_id} is registered with dim {info.dim}, not {dim}")
            info.name = info.name or name
            info.dim = info.dim if info.dim is not None else dim
        return info

    def add_encoder(self, encoder: DualEncoder, name: str = "") -> SpaceInfo:
        return self.add_space(encoder.space_id, name or getattr(encoder, "name", ""), encoder.embed_dim)

    def add_bridge(self, bridge) -> None:
        """Register a bridge (its spaces are added if unknown; declared dims must agree)."""
        for attr in ("source", "target"):
            if not isinstance(getattr(bridge, attr, None), str):
                raise TypeError(f"{bridge!r} has no {attr} space id")
        if bridge.source == bridge.target:
            raise ValueError(f"{bridge!r} maps a space onto itself")
        self.add_space(bridge.source, dim=getattr(bridge, "source_dim", None))
        self.add_space(bridge.target, dim=getattr(bridge, "target_dim", None))
        self._out.setdefault(bridge.source, []).append(bridge)

    def bridges(self) -> list:
        return [b for bs in self._out.values() for b in bs]

    def path(self, source: str, target: str) -> list:
        """The shortest bridge chain ``source -> target`` ([] if equal); :class:`NoBridgeError`."""
        chain = shortest_chain(lambda s: [(b.target, b) for b in self._out.get(s, [])], source, target)
        if chain is not None:
            return chain
        raise NoBridgeError(source, target, [f"{b.source}->{b.target}" for b in self.bridges()])

    def resolve(self, source: str, target: str):
        """A single bridge ``source -> target``: identity, one registered bridge, or a chain."""
        chain = self.path(source, target)
        if not chain:
            return IdentityBridge(source)
        return chain[0] if len(chain) == 1 else ComposedBridge(chain)

    @classmethod
    def from_bridges(cls, bridges: Iterable) -> "BridgeRegistry":
        reg = cls()
        for b in bridges:
            reg.add_bridge(b)
        return reg


class PairedEncoder(DualEncoder):
    """Embeds with two encoders and concatenates ``[new | old]`` (the source space of
    :class:`SlerpBridge`: the query side runs both models; the gallery stays old)."""

    kind = "paired"

    def __init__(self, new: DualEncoder, old: DualEncoder) -> None:
        self.new, self.old = new, old

    @property
    def embed_dim(self) -> int:
        return self.new.embed_dim + self.old.embed_dim

    @property
    def space_id(self) -> str:
        return paired_space_id(self.new.space_id, self.old.space_id)

    def encode_images(self, images, batch_size: int = 128, progress: bool = False) -> np.ndarray:
        return np.concatenate([self.new.encode_images(images, batch_size, progress),
                               self.old.encode_images(images, batch_size, progress)], axis=1)

    def encode_texts(self, texts, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        return np.concatenate([self.new.encode_texts(texts, batch_size, progress),
                               self.old.encode_texts(texts, batch_size, progress)], axis=1)

    def save(self, directory):  # pragma: no cover - nothing of its own to save
        raise NotImplementedError("a PairedEncoder is two saved models")


def describe(bridge) -> dict:
    return {"kind": getattr(bridge, "kind", type(bridge).__name__), "source": bridge.source,
            "target": bridge.target, "name": getattr(bridge, "name", "")}

