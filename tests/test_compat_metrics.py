"""Compatibility metrics on hand cases: Eq. 1 criterion rates, the matrix, AC / AA / ACA, ties."""

from __future__ import annotations

import numpy as np
import pytest

from nobackfill.metrics.compat import (average_accuracy, average_compatibility, average_compatibility_accuracy,
                                       compatibility_matrix, compatibility_summary, criterion_rates,
                                       cross_modal_criterion, empirical_criterion)

G = np.array([[1.0, 0.0], [0.0, 1.0]])  # gallery items 0 and 1 (labels 0, 1)


def test_criterion_hand_case():
    # query 0 (label 0): old query at 45 degrees; new query exactly on its item -> closer to the paired
    # item (satisfied) and farther from the unpaired one (satisfied)
    q_old = np.array([[1.0, 1.0], [1.0, 1.0]])
    q_new = np.array([[1.0, 0.0], [1.0, 0.0]])  # query 1 (label 1) got worse: both inequalities fail
    r = criterion_rates(q_new, q_old, G, [0, 1], [0, 1], n_unpaired=200, seed=0)
    assert r["n_paired"] == 2 and r["paired"] == 0.5
    assert r["unpaired"] == pytest.approx(0.5, abs=0.1)  # (0,1) satisfied, (1,0) not; sampled evenly
    assert r["strict"] is False


def test_criterion_ties_parameter():
    q = np.array([[1.0, 1.0], [1.0, -1.0]])
    loose = criterion_rates(q, q, G, [0, 1], [0, 1], n_unpaired=50)  # new == old: every pair ties
    strict = criterion_rates(q, q, G, [0, 1], [0, 1], n_unpaired=50, strict=True)
    assert (loose["paired"], loose["unpaired"]) == (1.0, 1.0)
    assert (strict["paired"], strict["unpaired"]) == (0.0, 0.0)


def test_cross_modal_criterion_directions():
    rng = np.random.default_rng(0)
    old_i, old_t = rng.normal(size=(4, 3)), rng.normal(size=(8, 3))
    c2i = np.repeat(np.arange(4), 2)
    out = cross_modal_criterion(old_t, old_i, old_t, old_i, c2i, n_unpaired=100)
    assert set(out) == {"w_new/v_old", "v_new/w_old"}
    assert out["w_new/v_old"]["n_paired"] == 8 and out["v_new/w_old"]["n_paired"] == 8
    assert out["w_new/v_old"]["paired"] == 1.0  # identical models tie everywhere


C = np.array([[0.40, np.nan, np.nan],
              [0.50, 0.80, np.nan],
              [0.40, 0.85, 0.90]])


def test_matrix_metrics_by_hand():
    # pairs (t,k): (2,1) .50>.40 yes; (3,1) .40>.40 tie; (3,2) .85>.80 yes
    assert average_compatibility(C) == pytest.approx(2 / 3)
    assert average_compatibility(C, strict=False) == pytest.approx(1.0)
    assert average_compatibility_accuracy(C) == pytest.approx((0.50 + 0.85) / 3)
    assert average_compatibility_accuracy(C, strict=False) == pytest.approx((0.50 + 0.40 + 0.85) / 3)
    assert average_accuracy(C) == pytest.approx((0.40 + 0.50 + 0.80 + 0.40 + 0.85 + 0.90) / 6)
    s = compatibility_summary(C, names=["a", "b", "c"])
    assert s["C"][0][1] is None and s["C"][2][1] == 0.85
    assert [p["compatible"] for p in s["pairs"]] == [True, False, True]
    assert empirical_criterion(0.5, 0.5) is False and empirical_criterion(0.5, 0.5, strict=False) is True


def test_compatibility_matrix_from_a_score_function():
    m = compatibility_matrix(lambda t, k: 10 * t + k, 3)
    assert m[2, 1] == 21 and np.isnan(m[0, 1])
    assert compatibility_matrix(lambda t, k: 1.0, 2, full=True)[0, 1] == 1.0
    with pytest.raises(ValueError):
        average_accuracy(np.full((2, 2), np.nan))
    assert np.isnan(average_compatibility(np.array([[0.5]])))
