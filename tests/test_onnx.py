"""Query encoders on ONNX Runtime: export with dynamic axes, the check against torch, the cache beside
the model (used only for the same weights, unaltered files), int8 only when asked, and the CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("onnxruntime")

from nobackfill.encoders import load_encoder  # noqa: E402
from nobackfill.encoders.onnx import OnnxEncoder, export_onnx, onnx_encoder, onnx_export_info  # noqa: E402
from nobackfill.search.models import ModelPool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["a red circle", "two blue squares at the top left next to a yellow cross", "x", "purple"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A copy of the shipped world-old model with its towers exported (fp32 and int8)."""
    d = tmp_path_factory.mktemp("onnx") / "world-old"
    shutil.copytree(ROOT / "models" / "world-old", d)
    export_onnx(d, int8=True)
    return d


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (h, 40, 3), dtype=np.uint8)) for h in (40, 57, 90)]


def test_the_export_matches_torch_on_every_batch_and_length(exported):
    info = onnx_export_info(exported)
    torch_enc = load_encoder(exported)
    assert info["space_id"] == torch_enc.space_id
    assert set(info["towers"]) == {"text", "image"}
    for entry in info["towers"].values():
        assert entry["max_abs_diff"] <= 1e-4 and (exported / "onnx" / entry["file"]).is_file()
    enc = onnx_encoder(torch_enc, exported)
    assert isinstance(enc, OnnxEncoder) and set(enc.sessions) == {"text", "image"}
    for batch in (TEXTS[:1], TEXTS, TEXTS * 9):  # batch 1, mixed lengths, more than one batch of 32
        got = enc.encode_texts(batch, batch_size=32)
        assert got.shape == (len(batch), torch_enc.embed_dim) and got.dtype == np.float32
        assert np.abs(got - torch_enc.encode_texts(batch)).max() <= 1e-4
    assert np.abs(enc.encode_images(_images()) - torch_enc.encode_images(_images())).max() <= 1e-4
    assert enc.space_id == torch_enc.space_id and enc.embed_dim == torch_enc.embed_dim
    assert enc.encode_texts([]).shape == (0, torch_enc.embed_dim)
    with pytest.raises(TypeError):
        enc.encode_texts("one string")


