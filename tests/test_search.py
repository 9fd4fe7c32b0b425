"""The Searcher: routes (native, old-model, bridge, fused), merges across spaces, calibration,
pinned routes, filters, and the explicit-query-model mode of ``nobackfill search``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _collection_helpers import NEW_REF, OLD_REF, HashEncoder, make_folder, pool_with, related_pair, \
    write_procrustes_upgrade
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items, text_item
from nobackfill.gallery.types import SpaceMismatchError
from nobackfill.search import Hit, Searcher
from nobackfill.lifecycle.calibrate import CalibrationTask, calibrate, text_pair_task
from nobackfill.search.merge import Candidate, ScoreMap, candidates, merge
from nobackfill.lifecycle.plan_changes import pin_route, route_table, upgrade_collection
from nobackfill.catalog.plan import Plan, UpgradeRecord
from nobackfill.search.routes import RoutePlanner, find_bridge


def _noisy_new(old: HashEncoder, noise: float, seed: int = 3) -> tuple[HashEncoder, np.ndarray]:
    """A new model whose texts are a rotation of the old ones plus noise, and the exact inverse
    rotation (a bridge that is good but not perfect, because of the noise)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((old.embed_dim, old.embed_dim)))
    mix = (q + noise * rng.standard_normal(q.shape)).astype(np.float32)
    return HashEncoder(old.embed_dim, f"noisy{noise}", base=old, mix=mix, name="noisy-new"), q.T.astype(np.float32)


def _text_collection(tmp_path, old, texts):
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old",
                          modalities=old.modalities)
    add_items(c, old, [text_item(t, id=f"t{i}") for i, t in enumerate(texts)], progress=False)
    return c


# ----------------------------------------------------------------------------- merges
def test_score_map_is_monotone_and_recovers_a_logistic_curve():
    rng = np.random.default_rng(0)
    s = rng.uniform(-1, 1, 20000)
    y = rng.random(s.size) < 1 / (1 + np.exp(-(6 * s - 1)))
    m = ScoreMap.fit(s, y)
    assert 4.5 < m.a < 7.5 and -1.6 < m.b < -0.4
    grid = np.linspace(-1, 1, 50)
    assert np.all(np.diff(m(grid)) >= 0)
    flat = ScoreMap.fit(s, rng.random(s.size) < 0.3)  # no signal: a flat map, never decreasing
    assert flat.a >= 0 and flat.a < 0.5


def test_the_three_merges_order_as_documented():
    lists = {"A": [Candidate("a1", 0.9, "A", "native", 0), Candidate("a2", 0.8, "A", "native", 1)],
             "B": [Candidate("b1", 0.5, "B", "bridge", 0), Candidate("b2", 0.4, "B", "bridge", 1)]}
    assert [c.item_id for c in merge(lists, 4, "raw")] == ["a1", "a2", "b1", "b2"]
    maps = {("A", "native"): ScoreMap(1.0, -0.9), ("B", "bridge"): ScoreMap(10.0, -3.0)}  # B's 0.5 -> p .88
    assert [c.item_id for c in merge(lists, 2, "calibrated", score_maps=maps)] == ["b1", "b2"]
    # A holds 10% of the items: its rank 0 counts as global rank 5, B's rank 0 as 0.56
    got = [c.item_id for c in merge(lists, 4, "rank", shares={"A": 0.1, "B": 0.9})]
    assert got == ["b1", "b2", "a1", "a2"]
    with pytest.raises(ValueError, match="merge must be one of"):
        merge(lists, 1, "average")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.9, 0.5, 0.5, 0.1, -0.2]), max_size=6), min_size=1, max_size=3),
       st.integers(1, 12))
def test_raw_merge_is_a_stable_sort_by_descending_score(score_lists, k):
    """Candidates made in C (``candidates``) equal those made one by one (with their metadata when
    given), and the raw merge keeps equal scores in list order, as the sort on the negated score
    did."""
    lists = {}
    for i, scores in enumerate(score_lists):
        ids = [f"s{i}-{r}" for r in range(len(scores))]
        made = candidates(f"s{i}", "native", scores, ids)
        assert made == [Candidate(x, sc, f"s{i}", "native", r) for r, (x, sc) in enumerate(zip(ids, scores))]
        assert all(type(c) is Candidate for c in made)
        metas = [f'{{"r": {r}}}' for r in range(len(scores))]
        assert candidates(f"s{i}", "native", scores, ids, metas) == [c._replace(metadata=m) for c, m in zip(made, metas)]
        lists[f"s{i}"] = made
    flat = [c for hits in lists.values() for c in hits]
    assert merge(lists, k, "raw") == sorted(flat, key=lambda c: -c.score)[:k]


