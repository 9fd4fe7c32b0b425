"""``nobackfill world``, ``train``, ``train-text``: data and models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer

from ..encoders import list_presets
from ._common import (config_option, fail, multi30k_default, resolve_config, results, set_option,
                      show_config_option)


def world(
    out: Path = typer.Option(Path("data/world"), help="Output folder (train/ val/ test/ + world.json)."),
    n_train: int = typer.Option(20000, help="Training images."),
    n_val: int = typer.Option(1000, help="Validation images."),
    n_test: int = typer.Option(1000, help="Test images."),
    seed: int = typer.Option(0, help="World seed (every item is a function of seed, split, index)."),
    langs: str = typer.Option("", help="Comma-separated languages (default: all grammars)."),
    captions_per_image: int = typer.Option(2, help="Captions per image and language."),
    workers: int = typer.Option(0, help="Processes (0 = up to 2)."),
) -> None:
    """Generate the synthetic multilingual world in the user data format."""
    from ..data.grammars import languages
    from ..data.world import WorldSpec, generate_world

    lang_t = tuple(x.strip() for x in langs.split(",") if x.strip()) or tuple(languages())
    if workers < 0:
        fail(f"--workers must be >= 0 (0: up to 2), got {workers}")
    try:  # (checked before anything is written: a refused world leaves no folder behind)
        spec = WorldSpec(seed=seed, n_train=n_train, n_val=n_val, n_test=n_test, langs=lang_t,
                         captions_per_image=captions_per_image)
        if _world_there(out, spec):
            return
        generate_world(out, spec, workers=workers or None)
    except ValueError as e:
        fail(e)
    results.print(f"world written to {out} ({n_train}/{n_val}/{n_test} images, langs {','.join(lang_t)})")


def _world_there(out: Path, spec: Any) -> bool:
    """True (said) if ``out`` holds this very world already; a folder holding another world, or
    anything else, is refused (its captions would be rewritten and its images left uncaptioned)."""
    if not out.exists():
        return False
    if not out.is_dir():
        fail(f"--out {out} is a file; a world is a folder")
    if (out / "world.json").is_file():
        return _over_a_world(out, spec)
    stray = [p.name for p in out.iterdir() if p.name not in ("train", "val", "test")]
    if stray:
        fail(f"--out {out} exists and is not empty ({', '.join(sorted(stray)[:3])}): choose a new or an empty "
             "folder for the world")
    beyond = [f"{split}: {n:,} images, this world has {want:,}"
              for split, want in spec.counts().items() if (n := _images(out / split)) > want]
    if beyond:  # (trial X: a smaller world written over an unfinished larger one left 9,274 images uncaptioned)
        fail(f"--out {out} holds an unfinished world with more images than this one ({'; '.join(beyond)}): they would "
             "stay there uncaptioned; remove the folder first, or choose another")
    if any(out.iterdir()):  # splits and no world.json: a run that was stopped; every item is rewritten alike
        results.print(f"{out} holds an unfinished world (no world.json): writing it again")
    return False


def _images(split: Path) -> int:
    """The PNG files of a world split folder."""
    images = split / "images"
    return sum(1 for p in images.iterdir() if p.suffix == ".png") if images.is_dir() else 0


def _over_a_world(out: Path, spec: Any) -> bool:
    """:func:`_world_there` for a folder holding a world.json: True (said) for this very world whole;
    False (said) for this world with fewer items or files missing (written again); else refused."""
    import json
    from dataclasses import asdict

    there = out / "world.json"
    want = json.loads(json.dumps(asdict(spec)))
    try:
        had = json.loads(there.read_text())
    except ValueError:
        had = None
    same = had == want
    if not same and _grows(had, want):  # the same world, more of it (make demo's, then the tour's)
        results.print(f"world {out} holds this world with fewer items ({_counts(had)}): writing it with "
                      f"{_counts(want)} (the items it holds are written again alike)")
        return False
    if not same and _grows(want, had):  # the same world, less of it: its other images would stay uncaptioned
        fail(f"--out {out} holds this world with more items ({_counts(had)}): a smaller one there would leave "
             "its other images uncaptioned; choose a new folder (or use the larger world: its splits hold these)")
    missing = _world_files_missing(out, spec) if same else []
    if same and not missing:
        results.print(f"world {out} is there already, with these settings: nothing to do")
        return True
    if same:  # the same world with files removed since: generation is deterministic, so it is written again
        results.print(f"world {out} has these settings but misses files ({'; '.join(missing[:3])}): writing "
                      "it again")
        return False
    fail(f"--out {out} holds another world already (its world.json): choose a new folder (nobackfill deletes "
         "no data: remove it yourself to write another world there)")


_COUNTS = ("n_train", "n_val", "n_test")


def _grows(had: Any, want: dict) -> bool:
    """Whether the world ``want`` is the world ``had`` (both world.json contents) with as many items
    of every split or more: items are drawn per split and index, so its items are ``had``'s and more."""
    if not isinstance(had, dict) or any(not isinstance(had.get(k), int) for k in _COUNTS):
        return False
    rest = {k: v for k, v in want.items() if k not in _COUNTS}
    return {k: v for k, v in had.items() if k not in _COUNTS} == rest and all(want[k] >= had[k] for k in _COUNTS)


