"""``nobackfill bench lingual-text`` and ``bench lingual-world``: continual language learning
(CLL-CLIP with and without TEIR, Yang et al. 2024) measured as a recall matrix ``a[j, i]`` with AR and F
(:mod:`nobackfill.metrics.continual`).

* **lingual-text** - start from the real all-MiniLM-L6-v2 (English only), learn de -> fr -> cs on
  Multi30K task-1 train (parallel translations: ``L_cl`` alone, no images). After each task,
  ``a[j, i]`` = R@1 of language ``i``'s ``test_2016_flickr`` captions retrieving their English line
  (1,000 lines; English side encoded by the current model). English forgetting: caption-to-caption
  R@1 on task-2 val (caption 1 -> caption 2) after each task.
* **lingual-world** - start from the English-only world model ``models/world-new``, learn the
  world's other languages in a fixed order with ``L_cm + L_cl`` (images through the frozen image
  tower); text->image and image->text R@1 per language on the world's test split, plus a check
  that the image embeddings are bit-identical before and after all languages.

Frozen-model embeddings are cached on disk (:func:`nobackfill.evaluate.embed_texts_cached`).
Hyper-parameters were chosen on validation splits (Multi30K task-1 val; world val), never on test.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..evaluate import embed_texts_cached
from ..lingual.data import multi30k_sequence, world_sequence
from ..lingual.learner import CLLConfig
from ..lingual.sequence import map_methods, method_config, prefixed_print, run_sequence, summarise
from ..train.loop import deterministic
from .host import cpu_cache_dir, host_info
from .runner import Report

TEXT_LANGS = ("de", "fr", "cs")
#: the world's languages after English, in a fixed order (the grammars' order)
WORLD_LANGS = ("de", "fr", "es", "ru", "el", "zh")
#: plain CLL-CLIP and the key-query prompt baselines (DualPrompt, CODA-Prompt), each with and without
#: TEIR; every other registered method runs with ``--methods`` (``lingual.sequence.method_variants``)
DEFAULT_METHODS = ("cll_clip", "cll_clip_teir", "dualprompt", "dualprompt_teir", "coda_prompt", "coda_prompt_teir")
WORLD_METHODS = ("cll_clip", "cll_clip_teir", "cll_clip_teir_used")
#: measured references (frozen MiniLM, foreign -> English R@1 on test_2016; English caption-to-caption)
MINILM_REFERENCE = {"de": 0.21, "fr": 0.34, "cs": 0.07, "en_caption": 0.58}
#: steps per language of the --quick modes (sized for < 15 min on 2 CPU cores)
QUICK_TEXT_STEPS = 60
QUICK_WORLD_STEPS = 60


def _quick(cls, kw: dict, steps: int):
    """``cls(**kw)`` with at most ``steps`` optimiser steps per language."""
    c = cls(**kw)
    c.cll = replace(c.cll, steps=min(c.cll.steps, steps))
    return c


class _FamilyRates:
    """A bench config's ``cll`` (shared method settings) and ``teir_lr`` (the TEIR family's own
    learning rate; None: ``cll.lr``)."""

    cll: CLLConfig
    teir_lr: float | None

    def method_cll(self, name: str) -> CLLConfig:
        """The :class:`CLLConfig` of bench method ``name`` (with its family's learning rate)."""
        c = method_config(name, self.cll)
        return replace(c, lr=self.teir_lr) if c.teir and self.teir_lr is not None else c


# ----------------------------------------------------------------------------- lingual-text
@dataclass
class LingualTextConfig(_FamilyRates):
    """CPU-sized CLL on Multi30K. ``cll`` holds the shared method settings; each task trains on
    ``cll.steps`` batches of ``cll.batch_size`` drawn from the first ``train_lines`` task-1 lines
    (the task's vocabulary is trained on the whole task-1 train split of that language)."""

    langs: tuple[str, ...] = TEXT_LANGS
    methods: tuple[str, ...] = DEFAULT_METHODS
    train_lines: int = 29000
    eval_split: str = "test_2016_flickr"
    eval_limit: int | None = None
    #: lr 1e-2: chosen on Multi30K val (first 500 lines, quick budget) from {2e-3, 5e-3, 1e-2} for
    #: plain CLL-CLIP (val AR 0.713 / 0.747 / 0.750) and from {2e-3, 1e-2} for TEIR (0.635 / 0.827)
    cll: CLLConfig = field(default_factory=lambda: CLLConfig(steps=200, batch_size=64, lr=1e-2,
                                                               task_vocab_size=10_000))
    #: learning rate of the methods with TEIR (None: ``cll.lr``, the rate val chose for both);
    #: each family's rate is chosen on Multi30K val with the same step budget
    teir_lr: float | None = None

    @classmethod
    def quick(cls, **kw) -> "LingualTextConfig":
        c = _quick(cls, kw, QUICK_TEXT_STEPS)
        c.train_lines = min(c.train_lines, c.cll.steps * c.cll.batch_size)
        return c


def _text_setup(data, eval_dir, cfg: "LingualTextConfig", model):
    from ..encoders.minilm import MiniLMTextEncoder

    base = MiniLMTextEncoder.pretrained() if model in (None, "", "pretrained") else MiniLMTextEncoder.load(model)
    return base, multi30k_sequence(data, cfg.langs, cfg.train_lines, cfg.eval_split, eval_dir, cfg.eval_limit)


def _text_method(name: str, data, eval_dir, cfg: "LingualTextConfig", model, cache_dir, work_dir,
                 log: Callable[[str], None] | None = None) -> dict:
    """One method's whole sequence (run in the parent or in a worker process), reproducibly
    (:func:`~nobackfill.train.loop.deterministic`)."""
    with deterministic(cfg.cll.seed, cfg.cll.threads):
        base, st = _text_setup(data, eval_dir, cfg, model)
        seq = run_sequence(copy.deepcopy(base), st.tasks, cfg.method_cll(name), st.evaluator(cache_dir),
                           english_corpus=st.english_corpus, english_features=_cached(base, cache_dir),
                           work_dir=Path(work_dir), oracle_corpora=[t.corpus for t in st.tasks],
                           log=log or prefixed_print(name))
    s = summarise(seq.stages, cfg.langs, "f2e")
    s.update({"english_R@1": [x["en_caption"] for x in seq.stages[1:]], "tasks": seq.history,
              "final": {lang: seq.stages[-1]["f2e"][lang] for lang in cfg.langs}, "seconds": round(seq.seconds, 1),
              "model_after": seq.learner.encoder.space_id})  # a fingerprint of every weight and token learned
    return s


def _cached(frozen, cache_dir) -> Callable:
    """Texts -> the frozen model's embeddings, cached on disk (the English targets r^E)."""
    return lambda texts: embed_texts_cached(frozen, texts, cache_dir)


def run_lingual_text(data: str | Path, *, eval_dir: str | Path | None = None, quick: bool = False,
                     config: LingualTextConfig | None = None, model: str | Path | None = None,
                     cache_dir: str | Path = "runs/cache", work_dir: str | Path = "runs/lingual-text",
                     jobs: int = 1, log: Callable[[str], None] = lambda m: None) -> dict:
    """The lingual-text benchmark; ``jobs > 1`` runs the methods in parallel processes (the
    frozen-model embeddings are computed first, so workers only read the shared cache)."""
    cfg = config or (LingualTextConfig.quick() if quick else LingualTextConfig())
    torch.set_num_threads(cfg.cll.threads)
    t_start, cache_dir = time.time(), cpu_cache_dir(cache_dir)
    base, st = _text_setup(data, eval_dir, cfg, model)
    stage0 = st.evaluator(cache_dir)(base)  # warms the cache for every worker
    _cached(base, cache_dir)(st.tasks[0].english)
    for name in cfg.methods:
        method_config(name, cfg.cll)  # fail fast on a bad name
    outs = map_methods(_text_method, cfg.methods, (data, eval_dir, cfg, model, cache_dir, work_dir), jobs, log)
    result: dict = {"methods": {}, "english_R@1_after": {}, "zero_shot": stage0["f2e"],
                    "english_R@1_before": stage0["en_caption"]}
    for name, s in zip(cfg.methods, outs):
        result["methods"][name] = s
        result["english_R@1_after"][name] = s["english_R@1"][-1]
    result.update({
        "langs": list(cfg.langs), "eval_split": cfg.eval_split, "eval_dir": None if eval_dir is None else str(eval_dir),
        "n_eval": len(st.eval_lines["en"]), "train_lines": len(st.tasks[0].foreign), "quick": quick, "config": asdict(cfg),
        "jobs": jobs, "reference_frozen_minilm": MINILM_REFERENCE, "seconds": round(time.time() - t_start, 1),
        "host": host_info(),
    })
    result["teir_gains"] = teir_gains(result)
    return result


# ----------------------------------------------------------------------------- lingual-world
@dataclass
class LingualWorldConfig(_FamilyRates):
    """CLL on the world: each language's train captions (2 per image) paired with the English
    caption of the same image and variant slot; images through the frozen image tower.
    ``translate_test_etas``: translate-test score fusion weights (Fig. 5 of the CLL-CLIP paper)
    evaluated beside the model alone, the query being ``(1 - eta) q_F + eta q_E`` with ``q_E`` the
    world's parallel English caption of the same scene (a perfect translation)."""

    langs: tuple[str, ...] = WORLD_LANGS
    #: plain CLL-CLIP, TEIR with the paper's token sets, and TEIR whose task tokens include every
    #: token the language's text uses (``_used``; see CLLConfig.teir_task_tokens): on world val at
    #: lr 1e-2 it reached t2i AR 0.744 / F 0.011 against the paper's sets' 0.684 / 0.010
    methods: tuple[str, ...] = WORLD_METHODS
    train_images: int = 5000
    eval_split: str = "test"
    eval_limit: int | None = None
    #: eta 1 (the translation alone) had the best val t2i AR for both methods; 0.75 is the best
    #: val i2t of plain CLL-CLIP (world val, 500 images, quick budget, eta in {.25, .5, .75, 1})
    translate_test_etas: tuple[float, ...] = (0.75, 1.0)
    #: lr 5e-3 (plain) and 1e-2 (TEIR), chosen by val t2i AR (world val, 500 images, quick budget of
    #: 60 steps x 64 per language, all six languages) from the same grid {2e-3, 5e-3, 1e-2, 2e-2, 5e-2}:
    #: plain 0.658 / 0.713 / 0.691 / 0.685 / 0.657; TEIR 0.597 / 0.663 / 0.684 / 0.682 / 0.665
    cll: CLLConfig = field(default_factory=lambda: CLLConfig(steps=150, batch_size=64, lr=5e-3,
                                                               task_vocab_size=1000))
    #: learning rate of the methods with TEIR (None: ``cll.lr``)
    teir_lr: float | None = 1e-2

    def __post_init__(self) -> None:
        if self.eval_split not in ("val", "test"):
            raise ValueError(f"world eval split must be 'val' or 'test', got {self.eval_split!r}")
        for eta in self.translate_test_etas:
            if not 0.0 < eta <= 1.0:
                raise ValueError(f"translate-test eta must be in (0, 1], got {eta}")

    @classmethod
    def quick(cls, **kw) -> "LingualWorldConfig":
        c = _quick(cls, kw, QUICK_WORLD_STEPS)
        c.eval_limit = c.eval_limit or 500
        return c


def _world_method(name: str, data, model, cfg: "LingualWorldConfig", cache_dir, work_dir,
                  log: Callable[[str], None] | None = None) -> dict:
    """One method's whole sequence on the world, reproducibly (as :func:`_text_method`)."""
    from ..encoders import load_encoder

    with deterministic(cfg.cll.seed, cfg.cll.threads):
        base = load_encoder(model)
        st = world_sequence(data, base, cfg.langs, cfg.train_images, cfg.eval_split, cfg.eval_limit)
        enc, checks = copy.deepcopy(base), {}
        seq = run_sequence(enc, st.tasks, cfg.method_cll(name),
                           st.evaluator(cfg.langs, cache_dir, cfg.translate_test_etas),
                           english_corpus=st.english_corpus, english_features=_cached(copy.deepcopy(base), cache_dir),
                           work_dir=Path(work_dir), oracle_corpora=[t.foreign for t in st.tasks], log=log or
                           prefixed_print(name), after_all=lambda _: checks.update(st.images_unchanged(base, enc)))
    res = {d: summarise(seq.stages, cfg.langs, d) for d in ("t2i", "i2t")}
    if cfg.translate_test_etas:
        res["translate_test"] = {key: {d: summarise([s["translate_test"][key] for s in seq.stages], cfg.langs, d)
                                       for d in ("t2i", "i2t")} for key in seq.stages[0]["translate_test"]}
    res["english_t2i"] = [x["t2i"]["en"] for x in seq.stages]
    res["english_i2t"] = [x["i2t"]["en"] for x in seq.stages]
    res["zero_shot"] = {d: {lg: seq.stages[0][d][lg] for lg in cfg.langs} for d in ("t2i", "i2t")}
    res.update(checks, tasks=seq.history, seconds=round(seq.seconds, 1))
    return res


def run_lingual_world(data: str | Path = "data/world", *, model: str | Path = "models/world-new", quick: bool = False,
                      config: LingualWorldConfig | None = None, cache_dir: str | Path = "runs/cache",
                      work_dir: str | Path = "runs/lingual-world", jobs: int = 1,
                      log: Callable[[str], None] = lambda m: None) -> dict:
    """The lingual-world benchmark (``jobs > 1``: methods in parallel processes)."""
    cfg = config or (LingualWorldConfig.quick() if quick else LingualWorldConfig())
    torch.set_num_threads(cfg.cll.threads)
    t_start, cache_dir = time.time(), cpu_cache_dir(cache_dir)
    from ..encoders import load_encoder

    base = load_encoder(model)
    st = world_sequence(data, base, cfg.langs, cfg.train_images, cfg.eval_split, cfg.eval_limit)
    st.evaluator(cfg.langs, cache_dir, cfg.translate_test_etas)(base)  # warm the shared cache for the workers
    _cached(base, cache_dir)([x for t in st.tasks for x in t.english])
    for name in cfg.methods:
        method_config(name, cfg.cll)
    outs = map_methods(_world_method, cfg.methods, (data, model, cfg, cache_dir, work_dir), jobs, log)
    result: dict = {"methods": dict(zip(cfg.methods, outs))}
    result.update({"langs": list(cfg.langs), "model": str(model), "eval_split": cfg.eval_split,
                   "n_eval_images": len(st.eval_data), "quick": quick, "config": asdict(cfg), "jobs": jobs,
                   "seconds": round(time.time() - t_start, 1),
                   "host": host_info()})
    result["teir_gains"] = teir_gains(result, ("t2i", "i2t"))
    result["images_bit_identical_all_methods"] = all(m.get("image_embeddings_bit_identical") for m in outs)
    return result


def teir_gains(result: dict, directions: tuple[str, ...] = ()) -> dict:
    """For every ``<method>_teir*`` beside its ``<method>``: AR gain and F drop (per direction of
    ``directions`` when the results have them, e.g. world t2i / i2t)."""
    m = result["methods"]
    out: dict = {}
    for name in m:
        base = name.split("_teir")[0]
        if "_teir" not in name or base not in m:
            continue
        parts = [(f"{d}_", m[name][d], m[base][d]) for d in directions] or [("", m[name], m[base])]
        out[name] = {k: v for p, t, b in parts for k, v in ((f"{p}AR_gain", t["AR"] - b["AR"]),
                                                            (f"{p}F_drop", b["F"] - t["F"]))}
    return out


# ----------------------------------------------------------------------------- output
def format_markdown(result: dict) -> str:
    lines = []
    if "english_R@1_after" in result:  # text
        langs = result["langs"]
        lines.append(f"Multi30K foreign -> English R@1 on {result['eval_split']} ({result['n_eval']} lines), "
                     f"English caption-to-caption R@1 (task2 val) as English forgetting")
        lines.append("")
        lines.append("| method | AR | F | " + " | ".join(f"{lg} final" for lg in langs) + " | English R@1 after |")
        lines.append("|---|---|---|" + "---|" * len(langs) + "---|")
        zs = result.get("zero_shot", {})
        lines.append("| frozen MiniLM | - | - | " + " | ".join(f"{zs.get(lg, float('nan')):.3f}" for lg in langs)
                     + f" | {result.get('english_R@1_before', float('nan')):.3f} |")
        for name, m in result["methods"].items():
            lines.append(f"| {name}{' *' if 'measured' in m else ''} | {m['AR']:.3f} | {m['F']:.3f} | "
                         + " | ".join(f"{m['final'][lg]:.3f}" for lg in langs) + f" | {result['english_R@1_after'][name]:.3f} |")
        lines += [f"\n\\* {n}" for n in dict.fromkeys(m["measured"] for m in result["methods"].values() if "measured" in m)]
    else:
        lines.append(f"World CLL from {result['model']}: R@1 per direction ({result['n_eval_images']} "
                     f"{result['eval_split']} images)")
        lines.append("")
        lines.append("| method | t2i AR | t2i F | i2t AR | i2t F | English t2i after | images bit-identical |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, m in result["methods"].items():
            lines.append(f"| {name} | {m['t2i']['AR']:.3f} | {m['t2i']['F']:.3f} | {m['i2t']['AR']:.3f} | "
                         f"{m['i2t']['F']:.3f} | {m['english_t2i'][-1]:.3f} | {m.get('image_embeddings_bit_identical')} |")
            for eta, tt in m.get("translate_test", {}).items():
                lines.append(f"| {name} + translate-test (eta {eta}) | {tt['t2i']['AR']:.3f} | {tt['t2i']['F']:.3f} | "
                             f"{tt['i2t']['AR']:.3f} | {tt['i2t']['F']:.3f} | - | - |")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, json_path: str | Path | None) -> str:
    """Write ``json_path`` and the markdown table next to it (``.md``), atomically; return the markdown."""
    from ..gallery.atomic_files import atomic_write_bytes

    md = format_markdown(result)
    if json_path is not None:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p, json.dumps(result, indent=2, default=float).encode())
        atomic_write_bytes(p.with_suffix(".md"), md.encode())
    return md


#: how ``bench lingual-text`` / ``lingual-world`` report: the JSON and its table beside it (``.md``, shown)
REPORT = Report(write_outputs)

__all__ = ["run_lingual_text", "run_lingual_world", "LingualTextConfig", "LingualWorldConfig", "format_markdown",
           "write_outputs", "teir_gains", "REPORT"]
