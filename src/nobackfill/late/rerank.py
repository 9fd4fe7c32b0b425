"""CMLI re-ranking of a first-stage top-k (the Target-CMLI paper: late interaction as a re-ranking score).

The first stage is the gallery's ordinary global search; the top ``rerank_k`` candidates are then
re-scored with ``global + weight * CMLI`` from stored token outputs (``nobackfill.gallery.tokens``).
A text query ranks images by the t2i score (Eq. 4: each query word's best patch), an image
query ranks texts by the i2t score (Eq. 3: each query patch's best word). ``weight = inf``
ranks by CMLI alone (ties broken by the global score). ``--rerank cmli-sym`` scores a pair in
either direction with the mean of Eq. 3 and Eq. 4 (on the world's val split this helped text
queries: the t2i mean over all query words is diluted by fill words; see ``bench late``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..encoders.base import DualEncoder, TokenOutput
from ..gallery.gallery import Gallery
from ..gallery.types import SearchResult, SpaceMismatchError
from ..gallery.tokens import TokenStore, write_tokens
from ..progress import progress_bar
from .cmli import cmli_scores, project_tokens

__all__ = ["DEFAULT_WEIGHT", "RERANK_SCORES", "fuse", "rerank_candidates", "rerank_search", "store_gallery_tokens",
           "pca_projection", "encode_tokens", "encode_token_batch", "store_dataset_tokens",
           "RerankSet", "RerankedScores", "rerank_pairs", "rerank_metrics"]

#: fusion weight of the CLI (the bench tunes it on val; see ``bench late``)
DEFAULT_WEIGHT = 1.0


def fuse(global_scores: np.ndarray, cmli: np.ndarray, weight: float) -> np.ndarray:
    """``global + weight * cmli``; ``weight = inf``: CMLI first, global as a tie-breaker."""
    if math.isinf(weight):
        return cmli + 1e-6 * global_scores
    return global_scores + weight * cmli


#: ``--rerank`` values: the score of a candidate pair (see the module docstring)
RERANK_SCORES = {"cmli": "directional", "cmli-sym": "symmetric"}


def rerank_candidates(direction: str, query_tokens: torch.Tensor, query_mask: torch.Tensor,
                      cand_tokens: torch.Tensor, cand_mask: torch.Tensor, score: str = "directional") -> np.ndarray:
    """CMLI score of one query against its candidates: ``direction="t2i"`` (text query, image
    candidates; Eq. 4) or ``"i2t"`` (image query, text candidates; Eq. 3). ``score="symmetric"``
    uses the mean of Eq. 3 and Eq. 4 for either direction. Returns ``(k,)``."""
    if direction not in ("t2i", "i2t"):
        raise ValueError(f"direction must be 't2i' or 'i2t', got {direction!r}")
    if score not in ("directional", "symmetric"):
        raise ValueError(f"score must be 'directional' or 'symmetric', got {score!r}")
    with torch.no_grad():
        if direction == "t2i":
            s = cmli_scores(cand_tokens, cand_mask, query_tokens, query_mask)
            i2t, t2i = s.i2t[:, 0], s.t2i[:, 0]
        else:
            s = cmli_scores(query_tokens, query_mask, cand_tokens, cand_mask)
            i2t, t2i = s.i2t[0, :], s.t2i[0, :]
    if score == "symmetric":
        return (0.5 * (i2t + t2i)).numpy()
    return (t2i if direction == "t2i" else i2t).numpy()


def encode_token_batch(encoder: DualEncoder, modality: str, items: Sequence, batch_size: int = 64,
                       progress: bool = False) -> TokenOutput:
    """Token outputs of ``items`` (images or texts), computed ``batch_size`` at a time and padded
    into one ``TokenOutput`` (masks mark content tokens)."""
    fn = encoder.image_tokens if modality == "image" else encoder.text_tokens
    parts: list[TokenOutput] = []
    with progress_bar(progress, f"{modality} tokens", len(items)) as advance:
        for s in range(0, len(items), batch_size):
            parts.append(fn(items[s:s + batch_size]))
            advance(parts[-1].tokens.shape[0])
    width = max(p.tokens.shape[1] for p in parts)
    pad = [(p, width - p.tokens.shape[1]) for p in parts]
    tokens = torch.cat([torch.nn.functional.pad(p.tokens, (0, 0, 0, w)) for p, w in pad])
    mask = torch.cat([torch.nn.functional.pad(p.mask, (0, w), value=False) for p, w in pad])
    return TokenOutput(tokens, mask)


def encode_tokens(encoder: DualEncoder, modality: str, items: Sequence, projection: np.ndarray | None = None,
                  batch_size: int = 64, progress: bool = False) -> list[np.ndarray]:
    """Content-token outputs (masked tokens dropped) of each item, optionally projected:
    a list of ``(L_i, d)`` float32 arrays."""
    proj = None if projection is None else torch.from_numpy(np.asarray(projection, np.float32))
    t = encode_token_batch(encoder, modality, items, batch_size, progress)
    tok = project_tokens(t.tokens, proj)
    return [tok[i][t.mask[i]].numpy() for i in range(tok.shape[0])]


def pca_projection(samples: np.ndarray, dim: int) -> np.ndarray:
    """``(D, dim)`` orthonormal top principal directions of token ``samples`` (uncentred, so
    inner products of unit tokens are preserved as well as possible)."""
    if not 0 < dim <= samples.shape[1]:
        raise ValueError(f"token dim must be in 1..{samples.shape[1]}, got {dim}")
    _, _, vt = np.linalg.svd(samples.astype(np.float64), full_matrices=False)
    return np.ascontiguousarray(vt[:dim].T, dtype=np.float32)


def store_gallery_tokens(encoder: DualEncoder, gallery_dir: str | Path, *, images: Sequence[tuple[str, str | Path]] = (),
                         texts: Sequence[tuple[str, str]] = (), dtype: str = "float16", dim: int | None = None,
                         batch_size: int = 64, progress: bool = True) -> TokenStore:
    """Embed and store the token outputs of ``images`` (id, path) and ``texts`` (id, text) beside
    the gallery at ``gallery_dir`` (its model must be ``encoder``). ``dim`` < the model's width
    fits a PCA projection on the items' tokens and stores the projected tokens."""
    g = Gallery.open(gallery_dir)
    if g.space_id != encoder.space_id:
        raise SpaceMismatchError(g.space_id, encoder.space_id, f"store tokens in {gallery_dir}", what="model",
                                 hint="store tokens with the model that built the gallery")
    jobs = [("image", [i for i, _ in images], [str(p) for _, p in images]),
            ("text", [i for i, _ in texts], [t for _, t in texts])]
    raw = {m: encode_tokens(encoder, m, items, batch_size=batch_size, progress=progress) for m, _, items in jobs if items}
    projection = None
    if dim is not None and dim < encoder.embed_dim:
        sample = np.concatenate([t for toks in raw.values() for t in toks[:2000]])
        projection = pca_projection(sample, dim)
        for m, toks in raw.items():
            raw[m] = [project_tokens(torch.from_numpy(t), torch.from_numpy(projection)).numpy() for t in toks]
    store = None
    for modality, ids, _ in jobs:
        if modality in raw:
            store = write_tokens(gallery_dir, modality, ids, raw[modality], space_id=encoder.space_id, dtype=dtype,
                                 projection=projection, source_dim=encoder.embed_dim)
    if store is None:
        raise ValueError("no images or texts to store tokens for")
    return store


