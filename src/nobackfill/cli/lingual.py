"""``nobackfill lingual ...``: continual language learning (Yang et al. 2024)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ._common import (NOTHING_WRITTEN, _bench, check_json_out, check_new_output, config_option, console, emit_json,
                      fail, from_project, json_flag, multi30k_default, on_interrupt, resolve_config, results,
                      set_option, show_config_option, write_json)


lingual_app = typer.Typer(no_args_is_help=True,
                          help="Continual language learning: teach a deployed text tower new languages "
                               "(CLL-CLIP + TEIR; image embeddings never change).")
_STEPS = typer.Option(None, help="Override the steps per language.")
_CACHE = typer.Option(Path("runs/cache"), help="Embedding cache.")
_THREADS = typer.Option(1, help="torch threads (per method process).")
_JOBS = typer.Option(1, help="Run the methods in this many parallel processes (2 on 2 cores).")
_METHODS = typer.Option(None, help="Comma list, e.g. cll_clip,oewc,er_teir or lora_teir,cll_clip_teir_oracle "
                                         "(default: cll_clip, dualprompt, coda_prompt, each with and without _teir). "
                                         "A name is a method, then optionally _teir (itself optionally followed by "
                                         "_grad or _update, then _reg, then _used), then optionally _oracle.")
_LR = typer.Option(None, help="Override the learning rate of the plain methods.")
_TEIR_LR = typer.Option(None, help="Override the learning rate of the TEIR methods.")
_LIMIT = typer.Option(None, help="Evaluate on the first N lines / images of the split.")


def _load_model(model: str):
    """``(encoder, LearnedState | None)``: ``minilm`` / ``pretrained`` = the real
    all-MiniLM-L6-v2; otherwise a model directory, with the per-language modules (adapters,
    prompts) and the state of a model written by ``lingual learn``."""
    from ..encoders.minilm import MiniLMTextEncoder
    from ..lingual.learner import open_learned

    if model in ("minilm", "pretrained"):
        return MiniLMTextEncoder.pretrained(), None
    return open_learned(model)


def _split_langs(text: str, flag: str = "") -> list[str]:
    """The names of a comma list, in order; a ValueError (naming ``flag``) for an empty list or a
    name given twice."""
    langs = [x.strip() for x in text.split(",") if x.strip()]
    if not langs:
        raise ValueError(f"{flag + ': ' if flag else ''}no {'methods' if flag == '--methods' else 'languages'} given")
    twice = [x for x in dict.fromkeys(langs) if langs.count(x) > 1]
    if twice:
        raise ValueError(f"{flag + ' ' if flag else ''}{text}: {', '.join(twice)} given more than once")
    return langs


def _to_learn(langs: list[str], known: list[str]) -> list[str]:
    """The task languages the model does not have yet (it names those it has); a ValueError, before
    any data is read or anything written, when it has them all."""
    todo = [lg for lg in langs if lg not in known]
    if not todo:
        raise ValueError(f"nothing to learn: the model already has {', '.join(langs)}"
                         + ("" if set(known) == set(langs) else f" (it has {', '.join(known)})"))
    if len(todo) < len(langs):
        console.print(f"learning {', '.join(todo)} (the model already has "
                      f"{', '.join(lg for lg in langs if lg not in todo)})")
    return todo


def _english_side(encoder):
    """``encoder`` with English active (no adapter or prompt): the frozen ``r^E`` targets."""
    from ..lingual.adapters import use_language

    use_language(encoder, "en")
    return encoder


@lingual_app.command("learn")
def learn(
    model: str = typer.Option(..., help="Starting model directory (a CLIP world model or a text model), "
                                        "'minilm' for the real all-MiniLM-L6-v2, or a model written by this command."),
    tasks: str = typer.Option("en,de,fr,cs", help="Languages in order; those the model already knows "
                                                  "(English first) are not trained."),
    data: Path = typer.Option(..., help="Multi30K root (task1/raw; text only) or a world data folder (images + captions)."),
    out: Path = typer.Option(..., help="Output model directory."),
    method: Optional[str] = typer.Option(None, help="cll_clip (default) | oewc | er | der | lora | prompt | dualprompt "
                                                   "| coda_prompt (the registry of nobackfill.lingual); each with --teir or not."),
    teir: Optional[bool] = typer.Option(None, "--teir/--no-teir", help="TEIR initialisation and regularisation "
                                                                       "(Eq. 5-6; default on)."),
    teir_scale: Optional[str] = typer.Option(None, help="How lambda acts with Adam: 'update' (default: scale each "
                                                        "row's step) or 'grad' (scale the gradient, the literal Eq. 5)."),
    teir_tokens: Optional[str] = typer.Option(None, help="TEIR's task tokens V_hat_t: 'vocab' (default: the task "
                                                         "vocabulary, Eq. 6's sets) or 'used' (plus every old token the "
                                                         "language's text uses; better on the world bench)."),
    oracle_vocab: Optional[bool] = typer.Option(None, "--oracle-vocab/--no-oracle-vocab",
                                                help="One vocabulary over all tasks' corpora (Table 3, setting 7)."),
    steps: Optional[int] = typer.Option(None, help="Optimiser steps per language."),
    batch_size: Optional[int] = typer.Option(None, help="Batch size (paper: 128)."),
    lr: Optional[float] = typer.Option(None, help="Learning rate (constant after 10% warm-up); the default was "
                                                  "chosen for TEIR on Multi30K val and world val."),
    vocab_size: Optional[int] = typer.Option(None, help="Per-task vocabulary size (paper: 10K)."),
    train_lines: Optional[int] = typer.Option(None, help="Multi30K: train on the first N task-1 lines (N >= 1; "
                                                         "default: every line)."),
    train_images: Optional[int] = typer.Option(None, help="World: train on the first N train images (N >= 1; "
                                                          "default: every train image)."),
    cache_dir: Path = typer.Option(Path("runs/cache"), help="Embedding cache for the frozen English targets."),
    seed: Optional[int] = typer.Option(None),
    threads: Optional[int] = typer.Option(None, help="torch threads."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Learn languages one after another; writes a loadable model plus lingual.json (learned
    languages, history) and the TEIR token statistics."""
    on_interrupt(f"nothing was written to {out} (the model is written at the end): the same command starts again")
    import copy

    import torch

    from ..evaluate import embed_texts_cached
    from ..lingual.learner import LEARN_DEFAULTS, CLLConfig, ContinualLearner
    cfg = resolve_config(CLLConfig, LEARN_DEFAULTS, config, set_, show=show_config, flags={
        "method": method, "teir": teir, "teir_scale": teir_scale, "teir_task_tokens": teir_tokens,
        "oracle_vocab": oracle_vocab, "steps": steps, "batch_size": batch_size, "lr": lr,
        "task_vocab_size": vocab_size, "seed": seed, "threads": threads},
        check=lambda _c: _check_learn_sizes(train_lines, train_images))
    torch.set_num_threads(cfg.threads)
    try:
        langs = _split_langs(tasks, "--tasks")
        _check_learn_output(out, model)
        enc, saved = _load_model(model)
        task_list, english = _learn_tasks(enc, saved, langs, data, train_lines, train_images)
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as e:
        fail(e)
    frozen = _english_side(copy.deepcopy(enc))
    try:
        learner = ContinualLearner(enc, cfg, english, english_features=lambda t: embed_texts_cached(frozen, t, cache_dir),
                                   oracle_corpora=[t.corpus for t in task_list], log=lambda m: console.print(m),
                                   resume=saved if saved is not None and saved.counts is not None else None)
    except ValueError as e:
        fail(e)
    _learn_and_save(learner, task_list, out)
    console.print(f"wrote {out} (languages: {', '.join(learner.learned)})")


