"""Encoding throughput: nobackfill's encoders versus a plain ``transformers`` loop over the same
model, on CPU.

For every CLIP model directory: images/s (PIL images in, as a user would pass them) and texts/s
through :func:`nobackfill.encoders.load_encoder`'s encoder, and through ``CLIPModel`` +
``CLIPImageProcessor`` + the directory's tokenizer. For the MiniLM text encoder: texts/s through
:class:`~nobackfill.encoders.minilm.MiniLMTextEncoder` and through ``AutoModel`` + mean pooling.
Both paths must produce the same embeddings; the maximum absolute difference is recorded.

Each measurement: one warm-up batch, then ``repeats`` timed passes over all inputs
(``time.perf_counter``), ours and plain interleaved so background load hits both alike; the
median pass is reported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

PRETRAINED = "pretrained"


# ----------------------------------------------------------------------------- inputs
def bench_images(n: int, seed: int = 0) -> list[Image.Image]:
    """``n`` world test images (64x64 RGB) as PIL images."""
    from ..data.world import make_item

    return [Image.fromarray(make_item(seed, "test", i)[1]) for i in range(n)]


def bench_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` English world captions."""
    from ..data.world import WorldSpec, world_corpus

    return world_corpus(WorldSpec(seed=seed), n)


# ----------------------------------------------------------------------------- timing
@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _time_paths(paths: Mapping[str, Callable[[Sequence], np.ndarray]], items: Sequence, batch_size: int,
                repeats: int) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """Warm every path up on one batch, then time ``repeats`` interleaved passes over ``items``;
    median items/s per path. ``paths[name](items)`` encodes a list of items."""
    for fn in paths.values():
        fn(items[:max(1, min(batch_size, len(items)))])
    times: dict[str, list[float]] = {k: [] for k in paths}
    last: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            last[name] = fn(items)
            times[name].append(time.perf_counter() - t0)
    stats = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        stats[name] = {"per_s": len(items) / med if med > 0 else float("inf"), "median_s": med,
                       "runs_s": [round(t, 6) for t in ts]}
    return stats, last


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"embedding shapes differ: {a.shape} vs {b.shape}")
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0


def _batches(items: Sequence, batch_size: int) -> Iterator[Sequence]:
    for s in range(0, len(items), batch_size):
        yield items[s:s + batch_size]


