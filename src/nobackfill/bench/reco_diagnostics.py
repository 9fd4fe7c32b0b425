"""Diagnostics of ``bench reco``: the RECO premise per attribute before any training, the extra
latency of the kNN + fusion step, and the near-duplicate calibration of the memory's test-item
removal."""

from __future__ import annotations

import time

import numpy as np

from ..data.labels import PREMISE_ATTRIBUTES, LabelSet, attribute_values
from ..metrics.zero_shot import knn_label_agreement, knn_neighbours, knn_vote_accuracy

def premise_diagnostics(memory, memory_attrs: dict[str, np.ndarray], memory_single: np.ndarray, s,
                        ls: LabelSet, classes: np.ndarray, base_named: dict[str, float], k: int) -> dict:
    """Does the RECO premise hold for this base + memory (on split ``s``, no training), per attribute of
    :data:`PREMISE_ATTRIBUTES` and for the classes of label set ``ls`` (``"fine"``)?

    * ``image_neighbours``: how many of each image's ``k`` nearest memory IMAGES share its value (v->v search:
      what KNN_t^{v->v} hands to phi_image);
    * ``prompt_neighbours``: for each class of ``ls`` (its prompt-ensemble vector ``classes``), how many of its
      ``k`` nearest memory TEXTS describe a scene with the class's value (t->t search: what phi_text gets);
    * ``knn_vote``: accuracy of a majority vote over the image neighbours' labels;
    * ``linear_probe``: a SUPERVISED ceiling - softmax regression (:mod:`nobackfill.reco.probe`) fitted on
      the memory's labelled frozen image embeddings, scored on the split: how much of the label the frozen
      image embedding carries linearly (refining only the prompts is a linear classifier of it); the fine
      class also with a probe fitted on single-object memory images;
    * ``base_zero_shot``: how well the base NAMES each attribute (``base_named``: the attribute of the base's
      zero-shot prediction, from a label set that contains it) - the premise is a label the image tower
      encodes (probe far above chance) but the base names badly;
    * ``chance``: 1 / number of values.
    """
    from ..reco.probe import linear_probe_predictions

    V, T = memory.vectors("image"), memory.vectors("text")
    nn_img = knn_neighbours(s.images, V, k)
    nn_txt = memory.text_image[knn_neighbours(classes, T, k)]
    values = attribute_values() | {"fine": ls.parts}
    mem = dict(memory_attrs) | {"fine": ls.labels(memory_attrs)}
    qry = dict(s.attrs) | {"fine": s.labels[ls.name]}
    out: dict = {"k": k, "label_set": ls.name, "image_neighbours": {}, "prompt_neighbours": {}, "knn_vote": {},
                 "linear_probe": {}, "base_zero_shot": {}, "chance": {}}
    for a in (*PREMISE_ATTRIBUTES, "fine"):
        ids = {v: i for i, v in enumerate(values[a])} if a != "fine" else None
        y_mem = mem[a] if ids is None else np.array([ids[v] for v in mem[a]])
        y_s = qry[a] if ids is None else np.array([ids[v] for v in qry[a]])
        n = len(values[a])
        out["image_neighbours"][a] = {"all": knn_label_agreement(nn_img, y_s, y_mem),
                                      "single_object": knn_label_agreement(nn_img, y_s, y_mem, s.single)}
        if a == "fine" or a in ls.attributes:
            q_cls = np.arange(n) if a == "fine" else np.array([ids[p[ls.attributes.index(a)]] for p in ls.parts])
            out["prompt_neighbours"][a] = knn_label_agreement(nn_txt, q_cls, y_mem)
        out["knn_vote"][a] = {"all": knn_vote_accuracy(nn_img, y_s, y_mem, n),
                              "single_object": knn_vote_accuracy(nn_img, y_s, y_mem, n, s.single)}
        hit = linear_probe_predictions(V, y_mem, s.images, n) == y_s
        out["linear_probe"][a] = {"all": float(hit.mean()),
                                  "single_object": float(hit[s.single].mean()) if s.single.any() else None}
        out["base_zero_shot"][a] = base_named.get(a)
        out["chance"][a] = 1 / n
    rows = np.asarray(memory_single, bool)
    if rows.any():
        hit = linear_probe_predictions(V[rows], mem["fine"][rows], s.images, len(ls.parts)) == qry["fine"]
        out["linear_probe"]["fine_trained_on_single_object"] = {
            "all": float(hit.mean()), "single_object": float(hit[s.single].mean()) if s.single.any() else None}
    return out


def measure_latency(model, memory, queries: np.ndarray, modality: str, n: int) -> dict:
    """Milliseconds per query of the kNN search and of the fusion forward, one query at a time and
    in one batch (current torch threads)."""
    import torch

    q = queries[:n]
    t0 = time.perf_counter()
    rets = [model.retrieve(memory, q[i:i + 1], modality) for i in range(len(q))]
    t1 = time.perf_counter()
    with torch.no_grad():
        for i in range(len(q)):
            model.fuse(modality, torch.tensor(q[i:i + 1]), torch.tensor(rets[i]))
    t2 = time.perf_counter()
    r = model.retrieve(memory, q, modality)
    t3 = time.perf_counter()
    with torch.no_grad():
        model.fuse(modality, torch.tensor(q), torch.tensor(r))
    t4 = time.perf_counter()
    ms = lambda s: round(1000 * s / len(q), 4)
    return {"queries": int(len(q)), "single_knn_ms": ms(t1 - t0), "single_fusion_ms": ms(t2 - t1),
            "single_total_ms": ms(t2 - t0), "batched_knn_ms": ms(t3 - t2), "batched_fusion_ms": ms(t4 - t3),
            "batched_total_ms": ms(t4 - t2), "memory_images": memory.gallery.count("image"),
            "memory_texts": memory.gallery.count("text")}


def near_duplicate_calibration(enc, spec, memory_ds, exclude_ds: list, threshold: float, n_scenes: int) -> dict:
    """Catch rate of re-rendered copies (same scene, fresh pixel noise) and how much of the memory
    each detector would remove, at ``threshold``: pixels (thumbnails) vs the encoder's embedding."""
    from ..data.render import render_scene
    from ..data.world import make_item
    from ..reco.memory import thumbnail_features

    orig, copy = [], []
    for i in range(n_scenes):
        scene, px = make_item(spec.seed, "test", i, spec.concepts)
        orig.append(px)
        copy.append(render_scene(scene, np.random.default_rng([12345, i])))
    orig, copy = np.stack(orig), np.stack(copy)

    def thumbs(px: np.ndarray) -> np.ndarray:
        from PIL import Image

        out = np.stack([np.asarray(Image.fromarray(p).resize((16, 16), Image.BOX), np.float32).ravel() for p in px])
        out -= out.mean(axis=1, keepdims=True)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)

    ex_paths = [p for d in exclude_ds for p in d.image_paths()]
    mem_paths = memory_ds.image_paths()
    res = {"threshold": threshold, "scenes": n_scenes, "memory_source_images": len(mem_paths)}
    for name, f_px, f_paths in (
            ("pixels", thumbs, thumbnail_features),
            ("embedding", enc.encode_images, enc.encode_images)):
        a, b = f_px(orig), f_px(copy)
        same = (a * b).sum(1)
        mem, ex = f_paths(mem_paths), f_paths(ex_paths)
        best = np.concatenate([(mem[s:s + 4096] @ ex.T).max(1) for s in range(0, len(mem), 4096)])
        res[name] = {"copies_caught": float((same > threshold).mean()),
                     "memory_removed": int((best > threshold).sum()),
                     "memory_removed_frac": float((best > threshold).mean())}
    return res