def _counts(spec: dict) -> str:
    return ", ".join(f"{k[2:]} {spec[k]:,}" for k in _COUNTS)


def _world_files_missing(out: Path, spec: Any) -> list[str]:
    """What of the world ``spec`` is missing under ``out``: per split, images short of its count, its
    captions.jsonl, or caption lines short of (or beyond) its count (a cheap check of names and lines,
    not of contents: an image changed in place is not seen)."""
    missing = []
    for split, want in spec.counts().items():
        if want == 0:
            continue
        have = _images(out / split)
        if have < want:
            missing.append(f"{split}: {have} of {want} images")
        captions, lines = out / split / "captions.jsonl", want * len(spec.langs) * spec.captions_per_image
        if not captions.is_file():
            missing.append(f"{split}: no captions.jsonl")
        elif (n := _lines(captions)) != lines:
            missing.append(f"{split}: {n} of {lines} caption lines")
    return missing


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def _train_command(preset: str, data: Path, out: Path, steps: Optional[int], seed: int, threads: int,
                   stream: bool, config: Optional[Path] = None, sets: Optional[List[str]] = None,
                   checkpoint_every: int = 250) -> str:
    """The exact ``nobackfill train`` command line that reproduces a run (saved in recipe.json)."""
    import shlex

    parts = ["nobackfill train", f"--preset {preset}", f"--data {data}", f"--out {out}"]
    parts += [f"--steps {steps}"] if steps is not None else []
    parts += [f"--config {config}"] if config is not None else []
    parts += [f"--set {shlex.quote(a)}" for a in sets or ()]
    parts += [f"--seed {seed}"] if seed else []
    parts += [f"--threads {threads}"] if threads else []
    parts += [] if stream else ["--no-stream"]
    parts += [f"--checkpoint-every {checkpoint_every}"] if checkpoint_every != 250 else []
    return " ".join(parts)