def test_a_hit_is_a_named_tuple_whose_metadata_is_parsed_once():
    h = Hit(1, 0.5, "a", "S", "native", '{"x": [1, 2]}')
    assert (h.rank, h.score, h.id, h.space, h.route) == (1, 0.5, "a", "S", "native")
    assert h.metadata == {"x": [1, 2]} and h.metadata is h.metadata  # parsed at the first read only
    assert h == Hit(1, 0.5, "a", "S", "native", {"x": [1, 2]})  # JSON or dict: the same hit
    assert h != Hit(1, 0.5, "a", "S", "native", {"x": [1]}) and h != Hit(2, 0.5, "a", "S", "native", {"x": [1, 2]})
    assert Hit(1, 0.5, "a", "S", "native").metadata == {}
    assert h.to_json() == {"rank": 1, "score": 0.5, "id": "a", "space": "S", "route": "native", "x": [1, 2],
                           "metadata": {"x": [1, 2]}}
    odd = Hit(1, 0.5, "a", "S", "native", {"rank": 9, "id": "mine", "metadata": 3, "y": 1})
    assert odd.to_json() == {"rank": 1, "score": 0.5, "id": "a", "space": "S", "route": "native", "y": 1,
                             "metadata": {"rank": 9, "id": "mine", "metadata": 3, "y": 1}}
    assert repr(h) == "Hit(rank=1, score=0.5, id='a', space='S', route='native', metadata={'x': [1, 2]})"
    with pytest.raises(TypeError):
        hash(h)
    import copy
    import pickle

    for again in (copy.copy(h), copy.deepcopy(h), pickle.loads(pickle.dumps(h))):
        assert type(again) is Hit and again == h and again.metadata == {"x": [1, 2]}


# ----------------------------------------------------------------------------- routes
def test_find_bridge_prefers_the_shortest_chain():
    ups = [UpgradeRecord(path="u1", kind="procrustes", source="B", target="A"),
           UpgradeRecord(path="u2", kind="procrustes", source="C", target="B"),
           UpgradeRecord(path="x", kind="xbt", source="C", target="A", encoder=True)]
    assert find_bridge(ups, "C", "A").describe() == ["x"]
    assert find_bridge(ups, "C", "B").describe() == ["u2"]
    assert find_bridge(ups, "A", "C") is None
    assert find_bridge(ups[:2], "C", "A").describe() == ["u2", "u1"]


def test_fused_route_score_is_the_weighted_sum_of_old_model_and_bridge_scores(tmp_path):
    old = HashEncoder(12, "old", name="old")
    new, w = _noisy_new(old, 0.3)
    texts = [f"text number {i}" for i in range(30)]
    c = _text_collection(tmp_path, old, texts)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    upgrade_collection(c, NEW_REF, bridges=[up], pool=pool)
    g = old.encode_texts(texts)
    q = "text number 7"
    s_old = g @ old.encode_texts([q])[0]
    b = new.encode_texts([q]) @ w
    s_br = g @ (b / np.linalg.norm(b))[0]
    for weight in (0.0, 0.3, 1.0):
        pin_route(c, old.space_id, "t2t", "fused", weight)
        hits = Searcher(c, pool=pool).search(text=q, k=30, target="text").hits
        got = {h.id: h.score for h in hits}
        want = {f"t{i}": (1 - weight) * s_old[i] + weight * s_br[i] for i in range(30)}
        assert all(h.route == "fused" for h in hits)
        assert max(abs(got[i] - want[i]) for i in want) < 1e-5
    pin_route(c, old.space_id, "t2t", "old-model")
    assert {h.route for h in Searcher(c, pool=pool).search(text=q, k=3, target="text").hits} == {"old-model"}
    with pytest.raises(ValueError, match="must lie in"):
        pin_route(c, old.space_id, "t2t", "fused", 1.5)
    with pytest.raises(ValueError, match="w is the fused route's weight; route 'old-model' takes none"):
        pin_route(c, old.space_id, "t2t", "old-model", 0.3)  # (it was ignored)
    pin_route(c, old.space_id, "t2t", "fused")  # no weight: the calibrated one, else 0.5
    assert c.plan.route(old.space_id, "t2t").w == 0.5
    with pytest.raises(ValueError, match="searched natively"):
        pin_route(c, new.space_id, "t2t", "bridge")


def test_text_only_old_model_has_no_route_for_image_queries(tmp_path):
    old = HashEncoder(12, "txt-old", modalities=("text",), name="txt-old")
    c = _text_collection(tmp_path, old, ["a", "b"])
    planner = RoutePlanner(c.plan, pool_with((OLD_REF, old)))
    assert planner.available(old.space_id, "t2t") == ["native"]
    assert planner.available(old.space_id, "i2t") == []


