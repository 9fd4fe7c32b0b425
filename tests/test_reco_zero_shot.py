"""Zero-shot metrics and the RECO premise diagnostics (metrics/zero_shot.py), on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nobackfill.metrics.zero_shot import (attribute_accuracy, knn_label_agreement, knn_neighbours, knn_vote_accuracy,
                                          zero_shot_accuracy, zero_shot_predictions)


def unit(*rows):
    a = np.asarray(rows, np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def test_zero_shot_accuracy_and_mask():
    prompts = unit([1, 0], [0, 1])
    images = unit([1, 0.1], [0.2, 1], [1, 0.3])
    labels = np.array([0, 1, 1])
    assert list(zero_shot_predictions(images, prompts)) == [0, 1, 0]
    assert zero_shot_accuracy(images, prompts, labels) == pytest.approx(2 / 3)
    assert zero_shot_accuracy(images, prompts, labels, np.array([False, True, True])) == pytest.approx(0.5)
    assert math.isnan(zero_shot_accuracy(images, prompts, labels, np.zeros(3, bool)))


def test_attribute_accuracy_counts_each_part():
    parts = [("small", "red"), ("small", "blue"), ("large", "red")]
    pred, labels = np.array([1, 2, 0]), np.array([0, 0, 0])  # right size, right colour, exact
    acc = attribute_accuracy(pred, labels, parts, ("size", "colour"))
    assert acc == {"size": pytest.approx(2 / 3), "colour": pytest.approx(2 / 3)}
    assert attribute_accuracy(pred, labels, parts, ("size", "colour"), np.array([True, False, False])) == \
        {"size": 1.0, "colour": 0.0}
    with pytest.raises(ValueError, match="attribute values"):
        attribute_accuracy(pred, labels, parts, ("size",))


def test_knn_neighbours_order_agreement_and_vote():
    keys = unit([1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9])
    queries = unit([1, 0.05], [0.05, 1])
    nn = knn_neighbours(queries, keys, 2)
    assert nn.tolist() == [[0, 1], [2, 3]]
    key_labels = np.array([0, 1, 1, 1])
    # query 0: neighbours labelled 0, 1 -> 1/2 agree with label 0; query 1: both 1 -> 2/2
    assert knn_label_agreement(nn, [0, 1], key_labels) == pytest.approx(0.75)
    assert knn_label_agreement(nn, ["a", "b"], np.array(["a", "x", "b", "b"], dtype=object)) == pytest.approx(0.75)
    # votes: query 0 ties 0/1 -> lowest id 0 (right); query 1 -> 1 (right)
    assert knn_vote_accuracy(nn, np.array([0, 1]), key_labels, 2) == 1.0
    assert knn_vote_accuracy(nn, np.array([1, 1]), key_labels, 2) == 0.5
    with pytest.raises(ValueError, match="k must be"):
        knn_neighbours(queries, keys, 5)


def test_linear_probe_separable_and_uninformative():
    from nobackfill.reco.probe import linear_probe_predictions

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    informative = np.eye(3)[y] + 0.05 * rng.standard_normal((300, 3))
    pred = linear_probe_predictions(informative[:200], y[:200], informative[200:], 3, steps=100)
    assert (pred == y[200:]).mean() == 1.0
    noise = rng.standard_normal((300, 3))  # carries nothing about y: near chance (1/3)
    assert (linear_probe_predictions(noise[:200], y[:200], noise[200:], 3, steps=100) == y[200:]).mean() < 0.6
    with pytest.raises(ValueError, match="as many labels"):
        linear_probe_predictions(informative[:10], y[:5], informative, 3)


def test_label_sets_prompts_and_labels():
    from nobackfill.data.labels import LABEL_SETS, label_set
    from nobackfill.data.scene import SHAPES

    sct = label_set("size_colour_texture")
    assert len(sct.parts) == 2 * 8 * 4 and sct.attributes == LABEL_SETS["size_colour_texture"]
    # no shape in the set: one prompt per shape (ensemble); a plain texture is not named, as in captions
    i = sct.parts.index(("small", "red", "striped"))
    assert sct.prompts[i] == [f"a photo of a small red striped {sh}" for sh in SHAPES]
    assert sct.prompts[sct.parts.index(("large", "blue", "plain"))][0] == "a photo of a large blue circle"
    scs = label_set("size_colour_shape")
    assert len(scs.parts) == 128 and scs.prompts[scs.parts.index(("small", "red", "ring"))] == ["a photo of a small red ring"]
    assert label_set("colour_shape").prompts[0] == ["a photo of a red circle"]
    attrs = {"size": np.array(["large", "small"]), "colour": np.array(["blue", "red"]),
             "texture": np.array(["plain", "striped"]), "shape": np.array(["ring", "star"])}
    assert list(sct.labels(attrs)) == [sct.parts.index(("large", "blue", "plain")), i]
    with pytest.raises(ValueError, match="unknown label set"):
        label_set("shape_only")


def test_class_vectors_average_normalised_prompts():
    from nobackfill.metrics.zero_shot import class_vectors

    E = np.array([[[2, 0], [0, 1]], [[0, 3], [0, 1]]], np.float32)  # (classes, prompts, dim), not unit
    c = class_vectors(E)
    assert np.allclose(c, [[math.sqrt(0.5), math.sqrt(0.5)], [0, 1]], atol=1e-6)
