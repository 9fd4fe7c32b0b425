"""The data of ``bench import`` (:mod:`nobackfill.bench.importing`): the world test split as
clip-retrieval rows, the Multi30K val captions, their vectors and clip-retrieval folders."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from .import_config import ImportBenchConfig


@dataclass
class World:
    """The world test split as clip-retrieval rows (one per caption: its image and its text)."""

    test_dir: Path
    items: list[Any]
    images: list[Path]  # the rows' image paths (an image repeats once per caption)
    captions: list[str]
    image_queries: list[Path]  # every image once


@dataclass
class Text:
    """The Multi30K val captions (image-major, repeats kept as clip-retrieval would write them)."""

    captions: list[str]
    unique: list[str]


def world_dir(cfg: "ImportBenchConfig", say: Callable[[str], None]) -> Path:
    from ..data.world import WorldSpec, generate_world, load_world_spec
    from ..evaluate import resolve_data

    if cfg.world is not None:
        return resolve_data(cfg.world, "test")
    root = cfg.work / "world"
    spec = WorldSpec(seed=cfg.seed, n_train=0, n_val=0, n_test=cfg.world_test, langs=("en",))
    have = load_world_spec(root) if (root / "test" / "captions.jsonl").is_file() else None
    if have != spec:
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.time()
        generate_world(root, spec, workers=1, progress=False)
        say(f"world: {cfg.world_test} test images generated in {root} ({time.time() - t0:.1f}s)")
    return root / "test"


def load_world(cfg: "ImportBenchConfig", say: Callable[[str], None]) -> World:
    from ..collection.ingest import folder_items

    test_dir = world_dir(cfg, say).absolute()
    items = folder_items(test_dir, langs=["en"], uncaptioned=False).items
    if cfg.test_images is not None:
        keep = {it.id for it in items if it.modality == "image"}
        keep = set([it.id for it in items if it.id in keep][:cfg.test_images])
        items = [it for it in items if (it.id if it.modality == "image" else it.metadata["image_id"]) in keep]
    texts = [it for it in items if it.modality == "text"]
    return World(test_dir, items, [test_dir / t.metadata["image"] for t in texts], [t.payload for t in texts],
                  [Path(it.payload) for it in items if it.modality == "image"])


def load_text(cfg: "ImportBenchConfig") -> Text:
    from ..data.multi30k import default_multi30k_dir, read_task2

    val = read_task2(cfg.multi30k or default_multi30k_dir(), "val", "en", limit=cfg.text_limit)
    captions = [c for c in val.flat()[0] if c.strip()]
    return Text(captions, list(dict.fromkeys(captions)))


def embed_world(enc: Any, w: World) -> tuple[np.ndarray, np.ndarray]:
    """(image vectors, caption vectors) of the world rows (each image embedded once)."""
    uniq = list(dict.fromkeys(w.images))
    img = np.asarray(enc.encode_images(uniq, progress=False), np.float32)
    pos = {p: i for i, p in enumerate(uniq)}
    txt = np.asarray(enc.encode_texts(w.captions, progress=False), np.float32)
    return img[[pos[p] for p in w.images]], txt


def write_world(out: Path, w: World, img: np.ndarray, txt: np.ndarray, dtype: Any = np.float32) -> Path:
    from ..data.clip_retrieval import write_clip_retrieval

    shutil.rmtree(out, ignore_errors=True)
    return write_clip_retrieval(out, image_paths=w.images, image_vectors=img, captions=w.captions,
                                text_vectors=txt, dtype=dtype)


def write_text(out: Path, captions: Sequence[str], vectors: np.ndarray, dtype: Any = np.float32) -> Path:
    from ..data.clip_retrieval import write_clip_retrieval

    shutil.rmtree(out, ignore_errors=True)
    return write_clip_retrieval(out, captions=list(captions), text_vectors=vectors, dtype=dtype)


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)



def embeddings(cfg: "ImportBenchConfig", pool: Any, w: World, t: Text, say: Callable[[str], None]
                ) -> dict[str, Any]:
    """The vectors and clip-retrieval folders the identical and model-check parts share."""
    from ..search.models import model_ref

    old_ref = model_ref(cfg.models / "world-old")
    text_ref = model_ref(cfg.models / "m30k-old-text")
    t0 = time.time()
    img, txt = embed_world(pool.get(old_ref), w)
    text_vectors = np.asarray(pool.get(text_ref).encode_texts(t.captions, progress=False), np.float32)
    emb: dict[str, Any] = {"old_ref": old_ref, "text_ref": text_ref, "world_vectors": (img, txt),
                           "world_f32": write_world(cfg.work / "clip-world-old", w, img, txt),
                           "text_f32": write_text(cfg.work / "clip-m30k-old-text", t.captions, text_vectors)}
    if "model_check" in cfg.parts:
        emb["world_new_vectors"] = embed_world(pool.get(model_ref(cfg.models / "world-new")), w)
    say(f"embedded the world rows and {len(t.captions)} Multi30K captions in {time.time() - t0:.1f}s")
    return emb


__all__ = ["Text", "World", "embed_world", "embeddings", "load_text", "load_world", "unit_rows", "write_text",
           "write_world"]
