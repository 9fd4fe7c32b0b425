"""What ``eval retrieval`` and ``eval compat`` print: every note the JSON carries is shown under the
table; a row's label says what was compared (query model, bridges, RECO, re-ranking, gallery model),
the same in the table and the JSON; the table has median rank and mAP; a wrong bridge's error names
the spaces right (what the bridge maps from and to, the query model's, the gallery's). On the shipped
world models and a small slice of the world's test split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

ROOT = Path(__file__).resolve().parents[1]
MODELS, UPGRADE = ROOT / "models", ROOT / "upgrades" / "world-old-to-new"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _space(model: str) -> str:
    return json.loads((MODELS / model / "nobackfill.json").read_text())["space_id"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The first 40 English captions of data/world/test (20 images), its images linked."""
    src = ROOT / "data" / "world" / "test"
    root = tmp_path_factory.mktemp("eval_out") / "small"
    root.mkdir()
    lines = [x for x in (src / "captions.jsonl").read_text().splitlines() if '"lang": "en"' in x][:40]
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n")
    (root / "images").symlink_to(src / "images")
    return root


def _table(output: str) -> tuple[list[str], dict[tuple[str, str], list[str]], list[str]]:
    """(header cells, {(label, direction): metric cells}, note lines) of a printed table."""
    lines = output.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("row "))
    header = lines[start].split()
    rows, notes = {}, []
    for line in lines[start + 2:]:
        if line.startswith("note: "):
            notes.append(line)
        elif line.strip() and not notes:
            label, d, *cells = line.rsplit(None, 6)
            rows[(label, d)] = cells
        else:
            break
    return header, rows, notes


