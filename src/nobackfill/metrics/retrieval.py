"""Cross-modal retrieval metrics (R@K, median rank, mAP) under the XBT evaluation protocol.

Protocol (XBT paper, Sec. 4.1): every sample is both a query and a gallery item. Each image has
one or more captions; ``text_to_image[j]`` is the index of caption ``j``'s image.

* **t2i** - every caption queries all images; the one relevant item is its own image.
* **i2t** - every image queries all captions; all of its captions are relevant. R@K counts a hit
  when *any* relevant caption is in the top K, the median rank uses the best-ranked relevant
  caption, and AP averages precision over *all* relevant captions. Images without a caption
  cannot be scored as i2t queries and are left out (they stay in the t2i gallery).

Scores are cosine similarities: rows are L2-normalised before the dot product, so query and
gallery may come from different embedding models as long as the dimensions agree.

Ties (equal scores): with ``ties="pessimistic"`` (the default) the gallery is ordered by score
and, among equal scores, *irrelevant items come before relevant ones*; the rank of a relevant
item is ``1 + #{irrelevant items with score >= its score} + #{relevant items ranked above it}``.
A collapsed model that gives every item the same score therefore ranks last, not first. With
``ties="optimistic"`` relevant items win ties (``>`` instead of ``>=``). With no ties both agree.

Ranks are computed ``chunk`` queries at a time, so memory is about ``chunk * N_gallery * 4``
bytes and the full similarity matrix is never built.
"""

from __future__ import annotations

from typing import Iterator, Literal, Sequence

import numpy as np

Ties = Literal["optimistic", "pessimistic"]
_TIES: tuple[str, ...] = ("optimistic", "pessimistic")
_DIRECTIONS: tuple[str, ...] = ("t2i", "i2t")


# --------------------------------------------------------------------------------- validation
def _as_matrix(x: np.ndarray, name: str) -> np.ndarray:
    """Check ``x`` is a non-empty finite 2-D array; return it as float32."""
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (N, D), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _check_dims(q: np.ndarray, g: np.ndarray, q_name: str, g_name: str) -> None:
    if q.shape[1] != g.shape[1]:
        raise ValueError(
            f"embedding dim mismatch: {q_name} has dim {q.shape[1]}, {g_name} has dim {g.shape[1]}"
        )


def _as_index(text_to_image: np.ndarray | Sequence[int], n_txt: int, n_img: int) -> np.ndarray:
    """Validate ``text_to_image`` (one image index per caption); return int64."""
    idx = np.asarray(text_to_image)
    if idx.ndim != 1:
        raise ValueError(f"text_to_image must be 1-D, got shape {idx.shape}")
    if idx.shape[0] != n_txt:
        raise ValueError(
            f"text_to_image has {idx.shape[0]} entries but text_emb has {n_txt} rows"
        )
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"text_to_image must hold integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n_img):
        bad = int(np.flatnonzero((idx < 0) | (idx >= n_img))[0])
        raise ValueError(
            f"text_to_image[{bad}] = {int(idx[bad])} is out of range for {n_img} images"
        )
    return idx


def _check_options(ks: Sequence[int], chunk: int, ties: str) -> tuple[int, ...]:
    if ties not in _TIES:
        raise ValueError(f"ties must be one of {_TIES}, got {ties!r}")
    if int(chunk) < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ks_t = tuple(int(k) for k in ks)
    if not ks_t or min(ks_t) < 1:
        raise ValueError(f"ks must be non-empty positive integers, got {tuple(ks)}")
    return ks_t


# --------------------------------------------------------------------------------- similarity
def _unit_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise rows (float32); all-zero rows stay zero."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, np.float32(1e-12))).astype(np.float32, copy=False)