def store_dataset_tokens(encoder: DualEncoder, data, gallery_dir: str | Path, dtype: str = "float16",
                         dim: int | None = None, progress: bool = True) -> TokenStore:
    """Token outputs of every image and caption of a data folder, under the ids that
    ``nobackfill index`` gives them (:func:`nobackfill.collection.ingest.pair_ids`)."""
    from ..collection.ingest import pair_ids

    img_ids, cap_ids = pair_ids(data)
    images = list({i: (i, str(p)) for i, p in zip(img_ids, data.image_paths())}.values())
    texts = list({t: (t, cap) for t, cap in zip(cap_ids, data.captions)}.values())
    return store_gallery_tokens(encoder, gallery_dir, images=images, texts=texts, dtype=dtype, dim=dim,
                                progress=progress)


def rerank_search(gallery: Gallery, encoder: DualEncoder, modality: str, query, first: SearchResult, k: int,
                  weight: float = DEFAULT_WEIGHT, rerank: str = "cmli") -> SearchResult:
    """Re-score the first-stage hits of one query (``query`` is the text, or the image path)
    with CMLI from the gallery's token store; returns the new top ``k``. ``rerank``: ``cmli``
    (Eq. 4 for text queries, Eq. 3 for image queries) or ``cmli-sym`` (their mean)."""
    if rerank not in RERANK_SCORES:
        raise ValueError(f"--rerank must be one of {sorted(RERANK_SCORES)}, got {rerank!r}")
    store = TokenStore.open(gallery.path)
    if encoder.space_id != store.space_id:
        raise SpaceMismatchError(store.space_id, encoder.space_id, f"re-rank with tokens of {gallery.path}",
                                 what="query model", hint="CMLI re-ranking needs the gallery's own model (no bridge)")
    proj = store.projection
    q_mod = "text" if modality == "image" else "image"
    q = encode_tokens(encoder, q_mod, [query], projection=proj)[0]
    ids = first.ids[0]
    cand, cmask = store.get(modality, ids)
    cmli = rerank_candidates("t2i" if modality == "image" else "i2t", torch.from_numpy(q)[None],
                             torch.ones((1, q.shape[0]), dtype=torch.bool), torch.from_numpy(cand),
                             torch.from_numpy(cmask), score=RERANK_SCORES[rerank])
    fused = fuse(np.asarray(first.scores[0], np.float32), cmli, weight)
    order = np.argsort(-fused, kind="stable")[:k]
    return SearchResult(scores=fused[order][None], ids=[[ids[i] for i in order]],
                        positions=np.asarray(first.positions)[:, order])