def test_raw_comparison_shows_its_note_and_every_metric(data, tmp_path):
    out = tmp_path / "e.json"
    r = invoke("eval", "retrieval", "--query-model", MODELS / "world-new", "--gallery-model", MODELS / "world-old",
               "--data", data, "--out", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    header, rows, notes = _table(r.stdout)
    assert header == ["row", "dir", "R@1", "R@5", "R@10", "median", "rank", "mAP"]
    assert res["label"] == "world-new/world-old" and set(rows) == {("world-new/world-old", "t2i"),
                                                                    ("world-new/world-old", "i2t")}
    for d in ("t2i", "i2t"):
        r1, r5, r10, med, ap = rows[("world-new/world-old", d)]
        assert float(r1) == pytest.approx(100 * res[d]["R@1"], abs=0.05)
        assert float(med) == pytest.approx(res[d]["median_rank"]) and float(ap) == pytest.approx(100 * res[d]["mAP"], abs=0.05)
    # the JSON's note, whole, under the table: the widths (128 vs 64) and the missing bridge between the spaces
    assert notes == [f"note: world-new/world-old: {res['note']}"]
    assert "different widths (128 vs 64)" in res["note"] and "no bridge" in res["note"]
    assert _space("world-new") in res["note"] and _space("world-old") in res["note"]


def test_same_model_has_no_note(data, tmp_path):
    out = tmp_path / "e.json"
    r = invoke("eval", "retrieval", "--query-model", MODELS / "world-old", "--gallery-model", MODELS / "world-old",
               "--data", data, "--out", out)
    assert r.exit_code == 0, r.output
    assert "note" not in json.loads(out.read_text()) and "note" not in r.stdout
    assert set(_table(r.stdout)[1]) == {("world-old/world-old", "t2i"), ("world-old/world-old", "i2t")}


def test_bridged_row_is_labelled_with_its_bridge(data, tmp_path):
    out = tmp_path / "e.json"
    r = invoke("eval", "retrieval", "--query-model", MODELS / "world-new", "--gallery-model", MODELS / "world-old",
               "--data", data, "--bridge", UPGRADE, "--out", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    label = "world-new+bridge(world-old-to-new)/world-old"
    assert res["label"] == label and set(_table(r.stdout)[1]) == {(label, "t2i"), (label, "i2t")}
    assert "note" not in res and "note" not in r.stdout  # same width and space after the bridge


def test_query_label_names_bridges_and_reco():
    from nobackfill.cli.evaluate import query_label

    assert query_label(Path("models/world-old")) == "world-old"
    assert query_label(Path("models/world-old/"), reco=Path("runs/reco/model")) == "world-old+reco(model)"
    assert query_label(Path("m/new"), [Path("up/a"), Path("up/b/")]) == "new+bridge(a)+bridge(b)"


@pytest.mark.parametrize("query, gallery, what", [
    ("world-newer", "world-old", "upgrade"),  # the upgrade was trained for world-new, not world-newer
    ("world-new", "world-newer", "gallery"),  # the upgrade lands in world-old's space, not the gallery's
])
def test_wrong_bridge_names_the_spaces_right(data, query, gallery, what):
    r = invoke("eval", "retrieval", "--query-model", MODELS / query, "--gallery-model", MODELS / gallery,
               "--data", data, "--bridge", UPGRADE)
    assert r.exit_code == 2
    msg = " ".join(r.output.split())
    new, old, q, g = _space("world-new"), _space("world-old"), _space(query), _space(gallery)
    assert f"maps {new} (world-new) to {old} (world-old)" in msg, msg  # what the bridge maps from and to
    assert f"query model's embeddings are in space {q} ({query})" in msg, msg
    if what == "upgrade":
        assert f"upgrade's source (its new model) is in embedding space {new} (world-new)" in msg, msg
        assert f"the gallery is in space {g} ({gallery})" in msg, msg
        assert f"gallery is in embedding space {new}" not in msg  # the old message's mistake
    else:
        assert f"the gallery is in embedding space {g} ({gallery})" in msg, msg


def test_rerank_rows_say_what_was_reranked(data, tmp_path):
    out = tmp_path / "r.json"
    r = invoke("eval", "retrieval", "--query-model", MODELS / "world-old", "--gallery-model", MODELS / "world-old",
               "--data", data, "--rerank", "cmli", "--rerank-k", 5, "--out", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["labels"] == {"global": "world-old/world-old",
                             "reranked": "world-old/world-old+rerank(cmli, top 5, weight 1)"}
    rows = _table(r.stdout)[1]
    assert {label for label, _ in rows} == set(res["labels"].values())
    assert all(cell != "-" for cells in rows.values() for cell in cells)


def test_compat_shows_models_and_the_raw_rows_note(data, tmp_path):
    out = tmp_path / "c.json"
    r = invoke("eval", "compat", "--old", MODELS / "world-old", "--new", MODELS / "world-new", "--bridge", UPGRADE,
               "--data", data, "--n-unpaired", 50, "--out", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert r.stdout.splitlines()[0] == (f"old: world-old ({_space('world-old')}), new: world-new ({_space('world-new')}), "
                                        "upgraded new: world-new+bridge(world-old-to-new)")
    header, rows, notes = _table(r.stdout)
    assert {label for label, _ in rows} == {"old/old", "new/new (upgrade off)", "raw new/old", "upgraded new/old"}
    assert "mAP" in header and "median" in header
    noted = {k: v["note"] for k, v in res["rows"].items() if v.get("note")}
    assert set(noted) == {"new_old_raw"} and notes == [f"note: raw new/old: {noted['new_old_raw']}"]


def test_compat_wrong_upgrade_is_refused_naming_the_spaces(data):
    r = invoke("eval", "compat", "--old", MODELS / "world-old", "--new", MODELS / "world-newer", "--bridge", UPGRADE,
               "--data", data)
    assert r.exit_code == 2
    msg = " ".join(r.output.split())
    assert f"maps {_space('world-new')} (world-new) to {_space('world-old')} (world-old)" in msg, msg
    assert f"the gallery is in space {_space('world-old')} (world-old)" in msg, msg
