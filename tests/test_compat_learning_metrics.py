"""Compatibility metrics as the tutorial defines them (Biondi et al.'s tutorial), flips, and class-matched search."""

from __future__ import annotations

import numpy as np
import pytest

from nobackfill.metrics.class_search import common_space, pad_to, search_accuracy, top1_hits
from nobackfill.metrics.compat import (average_accuracy, average_compatibility, average_compatibility_accuracy,
                                       compatibility_summary)
from nobackfill.metrics.flips import (flip_rates, negative_flip_rate, positive_flip_rate, prediction_flip_rates,
                                      relative_nfr, score_flip_rates)

NAN = np.nan


def test_ac_aa_aca_match_the_tutorial_equations():
    # T = 3: pairs (2,1) 0.5 > 0.4 yes, (3,1) 0.3 > 0.4 no, (3,2) 0.7 > 0.6 yes
    c = np.array([[0.4, NAN, NAN], [0.5, 0.6, NAN], [0.3, 0.7, 0.8]])
    T = 3
    assert average_compatibility(c) == pytest.approx(2 / (T * (T - 1)) * 2)
    assert average_compatibility_accuracy(c) == pytest.approx(2 / (T * (T - 1)) * (0.5 + 0.7))
    assert average_accuracy(c) == pytest.approx(2 / (T * (T + 1)) * (0.4 + 0.5 + 0.6 + 0.3 + 0.7 + 0.8))


def test_tie_is_incompatible_by_default():
    c = np.array([[0.5, NAN], [0.5, 0.9]])
    assert average_compatibility(c) == 0.0  # the tutorial's strict ">"
    assert average_compatibility(c, strict=False) == 1.0
    s = compatibility_summary(c)
    assert s["strict"] is True and s["AC"] == 0.0 and s["ACA"] == 0.0


def test_flip_rates_hand_computed():
    old = [True, True, False, False]
    new = [True, False, True, False]
    r = flip_rates(old, new)
    assert r["NFR"] == 0.25 and r["PFR"] == 0.25 and r["ER_old"] == 0.5 and r["ER_new"] == 0.5
    assert r["rel_NFR"] == pytest.approx(0.25 / (0.5 * 0.5))
    labels = [0, 1, 2, 3]
    old_pred, new_pred = [0, 1, 0, 0], [0, 0, 2, 0]
    assert negative_flip_rate(old_pred, new_pred, labels) == 0.25
    assert positive_flip_rate(old_pred, new_pred, labels) == 0.25
    assert relative_nfr(old_pred, new_pred, labels) == pytest.approx(1.0)
    assert prediction_flip_rates(old_pred, old_pred, labels)["NFR"] == 0.0
    assert np.isnan(flip_rates([True], [True])["rel_NFR"])  # ER_new = 0


def test_flip_rates_reject_bad_input():
    with pytest.raises(ValueError, match="samples"):
        flip_rates([True], [True, False])
    with pytest.raises(ValueError, match="equal lengths"):
        prediction_flip_rates([0], [0], [0, 1])


def test_score_flip_rates():
    r = score_flip_rates([0.5, 0.5, 0.5], [0.4, 0.5, 0.9])
    assert r["NFR"] == pytest.approx(1 / 3) and r["PFR"] == pytest.approx(1 / 3)


def test_class_search_with_padding():
    gallery = np.array([[1.0, 0.0], [0.0, 1.0]])
    query = np.array([[0.9, 0.1, 5.0], [0.1, 0.9, -5.0]])  # the third coordinate does not change rankings
    hits = top1_hits(query, gallery, [7, 8], [7, 8])
    assert hits.tolist() == [True, True]
    assert search_accuracy(query, gallery, [8, 8], [7, 8]) == 0.5
    q, g = common_space(query, gallery)
    assert q.shape == g.shape == (2, 3)
    assert np.allclose(np.linalg.norm(g, axis=1), 1)
    with pytest.raises(ValueError, match="pad"):
        pad_to(query, 2)
    with pytest.raises(ValueError, match="labels"):
        top1_hits(query, gallery, [1], [1, 2])


def test_junk_rule_drops_same_class_same_group_gallery_items():
    """Market-1501's rule: the query's class in the query's group is junk; other classes in the
    query's group stay as distractors; a query left without candidates is a miss."""
    gallery = np.array([[1.0, 0.0], [0.9, 0.2], [0.0, 1.0]], np.float32)
    g_labels, g_groups = [0, 1, 0], [5, 5, 6]
    query = np.array([[1.0, 0.05]], np.float32)  # nearest: item 0 (class 0, group 5), then 1, then 2
    assert top1_hits(query, gallery, [0], g_labels).tolist() == [True]
    # item 0 is junk -> the nearest candidate is item 1 (class 1, same group: a distractor) -> miss
    assert top1_hits(query, gallery, [0], g_labels, query_groups=[5], gallery_groups=g_groups).tolist() == [False]
    # another group: nothing is junk
    assert top1_hits(query, gallery, [0], g_labels, query_groups=[7], gallery_groups=g_groups).tolist() == [True]
    # distractor gone: item 2 (class 0, other group) is found
    assert search_accuracy(query, gallery[[0, 2]], [0], [0, 0], [5], [5, 6]) == 1.0
    # every gallery item is junk -> a miss, not an error
    assert top1_hits(query, gallery[[0]], [0], [0], query_groups=[5], gallery_groups=[5]).tolist() == [False]
    with pytest.raises(ValueError, match="both or neither"):
        top1_hits(query, gallery, [0], g_labels, query_groups=[5])
    with pytest.raises(ValueError, match="groups"):
        top1_hits(query, gallery, [0], g_labels, query_groups=[5], gallery_groups=[5])


def test_verification_pairs_are_memoised_and_returned_as_copies():
    from nobackfill.metrics.class_search import verification_pairs

    ql, gl = np.arange(40) % 4, np.arange(60) % 4
    a = verification_pairs(ql, gl, n_pairs=50, seed=3)
    a[0][:] = -1  # the caller's copy only
    b = verification_pairs(ql, gl, n_pairs=50, seed=3)
    assert (b[0] >= 0).all() and np.array_equal(ql[b[0]] == gl[b[1]], b[2]) and b[2].sum() == 50
    c = verification_pairs(ql, gl, n_pairs=50, seed=4)
    assert not np.array_equal(b[0], c[0])
