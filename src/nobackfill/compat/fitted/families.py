"""The candidate families of a bridge fitted on (new, old) vector pairs of the same items.

Every family maps a new-model vector ``q`` (``d_new``) to the old space (``d_old``) and is fitted on
row-paired, unit-normalised ``new`` / ``old`` arrays (the Drift-Adapter families, arXiv 2509.23471):

* ``orthogonal`` - mean-centred orthogonal Procrustes: ``(q - mu_new) R + mu_old`` with ``R`` the
  (semi-)orthogonal solution of ``min ||(X - mu_X) R - (Y - mu_Y)||_F`` (for unequal widths the
  narrower side is zero-padded; the padded square solution restricted to the real columns is the
  semi-orthogonal one :func:`~nobackfill.compat.bridges.procrustes` gives). A centred orthogonal
  map fitted on one modality's pairs also aligns the other's (arXiv 2602.17584).
* ``ridge`` - an affine map ``q W + b``, ``W`` by ridge regression on the centred pairs; the penalty
  is chosen on a split of the fit pairs (mean cosine of the held-back part).
* ``lowrank`` - the ridge map reduced to rank ``r`` (reduced-rank regression: projected on the top
  ``r`` right singular vectors of the fitted values).
* ``mlp`` - a residual MLP: the centred orthogonal map (fixed) plus ``Linear(GELU(LN(Linear(q))))``
  trained with a cosine loss on CPU (seconds; seeded); ``mlp-plain`` the same MLP without the skip.
  An unconstrained map (ridge, MLP) fitted on one modality can transfer worse to the other: the
  label-free choice judges each on the other modality's queries.
* ``ensemble`` - the mean of several fitted maps' unit outputs, re-normalised (:func:`ensemble_map`):
  what the label-free choice serves, the best-scored candidates averaged (model averaging lowers
  the variance of any one map fitted on a few hundred pairs; see :mod:`.choose`).

Outputs are L2-normalised. The parameters are plain float32 arrays (:class:`FittedMap`), applied
with numpy at query time (no torch), saved with safetensors by :mod:`.bridge`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...encoders.base import l2_normalise

FAMILIES = ("orthogonal", "ridge", "lowrank", "mlp", "mlp-plain")
MLP_FAMILIES = ("mlp", "mlp-plain")
ENSEMBLE = "ensemble"
MAP_TENSORS = ("w", "mu_in", "b")
MLP_TENSORS = ("w1", "b1", "ln_g", "ln_b", "w2", "b2")
RIDGE_LAMBDAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0)


@dataclass
class FitConfig:
    """How the families are fitted (the defaults fit 500-20,000 pairs in seconds on 1-2 cores)."""

    families: tuple[str, ...] = FAMILIES
    rank: int = 32
    hidden: int = 256
    epochs: int = 100
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 1e-4
    max_steps: int = 3000
    threads: int = 1
    seed: int = 0
    ensemble: int = 3  # the choice serves the mean of this many best-scored candidates (1: the best alone)

    def __post_init__(self) -> None:
        if not self.families:
            raise ValueError(f"families: at least one bridge family is needed; families: {FAMILIES}")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad:
            raise ValueError(f"unknown bridge families {bad}; families: {FAMILIES}")
        if self.rank < 1 or self.hidden < 1 or self.epochs < 1 or self.ensemble < 1:
            raise ValueError("rank, hidden, epochs and ensemble must be positive")


@dataclass
class FittedMap:
    """A fitted family's parameters; :meth:`__call__` maps ``(n, d_new)`` rows to unit ``(n, d_old)``."""

    family: str
    tensors: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    _members: list["FittedMap"] | None = field(default=None, repr=False, compare=False)

    @property
    def in_dim(self) -> int:
        return int(self.tensors["0.w" if self.family == ENSEMBLE else "w"].shape[0])

    @property
    def out_dim(self) -> int:
        return int(self.tensors["0.w" if self.family == ENSEMBLE else "w"].shape[1])

    def members(self) -> list["FittedMap"]:
        """An ensemble's member maps (their tensors are this map's, prefixed ``"<i>."``); ``[self]``
        for a single family."""
        if self.family != ENSEMBLE:
            return [self]
        if self._members is None:
            self._members = [FittedMap(f, _prefixed(self.tensors, i)) for i, f in enumerate(self.meta["member_families"])]
        return self._members

    def __call__(self, q: np.ndarray) -> np.ndarray:
        t = self.tensors
        q = np.asarray(q, np.float32)
        if self.family == ENSEMBLE:
            return l2_normalise(np.mean([m(q) for m in self.members()], axis=0).astype(np.float32))
        out = (q - t["mu_in"]) @ t["w"] + t["b"]
        if self.family in MLP_FAMILIES:
            h = q @ t["w1"] + t["b1"]
            mu = h.mean(axis=1, keepdims=True)
            var = ((h - mu) ** 2).mean(axis=1, keepdims=True)
            h = (h - mu) / np.sqrt(var + 1e-5) * t["ln_g"] + t["ln_b"]
            h = 0.5 * h * (1.0 + np.tanh(_GELU_C * (h + 0.044715 * h ** 3)))  # GELU, tanh form (as trained)
            out = out + h @ t["w2"] + t["b2"]
        return l2_normalise(out.astype(np.float32))


