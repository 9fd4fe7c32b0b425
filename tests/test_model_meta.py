"""What a model directory's encoder is, remembered once it was loaded (``nobackfill.encoders.meta``),
so that a trusted import, which embeds nothing, loads neither torch nor the weights; any change to the
directory's files makes it unknown again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nobackfill.encoders import meta
from nobackfill.search.models import ModelPool

ROOT = Path(__file__).resolve().parents[1]
WORLD_OLD = ROOT / "models" / "world-old"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NOBACKFILL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(WORLD_OLD, d)
    return d


def test_a_model_is_remembered_once_a_pool_loaded_it_and_checked_its_space(cache, model_dir):
    assert meta.remembered(model_dir) is None
    pool = ModelPool()
    enc = pool.get(str(model_dir))
    assert meta.remembered(model_dir) is None  # no fingerprint computed yet: nothing recorded
    pool.get(str(model_dir), enc.space_id)
    info = meta.remembered(model_dir)
    assert info == meta.ModelInfo(enc.space_id, enc.embed_dim, enc.name, tuple(enc.modalities))
    assert [p.parent.name for p in cache.rglob("*.json")] == ["models"]


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_any_change_to_the_directory_forgets_it(cache, model_dir, change):
    pool = ModelPool()
    pool.get(str(model_dir), pool.get(str(model_dir)).space_id)
    assert meta.remembered(model_dir) is not None
    cfg = model_dir / "config.json"
    if change == "edit":
        os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 1_000_000))
    elif change == "add":
        (model_dir / "extra.bin").write_bytes(b"x")
    else:
        next(p for p in model_dir.iterdir() if p.is_file() and p.name != "config.json").unlink()
    assert meta.remembered(model_dir) is None


def test_an_encoder_put_into_a_pool_is_never_remembered(cache, model_dir):
    class Stub:
        space_id, embed_dim, name, modalities = "not-the-model", 3, "stub", ("text",)

    pool = ModelPool()
    pool.put(str(model_dir), Stub())
    pool.get(str(model_dir), "not-the-model")
    pool.remember(str(model_dir))
    assert meta.remembered(model_dir) is None


def test_an_unreadable_or_foreign_record_is_not_known(cache, model_dir):
    pool = ModelPool()
    pool.get(str(model_dir), pool.get(str(model_dir)).space_id)
    (record,) = cache.rglob("*.json")
    record.write_text("{not json")
    assert meta.remembered(model_dir) is None
    assert meta.remembered("minilm") is None and meta.remembered(model_dir / "nowhere") is None


def test_a_trusted_import_of_a_remembered_model_loads_no_torch(tmp_path, cache, model_dir):
    """The first trusted import loads the model (and records it); the next one, into a new
    collection, knows it from the record: no torch, the same space; the collection then searches
    with the real model."""
    from nobackfill.client.local import LocalClient

    x = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp_path / "v.npy", x)
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps({"id": f"t{i}", "text": f"caption {i}"}) + "\n" for i in range(20)))
    LocalClient(tmp_path / "first").import_(f"npy:{tmp_path / 'v.npy'}", table=table, id_column="id",
                                            source_column="text", model=model_dir, modality="text",
                                            trust_model=True)
    code = ("import json, sys\nfrom nobackfill.client.local import LocalClient\n"
            "cl = LocalClient(sys.argv[1])\n"
            "kw = dict(table=sys.argv[4], id_column='id', source_column='text', modality='text', trust_model=True)\n"
            "rep = cl.import_('npy:' + sys.argv[2], model=sys.argv[3], **kw)\n"
            "again = cl.import_('npy:' + sys.argv[2], **kw)\n"
            "print(json.dumps([rep.added, again.unchanged, 'torch' in sys.modules, cl.status()['current']]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "second"), str(tmp_path / "v.npy"), str(model_dir),
                        str(table)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "NOBACKFILL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr[-2000:]
    added, unchanged, torch_loaded, current = json.loads(r.stdout.strip().splitlines()[-1])
    first = LocalClient(tmp_path / "first")
    assert added == 20 and unchanged == 20 and not torch_loaded
    assert current == first.status()["current"]
    hits = LocalClient(tmp_path / "second").search(text="a red circle", k=3)  # the real model answers
    assert len(hits.hits) == 3