# ----------------------------------------------------------------------------- calibration
def test_calibration_measures_every_route_and_chooses_the_best_on_its_own_split(tmp_path):
    old = HashEncoder(12, "old", name="old")
    new, w = _noisy_new(old, 0.45)
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    texts = [f"gallery caption {i}" for i in range(60)]
    c = _text_collection(tmp_path, old, texts)
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    cal_q = [f"calib caption {i}" for i in range(80)]
    task = text_pair_task(cal_q, cal_q)  # each query's own text is its match: old-model gets R@1 = 1
    plan = upgrade_collection(c, NEW_REF, bridges=[up], calibration=[task], calibration_label="toy", pool=pool)
    entry = plan.route(old.space_id, "t2t")
    cal = entry.calibration
    assert set(cal) >= {"old-model", "bridge", "fused", "curve"} and len(cal["curve"]) == 11
    assert cal["old-model"]["R@1"] == 1.0 and cal["bridge"]["R@1"] < 1.0
    assert entry.route == "old-model"  # w = 0 wins: named old-model
    assert plan.merge_method in ("raw", "calibrated", "rank")
    assert plan.merge.score_maps["t2t"]
    table = route_table(plan)[old.space_id]["t2t"]
    assert table["calibrated"] and not table["pinned"]


def test_calibration_fused_weight_is_the_argmax_of_its_curve():
    old = HashEncoder(12, "old", name="old")
    new, w = _noisy_new(old, 0.2)
    texts = [f"caption {i}" for i in range(50)]
    noisy_q = [t + " (paraphrased)" for t in texts]
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        up = write_procrustes_upgrade(Path(d) / "up", w, new, old)
        plan = Plan.from_json({"current": new.space_id, "spaces": [
            {"space_id": old.space_id, "model": OLD_REF, "dim": 12, "modalities": ["text"], "dir": "x"},
            {"space_id": new.space_id, "model": NEW_REF, "dim": 12, "modalities": ["text"], "dir": "y"}],
            "upgrades": [{"path": str(up), "source": new.space_id, "target": old.space_id, "encoder": False}],
            "routes": {}})
        res = calibrate(RoutePlanner(plan, pool_with((OLD_REF, old), (NEW_REF, new))),
                        [CalibrationTask("t2t", noisy_q, texts, np.arange(50), np.arange(50))])
    cal = res["routes"][old.space_id]["t2t"]["calibration"]
    best = max(cal["curve"], key=lambda r: (r["R@1"], r["R@5"], r["R@10"]))
    assert cal["fused"]["w"] == best["w"] and cal["fused"]["R@1"] == best["R@1"]


# ----------------------------------------------------------------------------- search options
def test_metadata_filter_and_k_limits(tmp_path):
    old, _, _ = related_pair()
    data = make_folder(tmp_path / "d", n_images=6, captions_per_image=1)
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF)
    add_items(c, old, folder_items(data).items, progress=False)
    s = Searcher(c, pool=pool_with((OLD_REF, old)))
    hits = s.search(text="anything", k=10, filter={"labels.n": [1, 4]}).hits
    assert sorted(h.metadata["labels"]["n"] for h in hits) == [1, 4]
    assert s.search(text="anything", k=10, filter={"labels.n": 99}).hits == []
    nested = s.search(text="anything", k=10, filter={"labels": {"n": [1, 4]}}).hits  # = dotted keys
    assert [h.id for h in nested] == [h.id for h in hits]
    assert s.search(text="anything", k=10, filter={"labels.n": 2 ** 70}).hits == []  # compared as a float
    assert s.search(text="anything", k=10, filter={"labels.n": float("-inf")}).hits == []  # (JSON's -1e999)
    assert len(s.search(text="anything", k=10, filter={"labels.n": [1, float("inf")]}).hits) == 1
    for bad, words in (({"labels.n": [[1]]}, "labels.n"), ({f"k{i}": 1 for i in range(65)}, "64 keys"),
                       ({"labels.n": list(range(257))}, "256 values"), ({1: 1}, "keys are strings"), (["a"], "object"),
                       ({"": 1}, "an empty key"), ({"labels": {"": 1}}, "an empty key in labels")):
        with pytest.raises(ValueError, match=words):
            s.search(text="anything", k=10, filter=bad)
    with pytest.raises(ValueError, match="k must be between"):
        s.search(text="x", k=0)
    with pytest.raises(ValueError, match="empty"):
        s.search(text="   ")
    img = next(p for p in (data / "images").iterdir())
    assert s.search(image=img, k=3).modality == "text"


def test_explicit_query_model_needs_a_bridge_to_another_space(tmp_path):
    old, new, w = related_pair()
    c = _text_collection(tmp_path, old, ["alpha", "beta", "gamma"])
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    with pytest.raises(SpaceMismatchError, match="pass a bridge"):
        Searcher(c, pool=pool, query_model=new).search(text="beta", k=1, target="text")
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    hit = Searcher(c, pool=pool, query_model=new, bridges=[up]).search(text="beta", k=1, target="text").hits[0]
    assert (hit.id, hit.route) == ("t1", "bridge")
    hit = Searcher(c, pool=pool, query_model=old).search(text="gamma", k=1, target="text").hits[0]
    assert (hit.id, hit.route) == ("t2", "native")