# ----------------------------------------------------------------------------- many queries at once
@dataclass
class RerankSet:
    """An evaluation set scored at once: images (pixels or paths) and captions;
    ``caption_image[j]`` is caption j's image."""

    name: str
    images: Sequence
    captions: list[str]
    caption_image: np.ndarray


@dataclass
class RerankedScores:
    """First-stage scores of one direction, each query's top-k columns and their CMLI scores
    (``directional``: Eq. 4 for text queries / Eq. 3 for image queries; ``symmetric``: the mean)."""

    first: np.ndarray
    top: np.ndarray
    cmli: dict[str, np.ndarray]

    def scores(self, weight: float, variant: str = "directional") -> np.ndarray:
        from ..metrics.scored import lift_top_k

        first_top = np.take_along_axis(self.first, self.top, axis=1)
        return lift_top_k(self.first, self.top, fuse(first_top, self.cmli[variant], weight))


def rerank_pairs(encoder, data: RerankSet, rerank_k: int, query_block: int = 16) -> dict[str, RerankedScores]:
    """Global scores and the CMLI scores of every query's first-stage top ``rerank_k``: t2i uses
    Eq. 4 (query words' best patches), i2t Eq. 3 (query patches' best words)."""
    from ..metrics.scored import top_k_columns
    from .cmli import pair_scores

    if int(rerank_k) < 1:
        raise ValueError(f"rerank_k must be >= 1 (the first-stage candidates re-ranked), got {rerank_k}")

    img = encoder.encode_images(data.images)
    txt = encoder.encode_texts(data.captions)
    it = encode_token_batch(encoder, "image", data.images)
    tt = encode_token_batch(encoder, "text", data.captions)
    out = {}
    for direction, first, (q_tok, q_mask), (g_tok, g_mask) in (
            ("t2i", txt @ img.T, (tt.tokens, tt.mask), (it.tokens, it.mask)),
            ("i2t", img @ txt.T, (it.tokens, it.mask), (tt.tokens, tt.mask))):
        top = top_k_columns(first, rerank_k)
        k = top.shape[1]
        cmli = {v: np.empty(top.shape, np.float32) for v in ("directional", "symmetric")}
        with torch.no_grad():
            for s in range(0, first.shape[0], query_block):
                cols = torch.from_numpy(top[s:s + query_block]).reshape(-1)
                q = torch.arange(s, min(s + query_block, first.shape[0])).repeat_interleave(k)
                if direction == "t2i":  # candidates are images, queries texts
                    r = pair_scores(g_tok[cols], g_mask[cols], q_tok[q], q_mask[q])
                else:
                    r = pair_scores(q_tok[q], q_mask[q], g_tok[cols], g_mask[cols])
                own = r.t2i if direction == "t2i" else r.i2t
                cmli["directional"][s:s + query_block] = own.reshape(-1, k).numpy()
                cmli["symmetric"][s:s + query_block] = (0.5 * (r.i2t + r.t2i)).reshape(-1, k).numpy()
        out[direction] = RerankedScores(first, top, cmli)
    return out


def rerank_metrics(scored: dict[str, RerankedScores], data: RerankSet, choice: dict | None,
                   ks: Sequence[int] = (1, 5, 10)) -> dict:
    """R@K / median rank / mAP of global scoring (``choice`` None) or re-ranking with the
    ``(variant, weight)`` of each direction."""
    from ..metrics.scored import retrieval_metrics_from_scores

    def pick(d: str) -> np.ndarray:
        return scored[d].first if choice is None else scored[d].scores(choice[d][1], choice[d][0])

    return retrieval_metrics_from_scores(pick("t2i"), pick("i2t"), data.caption_image, ks)