def _similarity_blocks(
    queries: np.ndarray, gallery: np.ndarray, chunk: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, scores)`` blocks of the cosine matrix, ``chunk`` query rows at a time."""
    q = _unit_rows(queries)
    g_t = np.ascontiguousarray(_unit_rows(gallery).T)
    for start in range(0, q.shape[0], chunk):
        yield start, q[start : start + chunk] @ g_t


def similarity(queries: np.ndarray, gallery: np.ndarray, *, chunk: int = 1024) -> np.ndarray:
    """Cosine similarity ``(N_q, N_g)`` float32 between rows of ``queries`` and ``gallery``.

    Builds the full matrix (computed ``chunk`` rows at a time); use :func:`retrieval_metrics`
    when only ranks are needed, it never holds the whole matrix.
    """
    q = _as_matrix(queries, "queries")
    g = _as_matrix(gallery, "gallery")
    _check_dims(q, g, "queries", "gallery")
    out = np.empty((q.shape[0], g.shape[0]), dtype=np.float32)
    for start, block in _similarity_blocks(q, g, max(1, int(chunk))):
        out[start : start + block.shape[0]] = block
    return out


# --------------------------------------------------------------------------------- ranking
def _relevant_ranks(
    queries: np.ndarray,
    gallery: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    *,
    chunk: int,
    ties: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Best rank (1-based) and average precision of every query.

    Query ``i``'s relevant gallery items are ``indices[indptr[i]:indptr[i+1]]`` (CSR layout,
    unique, at least one per query). With the relevant scores sorted descending,
    ``c_1 >= ... >= c_m``, the j-th relevant item sits at rank ``j + #{irrelevant above c_j}``
    ("above" is ``>`` if optimistic, ``>=`` if pessimistic); AP is ``mean_j j / rank_j``.
    """
    return ranks_from_score_blocks(_similarity_blocks(queries, gallery, chunk), queries.shape[0], indptr,
                                   indices, ties=ties)


