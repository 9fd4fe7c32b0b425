"""What an upgrade that fits bridges is given. Example query texts: a collection of images alone has
no captions to hold out, so its text-query bridges are scored on query texts the upgrade was given
(no labels); without them the text-query routes stay as they were and status says why. The first
sample's size (``fit_sample``). Both refused before anything changes, through every interface."""

from __future__ import annotations

import json

import pytest

from _collection_helpers import NEW_REF, OLD_REF, make_folder, pool_with, related_pair
from nobackfill.collection.collection import Collection
from nobackfill.collection.ingest import add_items, folder_items
from nobackfill.compat.fitted import FitConfig
from nobackfill.lifecycle import backfill_fit
from nobackfill.lifecycle.backfill import run_backfill
from nobackfill.lifecycle.fit_bridges import NO_QUERIES, FitBridgesConfig, few_queries, fit_collection_bridges
from nobackfill.lifecycle.plan_changes import upgrade_collection

FIT = {"families": ("orthogonal", "ridge"), "epochs": 5, "max_steps": 50}
QUERIES = [f"a photo of thing {i}" for i in range(60)]


def _images_only(tmp_path, n: int = 150, monkeypatch=None):
    old, new, w = related_pair()
    pool = pool_with((OLD_REF, old), (NEW_REF, new))
    if monkeypatch is not None:  # the backfill's fits load the models through a ModelPool of their own
        from nobackfill.lifecycle import fit_bridges

        monkeypatch.setattr(fit_bridges, "ModelPool", lambda: pool)
    data = make_folder(tmp_path / "data", n_images=0, extra_images=n)
    (data / "captions.jsonl").unlink()  # a folder of images alone
    c = Collection.create(tmp_path / "c", space_id=old.space_id, dim=old.embed_dim, model=OLD_REF, name="old")
    add_items(c, old, folder_items(data).items, progress=False)
    assert c.count("image") == n and c.count("text") == 0
    return c, old, new, w, pool


def _fitted_directions(c) -> set[str]:
    return {d for u in c.plan.upgrades if u.kind == "fitted" for d in u.directions}


def test_images_alone_without_queries_fit_no_text_query_bridge_and_say_why(tmp_path):
    c, old, new, _, pool = _images_only(tmp_path)
    upgrade_collection(c, NEW_REF, pool=pool, fit_sample={"fraction": 0.5, "min_pairs": 60, "max_pairs": 100,
                                                          "fit": FIT})
    run_backfill(c, new, order="sequential", batch_size=32)
    st = backfill_fit.fit_state(c)
    assert st["fits"] and "queries" not in st
    assert st["fits"][-1]["skipped"] == {f"{old.space_id}/t2i": NO_QUERIES}
    assert _fitted_directions(c) == {"i2i"}  # images queried by images: the held-out images are the queries


def test_images_alone_with_queries_fit_a_t2i_bridge_scored_on_them(tmp_path, monkeypatch):
    c, old, new, _, pool = _images_only(tmp_path, monkeypatch=monkeypatch)
    upgrade_collection(c, NEW_REF, pool=pool, queries=QUERIES + ["  ", QUERIES[0]],
                       fit_sample={"fraction": 0.5, "min_pairs": 60, "max_pairs": 100, "fit": FIT})
    assert backfill_fit.fit_state(c)["queries"] == QUERIES  # blank and repeated texts dropped
    run_backfill(c, new, order="sequential", batch_size=32)
    assert "t2i" in _fitted_directions(c)
    assert not backfill_fit.fit_state(c)["fits"][-1].get("skipped")
    rep = fit_collection_bridges(c, cfg=FitBridgesConfig(fit=FitConfig(**FIT), queries=tuple(QUERIES)), pool=pool)
    e = rep[old.space_id]["t2i"]
    # the new space is a linear map of the old one: a fitted map reproduces the new model's ranking
    # (scored on the given texts: there is no caption), and ties with the one serving, which stays
    assert e["heldout"]["r1"] > 0.9 and e["chosen"] == "serving" and not e["swapped"]


def test_images_alone_with_too_few_queries_say_so(tmp_path, monkeypatch):
    """trial V: 3 example texts fitted no t2i bridge, and nothing said why."""
    c, old, new, _, pool = _images_only(tmp_path, monkeypatch=monkeypatch)
    upgrade_collection(c, NEW_REF, pool=pool, queries=QUERIES[:3],
                       fit_sample={"fraction": 0.5, "min_pairs": 60, "max_pairs": 100, "fit": FIT})
    run_backfill(c, new, order="sequential", batch_size=32)
    assert "t2i" not in _fitted_directions(c)
    said = backfill_fit.fit_state(c)["fits"][-1]["skipped"][f"{old.space_id}/t2i"]
    assert said == few_queries(3) and "too few of the 3 query texts given" in said