def _check_learn_sizes(train_lines: Optional[int], train_images: Optional[int]) -> None:
    """Refuse (``ValueError``) ``--train-lines`` / ``--train-images`` below 1 (trial AL: -3 was blamed on
    the data, 0 trained on every image); left out, they mean everything."""
    for flag, value, what in (("--train-lines", train_lines, "line"), ("--train-images", train_images, "train image")):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value} (leave it out to train on every {what})")


def _check_learn_output(out: Path, model: str) -> None:
    """``lingual learn``'s ``--out``, before anything is read: a finished model there is named as the
    training commands name it (``check_output``); any other file is refused too (it never resumes)."""
    check_new_output(out, sources=(model,), finished="nobackfill.json", what="model")


def _learn_tasks(enc, saved, langs: list[str], data: Path, train_lines: Optional[int], train_images: Optional[int]):
    """``(tasks, English corpus)``: the languages of ``langs`` the model lacks, from Multi30K or a world
    data folder (its train split; images through the frozen image tower)."""
    import numpy as np

    from ..evaluate import load_eval_data
    from ..lingual.data import is_multi30k, multi30k_tasks, world_tasks

    todo = _to_learn(langs, saved.learned if saved is not None else ["en"])
    if is_multi30k(data):
        return multi30k_tasks(data, todo, train_lines)
    d = load_eval_data(data, "train", langs=["en", *todo])
    if train_images is not None:
        d = d.subset_images(np.arange(min(train_images, len(d))))
    return world_tasks(d, enc.encode_images(d.image_paths()), todo)


