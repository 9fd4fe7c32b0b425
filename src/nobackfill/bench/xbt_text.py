"""``nobackfill bench xbt-text``: XBT on real text (Multi30K task 2, caption-to-caption retrieval).

Task: on the val split, caption 1 of every image queries the captions 2 of all images; the
caption 2 of the same image is the one match (R@1/5/10).

* **old** - a small text encoder trained from scratch on all task-2 train captions until its val
  R@1 stopped improving (``nobackfill train-text``; shipped in ``models/m30k-old-text``). It embeds
  the gallery (captions 2).
* **new** - the real all-MiniLM-L6-v2.

Rows:

* ``old_old`` / ``new_new`` - each model on both sides.
* ``phi_stage1_new_old`` - MiniLM query through a phi trained *only* with stage 1 (Eq. 3):
  ``L_c(phi(w_new + eps), w_old)`` on train captions (both encoders frozen; embeddings cached).
* ``xbt_new_old`` - the XBT recipe applied to text (Eq. 4-5 with a second caption in place of the
  image): ``L_c(phi(w_new(cap_a)), phi(w_new(cap_b)))`` over pairs of two different captions of one
  train image; trainable LoRA (rank 16, alpha 16, dropout 0.1, via peft) on MiniLM's attention
  projections, MiniLM's LayerNorms, and phi (starting from the stage-1 phi). The old model is not
  loaded in this stage: its gallery embeddings are computed before and the model object is freed
  (checked with a weak reference, reported as ``xbt_old_model_alive``).

Embeddings of frozen models are cached on disk keyed by the model's space id and the text content
(:func:`nobackfill.evaluate.embed_texts_cached`), so a second run only trains.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import os
import platform
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROWS = ("old_old", "new_new", "phi_stage1_new_old", "xbt_new_old")
KS = (1, 5, 10)
#: BERT attention projections adapted by LoRA (the analogue of CLIP's q/k/v/out_proj)
BERT_LORA_TARGETS = r".*\.attention\.(self\.(query|key|value)|output\.dense)$"
DEFAULT_OLD_MODEL = "models/m30k-old-text"


@dataclass
class TextXBTConfig:
    """Stage 2 on caption pairs of the first ``images`` train images.

    Paper (App. A.2): AdamW lr 1e-4 constant, wd 0.01, batch 1,024, tau fixed (log scale 2.6592),
    one epoch over 4M pairs. Ours (CPU, a few seconds per MiniLM step): lr 1e-4 constant, batch 32
    pairs, 60 steps; chosen on val among lr 5e-5..5e-4, batch 32/64, 60..240 steps, phi all /
    LayerNorms only (larger learning rates or longer runs drift away from the old space: no term of
    Eq. 5 anchors phi's output to it)."""

    images: int = 29000
    steps: int = 60
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup: int = 5
    schedule: str = "constant"
    phi_train: str = "all"  # "all" (the issue: "and phi") | "layernorm" (App. A.2) | "none" (frozen)
    lora_rank: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    eval_every: int = 15

    def __post_init__(self) -> None:
        if self.phi_train not in ("all", "layernorm", "none"):
            raise ValueError(f"phi_train must be 'all', 'layernorm' or 'none', got {self.phi_train!r}")


def _stage1_default():
    from ..compat.xbt import Stage1Config

    return Stage1Config(steps=3000, batch_size=1024, lr=1e-3, noise_std=0.02, corpus_size=0)


@dataclass
class XBTTextConfig:
    """Stage 1 (:class:`nobackfill.compat.xbt.Stage1Config`) on the captions of the first
    ``stage1_images`` train images (all 5 each, deduplicated), then stage 2 (:class:`TextXBTConfig`)."""

    stage1_images: int = 29000
    stage1: "Stage1Config" = field(default_factory=_stage1_default)  # noqa: F821
    xbt: TextXBTConfig = field(default_factory=TextXBTConfig)
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        # one seed and thread count for both stages
        self.stage1.seed, self.stage1.threads = self.seed, self.threads

    @classmethod
    def quick(cls, **kw) -> "XBTTextConfig":
        """``--quick``: stage 1 on 8,000 images (40k captions) for 1,500 steps; stage 2 pairs from
        the same 8,000 images."""
        s1 = _stage1_default()
        s1.steps = 1500
        return cls(stage1_images=8000, stage1=s1, xbt=TextXBTConfig(images=8000), **kw)

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- pieces
def load_val(data: str | Path, eval_dir: str | Path | None = None, limit: int | None = None) -> tuple[list[str], list[str]]:
    """Queries (caption 1) and gallery (caption 2) of the val split (or of ``eval_dir``)."""
    from ..data.multi30k import read_task2

    cs = read_task2(data, "val", "en", ks=(1, 2), eval_dir=eval_dir, limit=limit)
    return cs.column(1), cs.column(2)


def caption_recall(query: np.ndarray, gallery: np.ndarray) -> dict[str, float]:
    """R@1/5/10 (+ median rank, mAP) of ``query[i] -> gallery[i]``."""
    from ..train.text_pairs import caption_retrieval

    m = caption_retrieval(query, gallery, KS)
    return {k: float(m[k]) for k in (*[f"R@{k}" for k in KS], "median_rank", "mAP")}


def attach_text_lora(model: torch.nn.Module, rank: int = 16, alpha: int = 16, dropout: float = 0.1,
                     seed: int = 0) -> dict[str, int]:
    """Freeze ``model`` (a BERT), inject peft LoRA into its attention projections, and make its
    LayerNorms trainable, in place. Returns the trainable parameter counts."""
    from peft import LoraConfig, inject_adapter_in_model

    model.requires_grad_(False)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, bias="none",
                                           target_modules=BERT_LORA_TARGETS), model)
    finally:
        torch.random.set_rng_state(state)
    counts = {"lora": 0, "layernorm": 0}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.LayerNorm):
            for p in mod.parameters():
                p.requires_grad_(True)
                counts["layernorm"] += p.numel()
    for n, p in model.named_parameters():
        if ".lora_" in n:
            p.requires_grad_(True)
            counts["lora"] += p.numel()
    if not counts["lora"]:
        raise ValueError("LoRA matched no attention projection (is this a BERT model?)")
    return counts


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def load_text_encoder(path: str | Path | None):
    """A MiniLM text encoder: the shipped pretrained all-MiniLM-L6-v2 for ``None``/``"pretrained"``,
    else a saved model directory."""
    from ..encoders.minilm import MiniLMTextEncoder

    return MiniLMTextEncoder.pretrained() if path in (None, "", "pretrained") else MiniLMTextEncoder.load(path)


