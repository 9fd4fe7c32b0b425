"""``nobackfill collection ...`` end to end with the shipped world models and XBT upgrade: create, add,
upgrade with calibration, search across spaces, status, delete, pin a route, backfill, retire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

from _cli_helpers import world_collection

ROOT = Path(__file__).resolve().parents[1]
MODELS, UPGRADE = ROOT / "models", ROOT / "upgrades" / "world-old-to-new"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def js(*args) -> dict:
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    root = tmp_path_factory.mktemp("coll")
    r = world_collection(root, "photos", MODELS / "world-old", n_train=10, n_val=24, n_test=30, langs="en,de")
    assert "added 90" in r.output
    return root


def test_readd_and_search_before_the_upgrade(coll):
    r = invoke("collection", "add", coll / "photos", "--data", coll / "world", "--split", "test", "--langs", "en")
    assert r.exit_code == 0 and "added 0, already there 90" in r.output
    out = js("collection", "search", coll / "photos", "--text", "a red circle", "--k", 5)
    assert out["modality"] == "image" and len(out["hits"]) == 5
    h = out["hits"][0]
    assert h["rank"] == 1 and h["route"] == "native" and h["space"].startswith("hf-clip-") and Path(h["path"]).is_file()
    img = next((coll / "world" / "test" / "images").iterdir())
    out = js("collection", "search", coll / "photos", "--image", img, "-k", 3)  # -k: --k
    assert out["modality"] == "text" and all("text" in h for h in out["hits"])
    table = runner.invoke(app, ["collection", "search", str(coll / "photos"), "--text", "a red circle", "--k", "2"],
                          terminal_width=80).stdout
    assert table.count("│ world-old │") == 2 and "hf-clip-" not in table  # the space by its name, whole at 80 columns


def test_upgrade_calibrates_routes_and_search_spans_both_spaces(coll):
    r = invoke("collection", "upgrade", coll / "photos", "--model", MODELS / "world-new", "--bridge", UPGRADE,
               "--calibrate", coll / "world", "--calibrate-split", "val")
    assert r.exit_code == 0, r.output
    assert "nothing was re-embedded" in r.output and "(calibrated)" in r.output
    st = js("collection", "status", coll / "photos")
    assert len(st["spaces"]) == 2 and st["calibrated"]
    (old_sid, old), (new_sid, new) = sorted(st["spaces"].items(), key=lambda kv: kv[1]["current"])
    assert new["current"] and new["image"] == 0 and old["image"] == 30 and old["text"] == 60
    assert set(st["routes"][old_sid]) >= {"t2i", "i2t"} and st["routes"][old_sid]["t2i"]["calibrated"]
    assert st["backfill"]["done"] == 0 and st["backfill"]["total"] == 90
    r = invoke("collection", "add", coll / "photos", "--texts", _texts(coll, ["a caption added after the upgrade"]))
    assert r.exit_code == 0, r.output
    out = js("collection", "search", coll / "photos", "--text", "a caption added after the upgrade", "--k", 100,
             "--target", "text")
    assert {h["space"] for h in out["hits"]} == {old_sid, new_sid} and len(out["hits"]) == 61
    assert out["hits"][0]["text"] == "a caption added after the upgrade" and out["hits"][0]["route"] == "native"
    assert len({h["id"] for h in out["hits"]}) == 61
    # hits of two spaces: the table says whose scale a score is on (the merge orders them)
    table = " ".join(runner.invoke(app, ["collection", "search", str(coll / "photos"), "--text", "a caption added after "
                                         "the upgrade", "--k", "100", "--target", "text"], terminal_width=200)
                     .stdout.split())
    assert "score: each hit's own, in its space; the order of hits from 2 spaces is the merge's" in table, table
    one = runner.invoke(app, ["collection", "search", str(coll / "photos"), "--text", "a caption added after the upgrade",
                              "--k", "1", "--target", "text"], terminal_width=200).stdout
    assert "merge's" not in one  # one space's hits: nothing to say


def _texts(root: Path, lines: list[str]) -> Path:
    p = root / "texts.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_delete_pin_and_errors_leave_the_collection_unchanged(coll):
    before = js("collection", "status", coll / "photos")
    r = invoke("collection", "delete", coll / "photos", "--id", "no-such-item")
    assert r.exit_code == 2 and "no item with id 'no-such-item'" in r.output
    r = invoke("collection", "create", coll / "photos", "--model", MODELS / "world-old")
    assert r.exit_code == 2 and "already holds a collection" in r.output
    not_a_model = coll / "empty-dir"
    not_a_model.mkdir(exist_ok=True)  # refused for the location before any model loads (it would fail to)
    r = invoke("collection", "create", coll / "photos", "--model", not_a_model)
    assert r.exit_code == 2 and "already holds a collection" in r.output, r.output
    r = invoke("collection", "search", coll / "photos", "--text", "")
    assert r.exit_code == 2 and "empty" in r.output
    r = invoke("collection", "upgrade", coll / "photos", "--model", MODELS / "world-new")  # a rerun: nothing to do
    assert r.exit_code == 0 and "is its current model already: nothing to do" in " ".join(r.output.split())
    r = invoke("collection", "upgrade", coll / "photos", "--model", MODELS / "world-new", "--bridge",
               UPGRADE, "--fit-bridge")  # options it would not apply: refused, named
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "is its current model already, so --bridge, --fit-bridge changed nothing" in out, out
    assert js("collection", "status", coll / "photos")["generation"] == before["generation"]
    hit = js("collection", "search", coll / "photos", "--text", "a blue square", "--k", 1)["hits"][0]
    r = invoke("collection", "delete", coll / "photos", "--id", hit["id"])
    assert r.exit_code == 0, r.output
    ids = {h["id"] for h in js("collection", "search", coll / "photos", "--text", "a blue square", "--k", 40)["hits"]}
    assert hit["id"] not in ids
    old_sid = next(s for s, v in before["spaces"].items() if not v["current"])
    r = invoke("collection", "route", coll / "photos", "--space", old_sid, "--direction", "t2i", "--route", "old-model")
    assert r.exit_code == 0 and "(pinned)" in r.output
    out = js("collection", "search", coll / "photos", "--text", "a blue square", "--k", 5)
    assert {h["route"] for h in out["hits"]} == {"old-model"}
    invoke("collection", "route", coll / "photos", "--space", old_sid, "--direction", "t2i", "--unpin")


def test_backfill_progress_and_retire(coll):
    st = js("collection", "status", coll / "photos")
    old_sid = next(s for s, v in st["spaces"].items() if not v["current"])
    r = invoke("collection", "backfill", coll / "photos", "--order", "random", "--limit", 20, "--batch-size", 8)
    assert r.exit_code == 0, r.output
    st = js("collection", "status", coll / "photos")
    assert st["backfill"]["done"] == 20 + 1 and st["backfill"]["order"] == "random"  # + the text added after
    r = invoke("collection", "upgrade", coll / "photos", "--model", MODELS / "world-newer", "--bridge", UPGRADE)
    assert r.exit_code == 2 and "let it finish" in r.output
    r = invoke("collection", "retire", coll / "photos", "--space", old_sid)
    assert r.exit_code == 2 and "no vector in the current space" in r.output
    r = invoke("collection", "backfill", coll / "photos")
    assert r.exit_code == 0, r.output
    st = js("collection", "status", coll / "photos")
    assert st["backfill"]["fraction"] == 1.0
    r = invoke("collection", "retire", coll / "photos", "--space", old_sid)
    assert r.exit_code == 0 and "retired; its vectors were dropped" in " ".join(r.output.split()), r.output
    r = invoke("collection", "status", coll / "photos")
    assert r.exit_code == 0 and "retired: its vectors were dropped" in next(line for line in r.output.splitlines()
                                                                         if old_sid in line)
    out = js("collection", "search", coll / "photos", "--text", "a red circle", "--k", 5)
    assert {h["route"] for h in out["hits"]} == {"native"}


def test_create_names_what_the_model_embeds(tmp_path):
    r = invoke("collection", "create", tmp_path / "captions", "--model", MODELS / "m30k-old-text")
    assert r.exit_code == 0 and "embeds text)" in r.output and "image" not in r.output.split("embeds")[1]
    st = js("collection", "status", tmp_path / "captions")
    assert st["spaces"][st["current"]]["modalities"] == ["text"]
    r = invoke("collection", "create", tmp_path / "photos", "--model", MODELS / "world-old")
    assert r.exit_code == 0 and "embeds image, text)" in r.output


def test_backfill_names_an_unreadable_image_and_finishes_the_rest(tmp_path):
    """An image file deleted after it was added: the run commits everything else, exits 0 and says
    which item it could not read; status says it too (the new tester's case: every run had stopped
    at that batch)."""
    r = world_collection(tmp_path, "p", MODELS / "world-old", n_train=4, n_val=4, n_test=6, langs="en")
    assert r.exit_code == 0, r.output
    c = tmp_path / "p"
    r = invoke("collection", "upgrade", c, "--model", MODELS / "world-new", "--bridge", UPGRADE)
    assert r.exit_code == 0, r.output
    item = js("collection", "search", c, "--text", "a red circle", "--k", 1, "--target", "image")["hits"][0]
    path = Path(item["metadata"]["path"])
    path = path if path.is_absolute() else Path.cwd() / path
    path.unlink()
    r = invoke("collection", "backfill", c, "--order", "sequential")
    assert r.exit_code == 0 and "1 item(s) could not be read" in r.output and item["id"] in r.output, r.output
    st = js("collection", "status", c)["backfill"]
    assert st["unreadable"] == 1 and st["done"] == st["total"] - 1 and list(st["unreadable_items"]) == [item["id"]]
    r = invoke("collection", "status", c)
    assert "could not be read" in " ".join(r.output.split())
    # retire names them as unreadable (running the backfill again would not help), and says what to do
    old = next(s for s, v in js("collection", "status", c)["spaces"].items() if not v["current"])
    r = invoke("collection", "retire", c, "--space", old)
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "1 of them the backfill could not read" in out and item["id"] in out, out
    assert "restore their files" in out and "collection delete" in out and "(run `nobackfill" not in out, out


def test_a_folder_with_an_empty_captions_file_and_twin_images_is_added_and_counted(tmp_path):
    """Trial J: an empty captions.jsonl refused the whole folder; two files of the same bytes read as
    two items but added as one, with nothing said (5 read, 4 added, 0 skipped)."""
    from PIL import Image

    data = tmp_path / "photos"
    (data / "images").mkdir(parents=True)
    for name, colour in (("a.png", (200, 30, 30)), ("b.png", (200, 30, 30)), ("c.png", (30, 30, 200))):
        Image.new("RGB", (32, 32), colour).save(data / "images" / name)
    (data / "captions.jsonl").write_text("")
    r = invoke("collection", "create", tmp_path / "c", "--model", MODELS / "world-old")
    assert r.exit_code == 0, r.output
    r = invoke("collection", "add", tmp_path / "c", "--data", data)
    out = " ".join(r.output.split())
    assert r.exit_code == 0, out
    assert "3 item(s) read (3 images without captions); 1 of them the same content as another" in out, out
    assert "added 2" in out and "2 images, 0 texts" in out, out


def test_json_keeps_text_readable_and_a_table_shortens_a_long_caption(tmp_path):
    """Trial J: ``--json`` printed ``\\u65e5\\u672c...`` for Japanese text, and a 20,000-character caption
    filled 1,700 rows of the result table. JSON now carries the text as it is; a table cell shows
    at most 300 characters (the hit's whole text stays in ``--json``)."""
    from nobackfill.cli.gallery import SHOWN_TEXT

    long = "a red circle " + "x" * 1980  # (within the 2,000 characters a caption holds)
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "日本の赤い円", "id": "jp"}, ensure_ascii=False) + "\n"
                                      + json.dumps({"text": long, "id": "long"}) + "\n", encoding="utf-8")
    assert invoke("collection", "create", tmp_path / "c", "--model", MODELS / "world-old").exit_code == 0
    r = invoke("collection", "add", tmp_path / "c", "--texts", tmp_path / "t.jsonl")
    assert r.exit_code == 0, r.output
    raw = runner.invoke(app, ["collection", "search", str(tmp_path / "c"), "--text", "赤い円", "--target", "text",
                              "--json"]).stdout
    assert "日本の赤い円" in raw and "\\u" not in raw
    assert {h["id"]: h["text"] for h in json.loads(raw)["hits"]}["long"] == long
    table = runner.invoke(app, ["collection", "search", str(tmp_path / "c"), "--text", "a red circle", "--target",
                                "text"], terminal_width=200).stdout
    assert 100 < table.count("x") < SHOWN_TEXT and "…" in table, table