def ranks_from_score_blocks(
    blocks: Iterator[tuple[int, np.ndarray]],
    n_q: int,
    indptr: np.ndarray,
    indices: np.ndarray,
    *,
    ties: str,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_relevant_ranks` over given ``(start, scores)`` blocks of any query x gallery score
    matrix (e.g. re-ranked scores), rows in query order."""
    strict = ties == "optimistic"
    best = np.empty(n_q, dtype=np.int64)
    ap = np.empty(n_q, dtype=np.float64)
    for start, scores in blocks:
        stop = start + scores.shape[0]
        counts = indptr[start + 1 : stop + 1] - indptr[start:stop]  # (B,) all >= 1
        slots = np.arange(int(counts.max()))
        valid = slots[None, :] < counts[:, None]  # (B, m)
        pos = indptr[start:stop, None] + np.minimum(slots[None, :], counts[:, None] - 1)
        rel = np.take_along_axis(scores, indices[pos], axis=1)  # (B, m)
        rel = np.where(valid, rel, -np.inf).astype(np.float32)
        rel_sorted = -np.sort(-rel, axis=1)  # descending; padding (-inf) last
        # relevant items "above" each sorted relevant score (padding excluded)
        if strict:
            rel_above = (rel[:, None, :] > rel_sorted[:, :, None]) & valid[:, None, :]
        else:
            rel_above = (rel[:, None, :] >= rel_sorted[:, :, None]) & valid[:, None, :]
        rel_above_n = rel_above.sum(axis=2)  # (B, m)
        all_above_n = np.empty_like(rel_above_n)
        for j in range(slots.size):
            thr = rel_sorted[:, j : j + 1]
            hits = scores > thr if strict else scores >= thr
            all_above_n[:, j] = np.count_nonzero(hits, axis=1)
        ranks = (slots[None, :] + 1) + (all_above_n - rel_above_n)  # (B, m)
        best[start:stop] = ranks[:, 0]
        prec = np.where(valid, (slots[None, :] + 1) / ranks, 0.0)
        ap[start:stop] = prec.sum(axis=1) / counts
    return best, ap


def _summarise(best: np.ndarray, ap: np.ndarray, ks: tuple[int, ...]) -> dict[str, float]:
    out: dict[str, float] = {f"R@{k}": float(np.mean(best <= k)) for k in ks}
    out["median_rank"] = float(np.median(best))
    out["mAP"] = float(np.mean(ap))
    out["n_queries"] = int(best.size)
    return out


def relevance_csr(direction: str, text_to_image: np.ndarray, n_img: int
                  ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Relevant gallery items of every query of ``direction`` in CSR layout: ``(keep, indptr,
    indices)``. t2i: each caption -> its own image (``keep`` None: every caption is a query).
    i2t: each image with captions -> all of its captions (``keep`` marks the images that query)."""
    if direction == "t2i":
        return None, np.arange(text_to_image.size + 1, dtype=np.int64), text_to_image
    per_image = np.bincount(text_to_image, minlength=n_img)
    keep = per_image > 0
    indptr = np.concatenate([[0], np.cumsum(per_image[keep])]).astype(np.int64)
    return keep, indptr, np.argsort(text_to_image, kind="stable").astype(np.int64)


def _direction_metrics(
    direction: str,
    queries: np.ndarray,
    gallery: np.ndarray,
    text_to_image: np.ndarray,
    ks: tuple[int, ...],
    chunk: int,
    ties: str,
) -> dict[str, float]:
    """Metrics of one direction; arrays already validated (float32, same dim)."""
    keep, indptr, indices = relevance_csr(direction, text_to_image, queries.shape[0])
    if keep is not None:
        queries = queries[keep]
    best, ap = _relevant_ranks(queries, gallery, indptr, indices, chunk=chunk, ties=ties)
    return _summarise(best, ap, ks)


def retrieval_metrics(
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    text_to_image: np.ndarray | Sequence[int],
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = 1024,
    *,
    ties: Ties = "pessimistic",
    directions: Sequence[str] = _DIRECTIONS,
) -> dict[str, dict[str, float]]:
    """Text-to-image and image-to-text retrieval metrics over the whole set.

    Args:
        image_emb: ``(N_img, D)`` image embeddings (any scale; rows are normalised).
        text_emb: ``(N_txt, D)`` caption embeddings, possibly from another model of the same D.
        text_to_image: ``(N_txt,)`` int, the image index of each caption.
        ks: cut-offs for ``R@K``.
        chunk: queries scored at a time (memory ~ ``chunk * N_gallery * 4`` bytes).
        ties: ``"pessimistic"`` (irrelevant items win ties) or ``"optimistic"``; see module doc.
        directions: which of ``"t2i"``, ``"i2t"`` to compute.

    Returns:
        ``{"t2i": {...}, "i2t": {...}}``, each with ``R@K`` (fraction in [0, 1]),
        ``median_rank`` (1-based), ``mAP`` and ``n_queries``.
    """
    ks_t = _check_options(ks, chunk, ties)
    bad_dirs = [d for d in directions if d not in _DIRECTIONS]
    if bad_dirs or not directions:
        raise ValueError(f"directions must be a non-empty subset of {_DIRECTIONS}, got {directions}")
    img = _as_matrix(image_emb, "image_emb")
    txt = _as_matrix(text_emb, "text_emb")
    _check_dims(txt, img, "text_emb", "image_emb")
    t2i = _as_index(text_to_image, txt.shape[0], img.shape[0])
    out: dict[str, dict[str, float]] = {}
    for d in directions:
        q, g = (txt, img) if d == "t2i" else (img, txt)
        out[d] = _direction_metrics(d, q, g, t2i, ks_t, int(chunk), ties)
    return out


def best_relevant_ranks(
    query_emb: np.ndarray,
    gallery_emb: np.ndarray,
    text_to_image: np.ndarray | Sequence[int],
    direction: str,
    *,
    chunk: int = 1024,
    ties: Ties = "pessimistic",
) -> np.ndarray:
    """Per query of ``direction`` (``t2i``: caption queries, gallery of images; ``i2t``: image queries
    with at least one caption, gallery of captions), the 1-based rank of its best relevant item:
    what :func:`retrieval_metrics` summarises, per query (for flip rates: rank 1 = correct top-1)."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
    q = _as_matrix(query_emb, "query_emb")
    g = _as_matrix(gallery_emb, "gallery_emb")
    _check_dims(q, g, "query_emb", "gallery_emb")
    n_txt, n_img = (q.shape[0], g.shape[0]) if direction == "t2i" else (g.shape[0], q.shape[0])
    t2i = _as_index(text_to_image, n_txt, n_img)
    keep, indptr, indices = relevance_csr(direction, t2i, n_img)
    if keep is not None:
        q = q[keep]
    best, _ = _relevant_ranks(q, g, indptr, indices, chunk=int(chunk), ties=ties)
    return best


# --------------------------------------------------------------------------------- model grid
def protocol_grid(
    image_embs: dict[str, np.ndarray],
    text_embs: dict[str, np.ndarray],
    text_to_image: np.ndarray | Sequence[int],
    pairs: list[tuple[str, str]] | None = None,
    *,
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = 1024,
    ties: Ties = "pessimistic",
) -> dict[str, dict]:
    """The "query model x gallery model" grid (cross-model compatibility, XBT Eqn. 2).

    For query model ``A`` and gallery model ``B`` the entry ``"A/B"`` holds
    ``{"t2i": metrics(text_embs[A] -> image_embs[B]), "i2t": metrics(image_embs[A] ->
    text_embs[B])}``. With ``pairs=None`` every ordered pair of models present in both dicts is
    evaluated, and a pair whose dims disagree becomes ``{"t2i": None, "i2t": None, "skipped":
    reason}``. Pairs listed explicitly must be computable: unknown names or dim mismatches raise
    ``ValueError``.
    """
    explicit = pairs is not None
    if pairs is None:
        names = [n for n in image_embs if n in text_embs]
        if not names:
            raise ValueError("no model has both image and text embeddings")
        pairs = [(a, b) for a in names for b in names]
    out: dict[str, dict] = {}
    for a, b in pairs:
        missing = [
            f"{kind}[{name!r}]"
            for kind, emb, name in (
                ("text_embs", text_embs, a), ("image_embs", image_embs, b),
                ("image_embs", image_embs, a), ("text_embs", text_embs, b),
            )
            if name not in emb
        ]
        if missing:
            raise ValueError(f"pair {a}/{b}: missing {', '.join(dict.fromkeys(missing))}")
        dims = {
            "t2i": (np.shape(text_embs[a])[-1], np.shape(image_embs[b])[-1]),
            "i2t": (np.shape(image_embs[a])[-1], np.shape(text_embs[b])[-1]),
        }
        mismatch = [f"{d}: query dim {qd} vs gallery dim {gd}" for d, (qd, gd) in dims.items()
                    if qd != gd]
        if mismatch:
            reason = f"dim mismatch ({'; '.join(mismatch)})"
            if explicit:
                raise ValueError(f"pair {a}/{b}: {reason}")
            out[f"{a}/{b}"] = {"t2i": None, "i2t": None, "skipped": reason}
            continue
        t2i = retrieval_metrics(image_embs[b], text_embs[a], text_to_image, ks, chunk,
                                ties=ties, directions=("t2i",))["t2i"]
        i2t = retrieval_metrics(image_embs[a], text_embs[b], text_to_image, ks, chunk,
                                ties=ties, directions=("i2t",))["i2t"]
        out[f"{a}/{b}"] = {"t2i": t2i, "i2t": i2t}
    return out


# --------------------------------------------------------------------------------- reporting
def format_table(results: dict[str, dict], ks: Sequence[int] = (1, 5, 10)) -> str:
    """Plain-text table: one row per name, columns t2i R@K then i2t R@K (in percent).

    ``results`` maps a row name to ``{"t2i": metrics, "i2t": metrics}`` (as returned by
    :func:`retrieval_metrics`, or the values of :func:`protocol_grid`). Missing metrics show
    ``-`` and a skipped entry's reason is appended to its row.
    """
    ks_t = tuple(int(k) for k in ks)
    headers = ["name"] + [f"{d} R@{k}" for d in _DIRECTIONS for k in ks_t]
    rows: list[list[str]] = []
    notes: list[str] = []
    for name, res in results.items():
        cells = [str(name)]
        for d in _DIRECTIONS:
            m = (res or {}).get(d)
            for k in ks_t:
                v = None if m is None else m.get(f"R@{k}")
                cells.append("-" if v is None else f"{100.0 * v:.1f}")
        rows.append(cells)
        notes.append(f"  ({res['skipped']})" if res and res.get("skipped") else "")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = "  ".join(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))
        return f"{first}  {rest}"

    out = [line(headers), "-" * len(line(headers))]
    out += [line(r) + n for r, n in zip(rows, notes)]
    out.append("(recall in %)")
    return "\n".join(out)


# --------------------------------------------------------------------------------- grouped relevance
def group_ranks(queries: np.ndarray, gallery: np.ndarray, query_groups: Sequence[int] | np.ndarray,
                gallery_groups: Sequence[int] | np.ndarray, *, scores: np.ndarray | None = None,
                chunk: int = 1024) -> np.ndarray:
    """Best rank (1-based, pessimistic ties) of a relevant gallery item for every query, where
    gallery item ``j`` is relevant to query ``i`` iff ``gallery_groups[j] == query_groups[i]``
    (t2i: a caption's image index vs each image's own index; t2t: two captions of one image).
    ``scores`` (``(Q, G)``) replaces ``queries @ gallery.T`` (e.g. fused scores). A query with no
    relevant item gets rank ``G + 1``."""
    qg = np.asarray(query_groups).reshape(-1)
    gg = np.asarray(gallery_groups).reshape(-1)
    n_q = len(qg) if scores is None else scores.shape[0]
    out = np.empty(n_q, dtype=np.int64)
    for s in range(0, n_q, chunk):
        block = (np.asarray(scores[s:s + chunk], np.float32) if scores is not None
                 else np.asarray(queries[s:s + chunk], np.float32) @ np.asarray(gallery, np.float32).T)
        rel = qg[s:s + chunk, None] == gg[None, :]
        best = np.where(rel, block, -np.inf).max(axis=1)
        above = ((block >= best[:, None]) & ~rel).sum(axis=1)
        out[s:s + chunk] = np.where(np.isfinite(best), above + 1, block.shape[1] + 1)
    return out


def recall_from_ranks(ranks: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """``{"R@k": fraction of queries whose best relevant rank is <= k}``."""
    r = np.asarray(ranks)
    return {f"R@{k}": float(np.mean(r <= k)) if r.size else 0.0 for k in ks}


def r1_by_image_subset(q_texts, q_images, g_texts, g_images, c2i: np.ndarray, mask: np.ndarray) -> dict:
    """R@1 (pessimistic ties) split by an image mask: t2i over captions of masked / unmasked
    images (gallery: all images), i2t over masked / unmasked query images (gallery: all captions).
    (The XBT benchmark's split by concepts seen / unseen in the upgrade's training pairs.)"""
    qt, gi, qi, gt = (_unit_rows(np.asarray(x, np.float32)) for x in (q_texts, g_images, q_images, g_texts))
    s = qt @ gi.T
    pos = s[np.arange(len(qt)), c2i]
    t2i_hit = (s >= pos[:, None]).sum(1) <= 1
    s = qi @ gt.T  # images x captions
    rel = c2i[None, :] == np.arange(len(qi))[:, None]
    best = np.where(rel, s, -np.inf).max(1)
    i2t_hit = (np.where(rel, -np.inf, s) >= best[:, None]).sum(1) == 0
    cap_mask = mask[c2i]
    out = {}
    for name, m_t, m_i in (("seen", cap_mask, mask), ("unseen", ~cap_mask, ~mask)):
        out[f"t2i_R@1_{name}"] = float(t2i_hit[m_t].mean()) if m_t.any() else float("nan")
        out[f"i2t_R@1_{name}"] = float(i2t_hit[m_i].mean()) if m_i.any() else float("nan")
    out["frac_images_seen"] = float(mask.mean())
    return out