#: how the old model is opened (a module attribute so tests can watch it)
load_old_model: Callable = load_text_encoder


def train_stage1(w_new: np.ndarray, w_old: np.ndarray, cfg, out: Path, progress: bool = False):
    """Eq. 3 on cached embeddings (``cfg``: :class:`nobackfill.compat.xbt.Stage1Config`) with
    :class:`nobackfill.compat.xbt.TextOnlyProjectionPretraining`; phi is written to ``out``."""
    from ..compat.data import IndexBatches
    from ..compat.phi import Projection
    from ..compat.xbt import TextOnlyProjectionPretraining
    from ..train.loop import train

    torch.manual_seed(cfg.seed)
    phi = Projection(w_new.shape[1], w_old.shape[1])
    method = TextOnlyProjectionPretraining(phi, w_new, w_old, cfg.noise_std, cfg.log_logit_scale)
    res = train(method, IndexBatches(len(w_new), cfg.batch_size, cfg.seed), cfg.loop(), out, progress=progress)
    phi.eval()
    return phi, res


def train_text_xbt(new, phi, captions: Sequence[Sequence[str]], cfg: TextXBTConfig, out: Path, *, seed: int = 0,
                   threads: int = 0, progress: bool = False, evaluate: Callable[[object], dict] | None = None):
    """Stage 2 on caption pairs: LoRA + LayerNorms on ``new`` (in place) and ``phi`` (a copy is
    trained; the argument is left as is). Only the new model and phi are touched: there is no old
    model argument. ``evaluate(phi_in_training)`` is called every ``cfg.eval_every`` steps.
    Returns ``(trained phi, TrainResult, trainable counts)``."""
    from ..compat.xbt import LOG_LOGIT_SCALE
    from ..train.loop import LoopConfig, train
    from ..train.text_pairs import CaptionPairBatches, TextPairContrastive

    counts = attach_text_lora(new.model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, seed=seed)
    new.invalidate_space_id()
    phi = copy.deepcopy(phi)
    phi_params = {"layernorm": phi.layernorm_parameters, "all": lambda: list(phi.parameters()),
                  "none": list}[cfg.phi_train]()
    phi.requires_grad_(False)
    for p in phi_params:
        p.requires_grad_(True)
    counts["phi"] = sum(p.numel() for p in phi_params)
    method = TextPairContrastive(new, head=phi, learn_temperature=False, log_scale=LOG_LOGIT_SCALE)
    loop = LoopConfig(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup, weight_decay=cfg.weight_decay, seed=seed,
                      threads=threads, schedule=cfg.schedule, log_every=max(1, min(25, cfg.steps)),
                      checkpoint_every=max(25, cfg.eval_every), eval_every=cfg.eval_every)
    batches = CaptionPairBatches([c[:cfg.images] for c in captions], cfg.batch_size, seed=seed)
    ev = (lambda: evaluate(phi)) if evaluate is not None else None
    res = train(method, batches, loop, out, evaluate=ev, progress=progress, export=False)
    phi.eval()
    new.model.eval()
    return phi, res, counts


