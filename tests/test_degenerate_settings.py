"""Settings that made a run do nothing or train nothing, without a word, are refused before any work
(trial R): a contrastive batch of 1 ("loss 0.000": no negatives), no candidates to re-rank, a
near-duplicate cosine above 1, no unpaired samples (a nan rate), a sequence of one model (AC nan)."""

from __future__ import annotations

import pytest


def test_contrastive_configs_need_two_pairs_a_batch():
    from nobackfill.compat.xbt import XBTConfig
    from nobackfill.encoders.zoo import RecipeSpec
    from nobackfill.late.world import LateTrainConfig
    from nobackfill.reco.train import RecoTrainConfig

    for cls in (XBTConfig, LateTrainConfig, RecipeSpec, RecoTrainConfig):
        with pytest.raises(ValueError, match="batch_size >= 2|batch_size must be >= 2"):
            cls(batch_size=1)
        assert cls(batch_size=2).batch_size == 2


def test_a_compatibility_sequence_needs_two_models():
    from nobackfill.compat.learning.sequence import SequenceConfig

    with pytest.raises(ValueError, match="must be >= 2"):
        SequenceConfig(steps=1)


def test_rerank_threshold_and_unpaired_samples_out_of_range_are_refused(tmp_path):
    from nobackfill.late.rerank import rerank_pairs
    from nobackfill.reco.memory import build_memory
    from nobackfill.search.compat_report import compat_report

    with pytest.raises(ValueError, match="rerank_k must be >= 1"):
        rerank_pairs(None, None, 0)
    for threshold in (1.5, -1.0):
        with pytest.raises(ValueError, match=r"threshold is a cosine in \(-1, 1\]"):
            build_memory(None, None, tmp_path / "m", threshold=threshold)
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="n_unpaired must be >= 1"):
        compat_report(None, None, None, n_unpaired=0)


def test_evaluation_data_names_a_missing_split_and_a_multi30k_root(tmp_path):
    """trial R: `eval`, `--calibrate-split` and `lingual eval` said "no captions.jsonl here nor in
    w/bogus" for an unknown split and for a Multi30K root, where `collection add` named the splits."""
    from nobackfill.data.world import WorldSpec, generate_world
    from nobackfill.evaluate import resolve_data

    w = generate_world(tmp_path / "w", WorldSpec(n_train=2, n_val=0, n_test=2, langs=("en",)), workers=1,
                       progress=False)
    assert resolve_data(w, "test") == w / "test"
    with pytest.raises(FileNotFoundError, match=r"a world root with no split 'val' \(its splits: test, train\)"):
        resolve_data(w, "val")
    (tmp_path / "m30k" / "task1" / "raw").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="a Multi30K root .* bench xbt-text"):
        resolve_data(tmp_path / "m30k", "test")


def test_training_on_a_split_folder_of_a_world_reads_that_folder(tmp_path):
    """trial R: `train --data w/train` streamed w's scenes (its world.json is one folder up) and never
    read the folder's files: the model was bit-identical to one trained with --data w."""
    import json

    from nobackfill.data.world import WorldSpec, generate_world
    from nobackfill.train.world_model import train_preset

    w = generate_world(tmp_path / "w", WorldSpec(n_train=64, n_val=0, n_test=0, langs=("en",)), workers=1,
                       progress=False)
    train_preset("world-tiny", w / "train", tmp_path / "m", steps=1, threads=1, eval_size=4, progress=False)
    recipe = json.loads((tmp_path / "m" / "recipe.json").read_text())
    assert recipe["world"] is None and recipe["data"] == str(w / "train")


def test_a_default_that_names_a_shipped_model_is_found_from_any_working_directory(tmp_path, monkeypatch):
    """trial R: `compat train`'s backbone, `upgrade xbt-text --old` and `late train --teacher` default to
    models/..., which failed outside the repository (naming a flag the user never typed)."""
    from pathlib import Path

    from nobackfill.encoders.zoo import shipped

    monkeypatch.chdir(tmp_path)
    found = shipped("models/world-new")
    assert found.is_absolute() and (found / "model.safetensors").is_file()
    (tmp_path / "models" / "world-new").mkdir(parents=True)  # the user's own, in the working directory, wins
    assert shipped("models/world-new") == Path("models/world-new")
    assert shipped("models/no-such-model") == Path("models/no-such-model")  # its own error names it


@pytest.mark.parametrize("backend, says", [("IVF9999,Zork", "could not parse code description Zork"),
                                           ("PQ17", "should be a multiple of the number of subquantizers"),
                                           ("hnsw:M=0", "hnsw options must be >= 1"),
                                           ("IVF8,Flat:nprobe=0",
                                            r"option nprobe must be in \[1, 2147483647\], got 0 in 'IVF8,Flat:nprobe=0'"),
                                           ("HNSW32:efSearch=-1", "option efSearch must be in .*, got -1 in"),
                                           # trial AM: past faiss' int, and an option the index lacks
                                           ("IVF16,PQ8:nprobe=2147483648", "got 2147483648 in"),
                                           ("HNSW32:nprobe=4", "option nprobe does not apply to the index 'HNSW32'"),
                                           ("IVF8,Flat:efSearch=64", "option efSearch does not apply"),
                                           ("HNSW32:efSearch=64,efSearch=32", "'efSearch' is given twice"),
                                           ("HNSW32:efSearch=64:efSearch=32", "options are separated by ','"),
                                           ("hnsw32", "in faiss' capitals")])
def test_an_index_spec_that_cannot_be_built_is_refused_before_anything_is_stored(tmp_path, backend, says):
    """trial U: `collection create --backend IVF9999,Zork` was accepted and every later search failed
    with faiss' C++ internals."""
    from nobackfill.collection.collection import Collection
    from nobackfill.gallery.gallery import Gallery

    with pytest.raises(ValueError, match=says) as e:
        Collection.create(tmp_path / "c", space_id="s", dim=64, model="m", backend=backend)
    assert "faiss::" not in str(e.value) and ".cpp" not in str(e.value)
    with pytest.raises(ValueError, match=says):
        Gallery.create(tmp_path / "g", space_id="s", dim=64, model="m", backend=backend)
    assert not (tmp_path / "c").exists() and not (tmp_path / "g").exists()


@pytest.mark.parametrize("backend", ["IVF8,Flat:nprobe=0", "HNSW32:efSearch=0", "IVF8,Flat:efSearch=4,nprobe=-1"])
def test_a_faiss_search_parameter_below_1_is_refused_when_parsed_and_when_an_index_opens(tmp_path, backend):
    """trial AL: `--backend IVF8,Flat:nprobe=0` was accepted at create and import, and every search
    failed with faiss' RuntimeError ('cur_nprobe > 0' failed); an index stored with such a string (an
    older build's) is refused with the same line when it opens."""
    import numpy as np

    from nobackfill.ann.backends import load_index, make_index, validate_spec
    from nobackfill.collection.collection import Collection

    with pytest.raises(ValueError, match=r"faiss search option \w+ must be in \[1, 2147483647\], got -?\d+ in '"):
        validate_spec(backend)
    with pytest.raises(ValueError, match="must be in"):
        Collection.check_new(tmp_path / "c", backend)  # (before a model loads)
    assert not (tmp_path / "c").exists()
    good = make_index(backend.split(":")[0], 16)
    good.add(np.random.default_rng(0).standard_normal((400, 16)).astype(np.float32))
    with pytest.raises(ValueError, match="faiss search option .* must be in") as e:
        load_index(backend, 16, good.to_bytes())
    assert "cur_nprobe" not in str(e.value) and ".cpp" not in str(e.value)
