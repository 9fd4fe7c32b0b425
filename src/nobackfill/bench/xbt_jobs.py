"""The training jobs of ``bench xbt`` (stage 1, XBT stage 2, the Direct baselines), each run here
or in a fresh process (``python -m nobackfill.bench.xbt_jobs JOB.json``) so that its peak RSS and the
models it loads are its own (the cost table). The training itself is :mod:`nobackfill.compat`'s."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ..compat.xbt import Stage1Config, XBTConfig
from ..config import from_dict, to_dict
from ..memory import peak_rss_mb


# ----------------------------------------------------------------------------- child jobs
def _world_spec(d: dict):
    from ..data.world import WorldSpec

    d = dict(d)
    for k in ("langs", "shapes", "colours"):
        if d.get(k) is not None:
            d[k] = tuple(d[k])
    return WorldSpec(**d)


def encode_eval(enc, eval_dir: Path) -> dict[str, np.ndarray]:
    images = np.load(eval_dir / "eval.npz")["images"]
    texts = json.loads((eval_dir / "eval_texts.json").read_text())
    return {"images": enc.encode_images(images), "texts": enc.encode_texts(texts["captions"]),
            "prompts": enc.encode_texts(texts["prompts"])}


def run_job(job: dict) -> dict:
    """One training job (stage1 / xbt / direct) in this process; returns timings, peak RSS, the
    models it loaded, and writes its upgrade + evaluation embeddings into ``job["out"]``."""
    import torch

    from ..compat.data import world_pairs
    from ..compat.direct import train_direct
    from ..compat.phi import Projection
    from ..compat.upgrade import load_upgrade, space_info
    from ..compat.xbt import embed_corpus, train_phi, train_xbt
    from ..data.world import world_corpus
    from ..encoders import load_encoder

    torch.set_num_threads(int(job["threads"]))
    t_start = time.time()
    rss0 = peak_rss_mb()
    loaded: list[str] = []

    def load(path):
        loaded.append(Path(path).name)
        return load_encoder(path)

    spec = _world_spec(job["world"])
    out = Path(job["out"])
    if out.exists():
        shutil.rmtree(out)
    res: dict = {"job": job["name"], "kind": job["kind"]}
    if job["kind"] == "stage1":
        cfg = from_dict(Stage1Config, job["cfg"], "stage1")
        new, old = load(job["new"]), load(job["old"])
        if job.get("old_upgrade"):
            old = load_upgrade(job["old_upgrade"]).apply(old)
        start, n = job["corpus"]
        corpus = world_corpus(spec, start + n, split="train")[start:]
        t0 = time.time()
        texts, w_new, w_old = embed_corpus(new, old, corpus, cfg)
        embed_s = time.time() - t0
        phi, tr = train_phi(w_new, w_old, cfg, out, source=space_info(new), target=space_info(old),
                            recipe={"stage": 1, "config": to_dict(cfg), "corpus_size": len(texts)})
        np.savez(out / "corpus_embeddings.npz", new=w_new, old=w_old)
        res.update(train_seconds=embed_s + tr.seconds, embed_seconds=embed_s, loop_seconds=tr.seconds,
                   last_loss=tr.last_loss, corpus_size=len(texts))
    else:
        cfg = from_dict(XBTConfig, job["cfg"], "stage2")
        start, n = job["pairs"]
        pairs = world_pairs(spec, n, "train", start=start)
        new = load(job["new"])
        t0 = time.time()
        if job["kind"] == "xbt":
            phi = Projection.load(job["phi"])
            target = json.loads((Path(job["phi"]) / "upgrade.json").read_text())["target"]
            up, tr = train_xbt(new, phi, pairs, cfg, out, target=target)
        else:
            old = load(job["old"])
            up, tr = train_direct(new, old, pairs, job["mode"], cfg, out)
        res.update(train_seconds=time.time() - t0, loop_seconds=tr.seconds, last_loss=tr.last_loss,
                   n_pairs=len(pairs))
        res["peak_rss_mb_train"] = peak_rss_mb()
        eval_dir = Path(job["eval_dir"])
        on = encode_eval(up, eval_dir)
        with up.switched(False):
            off = encode_eval(up, eval_dir)
        np.savez(out / "eval_embeddings.npz", **{f"on_{k}": v for k, v in on.items()},
                 **{f"off_{k}": v for k, v in off.items()})
    res.setdefault("peak_rss_mb_train", peak_rss_mb())
    res.update(peak_rss_mb_start=rss0, loaded_models=loaded, total_seconds=time.time() - t_start)
    (out / "job.json").write_text(json.dumps(res, indent=2))
    return res


def run_isolated(job: dict, isolate: bool) -> dict:
    """Run ``job`` here, or (``isolate``) in a fresh ``python -m nobackfill.bench.xbt_jobs JOB.json``
    process, so that its peak RSS and the models it loads are its own."""
    if not isolate:
        return run_job(job)
    import subprocess

    out = Path(job["out"])
    spec_path = out.with_name(out.name + ".job.json")
    spec_path.write_text(json.dumps(job, default=str))
    proc = subprocess.run([sys.executable, "-m", "nobackfill.bench.xbt_jobs", str(spec_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench job {job['name']} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads((out / "job.json").read_text())


if __name__ == "__main__":  # a child job: python -m nobackfill.bench.xbt_jobs JOB.json
    run_job(json.loads(Path(sys.argv[1]).read_text()))