def _normalise(x: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(x, dim=-1).float().numpy()


# ----------------------------------------------------------------------------- plain loops
def _clip_image_processor(directory: Path):
    """``CLIPImageProcessor`` from the directory (the PIL backend when torchvision is missing,
    which is what ``CLIPImageProcessor`` itself falls back to, minus the warning)."""
    import transformers

    if importlib.util.find_spec("torchvision") is None and hasattr(transformers, "CLIPImageProcessorPil"):
        cls = transformers.CLIPImageProcessorPil
    else:
        cls = transformers.CLIPImageProcessor
    return cls.from_pretrained(directory, local_files_only=True)


class PlainCLIP:
    """The loop a user would write with ``transformers`` alone."""

    def __init__(self, directory: str | Path) -> None:
        from transformers import AutoTokenizer, CLIPModel

        directory = Path(directory)
        self.model = CLIPModel.from_pretrained(directory, local_files_only=True).eval()
        self.processor = _clip_image_processor(directory)
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.max_length = min(int(self.tokenizer.model_max_length),
                              self.model.config.text_config.max_position_embeddings)

    @torch.inference_mode()
    def encode_images(self, images: Sequence[Image.Image], batch_size: int) -> np.ndarray:
        out = []
        for batch in _batches(images, batch_size):
            pv = self.processor(images=list(batch), return_tensors="pt")["pixel_values"]
            out.append(_normalise(self.model.get_image_features(pixel_values=pv).pooler_output))
        return np.concatenate(out)

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        out = []
        for batch in _batches(texts, batch_size):
            enc = self.tokenizer(list(batch), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
            out.append(_normalise(self.model.get_text_features(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).pooler_output))
        return np.concatenate(out)


class PlainMeanPool:
    """``AutoModel`` + ``AutoTokenizer`` + mean pooling + L2 (the sentence-transformers recipe)."""

    def __init__(self, directory: str | Path, max_length: int) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.model = AutoModel.from_pretrained(directory, local_files_only=True).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.max_length = max_length

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        out = []
        for batch in _batches(texts, batch_size):
            enc = self.tokenizer(list(batch), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
            hs = self.model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).to(hs.dtype)
            out.append(_normalise((hs * m).sum(1) / m.sum(1).clamp(min=1e-9)))
        return np.concatenate(out)


# ----------------------------------------------------------------------------- benches
def bench_clip(directory: str | Path, images: Sequence[Image.Image], texts: Sequence[str],
               batch_size: int = 128, repeats: int = 3) -> dict:
    """Ours vs plain transformers for one CLIP directory (threads as currently set)."""
    from ..encoders import load_encoder

    ours = load_encoder(directory)
    if not hasattr(ours, "preprocessor"):
        raise ValueError(f"{directory}: not a CLIP dual encoder ({type(ours).__name__})")
    plain = PlainCLIP(directory)
    img_stats, img_out = _time_paths(
        {"ours": lambda x: ours.encode_images(x, batch_size=batch_size),
         "plain_transformers": lambda x: plain.encode_images(x, batch_size)}, images, batch_size, repeats)
    txt_stats, txt_out = _time_paths(
        {"ours": lambda x: ours.encode_texts(x, batch_size=batch_size),
         "plain_transformers": lambda x: plain.encode_texts(x, batch_size)}, texts, batch_size, repeats)
    res: dict = {"dir": str(directory), "space_id": ours.space_id, "embed_dim": ours.embed_dim,
                 "image_processor": type(plain.processor).__name__}
    for path in ("ours", "plain_transformers"):
        res[path] = {"images_per_s": img_stats[path]["per_s"], "texts_per_s": txt_stats[path]["per_s"],
                     "images_runs_s": img_stats[path]["runs_s"], "texts_runs_s": txt_stats[path]["runs_s"]}
    res["max_abs_diff_images"] = _max_abs_diff(img_out["ours"], img_out["plain_transformers"])
    res["max_abs_diff_texts"] = _max_abs_diff(txt_out["ours"], txt_out["plain_transformers"])
    sample = list(images[:batch_size])  # does our preprocessing match CLIPImageProcessor's?
    res["max_abs_diff_pixels"] = _max_abs_diff(
        ours.preprocessor(sample).numpy(),
        plain.processor(images=sample, return_tensors="pt")["pixel_values"].numpy())
    return res


def bench_minilm(directory: str | Path | None, texts: Sequence[str], batch_size: int = 128,
                 repeats: int = 3) -> dict:
    """Ours vs ``AutoModel`` + mean pooling; ``directory=None`` means the packaged all-MiniLM-L6-v2."""
    from ..encoders.minilm import MiniLMTextEncoder, pretrained_model_dir

    if directory is None:
        directory = pretrained_model_dir()
        ours = MiniLMTextEncoder.pretrained()
    else:
        ours = MiniLMTextEncoder.load(directory)
    plain = PlainMeanPool(directory, ours.max_length)
    stats, out = _time_paths(
        {"ours": lambda x: ours.encode_texts(x, batch_size=batch_size),
         "plain_transformers": lambda x: plain.encode_texts(x, batch_size)}, texts, batch_size, repeats)
    res: dict = {"dir": str(directory), "name": ours.name, "space_id": ours.space_id,
                 "embed_dim": ours.embed_dim}
    for path in ("ours", "plain_transformers"):
        res[path] = {"texts_per_s": stats[path]["per_s"], "texts_runs_s": stats[path]["runs_s"]}
    res["max_abs_diff_texts"] = _max_abs_diff(out["ours"], out["plain_transformers"])
    return res


@dataclass
class EncodeBenchConfig:
    """``bench encode``'s settings: inputs per timed pass, batch, threads, passes, and whether the
    real all-MiniLM-L6-v2 is timed too."""

    n_images: int = 512
    n_texts: int = 2048
    batch_size: int = 128
    threads: int = 2
    repeats: int = 3
    seed: int = 0
    minilm: bool = True

    def __post_init__(self) -> None:
        if min(self.n_images, self.n_texts, self.batch_size, self.repeats, self.threads) < 1:
            raise ValueError("n_images, n_texts, batch_size, repeats and threads must be >= 1")


def run_encode_bench(model_dirs: Mapping[str, str | Path], n_images: int = 512, n_texts: int = 2048,
                     batch_size: int = 128, threads: int = 2, seed: int = 0,
                     minilm: str | Path | None = PRETRAINED, repeats: int = 3) -> dict:
    """Throughput of our encoders vs plain ``transformers`` loops (CPU, ``threads`` torch threads).

    ``model_dirs``: name -> CLIP model directory. ``minilm``: ``"pretrained"`` (the packaged
    all-MiniLM-L6-v2), a BERT-style model directory, or None to skip the MiniLM bench.
    Returns ``{"models": {name: {"ours": {...}, "plain_transformers": {...}, "max_abs_diff_images",
    "max_abs_diff_texts", ...}}, "minilm": {...} or None, "threads", "device": "cpu", ...}``.
    """
    if n_images < 1 or n_texts < 1 or batch_size < 1 or repeats < 1:
        raise ValueError("n_images, n_texts, batch_size and repeats must be >= 1")
    images = bench_images(n_images, seed) if model_dirs else []
    texts = bench_texts(n_texts, seed)
    result: dict = {"models": {}, "minilm": None, "threads": int(threads), "device": "cpu",
                    "n_images": n_images, "n_texts": n_texts, "batch_size": batch_size,
                    "repeats": repeats, "seed": seed, "torch": torch.__version__,
                    "cpu": platform.processor() or platform.machine()}
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except Exception:  # pragma: no cover
        pass
    with torch_threads(threads):
        for name, d in model_dirs.items():
            result["models"][name] = bench_clip(d, images, texts, batch_size, repeats)
        if minilm is not None:
            mdir = None if str(minilm) == PRETRAINED else Path(minilm)
            result["minilm"] = bench_minilm(mdir, texts, batch_size, repeats)
    return result


def clip_model_dirs(models: Path) -> dict[str, Path]:
    """The CLIP model directories in ``models`` by name (text-only models, e.g. m30k-old-text, have no
    image tower to time)."""
    def is_clip(p: Path) -> bool:
        try:
            return json.loads((p / "config.json").read_text()).get("model_type") == "clip"
        except (OSError, ValueError):
            return False

    dirs = {p.name: p for p in sorted(Path(models).iterdir()) if is_clip(p)} if Path(models).is_dir() else {}
    if not dirs:
        raise FileNotFoundError(f"{models}: no model directories found")
    return dirs


def run_encode_config(cfg: EncodeBenchConfig, models: Path) -> dict:
    """:func:`run_encode_bench` of every CLIP model in ``models`` with ``cfg``'s settings."""
    return run_encode_bench(clip_model_dirs(models), n_images=cfg.n_images, n_texts=cfg.n_texts,
                            batch_size=cfg.batch_size, threads=cfg.threads, seed=cfg.seed, repeats=cfg.repeats,
                            minilm=PRETRAINED if cfg.minilm else None)