_GELU_C = math.sqrt(2.0 / math.pi)


def _prefixed(tensors: Mapping[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    """Member ``i``'s tensors of an ensemble's (``"<i>.<name>"`` -> ``name``)."""
    return {k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == str(i)}


def _pairs(new: np.ndarray, old: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = l2_normalise(np.asarray(new, np.float32))
    y = l2_normalise(np.asarray(old, np.float32))
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise ValueError(f"a bridge is fitted on row-paired 2-D arrays, got {x.shape} and {y.shape}")
    if len(x) < 8:
        raise ValueError(f"a bridge needs at least 8 pairs, got {len(x)}")
    return x, y


def _f32(**arrays: np.ndarray) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in arrays.items()}


def fit_orthogonal(new: np.ndarray, old: np.ndarray, cfg: FitConfig | None = None) -> FittedMap:
    """Mean-centred orthogonal Procrustes (see the module doc)."""
    from ..bridges import procrustes

    x, y = _pairs(new, old)
    mx, my = x.mean(0), y.mean(0)
    r = procrustes(x - mx, y - my)
    return FittedMap("orthogonal", _f32(w=r, mu_in=mx, b=my))


def _ridge_solve(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    a = x64.T @ x64 + lam * np.eye(x.shape[1])
    return np.linalg.solve(a, x64.T @ y64)


def _mean_cos(pred: np.ndarray, y: np.ndarray) -> float:
    return float((l2_normalise(pred.astype(np.float32)) * y).sum(1).mean())


def _ridge(x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Centred ridge with the penalty chosen on a held-back fifth of the pairs; refitted on all."""
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(x))
    cut = max(1, len(x) // 5)
    va, tr = idx[:cut], idx[cut:]
    scores = [(_mean_cos(xc[va] @ _ridge_solve(xc[tr], yc[tr], lam) + my, y[va]), lam) for lam in RIDGE_LAMBDAS]
    lam = max(scores)[1]
    return _ridge_solve(xc, yc, lam), mx, my, lam


def fit_ridge(new: np.ndarray, old: np.ndarray, cfg: FitConfig | None = None) -> FittedMap:
    """Affine ridge regression (see the module doc)."""
    cfg = cfg or FitConfig()
    x, y = _pairs(new, old)
    w, mx, my, lam = _ridge(x, y, cfg.seed)
    return FittedMap("ridge", _f32(w=w, mu_in=mx, b=my), {"lambda": lam})


def fit_lowrank(new: np.ndarray, old: np.ndarray, cfg: FitConfig | None = None) -> FittedMap:
    """Reduced-rank affine regression (see the module doc)."""
    cfg = cfg or FitConfig()
    x, y = _pairs(new, old)
    w, mx, my, lam = _ridge(x, y, cfg.seed)
    rank = int(min(cfg.rank, *w.shape))
    _, _, vt = np.linalg.svd((x - mx) @ w, full_matrices=False)
    p = vt[:rank].T @ vt[:rank]
    return FittedMap("lowrank", _f32(w=w @ p, mu_in=mx, b=my), {"lambda": lam, "rank": rank})


def _train_mlp(x: np.ndarray, y: np.ndarray, skip: np.ndarray | None,
               cfg: FitConfig) -> tuple[dict[str, np.ndarray], int]:
    """Train ``Linear-LN-GELU-Linear`` with a cosine loss on ``y`` given a fixed ``skip`` output per
    row (the residual form; None: the MLP alone). AdamW, cosine schedule, seeded, ``cfg.threads``."""
    import torch

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, cfg.threads))
    try:
        g = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        d_in, d_out = x.shape[1], y.shape[1]
        l1, ln, l2 = torch.nn.Linear(d_in, cfg.hidden), torch.nn.LayerNorm(cfg.hidden), torch.nn.Linear(cfg.hidden, d_out)
        if skip is not None:
            with torch.no_grad():  # the residual branch starts at zero: the fit starts from the skip map
                l2.weight.zero_()
                l2.bias.zero_()
        params = [*l1.parameters(), *ln.parameters(), *l2.parameters()]
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        st = torch.from_numpy(np.asarray(skip, np.float32)) if skip is not None else None
        n = len(x)
        bs = min(cfg.batch_size, n)
        steps_per_epoch = max(1, n // bs)
        epochs = max(1, min(cfg.epochs, cfg.max_steps // steps_per_epoch))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps_per_epoch)
        for _ in range(epochs):
            perm = torch.randperm(n, generator=g)
            for s in range(steps_per_epoch):
                b = perm[s * bs:(s + 1) * bs]
                out = l2(torch.nn.functional.gelu(ln(l1(xt[b])), approximate="tanh"))
                if st is not None:
                    out = out + st[b]
                loss = 1.0 - torch.nn.functional.cosine_similarity(out, yt[b], dim=-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
    finally:
        torch.set_num_threads(prev_threads)
    return _f32(w1=l1.weight.detach().numpy().T, b1=l1.bias.detach().numpy(), ln_g=ln.weight.detach().numpy(),
                ln_b=ln.bias.detach().numpy(), w2=l2.weight.detach().numpy().T, b2=l2.bias.detach().numpy()), epochs


def fit_mlp(new: np.ndarray, old: np.ndarray, cfg: FitConfig | None = None) -> FittedMap:
    """The residual MLP: the centred orthogonal map (fixed) plus ``Linear-LN-GELU-Linear`` trained
    on what it leaves (cosine loss, seconds on CPU, seeded)."""
    cfg = cfg or FitConfig()
    x, y = _pairs(new, old)
    base = fit_orthogonal(x, y)
    mlp, epochs = _train_mlp(x, y, (x - base.tensors["mu_in"]) @ base.tensors["w"] + base.tensors["b"], cfg)
    return FittedMap("mlp", {**base.tensors, **mlp}, {"epochs": epochs, "hidden": cfg.hidden})


def fit_mlp_plain(new: np.ndarray, old: np.ndarray, cfg: FitConfig | None = None) -> FittedMap:
    """``Linear-LN-GELU-Linear`` alone (no skip), the same training."""
    cfg = cfg or FitConfig()
    x, y = _pairs(new, old)
    mlp, epochs = _train_mlp(x, y, None, cfg)
    zeros = _f32(w=np.zeros((x.shape[1], y.shape[1])), mu_in=np.zeros(x.shape[1]), b=np.zeros(y.shape[1]))
    return FittedMap("mlp-plain", {**zeros, **mlp}, {"epochs": epochs, "hidden": cfg.hidden})


def ensemble_map(members: Sequence[tuple[str, FittedMap]]) -> FittedMap:
    """The mean of ``members``' unit outputs, re-normalised: one map holding every member's tensors
    (prefixed ``"<i>."``); ``members`` are ``(candidate name, map)`` pairs with equal widths."""
    if not members:
        raise ValueError("an ensemble needs at least one member")
    dims = {(m.in_dim, m.out_dim) for _, m in members}
    if len(dims) != 1:
        raise ValueError(f"the members of an ensemble map between the same widths, got {sorted(dims)}")
    if any(m.family == ENSEMBLE for _, m in members):
        raise ValueError("an ensemble's members are single families")
    tensors = {f"{i}.{k}": v for i, (_, m) in enumerate(members) for k, v in m.tensors.items()}
    return FittedMap(ENSEMBLE, tensors, {
        "members": [name for name, _ in members], "member_families": [m.family for _, m in members],
        "member_pairs": [int(m.meta.get("pairs", 0)) for _, m in members],
        "pairs": max(int(m.meta.get("pairs", 0)) for _, m in members),
        "fit_s": round(sum(float(m.meta.get("fit_s", 0.0)) for _, m in members), 4)})


def check_tensors(family: str, tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> list[str]:
    """The tensors a ``family`` map (an ensemble: each member's, from ``meta["member_families"]``)
    needs and ``tensors`` lacks."""
    if family == ENSEMBLE:
        fams = meta.get("member_families")
        if not isinstance(fams, list) or not fams or any(f not in FAMILIES for f in fams):
            return [f"member_families (got {fams!r}; families: {FAMILIES})"]
        return [f"{i}.{k}" for i, f in enumerate(fams) for k in check_tensors(f, _prefixed(tensors, i), {})]
    need = MAP_TENSORS + (MLP_TENSORS if family in MLP_FAMILIES else ())
    return sorted(set(need) - set(tensors))


FITTERS: dict[str, Callable[[np.ndarray, np.ndarray, FitConfig | None], FittedMap]] = {
    "orthogonal": fit_orthogonal, "ridge": fit_ridge, "lowrank": fit_lowrank, "mlp": fit_mlp,
    "mlp-plain": fit_mlp_plain}


def fit_family(family: str, new: np.ndarray, old: np.ndarray, cfg: FitConfig | None = None) -> FittedMap:
    """Fit one family on row-paired ``new`` / ``old`` vectors; the seconds it took land in ``meta``."""
    if family not in FITTERS:
        raise ValueError(f"unknown bridge family {family!r}; families: {FAMILIES}")
    t0 = time.perf_counter()
    m = FITTERS[family](new, old, cfg)
    m.meta.update(pairs=int(len(new)), fit_s=round(time.perf_counter() - t0, 4))
    return m


__all__ = ["ENSEMBLE", "FAMILIES", "FITTERS", "MLP_FAMILIES", "FitConfig", "FittedMap", "check_tensors", "ensemble_map",
           "fit_family", "fit_lowrank", "fit_mlp", "fit_mlp_plain", "fit_orthogonal", "fit_ridge"]
