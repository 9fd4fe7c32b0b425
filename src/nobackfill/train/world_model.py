"""Train a zoo preset from scratch: tokenizer, fresh model, contrastive loop, export.

``train_preset("world-new", data="data/world", out="models/world-new")`` is what
``nobackfill train`` runs. On a generated world (a folder with ``world.json``) training streams
fresh scenes every step (never the same picture twice, never a val/test scene); on a user folder it
iterates the folder's English pairs.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..data.grammars import get_grammar
from ..data.scene import ConceptSet
from ..data.world import WorldSpec, WorldStream, load_world_spec, make_item, world_corpus
from ..encoders.tokenizer import train_bpe_tokenizer
from ..encoders.zoo import Preset, create_model, get_preset
from ..metrics.retrieval import retrieval_metrics
from .contrastive import ContrastivePretraining
from .checkpoint import data_settings
from .loop import LoopConfig, TrainResult, train, write_recipe

log = logging.getLogger(__name__)


def split_dir(data: str | Path, split: str) -> Path:
    """``data/split`` if it is a data folder, else ``data`` itself."""
    d = Path(data)
    return d / split if (d / split / "captions.jsonl").is_file() else d


def canonical_val_scenes(spec: WorldSpec, n: int = 500, lang: str = "en", split: str = "val"):
    """``n`` scenes of a world split rendered in memory, each with its canonical caption (variant 0):
    the training-time probe (``compat.data.world_eval_set`` gives the folder's captions instead)."""
    g = get_grammar(lang)
    pixels, caps = [], []
    for i in range(n):
        scene, px = make_item(spec.seed, split, i, spec.concepts)
        pixels.append(px)
        caps.append(g.caption(scene, 0))
    return np.stack(pixels), caps


def train_preset(preset: str | Preset, data: str | Path, out: str | Path, *, steps: int | None = None,
                 seed: int = 0, threads: int = 0, stream: bool = True, eval_size: int = 500,
                 progress: bool = True, command: str | None = None, checkpoint_every: int | None = None,
                 eval_every: int | None = None, log_every: int | None = None) -> TrainResult:
    """Train ``preset`` on ``data`` into ``out`` (resumes from a checkpoint there).

    ``checkpoint_every`` / ``eval_every`` / ``log_every`` override the loop's defaults (250 steps;
    a tenth of the run but at least 250 steps; 50 steps)."""
    preset = preset if isinstance(preset, Preset) else get_preset(preset)
    rec = preset.train
    concepts = ConceptSet.parse(rec.shapes, rec.colours)
    # a world root streams its world; a data folder is read, even a split of a world (trial R: w/train
    # streamed w's scenes and never read the folder's files)
    spec = None if (Path(data) / "captions.jsonl").is_file() else load_world_spec(data)
    out = Path(out)
    eval_on = f"{eval_size} canonical val scenes of the world"
    if spec is not None:
        # the model's own view of the world: only its concepts, English
        corpus = world_corpus(WorldSpec(seed=spec.seed, shapes=concepts.shapes, colours=concepts.colours), 20000)
    else:
        from ..data.folder import load_pairs

        corpus = load_pairs(split_dir(data, "train"), langs=["en"], check_images=False).captions
    tokenizer = train_bpe_tokenizer(corpus, preset.model.vocab_size, preset.model.max_length)
    encoder = create_model(preset, tokenizer, seed=seed)
    encoder.meta.update({"name": out.name, "concepts": asdict(concepts)})
    method = ContrastivePretraining(encoder, save_dtype=rec.save_dtype)
    # what it trains on first: a resume on another world or folder is refused naming it (trial AB)
    method.run_settings = {**data_settings(data, asdict(spec) if spec is not None else corpus),
                           "preset": asdict(preset), "stream": bool(spec is not None and stream)}
    if spec is not None and stream:
        from ..data.batches import WorldBatches

        batches = WorldBatches(WorldStream(rec.batch_size, seed=spec.seed * 1000 + seed, concepts=concepts))
        val_pixels, val_caps = canonical_val_scenes(spec, eval_size)
    else:
        from ..data.batches import FolderBatches
        from ..data.folder import load_pairs

        train_data = load_pairs(split_dir(data, "train"), langs=["en"])
        batches = FolderBatches(train_data, rec.batch_size, seed=seed)
        val = load_pairs(split_dir(data, "val"), langs=["en"])
        val = val.subset_images(range(min(eval_size, len(val))))
        val_pixels, val_caps = val.image_paths(), val.captions
        val_map = val.caption_image
        eval_on = f"the first {len(val)} images of {split_dir(data, 'val')}"
        if split_dir(data, "val") == split_dir(data, "train"):  # one folder: nothing held out (trial Y)
            eval_on = f"the first {len(val)} training images ({data} has no val/ folder: not held out)"
            log.warning("eval/* R@1 is measured on %s", eval_on)

    def evaluate() -> dict[str, float]:
        img = encoder.encode_images(val_pixels)
        txt = encoder.encode_texts(val_caps)
        t2i = np.arange(len(val_caps)) if spec is not None and stream else val_map
        m = retrieval_metrics(img, txt, t2i)
        return {"t2i_R@1": m["t2i"]["R@1"], "i2t_R@1": m["i2t"]["R@1"]}

    n_steps = steps or rec.steps
    cfg = LoopConfig(steps=n_steps, lr=rec.lr, warmup=rec.warmup, weight_decay=rec.weight_decay,
                     seed=seed, threads=threads, eval_every=eval_every or max(250, n_steps // 10),
                     checkpoint_every=checkpoint_every or 250, log_every=log_every or LoopConfig.log_every)
    result = train(method, batches, cfg, out, evaluate=evaluate, progress=progress)
    recipe = {"preset": preset.name, "model": asdict(preset.model), "train": asdict(rec), "loop": asdict(cfg),
              "data": str(data), "world": asdict(spec) if spec else None, "seconds": round(result.seconds, 1),
              "final_eval": result.history[-1] if result.history else None, "eval_on": eval_on,
              "command": command or " ".join(["nobackfill"] + sys.argv[1:])}
    write_recipe(out, recipe)
    return result