def _learn_and_save(learner, task_list, out: Path) -> None:
    """Train each task, then write the model to ``out`` in one rename. The per-task training logs go to a
    hidden work folder beside ``out`` that is removed however the run ends (nothing resumes from it:
    the tasks never checkpoint), so a failed or interrupted run leaves neither it nor ``out``."""
    import shutil

    from ..train.loop import TrainingInterrupted

    work = out.parent / f".{out.name}.work"
    shutil.rmtree(work, ignore_errors=True)  # a killed run's leftovers
    try:
        for task in task_list:
            try:
                learner.learn(task, work, progress=True)
            except TrainingInterrupted as e:  # not the loop's "no checkpoint yet": these tasks never checkpoint
                console.print(f"[yellow]interrupted at step {e.step} of {e.steps} (learning {task.lang}); nothing "
                              f"was written: lingual learn does not checkpoint, a rerun starts afresh[/yellow]", markup=True)
                raise typer.Exit(code=130) from None
        learner.save(work / ".saved")
        (work / ".saved").replace(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@lingual_app.command("eval")
def evaluate(
    model: str = typer.Option(..., help="Model directory (or 'minilm')."),
    data: Path = typer.Option(..., help="Multi30K root or a world data folder."),
    langs: str = typer.Option("", help="Languages to evaluate, comma list (default: those the model learned that "
                                       "the data has captions for; a model that learned none besides English: "
                                       "every language of the data)."),
    split: str = typer.Option("", help="Split of a world root or Multi30K (default: test_2016_flickr for Multi30K, "
                                        "test for a world root); a data folder without splits takes none."),
    eval_dir: Optional[Path] = typer.Option(None, help="Multi30K: folder holding {split}.{lang}.gz laid out like task1/raw."),
    eta: float = typer.Option(0.0, help="World: translate-test score fusion weight (0 = the model alone)."),
    limit: Optional[int] = typer.Option(None, help="Evaluate on the first N lines / images (N >= 1; default: all)."),
    cache_dir: Path = typer.Option(Path("runs/cache"), help="Embedding cache."),
    json_out: Optional[Path] = typer.Option(None, "--out", help="Write the result as JSON."),
    threads: int = typer.Option(1, help="torch threads."),
    as_json: bool = json_flag(),
) -> None:
    """Multi30K: foreign -> English caption R@1 per language. World: text->image and image->text R@1."""
    check_json_out(json_out)
    on_interrupt(NOTHING_WRITTEN)
    import numpy as np
    import torch

    from ..evaluate import load_eval_data
    from ..lingual.data import foreign_to_english, is_multi30k, multi30k_eval_lines, world_retrieval
    torch.set_num_threads(threads)
    try:
        enc, saved = _load_model(model)
        m30k = is_multi30k(data) or eval_dir is not None
        _check_eval_args(data, split, limit, m30k)
        split = split or ("test_2016_flickr" if m30k else "test")
        have = _multi30k_langs(data, split, eval_dir) if m30k else _world_langs(data, split)
        lang_list = _eval_langs(langs, saved.learned if saved is not None else [], have, split, foreign_only=m30k)
        if m30k:
            lines = multi30k_eval_lines(data, split, lang_list, eval_dir, limit)
            result = {"task": "multi30k foreign->English R@1", "split": split,
                      "R@1": foreign_to_english(enc, lines, cache_dir)}
        else:
            d = load_eval_data(data, split, langs=list(dict.fromkeys(["en", *lang_list])))
            if limit:
                d = d.subset_images(np.arange(min(limit, len(d))))
            imgs = enc.encode_images(d.image_paths())
            result = {"task": "world retrieval R@1", "split": split, "eta": eta,
                      **world_retrieval(enc, d, imgs, lang_list, cache_dir, eta=eta)}
    except (ValueError, FileNotFoundError, ModuleNotFoundError, NotImplementedError) as e:
        fail(e)
    result.update(model=str(model), langs=lang_list, limit=limit)
    if not as_json:
        _print_recall(result)
    if json_out is not None:
        write_json(json_out, result)
    emit_json(result, as_json)


def _check_eval_args(data: Path, split: str, limit: Optional[int], m30k: bool) -> None:
    """``lingual eval``'s ``--limit`` (at least 1; left out: everything) and ``--split`` (a world root's or
    Multi30K's: a data folder without splits has none to choose), before anything is loaded."""
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit} (leave it out to evaluate everything)")
    if split and not m30k and (Path(data) / "captions.jsonl").is_file():
        raise ValueError(f"--split {split}: {data} is a data folder without splits (its captions.jsonl is "
                         "evaluated whole); leave --split out, or give a world root")


