"""The XBT benchmark (``nobackfill bench xbt``): backfill-free upgrades of the world models.

Setting: the gallery is the world's evaluation split (test by default; ``--split val`` is what
hyper-parameters were tuned on) embedded by ``world-old`` (64-d); queries come from ``world-new``
(128-d) through each method. Rows (XBT paper Table 1 protocols, R@1/5/10 both directions):

* ``old_old``, ``new_new`` (the original new model, i.e. the upgrade switched off), and
  ``new_old_raw`` (the first 64 dims of the raw new embeddings against the old gallery: chance);
* ``phi_text_only`` - stage 1 only (Eq. 3): phi applied to the raw new embeddings;
* ``xbt`` - stage 1 + stage 2 (Eq. 4-5), the old model never loaded in stage 2;
* ``direct_full``, ``direct_lora``, ``direct_base`` - Eq. 6 with a random phi;
* ``procrustes`` - training-free orthogonal Procrustes fitted on the stage-1 corpus embeddings;
* ``slerp`` - ``slerp(q_old, procrustes(q_new), t)`` (the query side runs both models).

For every row: ``t2i`` = ``w_bar_new / v_old`` (new text queries, old image gallery) and ``i2t``
= ``v_bar_new / w_old``; Eq. 1 criterion rates; for adapter methods, new/new with the upgrade off
and its max abs difference to the original new model. Also: a sweep over the number of
image-text pairs (XBT vs Direct-Base), a cost table (training wall time and peak memory per
method, each method trained in its own fresh process so peak RSS is its own; which models each
loaded), the continual matrix (old -> new -> newer, A.3) with AC / AA / ACA, and zero-shot
classification on the world's 64 classes (Table 8 style). Means over ``--seeds`` training seeds.

Budgets above 4k, Direct Full-tune / LoRA-only and the continual chain are trained for the first
``extra_seeds`` seeds only (CPU time); XBT, Direct-Base and budgets <= 4k for every seed. Each training job runs in a spawned child process (``isolate=True``); its upgrade directory
stays under ``cfg.work`` (``runs/bench/xbt-work/``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..compat.xbt import Stage1Config, XBTConfig
from ..config import to_dict, updated
from ..metrics.retrieval import r1_by_image_subset
from ..report import mean_over_seeds
from .xbt_jobs import encode_eval, run_isolated
from .xbt_report import MAIN_ROWS, write_xbt_report
from ..search.compat_report import gap_closures
from .xbt_rows import cross, prompt_zero_shot, row_metrics, summary

@dataclass
class XBTBenchConfig:
    """What ``bench xbt`` runs. :meth:`quick` and :meth:`full` are the two presets."""

    quick: bool = False
    seeds: int = 3
    split: str = "test"
    n_eval: int = 1000
    n_pairs: int = 4000
    sweep: tuple[int, ...] = (1000, 4000, 16000)
    corpus_size: int = 40000
    stage1: Stage1Config = field(default_factory=Stage1Config)
    stage2: XBTConfig = field(default_factory=XBTConfig)
    slerp_t: float = 0.5
    continual: bool = True
    #: budgets above 4k, Direct Full-tune / LoRA-only and the continual chain are trained for the
    #: first ``extra_seeds`` seeds only (CPU time); XBT, Direct-Base and budgets <= 4k for every seed
    extra_seeds: int = 1
    direct: bool = True
    threads: int = 2
    isolate: bool = True
    n_unpaired: int = 20000
    #: scratch: every job's upgrade directory and embeddings (emptied at the start of a run)
    work: Path = Path("runs/bench/xbt-work")

    @classmethod
    def full(cls, **kw) -> "XBTBenchConfig":
        """The reported run: 3 seeds, stage 1 as tuned (1,500 steps on 40k captions), stage 2 and the
        Direct baselines for 150 steps at batch 64 (the shipped upgrade used 300 x 128; halved twice
        so that 3 seeds fit in about 1.5 hours on 2 cores), sweep {1k, 4k, 16k}."""
        base = dict(stage2=updated(XBTConfig(), steps=150, batch_size=64, warmup=10))
        base.update(kw)
        return cls(**base)

    @classmethod
    def quick_preset(cls, **kw) -> "XBTBenchConfig":
        """About 10 minutes on 2 cores: 1 seed, stage 1 for 600 steps on 10k captions, stage 2 and
        the Direct baselines for 60 steps at batch 32, sweep {1k, 4k}."""
        base = dict(quick=True, seeds=1, sweep=(1000, 4000), corpus_size=10000,
                    stage1=updated(Stage1Config(), steps=600, corpus_size=10000),
                    stage2=updated(XBTConfig(), steps=60, batch_size=32, warmup=5))
        base.update(kw)
        return cls(**base)

    def to_dict(self) -> dict:
        d = to_dict(self)
        d["sweep"] = list(self.sweep)
        return d


# ----------------------------------------------------------------------------- the benchmark
def run_xbt_bench(models_dir: str | Path = "models", world: str | Path = "data/world",
                  out_json: str | Path = "runs/bench/xbt.json", cfg: XBTBenchConfig | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Run the benchmark; writes ``out_json``, a Markdown table and an HTML report beside it."""
    import torch

    from ..compat.bridges import PhiBridge, ProcrustesBridge, SlerpBridge
    from ..compat.data import world_eval_set
    from ..compat.phi import Projection
    from ..data.grammars import get_grammar
    from ..data.scene import COLOURS, SHAPES
    from ..data.world import WorldSpec, load_world_spec
    from ..encoders import load_encoder

    cfg = cfg or XBTBenchConfig()
    t_all = time.time()
    models_dir, out_json = Path(models_dir), Path(out_json)
    paths = {k: models_dir / f"world-{k}" for k in ("old", "new", "newer")}
    for k in ("old", "new"):
        if not (paths[k] / "model.safetensors").is_file():
            raise FileNotFoundError(f"{paths[k]}: no trained model (model.safetensors)")
    has_newer = (paths["newer"] / "model.safetensors").is_file()
    spec = load_world_spec(world) or WorldSpec()
    work = Path(cfg.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    torch.set_num_threads(cfg.threads)

    log(f"rendering the world {cfg.split} split ({cfg.n_eval} images) ...")
    ev = world_eval_set(spec, cfg.split, cfg.n_eval)
    g = get_grammar("en")
    prompts = [g.class_prompt(s, c) for c in COLOURS for s in SHAPES]  # class_id order
    np.savez(work / "eval.npz", images=ev.images)
    (work / "eval_texts.json").write_text(json.dumps({"captions": ev.captions, "prompts": prompts}))
    c2i = ev.caption_image

    old_enc, new_enc = load_encoder(paths["old"]), load_encoder(paths["new"])
    E = {"old": encode_eval(old_enc, work), "new": encode_eval(new_enc, work)}
    # images whose main object's colour and shape the old model was trained on
    concepts = old_enc.meta.get("concepts") or {}
    seen_s, seen_c = set(concepts.get("shapes") or SHAPES), set(concepts.get("colours") or COLOURS)
    seen = np.array([COLOURS[c // len(SHAPES)] in seen_c and SHAPES[c % len(SHAPES)] in seen_s for c in ev.class_ids])
    space = {"old": old_enc.space_id, "new": new_enc.space_id}
    del old_enc, new_enc

    world_d = asdict(spec)
    common = {"world": world_d, "threads": cfg.threads, "eval_dir": str(work)}
    jobs_log: list[dict] = []

    def job(name: str, **kw) -> dict:
        j = dict(common, name=name, out=str(work / name), **kw)
        log(f"[{time.time() - t_all:6.0f}s] {name} ...")
        r = run_isolated(j, cfg.isolate)
        log(f"[{time.time() - t_all:6.0f}s] {name}: {r['train_seconds']:.1f}s training, "
            f"peak {r['peak_rss_mb_train']:.0f} MB, loaded {r['loaded_models']}")
        jobs_log.append(r)
        return r

    def emb(name: str, which: str = "on") -> dict:
        z = np.load(work / name / "eval_embeddings.npz")
        return {k: z[f"{which}_{k}"] for k in ("images", "texts", "prompts")}

    s1cfg = updated(cfg.stage1, corpus_size=cfg.corpus_size)
    rows_per_seed: dict[str, list[dict]] = {k: [] for k in MAIN_ROWS}
    zs_per_seed: dict[str, list[float]] = {}
    sweep_per_seed: dict[str, list[dict]] = {}
    matrix_per_seed: list[np.ndarray] = []
    onoff = 0.0
    cost: dict[str, dict] = {}

    def onoff_diff(name: str) -> float:
        off = emb(name, "off")
        return float(max(np.abs(off[k] - E["new"][k]).max() for k in ("images", "texts", "prompts")))

    def add_zs(key: str, val: float) -> None:
        zs_per_seed.setdefault(key, []).append(val)

    def note_cost(method: str, r: dict | list[dict]) -> None:
        rs = r if isinstance(r, list) else [r]
        c = cost.setdefault(method, {"train_seconds": [], "peak_rss_mb": [], "rss_growth_mb": [],
                                     "loaded_models": set()})
        c["train_seconds"].append(sum(x["train_seconds"] for x in rs))
        c["peak_rss_mb"].append(max(x["peak_rss_mb_train"] for x in rs))
        c["rss_growth_mb"].append(max(x["peak_rss_mb_train"] - x["peak_rss_mb_start"] for x in rs))
        for x in rs:
            c["loaded_models"].update(x["loaded_models"])

    for seed in range(cfg.seeds):
        s1 = updated(s1cfg, seed=seed)
        s2 = updated(cfg.stage2, seed=seed, adapters={"seed": seed})
        # -- stage 1 (text only) and the training-free bridges fitted on its corpus embeddings
        name1 = f"s{seed}-stage1"
        r1 = job(name1, kind="stage1", new=str(paths["new"]), old=str(paths["old"]), cfg=to_dict(s1),
                 corpus=(0, cfg.corpus_size))
        phi = Projection.load(work / name1)
        pb = PhiBridge(phi, space["new"], space["old"])
        phi_q = {"texts": pb(E["new"]["texts"]), "images": pb(E["new"]["images"]), "prompts": pb(E["new"]["prompts"])}
        rows_per_seed["phi_text_only"].append(row_metrics(phi_q, E["old"], c2i, cfg.n_unpaired, seed, seen))
        ce = np.load(work / name1 / "corpus_embeddings.npz")
        pro = ProcrustesBridge.fit(ce["new"], ce["old"], space["new"], space["old"])
        pro_q = {k: pro(E["new"][k]) for k in ("texts", "images")}
        rows_per_seed["procrustes"].append(row_metrics(pro_q, E["old"], c2i, cfg.n_unpaired, seed, seen))
        sl = SlerpBridge(pro, cfg.slerp_t)
        sl_q = {k: sl.blend(E["new"][k], E["old"][k]) for k in ("texts", "images")}
        rows_per_seed["slerp"].append(row_metrics(sl_q, E["old"], c2i, cfg.n_unpaired, seed, seen))
        # -- stage 2 (XBT): the old model is not passed to the job at all
        name_x = f"s{seed}-xbt-{cfg.n_pairs}"
        rx = job(name_x, kind="xbt", new=str(paths["new"]), phi=str(work / name1), cfg=s2.to_dict(),
                 pairs=(0, cfg.n_pairs))
        note_cost("xbt (stage 1 + 2)", [r1, rx])
        note_cost("xbt stage 1 (text only)", r1)
        note_cost("xbt stage 2", rx)
        x_on = emb(name_x)
        row = row_metrics(x_on, E["old"], c2i, cfg.n_unpaired, seed, seen)
        off = emb(name_x, "off")
        row["new_new_off"] = cross(off["texts"], off["images"], off["texts"], off["images"], c2i)
        row["new_new_on"] = cross(x_on["texts"], x_on["images"], x_on["texts"], x_on["images"], c2i)
        row["onoff_max_abs_diff"] = onoff_diff(name_x)
        onoff = max(onoff, row["onoff_max_abs_diff"])
        rows_per_seed["xbt"].append(row)
        add_zs("xbt (v_bar_new vs w_bar_new prompts)", prompt_zero_shot(x_on["images"], x_on["prompts"], ev.class_ids))
        add_zs("xbt prompts vs old images (w_bar_new / v_old)", prompt_zero_shot(E["old"]["images"], x_on["prompts"], ev.class_ids))
        add_zs("text-only phi prompts vs old images", prompt_zero_shot(E["old"]["images"], phi_q["prompts"], ev.class_ids))
        sweep_per_seed.setdefault(f"xbt@{cfg.n_pairs}", []).append(row)
        # -- Direct baselines (Eq. 6): the old model runs inside the training loop
        if cfg.direct:
            for mode in ("full", "lora", "base") if seed < cfg.extra_seeds else ("base",):
                name_d = f"s{seed}-direct_{mode}-{cfg.n_pairs}"
                rd = job(name_d, kind="direct", mode=mode, new=str(paths["new"]), old=str(paths["old"]),
                         cfg=s2.to_dict(), pairs=(0, cfg.n_pairs))
                note_cost(f"direct {mode}", rd)
                d_on = emb(name_d)
                row = row_metrics(d_on, E["old"], c2i, cfg.n_unpaired, seed, seen)
                off = emb(name_d, "off")
                row["new_new_off"] = cross(off["texts"], off["images"], off["texts"], off["images"], c2i)
                if mode != "full":
                    row["onoff_max_abs_diff"] = onoff_diff(name_d)
                    onoff = max(onoff, row["onoff_max_abs_diff"])
                rows_per_seed[f"direct_{mode}"].append(row)
                if mode == "base":
                    sweep_per_seed.setdefault(f"direct_base@{cfg.n_pairs}", []).append(row)
        # -- pair budget sweep (XBT vs Direct-Base), same steps at every budget
        for n in cfg.sweep:
            if n == cfg.n_pairs or (n > 4000 and seed >= cfg.extra_seeds):
                continue
            for meth in ("xbt", "direct_base") if cfg.direct else ("xbt",):
                name_s = f"s{seed}-{meth}-{n}"
                if meth == "xbt":
                    job(name_s, kind="xbt", new=str(paths["new"]), phi=str(work / name1), cfg=s2.to_dict(),
                        pairs=(0, n))
                else:
                    job(name_s, kind="direct", mode="base", new=str(paths["new"]), old=str(paths["old"]),
                        cfg=s2.to_dict(), pairs=(0, n))
                sweep_per_seed.setdefault(f"{meth}@{n}", []).append(row_metrics(emb(name_s), E["old"], c2i,
                                                                          cfg.n_unpaired, seed))
        # -- continual (A.3): newer made compatible with XBT-new (second halves of corpus and pairs)
        if cfg.continual and has_newer and seed < cfg.extra_seeds:
            name_n1 = f"s{seed}-newer-stage1"
            job(name_n1, kind="stage1", new=str(paths["newer"]), old=str(paths["new"]),
                old_upgrade=str(work / name_x), cfg=to_dict(s1), corpus=(cfg.corpus_size, cfg.corpus_size))
            name_n2 = f"s{seed}-newer-xbt"
            job(name_n2, kind="xbt", new=str(paths["newer"]), phi=str(work / name_n1),
                cfg=s2.to_dict(), pairs=(cfg.n_pairs, cfg.n_pairs))
            deployed = [E["old"], x_on, emb(name_n2)]

            def score(t: int, k: int, d: str) -> float:
                q, gal = deployed[t], deployed[k]
                r = cross(q["texts"], q["images"], gal["texts"], gal["images"], c2i)
                return r[d]["R@1"]

            from ..metrics.compat import compatibility_matrix

            matrix_per_seed.append(np.stack([compatibility_matrix(lambda t, k: score(t, k, d), 3)
                                             for d in ("t2i", "i2t")]))
            newer_on = deployed[2]
            rows_newer = row_metrics(newer_on, E["old"], c2i, cfg.n_unpaired, seed)
            rows_per_seed.setdefault("newer_xbt_old", []).append(rows_newer)

    # -- static rows
    rows_per_seed["old_old"] = [row_metrics(E["old"], E["old"], c2i, cfg.n_unpaired, 0, seen)]
    rows_per_seed["old_old"][0].pop("criterion", None)  # old vs itself: every pair ties
    rows_per_seed["new_new"] = [dict(cross(E["new"]["texts"], E["new"]["images"], E["new"]["texts"], E["new"]["images"], c2i),
                                     by_concept=r1_by_image_subset(E["new"]["texts"], E["new"]["images"], E["new"]["texts"],
                                                              E["new"]["images"], c2i, seen))]
    rows_per_seed["new_old_raw"] = [row_metrics(E["new"], E["old"], c2i, cfg.n_unpaired, 0)]
    rows = {k: mean_over_seeds(v) for k, v in rows_per_seed.items() if v}
    for k, r in rows.items():
        r["gap_closure"] = gap_closures(r, rows["old_old"], rows["new_new"])
    zero_shot = {"old": prompt_zero_shot(E["old"]["images"], E["old"]["prompts"], ev.class_ids),
                 "new": prompt_zero_shot(E["new"]["images"], E["new"]["prompts"], ev.class_ids),
                 **{k: float(np.mean(v)) for k, v in zs_per_seed.items()}}
    sweep = {k: mean_over_seeds(v) for k, v in sweep_per_seed.items()}
    result: dict = {
        "rows": rows,
        "onoff_max_abs_diff": onoff,
        "cost": {k: {"train_seconds": float(np.mean(v["train_seconds"])), "peak_rss_mb": float(np.max(v["peak_rss_mb"])),
                     "rss_growth_mb": float(np.max(v["rss_growth_mb"])),
                     "loaded_models": sorted(v["loaded_models"]),
                     "old_model_loaded": paths["old"].name in v["loaded_models"]} for k, v in cost.items()},
        "sweep": sweep,
        "zero_shot": zero_shot,
        "config": cfg.to_dict(),
        "split": cfg.split, "n_images": int(len(ev.images)), "n_captions": len(ev.captions),
        "spaces": space, "jobs": jobs_log,
    }
    if matrix_per_seed:
        from ..metrics.compat import compatibility_summary

        mean = np.mean(np.stack(matrix_per_seed), axis=0)  # NaN only above the diagonal
        names = ["old", "new (XBT)", "newer (XBT)"]
        result["matrix"] = {d: {"strict": compatibility_summary(mean[i], True, names),
                                "non_strict": compatibility_summary(mean[i], False, names)}
                            for i, d in enumerate(("t2i", "i2t"))}
    result["summary"] = summary(result)
    result["seconds"] = round(time.time() - t_all, 1)
    write_xbt_report(result, out_json)
    return result
