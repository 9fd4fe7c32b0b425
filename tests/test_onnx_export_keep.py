"""An export of some towers (``export-onnx --towers``) keeps the earlier export's other towers when
they were exported from the same weights and their files are unchanged, says which it could not keep,
and a refused export leaves the earlier one as it was; the differences recorded say what they were
measured on."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from nobackfill.encoders import load_encoder  # noqa: E402
from nobackfill.encoders.onnx import OnnxEncoder, export_onnx, onnx_encoder, onnx_export_info  # noqa: E402

from test_onnx import exported  # noqa: E402,F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def full(exported) -> Path:
    """test_onnx's copy of world-old with both towers exported, fp32 and int8 (copied by each test,
    never changed)."""
    return exported


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(d: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in sorted((d / "onnx").iterdir())}


def test_a_text_export_after_a_full_one_keeps_the_image_tower(full, tmp_path):
    d = _copy(full, tmp_path / "m")
    before = onnx_export_info(d)
    image_files = {n: s for n, s in _files(d).items() if n.startswith("image")}
    info = export_onnx(d, towers=["text"])
    assert info["earlier"] == {"kept": ["image"], "dropped": {}}
    after = onnx_export_info(d)
    assert "earlier" not in after and after["space_id"] == before["space_id"]
    assert after["towers"]["image"] == before["towers"]["image"]  # the entry as it was, int8 copy included
    assert "int8" not in after["towers"]["text"]  # the text tower re-exported in fp32 only
    assert {n: s for n, s in _files(d).items() if n.startswith("image")} == image_files
    assert not (d / "onnx" / "text.int8.onnx").exists()
    assert not [p for p in d.iterdir() if p.name.startswith(".onnx")]
    enc = onnx_encoder(load_encoder(d), d)
    assert isinstance(enc, OnnxEncoder) and enc.runtimes() == {"text": "onnx", "image": "onnx"}
    q = onnx_encoder(load_encoder(d), d, int8=True)
    assert q.runtimes() == {"text": "onnx", "image": "onnx-int8"}


def test_a_tower_from_other_weights_is_dropped_and_named(full, tmp_path):
    d = _copy(ROOT / "models" / "world-new", tmp_path / "world-new")
    shutil.copytree(full / "onnx", d / "onnx")  # world-old's export beside world-new's weights
    info = export_onnx(d, towers=["text"])
    assert info["earlier"]["kept"] == [] and "other weights" in info["earlier"]["dropped"]["image"]
    assert set(onnx_export_info(d)["towers"]) == {"text"} and not (d / "onnx" / "image.onnx").exists()


def test_a_changed_file_is_not_kept(full, tmp_path):
    d = _copy(full, tmp_path / "m")
    with open(d / "onnx" / "image.int8.onnx", "ab") as f:  # only the int8 copy changed: the fp32 tower stays
        f.write(b"\0")
    info = export_onnx(d, towers=["text"])
    assert info["earlier"]["kept"] == ["image"] and "changed" in info["earlier"]["dropped"]["image int8"]
    assert "int8" not in onnx_export_info(d)["towers"]["image"] and not (d / "onnx" / "image.int8.onnx").exists()
    with open(d / "onnx" / "image.onnx", "ab") as f:
        f.write(b"\0")
    info = export_onnx(d, towers=["text"])
    assert info["earlier"]["kept"] == [] and "image.onnx missing or changed" in info["earlier"]["dropped"]["image"]
    assert set(onnx_export_info(d)["towers"]) == {"text"}


def test_a_refused_export_leaves_the_earlier_one(full, tmp_path):
    d = _copy(full, tmp_path / "m")
    before, files = (d / "onnx" / "export.json").read_text(), _files(d)
    with pytest.raises(ValueError, match="differs from torch"):
        export_onnx(d, towers=["text"], max_abs_diff=0.0)
    assert (d / "onnx" / "export.json").read_text() == before and _files(d) == files
    assert not [p for p in d.iterdir() if p.name.startswith(".onnx")]
    assert onnx_encoder(load_encoder(d), d).runtimes() == {"text": "onnx", "image": "onnx"}


def test_the_recorded_differences_say_what_they_were_measured_on(full):
    info = onnx_export_info(full)
    text, image = info["towers"]["text"], info["towers"]["image"]
    assert text["checked_on"] == "the export's check inputs: 8 check texts, in batches of 1, 3 and 8"
    assert image["int8"]["checked_on"].startswith("the export's check inputs: 3 seeded random-noise images")
    assert "batch" in image["int8"]["note"] and "bench serve" in image["int8"]["note"]


def test_the_cli_says_what_it_kept_and_what_is_gone(full, tmp_path):
    from typer.testing import CliRunner

    from nobackfill.cli import app

    d = _copy(full, tmp_path / "m")
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any(ln.startswith("text: ") and "on the export's check inputs" in ln for ln in lines), r.stdout
    assert any(ln.startswith("image: ") and "kept from the earlier export" in ln and "int8: image.int8.onnx" in ln
               and "on the check inputs" in ln for ln in lines), r.stdout
    assert "note: the earlier int8 export of text is gone (export with --int8 to keep one)" in r.stdout
    assert "image is gone" not in r.stdout and "int8 export of image" not in r.stdout
    w = _copy(ROOT / "models" / "world-new", tmp_path / "world-new")
    shutil.copytree(full / "onnx", w / "onnx")
    r = CliRunner().invoke(app, ["export-onnx", str(w), "--towers", "text", "--int8"])
    assert r.exit_code == 0, r.output
    assert (f"note: the earlier export of image is gone: exported from other weights than the model's now "
            f"(nobackfill export-onnx {w} --towers image exports it again)") in r.stdout
    assert "earlier int8 export" not in r.stdout
    assert json.loads((w / "onnx" / "export.json").read_text())["towers"].keys() == {"text"}


def test_an_int8_record_that_is_no_record_is_left_out_with_a_warning(full, tmp_path, caplog):
    """Trial AG: ``towers.image.int8 = "x"`` in export.json made ``--onnx int8`` (serve, search) die
    with an AttributeError, and ``export-onnx --towers text`` kept it and crashed printing it (exit 1,
    the export written). That copy is now left out, said, and the rest serves."""
    from typer.testing import CliRunner

    from nobackfill.cli import app

    d = _copy(full, tmp_path / "m")
    p = d / "onnx" / "export.json"
    rec = json.loads(p.read_text())
    rec["towers"]["image"]["int8"] = "x"
    p.write_text(json.dumps(rec))
    with caplog.at_level("WARNING"):
        enc = onnx_encoder(load_encoder(d), d, int8=True)
    assert "image tower's int8 record is 'x'" in caplog.text  # the image tower in fp32, the text one in int8
    assert enc.runtimes() == {"text": "onnx-int8", "image": "onnx"}
    r = CliRunner().invoke(app, ["export-onnx", str(d), "--towers", "text"])
    assert r.exit_code == 0, r.output
    assert "note: the earlier int8 export of image is gone: its record is no export's record" in r.stdout
    assert "int8" not in json.loads(p.read_text())["towers"]["image"]