def _print_recall(result: dict) -> None:
    """The R@1 of ``lingual eval`` as a table: one row per language, a column per direction."""
    from rich.table import Table

    cols = {k: v for k, v in result.items() if k in ("R@1", "t2i", "i2t") and isinstance(v, dict)}
    table = Table(title=f"{result['task']} ({result['model']}, split {result['split']})")
    table.add_column("language")
    for name in cols:
        table.add_column("foreign -> English R@1" if name == "R@1" else f"{name} R@1", justify="right")
    for lang in dict.fromkeys(lang for v in cols.values() for lang in v):  # percent, as eval retrieval
        table.add_row(lang, *(f"{100 * v[lang]:.1f}" if isinstance(v.get(lang), (int, float)) else "-"
                              for v in cols.values()))
    results.print(table)


def _multi30k_langs(data: Path, split: str, eval_dir: Optional[Path]) -> list[str]:
    """The languages with a ``{split}.{lang}.gz`` file (in ``eval_dir``, else Multi30K's task1/raw)."""
    folder = Path(eval_dir) if eval_dir is not None else Path(data) / "task1" / "raw"
    found = (p.name[len(split) + 1:-len(".gz")] for p in folder.glob(f"{split}.*.gz")) if folder.is_dir() else ()
    return sorted(lg for lg in found if lg and "." not in lg)


def _world_langs(data: Path, split: str) -> list[str]:
    """The caption languages of a data folder or world split, in file order (captions read, images not
    checked)."""
    from ..data.folder import load_pairs
    from ..evaluate import resolve_data

    return list(dict.fromkeys(load_pairs(resolve_data(data, split), check_images=False).langs))