def test_given_queries_join_the_held_out_captions(tmp_path):
    from test_fit_bridges import _backfilled

    c, old, new, pool = _backfilled(tmp_path, n_images=60)
    cfg = FitBridgesConfig(fit=FitConfig(**FIT))
    alone = fit_collection_bridges(c, cfg=cfg, pool=pool)[old.space_id]["t2i"]
    cfg.queries = tuple(f"a photo of thing {i}" for i in range(400))  # about a fifth match a held-out image
    both = fit_collection_bridges(c, cfg=cfg, pool=pool)[old.space_id]["t2i"]
    assert alone["scored"]["gallery"] == both["scored"]["gallery"]
    assert both["scored"]["queries"] > alone["scored"]["queries"] >= 8  # the given texts scored too


def test_refused_queries_change_nothing(tmp_path):
    from _collection_helpers import write_procrustes_upgrade

    c, old, new, w, pool = _images_only(tmp_path, n=20)
    before = c.plan
    with pytest.raises(backfill_fit.QueriesError, match=r"queries\[1\]"):
        upgrade_collection(c, NEW_REF, pool=pool, queries=["fine", 3])
    with pytest.raises(backfill_fit.QueriesError, match=r"queries\[0\]: 301 characters"):
        upgrade_collection(c, NEW_REF, pool=pool, queries=["x" * 301])
    with pytest.raises(backfill_fit.QueriesError, match="at most 2000"):
        upgrade_collection(c, NEW_REF, pool=pool, queries=[f"q{i}" for i in range(2001)])
    with pytest.raises(backfill_fit.QueriesError, match="a list of texts"):
        upgrade_collection(c, NEW_REF, pool=pool, queries="one string")
    up = write_procrustes_upgrade(tmp_path / "up", w, new, old)
    with pytest.raises(backfill_fit.QueriesError, match="fits none .a bridge was given"):
        upgrade_collection(c, NEW_REF, bridges=[up], pool=pool, queries=["a red circle"])
    with pytest.raises(backfill_fit.QueriesError, match="fits none .fit_bridges is off"):
        upgrade_collection(c, NEW_REF, pool=pool, fit_bridges=False, queries=["a red circle"])
    c2 = Collection.open(c.path)
    assert c2.plan.current == before.current and c2.plan.space_ids == before.space_ids
    assert backfill_fit.fit_state(c2, new.space_id) is None


def test_cli_upgrade_reads_queries_and_status_says_why_without(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app

    c, old, new, _, pool = _images_only(tmp_path, n=40)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    cli = lambda *a: CliRunner().invoke(app, [str(x) for x in a])  # noqa: E731
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"text": q}) + "\n" for q in QUERIES[:5]))
    r = cli("collection", "upgrade", c.path, "--model", NEW_REF, "--queries", tmp_path / "q.jsonl")
    assert r.exit_code == 0, r.output
    assert backfill_fit.fit_state(Collection.open(c.path))["queries"] == QUERIES[:5]
    (tmp_path / "bad.jsonl").write_text('{"txt": "x"}\n')
    c2, *_ = _images_only(tmp_path / "second", n=150)
    r = cli("collection", "upgrade", c2.path, "--model", NEW_REF, "--queries", tmp_path / "bad.jsonl")
    assert r.exit_code == 2 and "bad.jsonl" in r.output and "line 1" in r.output
    assert Collection.open(c2.path).plan.current == old.space_id  # refused before anything changed
    r = cli("collection", "upgrade", c2.path, "--model", NEW_REF, "--fit-sample", "0.5,16")
    assert r.exit_code == 0, r.output
    run_backfill(Collection.open(c2.path), new, order="sequential", batch_size=32, limit=100)  # 50 left old
    r = cli("collection", "status", c2.path)
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "no fitted bridge for t2i" in out and "--queries FILE" in out, out
    run_backfill(Collection.open(c2.path), new, order="sequential", batch_size=32)  # the rest: the old space is empty
    out = " ".join(cli("collection", "status", c2.path).output.split())
    assert "no fitted bridge for t2i" not in out, out  # (trial AI D2: advice for a space that serves nothing)


