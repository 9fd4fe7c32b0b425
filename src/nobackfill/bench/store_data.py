"""The vectors of ``bench store``: real MiniLM caption embeddings, world-new embeddings or random
unit vectors, tiled to N rows with small noise (see :mod:`.store`), and exact top-k for recall."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from .store_config import StoreBenchConfig

K = 10


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def tile_rows(real: np.ndarray, n: int, rng: np.random.Generator, sigma: float = 0.01) -> np.ndarray:
    if n <= len(real):
        return real[:n].copy()
    out = np.empty((n, real.shape[1]), np.float32)
    out[:len(real)] = real
    for s in range(len(real), n, 100_000):
        e = min(n, s + 100_000)
        src = real[np.arange(s, e) % len(real)]
        out[s:e] = unit_rows(src + sigma * rng.standard_normal(src.shape).astype(np.float32))
    return out


def make_data(name: str, cfg: StoreBenchConfig, log: Callable[[str], None]) -> tuple[np.ndarray, np.ndarray]:
    """(gallery (n, d), queries (val + test, d)) of dataset ``name``, unit rows."""
    rng = np.random.default_rng(cfg.seed)
    nq = cfg.n_val_queries + cfg.n_test_queries
    if name == "random":
        return unit_rows(rng.standard_normal((cfg.n, 128)).astype(np.float32)), \
            unit_rows(rng.standard_normal((nq, 128)).astype(np.float32))
    from ..evaluate import embed_texts_cached

    if name == "minilm":
        from ..compat.text_upgrade import stage1_corpus
        from ..data.multi30k import default_multi30k_dir, read_task2
        from ..encoders.minilm import MiniLMTextEncoder

        root = cfg.multi30k or default_multi30k_dir()
        flat, _ = stage1_corpus(read_task2(root, "train", "en").captions, 29000)
        enc = MiniLMTextEncoder.pretrained()
        real_texts = list(dict.fromkeys(flat[:cfg.real_minilm]))  # distinct captions
        log(f"  minilm: embedding {len(real_texts)} real captions (cached in {cfg.cache_dir}) ...")
        real = embed_texts_cached(enc, flat[:cfg.real_minilm], cfg.cache_dir)
        keep = {t: i for i, t in reversed(list(enumerate(flat[:cfg.real_minilm])))}
        real = unit_rows(real[sorted(keep.values())])
        queries = embed_texts_cached(enc, read_task2(root, "val", "en", ks=(1,)).column(1)[:nq], cfg.cache_dir)
        return tile_rows(real, cfg.n, rng), unit_rows(queries)
    if name == "world":
        from ..data.folder import load_pairs
        from ..encoders import load_encoder
        from ..evaluate import resolve_data

        enc = load_encoder(cfg.models / "world-new")
        train = load_pairs(resolve_data(cfg.world, "train"))
        log(f"  world: embedding {len(train)} images and {len(train.captions)} captions with world-new ...")
        real = np.concatenate([embed_texts_cached(enc, train.captions, cfg.cache_dir),
                               enc.encode_images(train.image_paths())])
        real = unit_rows(real[rng.permutation(len(real))])
        test = load_pairs(resolve_data(cfg.world, "test"), langs=["en"])
        return tile_rows(real, cfg.n, rng), unit_rows(enc.encode_texts(test.captions[:nq]))
    raise ValueError(f"unknown dataset {name!r}; datasets: minilm, world, random")


def exact_top(gallery: np.ndarray, queries: np.ndarray, k: int = K) -> np.ndarray:
    """Exact top-``k`` row indices by inner product (faiss Flat)."""
    import faiss

    idx = faiss.IndexFlatIP(gallery.shape[1])
    idx.add(gallery)
    return idx.search(queries, k)[1]


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / len(t) for f, t in zip(found, truth)]))