def train_cmd(
    preset: str = typer.Option(..., help=f"Zoo preset name ({', '.join(list_presets())}) or TOML path."),
    data: Path = typer.Option(..., help="A world folder (streams fresh scenes) or a user data folder."),
    out: Path = typer.Option(..., help="Output model directory (resumes a killed run from its checkpoint; a "
                                       "finished model there is refused)."),
    steps: Optional[int] = typer.Option(None, help="Override the preset's number of steps."),
    seed: int = typer.Option(0, help="Training seed."),
    threads: int = typer.Option(0, help="torch threads (0 = default)."),
    stream: bool = typer.Option(True, help="On a world folder, sample fresh scenes every step."),
    checkpoint_every: int = typer.Option(250, help="Steps between checkpoints (a killed run resumes from the last "
                                                   "one)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(loop=False),
    show_config: bool = show_config_option(),
) -> None:
    """Contrastive training of a zoo preset (symmetric InfoNCE, learnable temperature). The preset
    (its [model] and [train] tables) is the config: ``--config`` and ``--set train.lr=...`` go over it."""
    from ..config import ConfigError, warn_warmup
    from ..encoders.zoo import Preset, get_preset
    from ..train.loop import check_output
    from ..train.world_model import train_preset

    if threads < 0 or checkpoint_every < 1:  # (before --show-config too)
        fail(f"--threads must be >= 0 (0 = torch's default), got {threads}" if threads < 0 else
             f"--checkpoint-every must be >= 1, got {checkpoint_every}")
    try:
        base = get_preset(preset)
    except (ConfigError, FileNotFoundError) as e:
        fail(e)
    cfg = resolve_config(Preset, base, config, set_, show=show_config, flags={"train": {"steps": steps}})
    try:
        check_output(out, finished="nobackfill.json", what="model")  # a killed run resumes; a finished one is kept
        warn_warmup(cfg)  # every step in the warm-up: said at the start (trial Y)
        r = train_preset(cfg, data, out, seed=seed, threads=threads, stream=stream, checkpoint_every=checkpoint_every,
                         command=_train_command(preset, data, out, steps, seed, threads, stream, config, set_,
                                                checkpoint_every))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        fail(e)
    results.print(f"trained {preset} for {r.steps} steps in {r.seconds:.0f}s -> {out}")
    if r.history:
        results.print(json.dumps(r.history[-1]))


def train_text_cmd(
    data: Optional[Path] = typer.Option(None, help="Multi30K root (default: data/multi30k under $NOBACKFILL_SHARED, "
                                                   "i.e. ../shared/data/multi30k)."),
    out: Path = typer.Option(Path("models/m30k-old-text"), help="Output model directory (resumes a killed run from its "
                                                                "checkpoint; a finished model there is refused)."),
    steps: Optional[int] = typer.Option(None, help="Step budget (early stopping on val R@1 ends it sooner)."),
    batch_size: Optional[int] = typer.Option(None, help="Caption pairs per step."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate."),
    hidden: Optional[int] = typer.Option(None, help="BERT hidden size."),
    layers: Optional[int] = typer.Option(None, help="BERT layers."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate val R@1 every N steps."),
    patience: Optional[int] = typer.Option(None, help="Stop after N evaluations without improvement."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, min=1, help="torch threads (1 is fastest on a shared 2-core machine)."),
    config: Optional[Path] = config_option(),
    set_: Optional[List[str]] = set_option(),
    show_config: bool = show_config_option(),
) -> None:
    """Train the small Multi30K text encoder (the "old" model of `bench xbt-text`): a tiny BERT with its
    own BPE vocabulary on task2 train caption pairs, until val R@1 (caption 1 -> caption 2) stops
    improving."""
    from ..config import warn_warmup
    from ..data.multi30k import read_task2
    from ..train.loop import check_output
    from ..train.text_pairs import TextTrainRecipe, TextTrainSpec, train_text_model

    recipe = resolve_config(TextTrainRecipe, TextTrainRecipe(train=TextTrainSpec(seed=seed, threads=threads)), config,
                            set_, show=show_config, flags={
                                "train": {"steps": steps, "batch_size": batch_size, "lr": lr, "eval_every": eval_every,
                                          "patience": patience},
                                "model": {"hidden": hidden, "layers": layers}})
    model, ts = recipe.model, recipe.train
    root = data or multi30k_default()
    parts = ["nobackfill train-text"] + ([f"--data {data}"] if data else []) + [f"--out {out}"]
    for flag, v in (("steps", steps), ("batch-size", batch_size), ("lr", lr), ("hidden", hidden), ("layers", layers),
                    ("eval-every", eval_every), ("patience", patience)):
        parts += [f"--{flag} {v}"] if v is not None else []
    parts += ([f"--seed {seed}"] if seed else []) + ([f"--threads {threads}"] if threads != 1 else [])
    parts += ([f"--config {config}"] if config else []) + [f"--set {x}" for x in set_ or ()]
    try:
        check_output(out, finished="nobackfill.json", what="model")  # a killed run resumes; a finished one is kept
        warn_warmup(recipe)
        train_caps = read_task2(root, "train", "en")
        val = read_task2(root, "val", "en", ks=(1, 2))
        r = train_text_model(train_caps.captions, val.column(1), val.column(2), out, model=model, train_spec=ts,
                             command=" ".join(parts), data=str(root))
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    results.print(f"trained {out} for {r.steps} steps in {r.seconds:.0f}s; best val R@1 {r.best_value:.3f} "
                  f"at step {r.best_step}{' (early stop)' if r.stopped_early else ''}")