def test_a_refused_export_writes_nothing(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(ROOT / "models" / "world-old", d)
    with pytest.raises(ValueError, match="differs from torch by .* above"):
        export_onnx(d, towers=["text"], max_abs_diff=0.0)
    assert not (d / "onnx").exists() and not [p for p in d.iterdir() if p.name.startswith(".onnx")]
    with pytest.raises(ValueError, match="towers"):
        export_onnx(d, towers=["audio"])


def test_an_export_after_a_killed_one_removes_its_staging_and_puts_back_what_it_set_aside(tmp_path):
    """trial T: a killed export left its staging folder (.onnx.XXXX, the size of an export) for good;
    killed between its two renames, it left the earlier export set aside (.onnx.old) and no onnx/."""
    d = tmp_path / "m"
    shutil.copytree(ROOT / "models" / "world-old", d)
    export_onnx(d, towers=["text"])
    (d / ".onnx.k1ll3d").mkdir()
    (d / ".onnx.k1ll3d" / "text.onnx").write_bytes(b"half")
    os.replace(d / "onnx", d / ".onnx.old")  # as a kill between the renames leaves it
    with pytest.raises(ValueError, match="differs from torch"):  # a refused export still puts things right
        export_onnx(d, towers=["text"], max_abs_diff=0.0)
    assert (d / "onnx" / "export.json").is_file() and not (d / ".onnx.k1ll3d").exists()
    assert not (d / ".onnx.old").exists()
    before = set(os.listdir(ROOT / "models" / "world-old")) | {"onnx"}
    assert set(os.listdir(d)) == before  # no lock file left in the user's folder (trial W)


def test_two_exports_of_one_model_run_one_after_the_other(tmp_path):
    """The export lock is the model directory's own: a second export waits for the first."""
    import fcntl
    import threading

    from nobackfill.encoders.onnx import _export_lock

    d = tmp_path / "m"
    d.mkdir()
    entered = []
    with _export_lock(d):
        t = threading.Thread(target=lambda: _export_lock(d).__enter__() and None or entered.append(1))
        t.start()
        t.join(0.3)
        assert not entered  # waiting
        fd = os.open(d, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    t.join(5)
    assert entered == [1] and os.listdir(d) == []


def test_the_export_is_used_only_for_its_own_unaltered_weights(exported, tmp_path, caplog):
    other = load_encoder(ROOT / "models" / "world-new")
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        assert onnx_encoder(other, exported) is other  # another model's export is never used
    assert "other weights" in caplog.text and "export-onnx" in caplog.text  # and the log says so
    d = tmp_path / "m"
    shutil.copytree(exported, d)
    with open(d / "onnx" / "text.onnx", "ab") as f:  # a file changed after the check
        f.write(b"\0")
    caplog.clear()
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        enc = onnx_encoder(load_encoder(d), d)
    assert set(enc.sessions) == {"image"} and enc.runtimes() == {"image": "onnx", "text": "torch"}
    assert "text.onnx: missing or changed" in caplog.text
    (d / "onnx" / "export.json").write_text("{not json")
    plain = load_encoder(d)
    caplog.clear()
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        assert onnx_encoder(plain, d) is plain
    assert "export.json: JSONDecodeError" in caplog.text and "queries run on torch" in caplog.text


def test_an_export_onnx_runtime_cannot_load_runs_that_tower_on_torch(exported, tmp_path, caplog):
    """Trial L: a file that matches its record but does not load (another onnx version's, cut) or a
    tower record that is no object made every process that loaded the model fail; the tower runs on
    torch with a warning instead, the others on ONNX Runtime."""
    import hashlib

    d = tmp_path / "m"
    shutil.copytree(exported, d)
    cut = (d / "onnx" / "text.onnx").read_bytes()[:1000]
    (d / "onnx" / "text.onnx").write_bytes(cut)
    info = json.loads((d / "onnx" / "export.json").read_text())
    info["towers"]["text"]["sha256"] = hashlib.sha256(cut).hexdigest()
    (d / "onnx" / "export.json").write_text(json.dumps(info))
    torch_enc = load_encoder(d)
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        enc = onnx_encoder(torch_enc, d)
    assert enc.runtimes() == {"image": "onnx", "text": "torch"}
    assert "ONNX Runtime cannot load it" in caplog.text and "text tower runs on torch" in caplog.text
    assert np.abs(enc.encode_texts(TEXTS) - torch_enc.encode_texts(TEXTS)).max() == 0
    info["towers"]["text"] = None
    (d / "onnx" / "export.json").write_text(json.dumps(info))
    caplog.clear()
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        assert onnx_encoder(torch_enc, d).runtimes() == {"image": "onnx", "text": "torch"}
    assert "text tower's record is None" in caplog.text
    for raw in ("[]", '{"space_id": "x"}'):  # a record that is no export's: said, not silent
        (d / "onnx" / "export.json").write_text(raw)
        caplog.clear()
        with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
            assert onnx_encoder(torch_enc, d) is torch_enc
        assert "not an export's record" in caplog.text


def test_int8_only_when_asked(exported, monkeypatch):
    info = onnx_export_info(exported)
    assert {"file", "sha256", "max_abs_diff"} <= set(info["towers"]["text"]["int8"])
    monkeypatch.delenv("NOBACKFILL_ONNX", raising=False)
    enc = ModelPool().query_encoder(str(exported))
    assert isinstance(enc, OnnxEncoder) and enc.files["text"].endswith("text.onnx")
    monkeypatch.setenv("NOBACKFILL_ONNX", "int8")
    q = ModelPool().query_encoder(str(exported))
    assert q.files["text"].endswith("text.int8.onnx")
    diff = np.abs(q.encode_texts(TEXTS) - enc.encode_texts(TEXTS)).max()
    assert 0 < diff < 0.1  # quantised: close, not equal
    monkeypatch.setenv("NOBACKFILL_ONNX", "0")
    assert not isinstance(ModelPool().query_encoder(str(exported)), OnnxEncoder)


def test_an_upgraded_copy_is_made_from_the_torch_model(tmp_path, monkeypatch):
    """An encoder upgrade (XBT) attaches adapters to torch modules: the pool copies the torch encoder
    under the ONNX one, and the upgraded copy embeds as it does without an export."""
    monkeypatch.delenv("NOBACKFILL_ONNX", raising=False)
    d = tmp_path / "world-new"
    shutil.copytree(ROOT / "models" / "world-new", d)
    export_onnx(d, towers=["text"])
    upgrade = ROOT / "upgrades" / "world-old-to-new"
    pool = ModelPool()
    assert isinstance(pool.query_encoder(str(d)), OnnxEncoder)
    got = pool.upgraded(str(d), upgrade).encode_texts(TEXTS)
    monkeypatch.setenv("NOBACKFILL_ONNX", "0")
    want = ModelPool().upgraded(str(d), upgrade).encode_texts(TEXTS)
    assert np.abs(got - want).max() <= 1e-5


def test_the_cli_exports_and_reports(tmp_path):
    from typer.testing import CliRunner

    from nobackfill.cli import app

    d = tmp_path / "m"
    shutil.copytree(ROOT / "models" / "world-old", d)
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text"])
    assert r.exit_code == 0, r.output
    assert "text:" in r.stdout and "max abs diff vs torch" in r.stdout
    assert json.loads((d / "onnx" / "export.json").read_text())["towers"].keys() == {"text"}
    assert CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text", "--int8"]).exit_code == 0
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text"])  # an int8 export replaced by fp32 only
    assert r.exit_code == 0 and "earlier int8 export of text is gone" in r.stdout
    r = CliRunner().invoke(app, ["export-onnx", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "nope: no such directory" in r.output
    for empty in ("", "text,"):  # an empty tower name is refused alike (--towers "" exported every tower)
        r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", empty])
        assert r.exit_code == 2 and "not ['']" in r.output, (empty, r.output)


def test_the_cli_says_when_it_cannot_write_the_export(tmp_path, monkeypatch):
    """A read-only model directory: one error line naming the model, exit 2, nothing left behind."""
    from typer.testing import CliRunner

    from nobackfill.cli import app

    d = tmp_path / "m"
    shutil.copytree(ROOT / "models" / "world-old", d)

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(d / ".onnx.x"))

    monkeypatch.setattr("tempfile.mkdtemp", refuse)
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text"])
    assert r.exit_code == 2 and "could not write the export (Permission denied" in r.output, r.output
    assert "Traceback" not in r.output and not (d / "onnx").exists()
    with pytest.raises(ValueError, match="onnx_threads must be at least 1"):
        ModelPool(onnx_threads=0)


def test_export_on_first_load_writes_the_cache_beside_the_model_once(tmp_path, monkeypatch, caplog):
    """Mode ``export``: the first load of a model without an export exports it into ``MODEL/onnx/`` and
    serves it on ONNX Runtime; a later load finds the export and does not redo it; mode ``auto`` never
    exports."""
    monkeypatch.delenv("NOBACKFILL_ONNX", raising=False)
    d = tmp_path / "world-old"
    shutil.copytree(ROOT / "models" / "world-old", d)
    assert not isinstance(ModelPool().query_encoder(str(d)), OnnxEncoder)  # auto: no export, torch
    assert onnx_export_info(d) is None
    enc = ModelPool(onnx="export").query_encoder(str(d))
    assert isinstance(enc, OnnxEncoder) and onnx_export_info(d)["space_id"] == enc.space_id
    stamp = (d / "onnx" / "export.json").stat().st_mtime_ns
    monkeypatch.setenv("NOBACKFILL_ONNX", "export")
    again = ModelPool().query_encoder(str(d))
    assert isinstance(again, OnnxEncoder) and (d / "onnx" / "export.json").stat().st_mtime_ns == stamp
    want = load_encoder(d).encode_texts(TEXTS)
    assert np.abs(again.encode_texts(TEXTS) - want).max() <= 1e-4


def test_export_on_first_load_falls_back_to_torch_when_it_cannot_write(tmp_path, monkeypatch, caplog):
    d = tmp_path / "world-old"
    shutil.copytree(ROOT / "models" / "world-old", d)

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(d))

    monkeypatch.setattr("nobackfill.encoders.onnx.export_onnx", refuse)
    with caplog.at_level("WARNING", logger="nobackfill.search.models"):
        enc = ModelPool(onnx="export").query_encoder(str(d))
    assert not isinstance(enc, OnnxEncoder)
    assert "could not export" in caplog.text and "serving it on torch" in caplog.text


def test_the_shipped_minilm_by_name_is_exported_and_served_from_its_directory(tmp_path, monkeypatch):
    """Trial AG: ``export-onnx minilm`` failed on the name (``[Errno 2] ... 'minilm'``), and a
    collection whose model is the alias served its queries on torch in every mode, saying nothing.
    The name opens the package's directory for both (a copy here: the package is left as it is)."""
    from typer.testing import CliRunner

    import nobackfill.encoders.minilm as minilm
    from nobackfill.cli import app

    monkeypatch.delenv("NOBACKFILL_ONNX", raising=False)
    assert load_encoder(minilm.pretrained_model_dir()).name == "all-MiniLM-L6-v2"  # as by the name (not "model")
    d = tmp_path / "minilm-copy"
    shutil.copytree(minilm.pretrained_model_dir(), d)
    monkeypatch.setattr(minilm, "pretrained_model_dir", lambda: d)
    assert not isinstance(ModelPool().query_encoder("minilm"), OnnxEncoder)  # no export yet: torch
    r = CliRunner().invoke(app, ["export-onnx", "minilm"])
    assert r.exit_code == 0, r.output
    assert f"text: {d / 'onnx' / 'text.onnx'}" in r.stdout and onnx_export_info(d)["towers"].keys() == {"text"}
    enc = ModelPool().query_encoder("minilm")
    assert isinstance(enc, OnnxEncoder) and enc.runtimes() == {"text": "onnx"}
    want = load_encoder("minilm").encode_texts(TEXTS)
    assert np.abs(enc.encode_texts(TEXTS) - want).max() <= 1e-4


def test_an_unknown_onnx_mode_is_refused_naming_it(monkeypatch):
    with pytest.raises(ValueError, match=r"onnx must be one of auto, export, int8, off \(or 0: off, 1: auto\), got 'fast'"):
        ModelPool(onnx="fast")
    monkeypatch.setenv("NOBACKFILL_ONNX", "fast")
    with pytest.raises(ValueError, match="NOBACKFILL_ONNX must be one of"):
        ModelPool().query_encoder(str(ROOT / "models" / "world-old"))


def test_the_cli_choices_are_the_pool_modes():
    from nobackfill.cli.serve import ONNX_CHOICES
    from nobackfill.search.models import ONNX_MODES

    assert ONNX_CHOICES == ONNX_MODES


def test_the_pool_gives_its_sessions_the_query_threads(exported, monkeypatch):
    monkeypatch.delenv("NOBACKFILL_ONNX", raising=False)
    for n in (1, 2):
        enc = ModelPool(onnx_threads=n).query_encoder(str(exported))
        assert {s.get_session_options().intra_op_num_threads for s in enc.sessions.values()} == {n}
        spins = {s.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
                 for s in enc.sessions.values()}
        assert spins == {"0"}  # the service's idle threads sleep between queries


def test_spinning_sessions_only_when_asked(exported):
    """`bench serve` times ONNX Runtime's threads spinning too, as torch's OpenMP threads do."""
    plain = load_encoder(exported)
    for spin, said in ((False, "0"), (True, "1")):
        enc = onnx_encoder(plain, exported, threads=2, spin=spin)
        assert {s.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
                for s in enc.sessions.values()} == {said}


def test_int8_without_an_int8_export_says_it_runs_fp32(tmp_path, caplog):
    d = tmp_path / "m"
    shutil.copytree(ROOT / "models" / "world-old", d)
    export_onnx(d, towers=["text"])
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        enc = onnx_encoder(load_encoder(d), d, int8=True)
    assert enc.runtimes()["text"] == "onnx" and "no int8 export" in caplog.text
    # trial AJ (D9): docs/serve.md said such a tower runs on torch; it says what runs
    doc = " ".join((ROOT / "docs" / "serve.md").read_text(encoding="utf-8").split())
    assert "a tower exported without an int8 copy is logged as a warning and runs on its fp32 export" in doc


def test_onnx_embeds_queries_and_torch_the_stored_items(exported, tmp_path, monkeypatch):
    """An int8 (or fp32) export changes the vectors of queries only: what a collection stores (added,
    backfilled) comes from the torch model, whose space id the vectors are recorded under."""
    from nobackfill.client.local import LocalClient

    monkeypatch.setenv("NOBACKFILL_ONNX", "int8")
    pool = ModelPool()
    assert not isinstance(pool.get(str(exported)), OnnxEncoder)
    assert pool.query_encoder(str(exported)).runtimes() == {"image": "onnx-int8", "text": "onnx-int8"}
    assert pool.runtimes() == {str(exported): {"image": "onnx-int8", "text": "onnx-int8"}}
    client = LocalClient(tmp_path / "c", pool=pool)
    client.create(exported)
    client.add(texts=[{"text": t, "id": f"t{i}"} for i, t in enumerate(TEXTS)])
    torch_rows = load_encoder(exported).encode_texts(TEXTS)
    hits = client.search(text=TEXTS[1], k=len(TEXTS), target="text").hits
    stored = {h.id: h.score for h in hits}
    query = pool.query_encoder(str(exported)).encode_texts(TEXTS[1:2])[0]
    for i in range(len(TEXTS)):  # the score of each hit is the int8 query against the torch row
        assert abs(stored[f"t{i}"] - float(query @ torch_rows[i])) <= 1e-5


def test_an_upgrade_to_a_model_whose_export_does_not_load_is_served(exported, tmp_path, caplog):
    """Trial L: the upgrade was committed, then failed with a 500, and every search after it too.
    Its query tower runs on torch (a warning), and the upgrade and searches answer."""
    import hashlib

    from nobackfill.client.local import LocalClient

    d = tmp_path / "world-old-cut"
    shutil.copytree(exported, d)
    info = json.loads((d / "onnx" / "export.json").read_text())
    for tower in ("text", "image"):
        cut = (d / "onnx" / f"{tower}.onnx").read_bytes()[:500]
        (d / "onnx" / f"{tower}.onnx").write_bytes(cut)
        info["towers"][tower]["sha256"] = hashlib.sha256(cut).hexdigest()
    (d / "onnx" / "export.json").write_text(json.dumps(info))
    client = LocalClient(tmp_path / "c", pool=ModelPool())
    client.create(ROOT / "models" / "world-new")
    client.add(texts=[{"text": t, "id": f"t{i}"} for i, t in enumerate(TEXTS)])
    with caplog.at_level("WARNING", logger="nobackfill.encoders.onnx"):
        up = client.upgrade(d)
    assert len(up.spaces) == 2 and "ONNX Runtime cannot load it" in caplog.text
    assert [h.id for h in client.search(text=TEXTS[1], k=2, target="text").hits]
    assert client.pool.runtimes()[str(d)] == {"image": "torch", "text": "torch"}


def test_the_pool_names_the_query_side_of_a_bridge_as_torch():
    """/metrics reads :meth:`ModelPool.runtimes`: a model with an XBT upgrade's adapters (a query
    through a bridge) is one of the query towers, on torch (trial L: only the plain models showed)."""
    pool = ModelPool()
    up = ROOT / "upgrades" / "world-old-to-new"
    pool.upgraded(ROOT / "models" / "world-new", up)
    runs = pool.runtimes()
    assert runs == {f"{ROOT / 'models' / 'world-new'} via world-old-to-new": {"image": "torch", "text": "torch"}}
