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
