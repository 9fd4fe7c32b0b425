"""Trust what is stored: every read checks what it reads, `nobackfill verify` finds every kind of
damage, `--repair` puts a gallery back in service, and damaged upgrades and models are named."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nobackfill.cli import app
from nobackfill.gallery.gallery import Gallery
from nobackfill.gallery.types import CorruptGalleryError, GalleryError, SpaceMismatchError

SPACE = "s" * 16
DIM = 8
runner = CliRunner()


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A small gallery: two image chunks, one text chunk, cached indexes on disk."""
    root = tmp_path_factory.mktemp("trust") / "g"
    rng = np.random.default_rng(0)
    g = Gallery.create(root, space_id=SPACE, dim=DIM, model="m", backend="flat")
    g.add("image", [f"i{k}" for k in range(20)], _unit(rng.normal(size=(20, DIM))),
          [{"path": f"/x/{k}.png"} for k in range(20)], space_id=SPACE)
    g.add("image", [f"i{k}" for k in range(20, 30)], _unit(rng.normal(size=(10, DIM))), space_id=SPACE)
    g.add("text", [f"t{k}" for k in range(15)], _unit(rng.normal(size=(15, DIM))),
          [{"text": f"caption {k}"} for k in range(15)], space_id=SPACE)
    q = _unit(rng.normal(size=(4, DIM)))
    for m in ("image", "text"):
        g.search(m, q, 5, space_id=SPACE)  # writes the cached indexes
    g.close()
    assert (root / "index-image.faiss").is_file() and (root / "index-text.json").is_file()
    return root


def _answers(path: Path, q: np.ndarray):
    g = Gallery.open(path)
    try:
        out = {}
        for m in ("image", "text"):
            r = g.search(m, q, 5, space_id=SPACE)
            out[m] = (r.ids, np.round(r.scores, 5).tolist(), [x.get("text") for x in g.metadata(m)])
        return out
    finally:
        g.close()


FILE_KINDS = {
    "vector chunk": lambda root: sorted((root / "chunks").glob("*.npz")),
    "metadata chunk": lambda root: sorted((root / "chunks").glob("*.jsonl")),
    "cached index": lambda root: sorted(root.glob("index-*.faiss")),
    "index stamp": lambda root: sorted(root.glob("index-*.json")),
    "manifest": lambda root: [root / "manifest.json"],
}


@pytest.mark.parametrize("kind", list(FILE_KINDS))
def test_bit_flips_are_detected_or_harmless_never_served(template, tmp_path, kind):
    """>= 50 random single-byte flips or truncations per file kind: each search either answers exactly
    as the intact gallery does or fails with an error naming a file of the gallery; `verify` flags
    every flip of committed data."""
    rng = random.Random(hash(kind) % 1000)
    q = _unit(np.random.default_rng(1).normal(size=(4, DIM)))
    truth = _answers(template, q)
    detected = harmless = 0
    for trial in range(50):
        root = tmp_path / f"t{trial}"
        shutil.copytree(template, root)
        target = rng.choice(FILE_KINDS[kind](root))
        data = bytearray(target.read_bytes())
        if trial % 5 == 4:  # a truncation
            data = data[: rng.randrange(len(data))]
        else:
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        try:
            got = _answers(root, q)
        except (GalleryError, SpaceMismatchError, ValueError) as e:
            assert str(root) in str(e) or target.name in str(e), f"{kind} trial {trial}: error names no file: {e}"
            detected += 1
            report = Gallery.open(root).verify() if not isinstance(e, GalleryError) or "manifest" not in str(e) else None
            if report is not None and kind in ("vector chunk", "metadata chunk"):
                assert not report.ok and any(target.name in p for p in report.problems)
            continue
        assert got == truth, f"{kind} trial {trial}: a wrong answer was served after damaging {target.name}"
        harmless += 1
        if kind in ("vector chunk", "metadata chunk"):
            raise AssertionError(f"trial {trial}: damage to committed {target.name} went unnoticed")
    assert detected + harmless == 50
    if kind in ("vector chunk", "metadata chunk"):
        assert detected == 50