def format_markdown(result: dict) -> str:
    lines = ["| row | query | gallery | R@1 | R@5 | R@10 |", "|---|---|---|---:|---:|---:|"]
    sides = {"old_old": ("old", "old"), "new_new": ("MiniLM", "MiniLM"),
             "phi_stage1_new_old": ("phi_stage1(MiniLM)", "old"), "xbt_new_old": ("phi_xbt(MiniLM+LoRA)", "old")}
    for name in ROWS:
        r = result["rows"].get(name)
        if r is None:
            continue
        q, g = sides[name]
        lines.append(f"| {name} | {q} | {g} | " + " | ".join(f"{100 * r[f'R@{k}']:.1f}" for k in KS) + " |")
    lines.append("")
    lines.append(f"Multi30K task2 val ({result.get('n_val')} images): caption 1 -> caption 2, recall in %.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the benchmark
def run_xbt_text(data: str | Path, *, eval_dir: str | Path | None = None, quick: bool = False,
                 old_model: str | Path = DEFAULT_OLD_MODEL, new_model: str | Path | None = None,
                 cache_dir: str | Path | None = "runs/cache", work_dir: str | Path = "runs/xbt-text",
                 config: XBTTextConfig | None = None, progress: bool = False,
                 log: Callable[[str], None] | None = None) -> dict:
    """Run every row; return the result dict (``{"rows": {...}, ...}``)."""
    from ..compat.data import dedupe
    from ..data.multi30k import CaptionSet, read_task2

    say = log or (lambda s: None)
    cfg = config or (XBTTextConfig.quick() if quick else XBTTextConfig())
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_all = time.time()
    timings: dict[str, float] = {}
    cache_stats: dict[str, dict] = {}

    # ---- data
    q_val, g_val = load_val(data, eval_dir)
    n_img = max(cfg.stage1_images, cfg.xbt.images)
    train_cs = read_task2(data, "train", "en", limit=n_img)
    # stage-1 corpus: every caption of the first stage1_images images, image-major (so a smaller
    # corpus is a prefix of a larger one and reuses its cached embedding blocks), deduplicated
    flat, _ = CaptionSet([c[:cfg.stage1_images] for c in train_cs.captions], train_cs.source).flat()
    uniq = {t: i for i, t in reversed(list(enumerate(flat)))}
    corpus_idx = np.array([uniq[t] for t in dedupe(flat)], np.int64)

    def cached(enc, texts, what):
        from ..evaluate import embed_texts_cached

        st = cache_stats.setdefault(what, {})
        return embed_texts_cached(enc, texts, cache_dir, progress=progress, stats=st)

    # ---- old model: val gallery + queries, train corpus; then freed
    t0 = time.time()
    old = load_old_model(old_model)
    old_id, old_dim = old.space_id, old.embed_dim
    o_q, o_g = cached(old, q_val, "old_val_q"), cached(old, g_val, "old_val_g")
    o_train = cached(old, flat, "old_train")[corpus_idx]
    old_ref = weakref.ref(old.model)
    del old
    gc.collect()
    timings["old_embed_s"] = time.time() - t0
    say(f"old model {old_id}: embedded in {timings['old_embed_s']:.0f}s")

    # ---- new model (frozen) embeddings
    t0 = time.time()
    new = load_text_encoder(new_model)
    new_id, new_name = new.space_id, new.name
    n_q, n_g = cached(new, q_val, "new_val_q"), cached(new, g_val, "new_val_g")
    n_train = cached(new, flat, "new_train")[corpus_idx]
    timings["new_embed_s"] = time.time() - t0
    say(f"new model {new_name} {new_id}: embedded in {timings['new_embed_s']:.0f}s")

    rows = {"old_old": caption_recall(o_q, o_g), "new_new": caption_recall(n_q, n_g)}
    say(f"old_old R@1 {rows['old_old']['R@1']:.3f}  new_new R@1 {rows['new_new']['R@1']:.3f}")

    run_dir = Path(work_dir) / _key({"old": old_id, "new": new_id, "cfg": cfg.to_dict(),
                                     "train": _key(flat), "n": n_img})

    # ---- stage 1
    t0 = time.time()
    phi1, res1 = train_stage1(n_train, o_train, cfg.stage1, run_dir / "stage1", progress=progress)
    timings["stage1_train_s"] = res1.seconds
    rows["phi_stage1_new_old"] = caption_recall(phi1.project(n_q), o_g)
    say(f"phi_stage1_new_old R@1 {rows['phi_stage1_new_old']['R@1']:.3f} ({time.time() - t0:.0f}s)")

    # ---- stage 2 (XBT); the old model is gone (only its gallery vectors remain)
    gc.collect()
    old_alive = old_ref() is not None
    if old_alive:
        raise RuntimeError("the old model is still in memory at the XBT stage")

    def xbt_query(phi) -> np.ndarray:  # loop evaluation runs in eval mode (dropout off)
        return phi.project(new.encode_texts(q_val))

    def evaluate(phi) -> dict:
        r = caption_recall(xbt_query(phi), o_g)
        return {"R@1": r["R@1"], "R@5": r["R@5"], "R@10": r["R@10"]}

    t0 = time.time()
    phi2, res2, counts = train_text_xbt(new, phi1, train_cs.captions, cfg.xbt, run_dir / "xbt", seed=cfg.seed,
                                        threads=cfg.threads, progress=progress, evaluate=evaluate)
    timings["xbt_train_s"] = res2.seconds
    rows["xbt_new_old"] = caption_recall(xbt_query(phi2), o_g)
    say(f"xbt_new_old R@1 {rows['xbt_new_old']['R@1']:.3f} ({time.time() - t0:.0f}s)")
    timings["total_s"] = time.time() - t_all

    curve = [{"step": r["step"], "loss": round(r["loss"], 4), "seconds": r["seconds"],
              **{k[5:]: round(v, 4) for k, v in r.items() if k.startswith("eval/")}}
             for r in res2.history if "eval/R@1" in r]
    return {
        "rows": {k: {m: rows[k][m] for m in ("R@1", "R@5", "R@10")} for k in ROWS},
        "rows_detail": rows,
        "n_val": len(q_val),
        "task": "Multi30K task2 en, val: caption 1 -> caption 2",
        "eval_dir": str(eval_dir) if eval_dir else None,
        "quick": bool(quick),
        "old": {"path": str(old_model), "space_id": old_id, "dim": old_dim},
        "new": {"name": new_name, "space_id": new_id, "dim": int(n_q.shape[1])},
        "stage1": {"corpus_size": int(len(corpus_idx)), "steps": res1.steps, "seconds": round(res1.seconds, 1),
                   "last_loss": res1.last_loss},
        "xbt": {"pairs_images": min(cfg.xbt.images, train_cs.n_images), "steps": res2.steps,
                "seconds": round(res2.seconds, 1), "last_loss": res2.last_loss, "trainable": counts,
                "val_curve": curve},
        "xbt_old_model_alive": old_alive,
        "config": cfg.to_dict(),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "cache": {"dir": str(cache_dir) if cache_dir else None, "blocks": cache_stats},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version()},
        "criteria": {
            "old_old_R@1>=0.40": rows["old_old"]["R@1"] >= 0.40,
            "xbt_new_old_R@1>old_old_R@1": rows["xbt_new_old"]["R@1"] > rows["old_old"]["R@1"],
            "|phi_stage1-old_old|<=0.03": abs(rows["phi_stage1_new_old"]["R@1"] - rows["old_old"]["R@1"]) <= 0.03,
        },
    }


def write_outputs(result: dict, json_path: str | Path | None) -> str:
    """Write ``json_path`` and the markdown table next to it (``.md``); return the markdown."""
    md = format_markdown(result)
    if json_path is not None:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2, default=float))
        tmp.replace(p)
        p.with_suffix(".md").write_text(md)
    return md


__all__ = ["run_xbt_text", "XBTTextConfig", "TextXBTConfig", "attach_text_lora",
           "train_stage1", "train_text_xbt", "format_markdown", "write_outputs", "load_val", "ROWS"]
