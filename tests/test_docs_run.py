"""The collection guides run as written: every ``nobackfill`` command of docs/own-data.md and then
docs/upgrade.md, in order, on a folder of the user's kind (my_photos as the README's quick start
makes it, a small world as data/world for calibration, the shipped models and upgrade linked in). Placeholders take what the
reader would look up (``<old space id>`` from ``collection status``, ``<an id ...>`` from a
search); only the two commands that train a bridge for minutes are left to their own tests
(tests/test_compat_cli.py runs ``upgrade xbt`` and ``upgrade procrustes`` on a tiny world)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

from test_docs_commands import PLACEHOLDERS, doc_commands

ROOT = Path(__file__).resolve().parents[1]
TRAINING = (("upgrade", "xbt"), ("upgrade", "procrustes"))


def _args(text: str, filled: dict[str, str]) -> list[str]:
    text = PLACEHOLDERS["optional"].sub(r"\1", text)
    text = PLACEHOLDERS["angle"].sub(lambda m: filled[m.group(0)], text)
    return shlex.split(text)[1:]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    runner = CliRunner()
    r = runner.invoke(app, ["world", "--out", str(tmp_path / "data" / "world"), "--n-train", "4", "--n-val", "12",
                            "--n-test", "10", "--workers", "1", "--langs", "en"])
    assert r.exit_code == 0, r.output
    from PIL import Image  # my_photos as the README's quick start makes it: images + captions.jsonl

    photos = tmp_path / "my_photos"
    (photos / "images").mkdir(parents=True)
    lines = []
    for k in range(6):
        Image.new("RGB", (64, 64), (200 * (k % 2), 40 * k, 90)).save(photos / "images" / f"p{k}.png")
        lines.append(json.dumps({"image": f"images/p{k}.png", "caption": f"a red circle number {k}", "lang": "en"}))
    (photos / "captions.jsonl").write_text("\n".join(lines) + "\n")
    for d in ("models", "upgrades"):
        (tmp_path / d).symlink_to(ROOT / d)
    Image.new("RGB", (64, 64), (10, 200, 30)).save(tmp_path / "some.png")
    (tmp_path / "queries.txt").write_text("a red circle\ntwo blue squares\na green triangle\n")  # searches users typed
    (tmp_path / "more_captions.jsonl").write_text(json.dumps({"text": "a caption added on its own", "id": "own-1"})
                                                  + "\n")
    monkeypatch.chdir(tmp_path)
    return runner


def _look_up(runner, placeholder: str) -> str:
    """What a reader fills in: an old space's id from ``collection status``, or an item id from a
    search."""
    if "space" in placeholder:
        st = json.loads(runner.invoke(app, ["collection", "status", "photos", "--json"]).stdout)
        return next(s for s, v in st["spaces"].items() if not v["current"])
    hits = json.loads(runner.invoke(app, ["collection", "search", "photos", "--text", "a red circle",
                                          "--json"]).stdout)["hits"]
    return hits[0]["id"]


@pytest.mark.parametrize("pages", [("own-data.md", "upgrade.md"), ("guide.md",)])
def test_the_collection_guides_run_as_written(sandbox, pages):
    runner = sandbox
    filled: dict[str, str] = {}
    ran = []
    for cmd in doc_commands([ROOT / "docs" / p for p in pages]):
        args = shlex.split(cmd.text)[1:]
        if tuple(args[:2]) in TRAINING:
            continue
        for ph in PLACEHOLDERS["angle"].findall(cmd.text):
            if ph not in filled or "space" not in ph:  # an old space keeps its id; an item is looked up anew
                filled[ph] = _look_up(runner, ph)
        r = runner.invoke(app, _args(cmd.text, filled))
        assert r.exit_code == 0, f"{cmd.where}: {cmd.text}\n{r.output}"
        ran.append(cmd.where)
    assert len(ran) >= 9, ran
    st = json.loads(runner.invoke(app, ["collection", "status", "photos", "--json"]).stdout)
    old = filled["<old space id>"]
    assert st["spaces"][old]["retired"] and st["backfill"]["done"] == st["backfill"]["total"]


def test_the_import_guide_runs_as_written(sandbox):
    """docs/import.md's commands, in order: a clip-retrieval folder (the world's test images and
    captions, embedded by world-old, image paths under data/images), then an .npy of image vectors
    with its parquet table, then a faiss index of caption vectors with its JSONL table (both the
    val split, world-old), then the upgrade, the backfill and the model check."""
    import faiss
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nobackfill.data.clip_retrieval import write_clip_retrieval
    from nobackfill.evaluate import load_eval_data
    from nobackfill.encoders import load_encoder

    runner = sandbox
    old = load_encoder(ROOT / "models" / "world-old")
    test = load_eval_data("data/world", "test", langs=["en"])
    (Path("data") / "images").symlink_to(Path("data/world/test/images").absolute())
    rows = [test.image_paths()[i] for i in test.caption_image]
    write_clip_retrieval("embeddings_folder", image_paths=[Path(p).name for p in rows],
                         image_vectors=old.encode_images(rows), captions=test.captions,
                         text_vectors=old.encode_texts(test.captions), dtype=np.float32)
    val = load_eval_data("data/world", "val", langs=["en"])
    np.save("emb.npy", old.encode_images(val.image_paths()))
    pq.write_table(pa.table({"id": [f"val-img-{i}" for i in range(len(val))],
                             "image_path": [str(Path(p).absolute()) for p in val.image_paths()]}), "meta.parquet")
    txt = np.ascontiguousarray(old.encode_texts(val.captions), np.float32)
    index = faiss.IndexFlatIP(txt.shape[1])
    index.add(txt)
    faiss.write_index(index, "index.faiss")
    Path("ids.jsonl").write_text("".join(json.dumps({"id": f"val-cap-{i}", "text": c}) + "\n"
                                         for i, c in enumerate(val.captions)))
    ran = []
    for cmd in doc_commands([ROOT / "docs" / "import.md"]):
        if "milvus" in cmd.text:  # a Milvus server's collection: tests/test_milvus_adopt.py starts one
            continue
        r = runner.invoke(app, _args(cmd.text, {}))
        assert r.exit_code == 0, f"{cmd.where}: {cmd.text}\n{r.output}"
        ran.append(cmd.where)
    assert len(ran) >= 6, ran
    st = json.loads(runner.invoke(app, ["collection", "status", "photos", "--json"]).stdout)
    assert st["items"]["image"] == 10 + len(val) and st["items"]["text"] == len(test.captions) + len(val.captions)
    assert len(st["spaces"]) == 2 and st["backfill"]["done"] == st["backfill"]["total"]


def test_an_unreachable_milvus_server_is_one_clear_error(postgres_db):
    """A Milvus address nobody listens on: one error line naming it (not pymilvus' exception), and
    the create it refused wrote nothing in the catalog's database; without a catalog the URI is
    refused first, saying what to add (no server is asked)."""
    import socket

    import psycopg

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = CliRunner().invoke(app, ["collection", "create", f"milvus://127.0.0.1:{port}#photos?catalog={postgres_db}",
                                 "--model", "models/world-old"])
    assert r.exit_code == 2 and f"cannot reach the Milvus server at http://127.0.0.1:{port}" in r.output, r.output
    with psycopg.connect(postgres_db) as conn:
        assert not conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name LIKE 'nb_%'").fetchall()
    r = CliRunner().invoke(app, ["collection", "status", f"milvus://127.0.0.1:{port}#photos"])
    assert r.exit_code == 2 and "add ?catalog=postgresql://" in r.output, r.output
