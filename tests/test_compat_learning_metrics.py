"""Compatibility metrics as the tutorial defines them (seed 002), flips, and class-matched search."""

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
