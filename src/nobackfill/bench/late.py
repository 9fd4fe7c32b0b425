"""``nobackfill bench late``: cross-modal late interaction (the Target-CMLI paper) on the world.

* **Retrieval** on the world test split (English captions) and on an attribute-swap hard-negative
  subset (every test scene with two objects plus its twin with the two objects' colours - or
  shapes - exchanged; :mod:`nobackfill.late.hard_negatives`). Models, all ``world-tiny`` trained
  from scratch on the same stream of fresh scenes with the same seed and steps:

  - ``global``: trained with global InfoNCE only, scored with global cosine;
  - ``cmli_rerank``: the same model, its first-stage top ``rerank_k`` re-scored with
    ``global + w * CMLI`` from its own token outputs;
  - ``cmli_trained``: trained with global InfoNCE + CMLI InfoNCE (FILIP-style logits), scored
    globally, re-ranked, and by CMLI alone.

  The shipped ``world-new`` (global training) is scored the same way for reference. Every fusion
  weight ``w`` (``w = 0``: re-ranking off) and pair score is chosen on the *val* split (regular +
  hard-negative val sets), never on test; ``rerank_k`` is fixed. ``rerank_gain`` gives the R@1
  gains in points (within the CMLI-trained model, over the globally trained model, and the global
  model's own re-ranking), averaged over the training seeds ``seed`` + ``extra_seeds`` (``seeds``:
  per seed).
* **KD**: ``world-tiny`` students of the ``world-new`` teacher: contrastive only (= ``global``
  above), global-only KD, Target-CMLI KD without and with the empty target (Eq. 5-8), R@K on
  test and the hard negatives, and the share of text tokens routed to the empty target with the
  words it excuses (on val scenes).
* **Memory**: naive (materialises ``B x B x N x M``) vs streamed CMLI of a ``B x B`` batch at
  B = 64, 128, 256; peak memory is MEASURED as the rise of the resident-set high-water mark
  (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` after a warm-up) in a fresh
  subprocess per measurement; time is the median of repeated calls, 1 thread.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from ..late.choose import evaluate_reranking
from ..late.rerank import RerankSet
from .late_config import LateBenchConfig
from .late_memory import measure_memory
from .late_report import write_outputs
from .late_runs import RUNS, seed_run, train_runs

KS = (1, 5, 10)


# ----------------------------------------------------------------------------- evaluation
def evaluate_model(encoder, tests: dict[str, RerankSet], vals: list[RerankSet], cfg: LateBenchConfig) -> dict:
    """Global, re-ranked (score variant and weight chosen on val) and CMLI-only metrics of one
    model on each test set (:func:`nobackfill.late.choose.evaluate_reranking` at the bench's grid)."""
    return evaluate_reranking(encoder, tests, vals, rerank_k=cfg.rerank_k, weights=cfg.weights,
                              variants=cfg.score_variants)


def global_metrics(encoder, tests: dict[str, RerankSet]) -> dict:
    from ..metrics.retrieval import retrieval_metrics

    return {name: retrieval_metrics(encoder.encode_images(d.images), encoder.encode_texts(d.captions),
                                    d.caption_image, KS) for name, d in tests.items()}


def _r1_gain(after: dict, before: dict) -> dict:
    return {d: round(100 * (after[d]["R@1"] - before[d]["R@1"]), 2) for d in ("t2i", "i2t")}


def seed_summary(by_model: dict, cfg: LateBenchConfig) -> dict:
    """R@1 gains (points) of CMLI re-ranking per training seed and their mean, on each test set:
    ``within_cmli_model`` = CMLI-trained model re-ranked minus the same model scored globally;
    ``over_global_model`` = CMLI-trained model re-ranked minus the globally trained model (same
    seed and steps) scored globally; ``global_model_rerank`` = the global model's own re-ranking."""
    per_seed = {}
    for sd in (cfg.seed, *cfg.extra_seeds):
        g = by_model["global" if sd == cfg.seed else seed_run("global", sd)]
        c = by_model["cmli" if sd == cfg.seed else seed_run("cmli", sd)]
        per_seed[str(sd)] = {t: {"within_cmli_model": _r1_gain(c[t]["rerank"], c[t]["global"]),
                                 "over_global_model": _r1_gain(c[t]["rerank"], g[t]["global"]),
                                 "global_model_rerank": _r1_gain(g[t]["rerank"], g[t]["global"]),
                                 "r1": {"global_model": {d: g[t]["global"][d]["R@1"] for d in ("t2i", "i2t")},
                                        "cmli_model_global": {d: c[t]["global"][d]["R@1"] for d in ("t2i", "i2t")},
                                        "cmli_model_rerank": {d: c[t]["rerank"][d]["R@1"] for d in ("t2i", "i2t")}}}
                             for t in ("test", "hard_negatives")}
    first = next(iter(per_seed.values()))
    mean = {t: {k: {d: round(float(np.mean([v[t][k][d] for v in per_seed.values()])), 2) for d in ("t2i", "i2t")}
                for k in ("within_cmli_model", "over_global_model", "global_model_rerank")} for t in first}
    return {"per_seed": per_seed, "mean": mean, "n_seeds": len(per_seed)}


# ----------------------------------------------------------------------------- data
def bench_sets(world: Path, cfg: LateBenchConfig) -> tuple[dict[str, RerankSet], list[RerankSet]]:
    """Test sets (split "test" English captions; attribute-swap hard negatives) and val sets."""
    from ..data.world import load_world_spec
    from ..evaluate import load_eval_data
    from ..late.hard_negatives import hard_negative_set
    from ..train.world_model import canonical_val_scenes

    spec = load_world_spec(world)
    if spec is None:
        raise FileNotFoundError(f"{world}: no world.json (generate the world with `nobackfill world`)")
    test = load_eval_data(world, "test", langs=["en"])
    hard = hard_negative_set(spec, "test", limit_pairs=cfg.test_hard_pairs)
    val_px, val_caps = canonical_val_scenes(spec, cfg.n_val)
    val_hard = hard_negative_set(spec, "val", limit_pairs=cfg.val_hard_pairs)
    tests = {"test": RerankSet("test", test.image_paths(), list(test.captions), np.asarray(test.caption_image)),
             "hard_negatives": RerankSet("hard_negatives", hard.pixels, hard.captions, hard.caption_image)}
    vals = [RerankSet("val", val_px, val_caps, np.arange(len(val_caps))),
            RerankSet("val_hard", val_hard.pixels, val_hard.captions, val_hard.caption_image)]
    return tests, vals


# ----------------------------------------------------------------------------- the bench
def run_late_bench(models: Path, world: Path, json_out: Path | None, cfg: LateBenchConfig,
                   work: Path | None = None, log: Callable[[str], None] = print) -> dict:
    import torch

    from ..encoders import load_encoder

    t0 = time.time()
    torch.set_num_threads(cfg.threads)
    teacher_dir = Path(models) / "world-new"
    if not (teacher_dir / "config.json").is_file():
        raise FileNotFoundError(f"{teacher_dir}: the world-new model (teacher / reference) is missing")
    work = Path(work) if work else Path(json_out or "runs/bench/late.json").with_suffix("").parent / "late-work"
    log("memory: naive vs streamed CMLI (fresh subprocess per measurement) ...")
    memory = measure_memory(cfg, log)
    tests, vals = bench_sets(Path(world), cfg)
    log(f"sets: test {len(tests['test'].captions)} captions / {len(tests['test'].images)} images, "
        f"hard negatives {len(tests['hard_negatives'].captions)} (pairs of twins)")
    extra = [seed_run(n, sd) for sd in cfg.extra_seeds for n in ("global", "cmli")]
    train_info = train_runs(list(RUNS) + extra, work, Path(world), teacher_dir, cfg, log, jobs=cfg.jobs)
    log("evaluating ...")
    by_model = {}
    for name in ["global", "cmli"] + extra:
        by_model[name] = evaluate_model(load_encoder(work / name), tests, vals, cfg)
    if cfg.world_new:
        by_model["world_new"] = evaluate_model(load_encoder(teacher_dir), tests, vals, cfg)

    def section(test_name: str) -> dict:
        g, c = by_model["global"], by_model["cmli"]
        sec = {"global": g[test_name]["global"], "cmli_rerank": g[test_name]["rerank"],
               "cmli_trained": c[test_name]["rerank"], "cmli_trained_global": c[test_name]["global"],
               "cmli_trained_cmli_only": c[test_name]["cmli_only"]}
        if "world_new" in by_model:
            sec["world_new_global"] = by_model["world_new"][test_name]["global"]
            sec["world_new_cmli_rerank"] = by_model["world_new"][test_name]["rerank"]
        return sec

    kd_models = {name: load_encoder(work / name) for name in ("global", "global_kd", "target_cmli", "target_cmli_empty")}
    kd = {("student_no_kd" if n == "global" else n): global_metrics(e, tests) for n, e in kd_models.items()}
    kd["teacher_world_new"] = global_metrics(load_encoder(teacher_dir), tests)
    routing_path = work / "target_cmli_empty" / "empty_routing.json"
    kd["empty_routing"] = json.loads(routing_path.read_text()) if routing_path.is_file() else None
    seeds = seed_summary(by_model, cfg)
    result = {
        "retrieval": section("test"),
        "hard_negatives": section("hard_negatives"),
        "rerank_gain": seeds["mean"],
        "seeds": seeds,
        "kd": kd,
        "memory": memory,
        "rerank_choice": {n: m["choice"] for n, m in by_model.items()},
        "val_r1_by_choice": {n: m["val_r1_by_choice"] for n, m in by_model.items()},
        "training": train_info,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "notes": {
            "models": "world-tiny (64-d, 2+2 layers) trained from scratch on fresh world scenes, same seed/steps",
            "global": "trained with global InfoNCE, global cosine scoring",
            "cmli_rerank": "the global model's top-k re-scored with global + w * CMLI from its own tokens",
            "cmli_trained": "trained with global + CMLI InfoNCE (FILIP logits), top-k re-ranked with its tokens",
            "rerank_choice": "per direction, the pair score (directional: Eq. 4 for text queries / Eq. 3 for image "
                             "queries; symmetric: their mean) and fusion weight w chosen on val (regular + "
                             "hard-negative val sets), never on test",
            "memory": "peak = rise of VmHWM over VmRSS after a warm-up, fresh subprocess, 1 thread, no grad",
            "rerank_gain": "R@1 points, mean over training seeds: within_cmli_model = CMLI model re-ranked - same "
                           "model global; over_global_model = CMLI model re-ranked - global model global (same "
                           "seed, steps, data); global_model_rerank = global model re-ranked - global",
            "hard_negatives": "test scenes with >= 2 objects + twins with the colours (else shapes) of objects "
                              "0 and 1 exchanged; retrieval among all originals and twins",
        },
        "seconds": round(time.time() - t0, 1),
    }
    if json_out is not None:
        write_outputs(result, json_out)
    return result


__all__ = ["LateBenchConfig", "run_late_bench", "evaluate_model", "seed_summary", "seed_run"]