def test_http_upgrade_takes_queries_and_names_the_field_when_refused(tmp_path):
    pytest.importorskip("fastapi")
    from _collection_helpers import ADMIN, served_old_collection

    data = make_folder(tmp_path / "data", n_images=0, extra_images=10)
    (data / "captions.jsonl").unlink()
    api, c, old, new = served_old_collection(tmp_path, data)
    auth = {"Authorization": "Bearer " + ADMIN}
    r = api.post("/v1/upgrade", json={"model": "new", "queries": ["x" * 301]}, headers=auth)
    assert r.status_code == 422 and "queries" in r.text
    r = api.post("/v1/upgrade", json={"model": "new", "queries": ["a"] + [f"q{i}" for i in range(2000)]},
                 headers=auth)
    assert r.status_code == 422 and "queries" in r.text
    r = api.post("/v1/upgrade", json={"model": "new", "fit_bridges": False, "queries": ["a red circle"]},
                 headers=auth)
    assert r.status_code == 422 and r.json().get("field") == "queries", r.text
    assert Collection.open(c.path).plan.current == old.space_id
    r = api.post("/v1/upgrade", json={"model": "new", "queries": ["a red circle", "two blue squares"]}, headers=auth)
    assert r.status_code == 200, r.text
    assert backfill_fit.fit_state(Collection.open(c.path))["queries"] == ["a red circle", "two blue squares"]


def test_the_first_sample_is_set_through_the_client_and_a_bad_one_changes_nothing(tmp_path):
    from nobackfill.client import InvalidRequest
    from nobackfill.client.local import LocalClient

    c, old, new, _, pool = _images_only(tmp_path, n=30)
    client = LocalClient(c.path, pool=pool)
    for bad, what in (({"fraction": 0}, "fraction in"), ({"min_pairs": 10, "max_pairs": 5}, "min_pairs <= max_pairs"),
                      ({"fraction": 0.1, "min_pairs": 1.5}, "whole numbers"), ({"fractoin": 0.1}, "unknown settings"),
                      ({"fit": {"families": ("cubic",)}}, "unknown bridge families")):
        with pytest.raises(InvalidRequest, match=what) as e:
            client.upgrade(NEW_REF, fit_sample=bad)
        assert e.value.field == "fit_sample" and e.value.status == 422
    with pytest.raises(InvalidRequest, match="fits no bridge .fit_bridges is off"):
        client.upgrade(NEW_REF, fit_bridges=False, fit_sample={"fraction": 0.5})
    assert Collection.open(c.path).plan.current == old.space_id  # every refusal before anything changed
    client.upgrade(NEW_REF, fit_sample={"fraction": 0.5, "min_pairs": 4, "max_pairs": 10})
    st = backfill_fit.fit_state(Collection.open(c.path))
    assert (st["fraction"], st["min"], st["max"]) == (0.5, 4, 10)


def test_cli_fit_sample_option(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import nobackfill.search.models as models
    from nobackfill.cli import app

    c, old, new, _, pool = _images_only(tmp_path, n=20)
    monkeypatch.setattr(models, "ModelPool", lambda: pool)
    cli = lambda *a: CliRunner().invoke(app, [str(x) for x in a])  # noqa: E731
    r = cli("collection", "upgrade", c.path, "--model", NEW_REF, "--fit-sample", "0.2,3,x")
    assert r.exit_code == 2 and "--fit-sample: FRACTION[,MIN[,MAX]]" in r.output
    assert Collection.open(c.path).plan.current == old.space_id
    r = cli("collection", "upgrade", c.path, "--model", NEW_REF, "--fit-sample", "0.2,3")
    assert r.exit_code == 0, r.output
    st = backfill_fit.fit_state(Collection.open(c.path))
    assert (st["fraction"], st["min"], st["max"]) == (0.2, 3, 20000)


def test_http_fit_sample(tmp_path):
    pytest.importorskip("fastapi")
    from _collection_helpers import ADMIN, served_old_collection

    api, c, old, new = served_old_collection(tmp_path, make_folder(tmp_path / "data", n_images=4))
    auth = {"Authorization": "Bearer " + ADMIN}
    for bad in ({"fraction": 2}, {"min_pairs": 0}, {"fraction": 0.1, "extra": 1}):
        r = api.post("/v1/upgrade", json={"model": "new", "fit_sample": bad}, headers=auth)
        assert r.status_code == 422 and "fit_sample" in r.text, r.text
    r = api.post("/v1/upgrade", json={"model": "new", "fit_sample": {"min_pairs": 9, "max_pairs": 3}}, headers=auth)
    assert r.status_code == 422 and r.json()["field"] == "fit_sample", r.text
    assert Collection.open(c.path).plan.current == old.space_id
    r = api.post("/v1/upgrade", json={"model": "new", "fit_sample": {"fraction": 0.25, "max_pairs": 600}}, headers=auth)
    assert r.status_code == 200, r.text
    st = backfill_fit.fit_state(Collection.open(c.path))
    assert (st["fraction"], st["min"], st["max"]) == (0.25, 512, 600)