def _eval_langs(text: str, learned: list[str], have: list[str], split: str, *, foreign_only: bool) -> list[str]:
    """The languages ``lingual eval`` evaluates: ``--langs`` (each must be in the data), else those
    the model learned that the data has captions for, else (a model that learned none besides
    English) every language of the data; English is never a query language on Multi30K (it is the
    gallery). Says which were used and why."""
    pool = [lg for lg in dict.fromkeys(["en", *have]) if lg in have and not (foreign_only and lg == "en")]
    if text.strip():
        chosen = _split_langs(text, "--langs")
        missing = [lg for lg in chosen if lg not in have]
        if have and missing:
            raise ValueError(f"--langs {text}: the data has no {', '.join(missing)} captions in split {split} "
                             f"(it has {', '.join(have)})")
        if foreign_only and "en" in chosen:  # (it printed an empty table for en alone, an en,de one without en)
            raise ValueError(f"--langs {text}: on Multi30K each language is scored against the English captions, "
                             "so English is not evaluated here (English forgetting: `nobackfill bench "
                             "lingual-text`); give the other languages")
        return chosen
    mine = [lg for lg in learned if lg in pool]
    absent = [lg for lg in learned if lg not in have and lg != "en"]
    if any(lg != "en" for lg in mine):
        chosen, why = mine, "learned by the model, with captions in the data"
    else:
        chosen, why = pool, "every language of the data: the model learned " + \
            ("no language in it besides English" if absent else "none besides English")
    why += f"; the model's {', '.join(absent)} not in the data" if absent else ""
    if not chosen:
        raise ValueError(f"no language to evaluate: the data's split {split} has captions in "
                         f"{', '.join(have) or 'no language'} only; give --langs")
    console.print(f"languages: {', '.join(chosen)} ({why}; --langs to choose)")
    return chosen


def bench_lingual_text(
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED)."),
    eval_dir: Optional[Path] = typer.Option(None, help="Folder holding test_2016_flickr.LANG.gz (LANG: en, de, fr, "
                                                       "cs) laid out like task1/raw: evaluate on it instead."),
    quick: bool = typer.Option(False, help="Fewer steps per language (CPU minutes)."),
    methods: Optional[str] = _METHODS,
    steps: Optional[int] = _STEPS,
    lr: Optional[float] = _LR,
    teir_lr: Optional[float] = _TEIR_LR,
    split: str = typer.Option("test_2016_flickr", help="Task-1 split to evaluate on ('val' for tuning)."),
    limit: Optional[int] = _LIMIT,
    cache_dir: Path = _CACHE,
    work_dir: Path = typer.Option(Path("runs/lingual-text"), help="Training scratch."),
    threads: int = _THREADS,
    jobs: int = _JOBS,
    json_out: Path = typer.Option(Path("runs/bench/lingual_text.json"), "--out", help="JSON output (.md beside it)."),
    as_json: bool = json_flag(),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """CLL on real text: MiniLM learns de -> fr -> cs (Multi30K task 1); a[j,i], AR, F per method and
    English forgetting."""
    from ..bench.host import pin_cpu_code_path

    pin_cpu_code_path()  # before torch starts: the committed numbers' CPU code path (AVX2) on any CPU
    from ..bench.lingual import DEFAULT_METHODS, REPORT, LingualTextConfig, run_lingual_text

    try:
        cfg = _bench_config(LingualTextConfig, quick, methods or ",".join(DEFAULT_METHODS), threads, steps, lr, teir_lr,
                            eval_split=split, eval_limit=limit)
        cfg = resolve_config(LingualTextConfig, cfg, config, set_, show=show_config, check=_check_methods)
    except ValueError as e:
        fail(e)
    _bench(cfg, lambda c, log: run_lingual_text(data or multi30k_default(), eval_dir=eval_dir, quick=quick, config=c,
                                                cache_dir=cache_dir, work_dir=work_dir, jobs=jobs, log=log),
           REPORT, json_out, as_json, errors=(ModuleNotFoundError,))


