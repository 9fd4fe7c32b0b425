"""The models ``bench late`` trains: one run per name of :data:`RUNS` (global, CMLI, the KD
students), each reused when ``work/<name>/recipe.json`` records the same settings, trained in
parallel processes when asked (each a call of :func:`nobackfill.late.world.train_world_method`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from .late_config import LateBenchConfig


RUNS = {  # name -> (kind, KD config kwargs)
    "global": ("global", None),
    "cmli": ("cmli", None),
    "global_kd": ("kd", {"mode": "global"}),
    "target_cmli": ("kd", {"empty_target": False}),
    "target_cmli_empty": ("kd", {"empty_target": True}),
}


def seed_run(name: str, seed: int) -> str:
    """Run name of a global / CMLI model trained with an extra seed (``cmli_seed1``)."""
    return f"{name}_seed{seed}"


def _parse_run(name: str, cfg: LateBenchConfig) -> tuple[str, int]:
    """``(RUNS key, training seed)`` of a run name (``cmli_seed1`` -> ``("cmli", 1)``)."""
    base, _, tail = name.rpartition("_seed")
    if base in RUNS and tail.isdigit():
        return base, int(tail)
    if name not in RUNS:
        raise ValueError(f"unknown late bench run {name!r}")
    return name, cfg.seed


def _run_key(name: str, cfg: LateBenchConfig, world_seed: int) -> dict:
    from ..late.distill import KDConfig

    from ..late.train import CMLIConfig

    base, seed = _parse_run(name, cfg)
    kind, kd_kw = RUNS[base]
    return {"kind": kind, "steps": cfg.kd_steps if kind == "kd" else cfg.steps, "batch_size": cfg.batch_size,
            "lr": cfg.lr, "seed": seed, "preset": cfg.preset, "world_seed": world_seed,
            "swap_twins": cfg.swap_twins and kind != "kd", "kd": asdict(KDConfig(**kd_kw)) if kd_kw else None,
            "cmli": asdict(CMLIConfig(cmli_weight=cfg.cmli_loss_weight)) if kind == "cmli" else None}


def train_one(name: str, work: str, world: str, teacher_dir: str, cfg: LateBenchConfig) -> dict:
    """Train run ``name`` into ``work/name`` (a separate process may call this)."""
    import torch

    from ..data.world import WorldStream, load_world_spec
    from ..encoders import load_encoder
    from ..late.distill import KDConfig
    from ..late.train import CMLIConfig
    from ..late.world import train_world_method

    torch.set_num_threads(cfg.threads)
    spec = load_world_spec(world)
    teacher = load_encoder(teacher_dir)
    kind, kd_kw = RUNS[_parse_run(name, cfg)[0]]
    key = _run_key(name, cfg, spec.seed)
    out = Path(work) / name
    method, result = train_world_method(kind, out, spec, teacher.tokenizer, preset=cfg.preset, steps=key["steps"],
                                        batch_size=cfg.batch_size, lr=cfg.lr, seed=key["seed"], threads=cfg.threads,
                                        kd=KDConfig(**kd_kw) if kd_kw else None,
                                        cmli=CMLIConfig(**key["cmli"]) if key["cmli"] else None,
                                        teacher=teacher if kind == "kd" else None, swap_twins=key["swap_twins"])
    if name == "target_cmli_empty":  # which words the empty target excuses, on fresh (unseen) scenes
        px, caps, _ = WorldStream(cfg.routing_pairs, seed=spec.seed * 1000 + 999).batch(0)
        method.train_mode(False)
        (out / "empty_routing.json").write_text(json.dumps(method.empty_routing(px, caps), indent=2))
    return {"seconds": round(result.seconds, 1), "reused": False, "steps": key["steps"],
            "last": result.history[-1] if result.history else None}


def train_runs(names: Sequence[str], work: Path, world: Path, teacher_dir: Path, cfg: LateBenchConfig,
               log: Callable[[str], None], jobs: int = 1) -> dict[str, dict]:
    """Train (or reuse, when ``work/<name>/recipe.json`` records the same settings) each run;
    ``jobs`` > 1 trains that many runs at once in separate processes (``cfg.threads`` each)."""
    from ..data.world import load_world_spec

    spec = load_world_spec(world)
    info, todo = {}, []
    for name in names:
        out = work / name
        want = _run_key(name, cfg, spec.seed)
        if (out / "recipe.json").is_file() and (out / "model.safetensors").is_file():
            old = json.loads((out / "recipe.json").read_text())
            if all(old.get(k) == v for k, v in want.items()):
                log(f"reusing {out} ({name})")
                info[name] = {"seconds": old.get("seconds"), "reused": True, "steps": want["steps"]}
                continue
        todo.append(name)
    args = [(n, str(work), str(world), str(teacher_dir), cfg) for n in todo]
    log(f"training {', '.join(todo) or 'nothing'} ({jobs} at a time) ...")
    if jobs > 1 and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=mp.get_context("spawn")) as ex:
            for a, r in zip(args, ex.map(train_one, *zip(*args))):
                info[a[0]] = r
                log(f"  {a[0]}: {r['seconds']} s")
    else:
        for a in args:
            info[a[0]] = train_one(*a)
            log(f"  {a[0]}: {info[a[0]]['seconds']} s")
    return {n: info[n] for n in names}
