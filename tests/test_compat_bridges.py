"""Training-free bridges (Procrustes, SLERP, phi), the bridge registry (refusal, composition),
and bridges as upgrade directories through the gallery."""

from __future__ import annotations

import numpy as np
import pytest

from nobackfill.compat.bridges import (BridgeRegistry, ComposedBridge, IdentityBridge, NoBridgeError, PhiBridge,
                                       ProcrustesBridge, SlerpBridge, procrustes, slerp)
from nobackfill.compat.phi import Projection
from nobackfill.compat.upgrade import load_upgrade, save_vector_upgrade
from nobackfill.search.searcher import query_side_for
from nobackfill.encoders.base import l2_normalise
from nobackfill.gallery.gallery import Gallery
from nobackfill.gallery.types import SpaceMismatchError


def _orthogonal(d: int, seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def test_procrustes_recovers_a_random_orthogonal_map():
    q = _orthogonal(16, 0)
    x = np.random.default_rng(1).normal(size=(200, 16))
    w = procrustes(x, x @ q)
    assert np.allclose(w, q, atol=1e-4)
    assert np.allclose(w.T @ w, np.eye(16), atol=1e-4)


def test_procrustes_semi_orthogonal_new_to_smaller_old():
    w0 = _orthogonal(24, 2)[:, :8]  # 24 -> 8 with orthonormal columns
    # whitened inputs (x^T x = c I): then the SVD solution is the exact least-squares one
    x = np.linalg.qr(np.random.default_rng(3).normal(size=(300, 24)))[0] * 10
    w = procrustes(x, x @ w0)
    assert w.shape == (24, 8)
    assert np.allclose(w, w0, atol=1e-4)
    b = ProcrustesBridge(w, "new", "old")
    out = b(x[:5].astype(np.float32))
    assert np.allclose(out, l2_normalise((x[:5] @ w0).astype(np.float32)), atol=1e-4)


def test_slerp_endpoints_and_midpoint():
    rng = np.random.default_rng(4)
    a, b = l2_normalise(rng.normal(size=(6, 8)).astype(np.float32)), l2_normalise(rng.normal(size=(6, 8)).astype(np.float32))
    assert np.allclose(slerp(a, b, 0.0), a, atol=1e-6)
    assert np.allclose(slerp(a, b, 1.0), b, atol=1e-6)
    m = slerp(a, b, 0.5)
    assert np.allclose(np.linalg.norm(m, axis=1), 1, atol=1e-6)
    assert np.allclose((m * a).sum(1), (m * b).sum(1), atol=1e-5)  # equal angles to both ends
    assert np.allclose(slerp(a, a, 0.3), a, atol=1e-6)  # parallel rows: no division by zero


def test_slerp_bridge_blends_old_query_and_aligned_new_query():
    pro = ProcrustesBridge(_orthogonal(8, 5)[:, :4], "new", "old")
    s = SlerpBridge(pro, t=0.0)
    assert s.source == "pair(new,old)" and s.target == "old"
    rng = np.random.default_rng(6)
    qn, qo = rng.normal(size=(3, 8)).astype(np.float32), l2_normalise(rng.normal(size=(3, 4)).astype(np.float32))
    assert np.allclose(s.blend(qn, qo), qo, atol=1e-6)
    assert np.allclose(SlerpBridge(pro, 1.0).blend(qn, qo), pro(qn), atol=1e-6)
    with pytest.raises(ValueError):
        SlerpBridge(pro, 1.5)


class _Scale:
    def __init__(self, source, target, k):
        self.source, self.target, self.k = source, target, k

    def __call__(self, q):
        return np.asarray(q) * self.k


def test_registry_refuses_without_a_chain_and_composes_along_one():
    reg = BridgeRegistry.from_bridges([_Scale("C", "B", 2.0), _Scale("B", "A", 3.0), _Scale("D", "C", 5.0)])
    with pytest.raises(NoBridgeError) as e:
        reg.resolve("A", "C")  # bridges are directed: no way back
    assert isinstance(e.value, SpaceMismatchError) and "A" in str(e.value) and "C" in str(e.value)
    with pytest.raises(NoBridgeError):
        reg.resolve("X", "A")
    chain = reg.resolve("D", "A")
    assert isinstance(chain, ComposedBridge) and (chain.source, chain.target) == ("D", "A")
    assert [b.k for b in chain.bridges] == [5.0, 2.0, 3.0]
    assert np.allclose(chain(np.ones((1, 2))), 30.0)
    assert isinstance(reg.resolve("B", "B"), IdentityBridge)
    assert reg.resolve("B", "A").k == 3.0  # a single bridge is returned as is
    with pytest.raises(ValueError):
        ComposedBridge([_Scale("C", "B", 1), _Scale("C", "A", 1)])  # not contiguous


def test_registry_prefers_the_shortest_chain_and_checks_dims():
    reg = BridgeRegistry.from_bridges([_Scale("N", "M", 2.0), _Scale("M", "O", 2.0), _Scale("N", "O", 7.0)])
    assert reg.resolve("N", "O").k == 7.0
    reg.add_space("S", dim=4)
    with pytest.raises(ValueError):
        reg.add_space("S", dim=8)


def test_gallery_accepts_bridged_queries_only(tmp_path):
    rng = np.random.default_rng(7)
    g = Gallery.create(tmp_path / "g", space_id="old", dim=4, model="m")
    g.add("image", [f"i{k}" for k in range(5)], l2_normalise(rng.normal(size=(5, 4)).astype(np.float32)),
          space_id="old")
    q = rng.normal(size=(2, 8)).astype(np.float32)
    with pytest.raises(SpaceMismatchError):
        g.search("image", q, k=2, space_id="newer")
    reg = BridgeRegistry.from_bridges([ProcrustesBridge(_orthogonal(8, 8), "newer", "new"),
                                       ProcrustesBridge(_orthogonal(8, 9)[:, :4], "new", "old")])
    bridge = reg.resolve("newer", "old")
    res = g.search("image", bridge(q), k=2, space_id=bridge.target)
    assert len(res.ids[0]) == 2


def test_vector_upgrades_round_trip_and_chain(tmp_path):
    phi = Projection(8, 4)
    save_vector_upgrade(tmp_path / "phi", PhiBridge(phi, "new", "old"), {"space_id": "new"}, {"space_id": "old"})
    w = _orthogonal(12, 10)[:, :8]
    save_vector_upgrade(tmp_path / "pro", ProcrustesBridge(w, "newer", "new"), {"space_id": "newer"},
                        {"space_id": "new"})
    up_phi, up_pro = load_upgrade(tmp_path / "phi"), load_upgrade(tmp_path / "pro")
    assert up_phi.kind == "phi" and up_pro.kind == "procrustes" and up_phi.is_bridge
    x = np.random.default_rng(11).normal(size=(3, 12)).astype(np.float32)
    expect = phi.project(ProcrustesBridge(w, "newer", "new")(x))

    class _Enc:
        space_id, embed_dim, name = "newer", 12, "newer"

    side = query_side_for(_Enc(), "old", bridges=[tmp_path / "phi", tmp_path / "pro"])
    assert side.route == "bridge" and side.path.vector_upgrades and side.bridge.target == "old"
    assert np.allclose(side.bridge(x), expect, atol=1e-6)
    with pytest.raises(SpaceMismatchError):
        query_side_for(_Enc(), "old", bridges=[tmp_path / "phi"])