def test_skip_bad_reports_each_problem_once(tmp_path, caplog):
    """Trial J: each skipped line was printed three times (a warning as it was read, a summary of
    unreadable images that left some out, then the report). Now the report alone, once each."""
    from PIL import Image

    data = tmp_path / "photos"
    (data / "images").mkdir(parents=True)
    Image.new("RGB", (32, 32), (200, 30, 30)).save(data / "images" / "a.png")
    (data / "images" / "corrupt.png").write_bytes(b"not an image")
    (data / "captions.jsonl").write_text(json.dumps({"image": "images/a.png", "caption": "a red one", "lang": "en"})
                                         + "\n{not json\n"
                                         + json.dumps({"image": "images/corrupt.png", "caption": "x", "lang": "en"})
                                         + "\n")
    assert invoke("collection", "create", tmp_path / "c", "--model", MODELS / "world-old").exit_code == 0
    r = invoke("collection", "add", tmp_path / "c", "--data", data, "--skip-bad")
    out = r.output
    assert r.exit_code == 0, out
    assert out.count("invalid JSON") == 1 and out.count("cannot decode image") == 1, out
    assert "skipped 2 bad line(s)/image(s)" in " ".join(out.split()), out
    said = [r.getMessage() for r in caplog.records if r.name.startswith("nobackfill.data")]
    assert not said, said  # not warned as they were read (on stderr, beside the report)