def test_verify_cli_names_the_damage_and_repair_restores_service(template, tmp_path):
    root = tmp_path / "g"
    shutil.copytree(template, root)
    r = runner.invoke(app, ["verify", str(root)])
    assert r.exit_code == 0 and "OK" in r.output, r.output
    npz = sorted((root / "chunks").glob("image-*.npz"))[1]  # the second image chunk: ids i20..i29
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    npz.write_bytes(bytes(data))
    (root / "index-text.faiss").write_bytes(b"garbage")
    manifest_before = (root / "manifest.json").read_bytes()
    with pytest.raises(CorruptGalleryError, match="verify"):  # the hits' ids come from the damaged chunk
        Gallery.open(root).search("image", np.ones((1, DIM), np.float32), 3, space_id=SPACE).ids
    r = runner.invoke(app, ["verify", str(root), "--json"])
    assert r.exit_code == 1
    rep = json.loads(r.stdout)
    assert rep["kind"] == "gallery" and not rep["ok"] and any(npz.name in p for p in rep["problems"])
    assert any("index-text.faiss" in d for d in rep["derived"])
    assert (root / "manifest.json").read_bytes() == manifest_before  # verify changes nothing
    r = runner.invoke(app, ["verify", str(root), "--repair", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["repaired"]["lost_counts"] == {"image": 10, "text": 0}
    assert rep["repaired"]["lost_ids"]["image"] == [f"i{k}" for k in range(20, 30)] and rep["advice"]
    g = Gallery.open(root)
    assert g.count("image") == 20 and g.search("image", np.ones((1, DIM), np.float32), 3, space_id=SPACE).ids
    g.add("image", [f"i{k}" for k in range(20, 30)], _unit(np.ones((10, DIM))), space_id=SPACE)  # re-added
    assert g.count("image") == 30 and len(set(g.ids("image"))) == 30
    assert not g.verify().problems


def test_verify_upgrade_and_model_directories(tmp_path):
    """The shipped upgrade keeps file hashes: a flipped byte or a truncated phi is named, by
    `verify` and when the upgrade is applied; a model whose weights changed is named too."""
    up = tmp_path / "up"
    shutil.copytree("upgrades/world-old-to-new", up)
    assert runner.invoke(app, ["verify", str(up)]).exit_code == 0
    phi = up / "phi.safetensors"
    phi.write_bytes(phi.read_bytes()[:100])
    r = runner.invoke(app, ["verify", str(up)])
    assert r.exit_code == 1 and "phi.safetensors" in r.output
    from nobackfill.compat.upgrade import load_upgrade
    from nobackfill.encoders import load_encoder

    with pytest.raises(ValueError, match="phi.safetensors"):
        load_upgrade(up).apply(load_encoder("models/world-new"))
    cfg = up / "phi_config.json"
    shutil.copy("upgrades/world-old-to-new/phi.safetensors", phi)
    cfg.write_text(cfg.read_text().replace('"out_dim": 64', '"out_dim": 65'))
    with pytest.raises(ValueError, match="phi_config.json"):
        load_upgrade(up).apply(load_encoder("models/world-new"))

    model = tmp_path / "model"
    shutil.copytree("models/world-old", model)
    w = model / "model.safetensors"
    w.write_bytes(w.read_bytes()[: len(w.read_bytes()) // 2])
    with pytest.raises(ValueError, match=str(model)):
        load_encoder(model)
    r = runner.invoke(app, ["verify", str(model)])
    assert r.exit_code == 1 and str(model) in r.output


def test_verify_refuses_what_it_does_not_know(tmp_path):
    r = runner.invoke(app, ["verify", str(tmp_path)])
    assert r.exit_code == 2 and "not a gallery, collection, upgrade or model" in r.output
    r = runner.invoke(app, ["verify", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "nope" in r.output


# ----------------------------------------------------------------------------- ingest and messages
def _truncated_stream_png(path: Path, size: int = 24) -> None:
    """A PNG whose every chunk checksum is valid but whose pixel stream stops half-way."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = bytes(np.random.default_rng(0).integers(0, 255, (size, 1 + 3 * size), dtype=np.uint8).ravel())
    stream = zlib.compress(rows)[: len(rows) // 3]  # the deflate stream stops a third of the way in
    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", stream) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A user folder of 6 captioned images + a tiny model; a text-only model beside it."""
    from PIL import Image
    from _late_helpers import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("ingest")
    data = root / "data"
    (data / "images").mkdir(parents=True)
    lines = []
    for k in range(6):
        Image.new("RGB", (32, 32), (40 * k, 100, 200)).save(data / "images" / f"p{k}.png")
        lines.append(json.dumps({"image": f"images/p{k}.png", "caption": f"a photo number {k}", "lang": "en"}))
    (data / "captions.jsonl").write_text("\n".join(lines) + "\n")
    tiny_model(root, "tiny", 16, tiny_tokenizer()).save(root / "model")
    return root


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} if path.exists() else {}


def test_a_truncated_pixel_stream_is_caught_before_embedding(folder, tmp_path):
    from PIL import Image

    data = tmp_path / "data"
    shutil.copytree(folder / "data", data)
    bad = data / "images" / "p3.png"
    _truncated_stream_png(bad)
    with Image.open(bad) as im:
        im.verify()  # the checksums are fine: only a full decode finds it
    out = tmp_path / "g"
    r = runner.invoke(app, ["index", "--model", str(folder / "model"), "--data", str(data), "--out", str(out)])
    assert r.exit_code == 2 and "p3.png" in r.output and "line 4" in r.output, r.output
    assert not (out / "manifest.json").exists()  # nothing committed
    r = runner.invoke(app, ["index", "--model", str(folder / "model"), "--data", str(data), "--out", str(out), "--skip-bad"])
    assert r.exit_code == 0 and "skipped 1" in r.output, r.output
    assert Gallery.open(out).count("image") == 5


def test_a_second_writer_is_told_the_store_is_busy(folder, tmp_path):
    import os

    from nobackfill.storage.local import LocalStorage

    out = tmp_path / "g"
    st = LocalStorage(out)
    out.mkdir()
    args = ["index", "--model", str(folder / "model"), "--data", str(folder / "data"), "--out", str(out)]
    with st.lock("ingest", blocking=False) as taken:
        assert taken
        st.record_holder("ingest")
        before = _snapshot(out)
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "busy" in r.output and f"process {os.getpid()}" in r.output and "--wait" in r.output
        assert _snapshot(out) == before
    r = runner.invoke(app, args + ["--wait"])
    assert r.exit_code == 0, r.output


def test_long_captions_warn_with_the_count_and_empty_queries_are_refused(folder, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(folder / "data", data)
    lines = (data / "captions.jsonl").read_text().splitlines()
    lines[1] = json.dumps({"image": "images/p1.png", "caption": "word " * 20000, "lang": "en"})
    (data / "captions.jsonl").write_text("\n".join(lines) + "\n")
    # over the 2,000 characters a text may have: a bad line, as `collection add` reads it (trial AJ)
    r = runner.invoke(app, ["index", "--model", str(folder / "model"), "--data", str(data), "--out", str(tmp_path / "g")])
    assert r.exit_code == 2 and "line 2: a caption of 100000 characters, longer than the 2000" in r.output, r.output
    lines[1] = json.dumps({"image": "images/p1.png", "caption": "word " * 390, "lang": "en"})
    (data / "captions.jsonl").write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["index", "--model", str(folder / "model"), "--data", str(data), "--out", str(tmp_path / "g")])
    assert r.exit_code == 0 and "1 caption(s) exceed" in r.output and "1950 characters" in r.output, r.output
    assert "line 2" in r.output
    r = runner.invoke(app, ["search", "--gallery", str(tmp_path / "g"), "--model", str(folder / "model"), "--text", ""])
    assert r.exit_code == 2 and "empty" in r.output


def test_a_text_only_model_is_refused_before_anything_is_created(folder, tmp_path):
    out = tmp_path / "g"
    r = runner.invoke(app, ["index", "--model", "models/m30k-old-text", "--data", str(folder / "data"), "--out", str(out)])
    assert r.exit_code == 2 and "no image tower" in r.output, r.output
    assert not out.exists()


def test_a_bridge_for_another_model_names_every_space_by_role(tmp_path):
    from nobackfill.compat.upgrade import load_upgrade
    from nobackfill.encoders import load_encoder

    with pytest.raises(SpaceMismatchError) as e:
        load_upgrade("upgrades/world-old-to-new").apply(load_encoder("models/world-newer"))
    msg = str(e.value)
    assert "upgrade's source" in msg and "world-new" in msg and "world-newer" in msg and "gallery space" in msg


def test_a_bridge_with_the_wrong_output_width_is_named(tmp_path):
    from nobackfill.compat.bridges import ProcrustesBridge

    g = Gallery.create(tmp_path / "g", space_id=SPACE, dim=DIM, model="m")
    g.add("image", ["a"], _unit(np.ones((1, DIM))), space_id=SPACE)
    b = ProcrustesBridge(np.eye(4, 6, dtype=np.float32), "q" * 16, SPACE, name="my-procrustes")
    with pytest.raises(ValueError, match=r"queries must have shape \(N, 8\) .* got \(1, 6\)"):
        g.search("image", b(np.ones((1, 4), np.float32)), 1, space_id=b.target)


def test_one_json_convention(folder, tmp_path):
    """--json prints JSON on stdout, --out FILE writes it, and the old --json FILE still writes."""
    g = tmp_path / "g"
    assert runner.invoke(app, ["index", "--model", str(folder / "model"), "--data", str(folder / "data"),
                               "--out", str(g)]).exit_code == 0
    base = ["eval", "retrieval", "--query-model", str(folder / "model"), "--gallery-model", str(folder / "model"),
            "--data", str(folder / "data")]
    r = runner.invoke(app, base + ["--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["t2i"]["R@1"] >= 0
    r = runner.invoke(app, base + ["--out", str(tmp_path / "a.json")])
    assert r.exit_code == 0 and "t2i" in json.loads((tmp_path / "a.json").read_text())
    r = runner.invoke(app, base + ["--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0 and json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "a.json").read_text())
    r = runner.invoke(app, ["search", "--gallery", str(g), "--model", str(folder / "model"), "--text", "a photo", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["hits"]
    from typer.main import get_command

    root = get_command(app)
    for path in (["index"], ["eval", "retrieval"], ["eval", "compat"], ["collection", "add"], ["reco", "build-memory"]):
        cmd = root
        for part in path:
            cmd = cmd.commands[part]
        (langs,) = [p for p in cmd.params if p.name == "langs"]
        assert langs.default == "" and "every language in the data" in langs.help, path
