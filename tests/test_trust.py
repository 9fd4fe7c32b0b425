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
from nobackfill.index.store import CorruptGalleryError, Gallery, GalleryError, SpaceMismatchError

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
    with pytest.raises(CorruptGalleryError, match="verify"):
        Gallery.open(root).search("image", np.ones((1, DIM), np.float32), 3, space_id=SPACE)
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
