"""Zero-shot classification and the diagnostics that explain it (RECO benchmark, Iscen et al. 2023).

* :func:`zero_shot_accuracy`: top-1 of ``argmax_c cos(image, prompt_c)`` (the RECO paper's zero-shot
  transfer, Sec. 4.2: class-name prompts embedded by the text tower).
* :func:`attribute_accuracy`: for composite classes (e.g. ``size x colour x shape``), how often the
  predicted class has the right value of each attribute - which part of a fine-grained label a
  model gets wrong.
* :func:`knn_label_agreement` / :func:`knn_vote_accuracy`: how label-consistent the uni-modal
  neighbourhoods are (the RECO premise, Sec. 1: "matching representations within the same modality
  is simpler than across modalities"; retrieved knowledge helps only if the neighbours share the
  query's label).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _masked_mean(hit: np.ndarray, mask: np.ndarray | None) -> float:
    hit = hit if mask is None else hit[np.asarray(mask, bool)]
    return float(hit.mean()) if hit.size else float("nan")


def zero_shot_accuracy(images: np.ndarray, prompts: np.ndarray, labels: np.ndarray,
                       mask: np.ndarray | None = None) -> float:
    """Top-1 accuracy of ``argmax_c cos(image, prompt_c)`` (rows are unit vectors); ``mask`` selects
    the images scored."""
    return _masked_mean(zero_shot_predictions(images, prompts) == np.asarray(labels), mask)


def zero_shot_predictions(images: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    """``argmax_c cos(image, prompt_c)`` for every image row."""
    return (np.asarray(images) @ np.asarray(prompts).T).argmax(axis=1)


def attribute_accuracy(pred: np.ndarray, labels: np.ndarray, parts: Sequence[Sequence[str]],
                       attributes: Sequence[str], mask: np.ndarray | None = None) -> dict[str, float]:
    """Per attribute ``a``: the fraction of images whose predicted class has the labelled class's value
    of ``a``. ``parts[c]`` are the attribute values of class ``c`` in the order of ``attributes``."""
    table = np.asarray(parts, dtype=object)
    if table.ndim != 2 or table.shape[1] != len(attributes):
        raise ValueError(f"parts must be (classes, {len(attributes)}) attribute values, got shape {table.shape}")
    pred, labels = np.asarray(pred), np.asarray(labels)
    return {a: _masked_mean(table[pred, i] == table[labels, i], mask) for i, a in enumerate(attributes)}


def knn_neighbours(queries: np.ndarray, keys: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """Rows ``(Q, k)`` of the ``k`` most cosine-similar keys of each query (unit rows), best first."""
    if not 1 <= k <= keys.shape[0]:
        raise ValueError(f"k must be in [1, {keys.shape[0]}], got {k}")
    out = np.empty((queries.shape[0], k), np.int64)
    for s in range(0, queries.shape[0], chunk):
        sim = queries[s:s + chunk] @ keys.T
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sim, top, axis=1), axis=1, kind="stable")
        out[s:s + chunk] = np.take_along_axis(top, order, axis=1)
    return out


def knn_label_agreement(neighbours: np.ndarray, query_labels: Sequence, key_labels: Sequence,
                        mask: np.ndarray | None = None) -> float:
    """Fraction of (query, neighbour) pairs whose labels are equal; ``neighbours`` from
    :func:`knn_neighbours`."""
    q = np.asarray(query_labels, dtype=object)[:, None]
    return _masked_mean((np.asarray(key_labels, dtype=object)[neighbours] == q).mean(axis=1), mask)


def knn_vote_accuracy(neighbours: np.ndarray, query_labels: np.ndarray, key_labels: np.ndarray, n_classes: int,
                      mask: np.ndarray | None = None) -> float:
    """Accuracy of a majority vote over the neighbours' integer labels (ties: lowest class id)."""
    votes = np.zeros((neighbours.shape[0], n_classes), np.int64)
    np.add.at(votes, (np.repeat(np.arange(neighbours.shape[0]), neighbours.shape[1]), key_labels[neighbours].ravel()), 1)
    return _masked_mean(votes.argmax(axis=1) == np.asarray(query_labels), mask)


__all__ = ["attribute_accuracy", "knn_label_agreement", "knn_neighbours", "knn_vote_accuracy",
           "zero_shot_accuracy", "zero_shot_predictions"]


def class_vectors(prompt_embeddings: np.ndarray) -> np.ndarray:
    """Zero-shot classifier ``(C, d)`` from prompt embeddings ``(C, n, d)``: the normalised mean of each
    class's (refined) prompt embeddings."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

    return unit(unit(np.asarray(prompt_embeddings, np.float32)).mean(axis=1)).astype(np.float32)