def _bench_config(cls, quick: bool, methods: str, threads: int, steps: int | None, lr: float | None,
                  teir_lr: float | None, **kw):
    """A bench config (``cls.quick`` with ``--quick``) with the command line's overrides."""
    from dataclasses import replace

    cfg = (cls.quick if quick else cls)(methods=tuple(_split_langs(methods, "--methods")), **kw,
                                        **({"teir_lr": teir_lr} if teir_lr else {}))
    cfg.cll = replace(cfg.cll, threads=threads, **({"steps": steps} if steps else {}), **({"lr": lr} if lr else {}))
    return cfg


def _check_methods(cfg) -> None:
    """The bench's methods by name (a bad one fails here, before any data is read, with the run's
    own message; ``--show-config`` too)."""
    for name in cfg.methods:
        cfg.method_cll(name)


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"not a comma list of numbers: {text!r}") from None


def bench_lingual_world(
    data: Path = typer.Option(Path("data/world"), callback=from_project, help="World root."),
    model: Path = typer.Option(Path("models/world-new"), callback=from_project,
                               help="The English-only starting model."),
    quick: bool = typer.Option(False, help="Fewer steps and 500 images (CPU minutes)."),
    methods: Optional[str] = typer.Option(None, help="Comma list (default: cll_clip, cll_clip_teir and cll_clip_teir_used; "
                                                     "see bench lingual-text for the others)."),
    langs: Optional[str] = typer.Option(None, help="Languages to learn, in order (default: de,fr,es,ru,el,zh; "
                                                   "fewer for quick trend checks)."),
    etas: Optional[str] = typer.Option(None, help="Translate-test fusion weights evaluated beside the model alone, "
                                                  "comma list in (0, 1] (default: the bench's val-chosen eta; "
                                                  "'' for none)."),
    split: str = typer.Option("test", help="World split to evaluate on: 'val' for tuning, 'test' to report."),
    limit: Optional[int] = _LIMIT,
    steps: Optional[int] = _STEPS,
    lr: Optional[float] = _LR,
    teir_lr: Optional[float] = _TEIR_LR,
    cache_dir: Path = _CACHE,
    work_dir: Path = typer.Option(Path("runs/lingual-world"), help="Training scratch."),
    threads: int = _THREADS,
    jobs: int = _JOBS,
    json_out: Path = typer.Option(Path("runs/bench/lingual_world.json"), "--out", help="JSON output (.md beside it)."),
    as_json: bool = json_flag(),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """CLL on the world: the English-only world model learns de, fr, es, ru, el, zh in that order;
    t2i / i2t AR and F per method (and with translate-test fusion); image embeddings checked
    bit-identical."""
    from ..bench.host import pin_cpu_code_path

    pin_cpu_code_path()  # as bench lingual-text
    from ..bench.lingual import REPORT, WORLD_METHODS, LingualWorldConfig, run_lingual_world

    try:
        kw = {} if etas is None else {"translate_test_etas": _floats(etas)}
        if langs is not None:
            kw["langs"] = tuple(_split_langs(langs, "--langs"))
        cfg = _bench_config(LingualWorldConfig, quick, ",".join(WORLD_METHODS) if methods is None else methods, threads,
                            steps, lr, teir_lr, eval_split=split, eval_limit=limit, **kw)
        cfg = resolve_config(LingualWorldConfig, cfg, config, set_, show=show_config, check=_check_methods)
    except ValueError as e:
        fail(e)
    _bench(cfg, lambda c, log: run_lingual_world(data, model=model, quick=quick, config=c, cache_dir=cache_dir,
                                                 work_dir=work_dir, jobs=jobs, log=log), REPORT, json_out, as_json)