def test_a_world_root_without_the_split_asked_is_refused(tmp_path):
    """Trial N: `--split tset` on a world root read the root as a folder of photos: every split's
    images added uncaptioned (21,800 on the real world) and the test images' labels dropped."""
    r = world_collection(tmp_path, "p", MODELS / "world-old", n_train=2, n_val=2, n_test=3, langs="en")
    assert r.exit_code == 0, r.output
    world = next(p.parent for p in tmp_path.rglob("world.json"))
    before = js("collection", "status", tmp_path / "p")["items"]
    for cmd in (("collection", "add", tmp_path / "p", "--data", world, "--split", "tset"),
                ("index", "--model", MODELS / "world-old", "--data", world, "--split", "tset", "--out", tmp_path / "g")):
        r = invoke(*cmd)
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and "a world root with no split 'tset' (its splits: test, train, val)" in out, out
    assert js("collection", "status", tmp_path / "p")["items"] == before and not (tmp_path / "g").exists()
    for split in ("", ".", "../x/val"):  # (trial P: '' and '.' named the root itself, read as photos)
        r = invoke("collection", "add", tmp_path / "p", "--data", world, "--split", split)
        assert r.exit_code == 2 and "split must name one split of a world root" in " ".join(r.output.split()), r.output
    assert js("collection", "status", tmp_path / "p")["items"] == before


@pytest.mark.parametrize("remote", [False, True])
def test_an_interrupted_backfill_says_whether_the_same_command_goes_on(remote, capsys):
    """In process the interrupted command's workers stop and the same command goes on; over HTTP
    the server's worker goes on after the command that followed it is stopped, so it says how to
    pause it instead (it told to run the command again while the server still ran)."""
    import typer

    from nobackfill.cli import _collection_print as cp

    class Client:
        def status(self):
            return {"items": {"image": 3, "text": 0}, "backfill": {"done": 3, "total": 9}}

    client = type("RemoteClient" if remote else "LocalClient", (Client,), {})()
    with pytest.raises(typer.Exit) as e:
        with cp.interrupt_report(client, "photos", "backfill"):
            raise KeyboardInterrupt
    got = capsys.readouterr()
    out = " ".join((got.out + got.err).split())
    assert e.value.exit_code == 130
    assert "serves 3 of 9 items now" in out
    assert ("the server's backfill goes on" in out and "--pause" in out) if remote else \
        "Run the same command again to go on" in out
