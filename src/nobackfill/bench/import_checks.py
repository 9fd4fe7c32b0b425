"""The model-check trials of ``bench import`` (:mod:`nobackfill.bench.importing`): right and wrong
models declared, ``trials`` sample seeds each, through
:func:`~nobackfill.adopt.importing.run_model_check`."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .import_data import Text, World, unit_rows, write_text, write_world

if TYPE_CHECKING:
    from .import_config import ImportBenchConfig

_MEDIAN = re.compile(r"median cosine (-?[0-9.]+)")


def _trials(source: Any, enc: Any, ref: str, cfg: "ImportBenchConfig", base_seed: int) -> dict[str, Any]:
    """``cfg.trials`` model checks of ``source`` declared as ``ref``, each with its own sample seed."""
    from ..adopt.importing import ModelCheckRefused, run_model_check

    accepted = width = 0
    medians: list[float] = []
    lows: list[float] = []
    sampled: list[int] = []
    example = ""
    t0 = time.perf_counter()
    for t in range(cfg.trials):
        try:
            v = run_model_check(source, enc, ref, samples=cfg.samples, threshold=cfg.threshold,
                                seed=base_seed + 1000 * t)
            accepted += 1
            medians.append(float(v["median_cosine"]))
            lows.append(float(v["min_cosine"]))
            sampled.append(int(v["n"]))
            example = example or v["message"]
        except ModelCheckRefused as e:
            msg = str(e)
            example = example or msg
            if "-d and" in msg and "embeds" in msg:
                width += 1
            m = _MEDIAN.search(msg)
            if m:
                medians.append(float(m.group(1)))
    out: dict[str, Any] = {"trials": cfg.trials, "accepted": accepted, "refused": cfg.trials - accepted,
                           "refused_by_width": width}
    if medians:
        out["median_cosine"] = {"min": round(min(medians), 6), "max": round(max(medians), 6)}
    if lows:
        out["min_cosine"] = round(min(lows), 6)
    if sampled:
        out["items_per_check"] = {"min": min(sampled), "max": max(sampled)}
    out["seconds_per_check"] = round((time.perf_counter() - t0) / max(1, cfg.trials), 3)
    out["example"] = example
    return out


def run_model_checks(cfg: "ImportBenchConfig", pool: Any, w: World, t: Text, emb: dict[str, Any],
                     say: Callable[[str], None]) -> dict[str, Any]:
    """Right-model and wrong-model cases, ``cfg.trials`` checks each."""
    from ..adopt.sources import open_source

    old, text = pool.get(emb["old_ref"]), pool.get(emb["text_ref"])
    work = cfg.work / "model-check"
    rng = np.random.default_rng(cfg.seed)
    img, txt = emb["world_vectors"]
    new_img, new_txt = emb["world_new_vectors"]
    perm = rng.permutation(len(img))
    folders = {
        "right": {
            "world-old as world-old (float32)": (emb["world_f32"], old, emb["old_ref"]),
            "world-old as world-old (float16, clip-retrieval's default)":
                (write_world(work / "old-f16", w, img, txt, np.float16), old, emb["old_ref"]),
            "m30k-old-text as m30k-old-text": (emb["text_f32"], text, emb["text_ref"]),
        },
        "wrong": {
            "world-new as world-old": (write_world(work / "new", w, new_img, new_txt), old, emb["old_ref"]),
            "world-old rows shuffled against the table": (write_world(work / "shuffled", w, img[perm], txt[perm]),
                                                          old, emb["old_ref"]),
            "world-old image and caption vectors swapped": (write_world(work / "swapped", w, txt, img), old,
                                                            emb["old_ref"]),
            "world-new cut to 64-d (renormalised) as world-old":
                (write_world(work / "new-64", w, unit_rows(new_img[:, :old.embed_dim]),
                              unit_rows(new_txt[:, :old.embed_dim])), old, emb["old_ref"]),
        },
    }
    minilm_case = "MiniLM as m30k-old-text"
    skipped_minilm = ""
    try:
        mini = pool.get(cfg.minilm)
        caps = t.unique[:cfg.minilm_captions] if cfg.minilm_captions is not None else t.unique
        t0 = time.time()
        mv = np.asarray(mini.encode_texts(caps, progress=False), np.float32)
        say(f"  MiniLM: {len(caps)} captions embedded in {time.time() - t0:.1f}s")
        folders["wrong"][minilm_case] = (write_text(work / "minilm", caps, mv), text, emb["text_ref"])
    except (ImportError, OSError, ValueError) as e:  # the pretrained model is not installed
        folders["wrong"][minilm_case] = None
        skipped_minilm = f"{type(e).__name__}: {e}"
    out: dict[str, Any] = {}
    for side in ("right", "wrong"):
        cases: dict[str, Any] = {}
        for i, (name, spec) in enumerate(folders[side].items()):
            if spec is None:
                cases[name] = {"skipped": skipped_minilm}
                continue
            folder, enc, ref = spec
            src = open_source(f"clip-retrieval:{folder}")
            cases[name] = _trials(src, enc, ref, cfg, cfg.seed + 100 * i + (0 if side == "right" else 50))
            c = cases[name]
            say(f"  {side}: {name}: {c['accepted']}/{c['trials']} accepted"
                + (f", median cosine {c['median_cosine']['min']}..{c['median_cosine']['max']}"
                   if "median_cosine" in c else "") + (f", {c['refused_by_width']} by width" if c["refused_by_width"]
                                                       else ""))
        run = [c for c in cases.values() if "trials" in c]
        total = sum(c["trials"] for c in run)
        if side == "right":
            out["right"] = {"trials": total, "refused": sum(c["refused"] for c in run), "by_case": cases}
        else:
            out["wrong"] = {"trials": total, "accepted": sum(c["accepted"] for c in run), "by_case": cases}
    out["samples"] = cfg.samples
    out["threshold"] = cfg.threshold
    out["equal_width_wrong_cases"] = ["world-old rows shuffled against the table",
                                      "world-old image and caption vectors swapped",
                                      "world-new cut to 64-d (renormalised) as world-old"]
    return out


__all__ = ["run_model_checks"]
