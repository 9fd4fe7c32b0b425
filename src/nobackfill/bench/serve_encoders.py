"""The query encoder's share of a search, for ``nobackfill bench serve``: torch against ONNX Runtime
(fp32 and int8, :mod:`nobackfill.encoders.onnx`) on a CLIP ViT-B/32-sized text tower (the shapes of
``openai/clip-vit-base-patch32``'s text tower, seeded random weights: the time depends on the shapes,
not the values), and what int8 does to R@1 where it matters (the world test split, t2i with the
``world-old`` model; Multi30K val caption 1 -> caption 2 with ``m30k-old-text``): the gallery is
embedded by torch, the queries by each encoder. The text tower is timed both as the export writes it
(the CLIP text graph, :mod:`nobackfill.encoders.onnx_clip`) and traced."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .serve_products import products_floor

#: the text tower of CLIP ViT-B/32 (transformers' CLIPTextConfig fields)
B32_TEXT = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8,
            "max_position_embeddings": 77}


def _b32_sized(tokenizer_from: Path, out: Path) -> Path:
    """A CLIP model with a ViT-B/32-sized text tower (a tiny vision tower), saved at ``out``."""
    import torch
    from transformers import AutoTokenizer, CLIPConfig, CLIPModel

    from ..encoders.clip import CLIPDualEncoder

    tok = AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
    torch.manual_seed(0)
    cfg = CLIPConfig(text_config={**B32_TEXT, "vocab_size": max(len(tok), 1000), "eos_token_id": tok.eos_token_id,
                                  "bos_token_id": tok.bos_token_id, "pad_token_id": tok.pad_token_id},
                     vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                    "num_attention_heads": 2, "image_size": 32, "patch_size": 16}, projection_dim=512)
    CLIPDualEncoder(CLIPModel(cfg), tok, meta={"name": "b32-sized-text"}).save(out)
    return out


def _ms_per_query(encoders: dict[str, Callable[[list[str]], Any]], texts: Sequence[str], batch: int,
                  seconds: float, block: int = 5, settle: float = 0.05) -> dict[str, float]:
    """Median milliseconds per query of each of ``encoders`` on batches of ``batch`` texts, over
    ~``seconds``. The encoders take turns block by block (``block`` timed calls each, on the same
    batches), so a slow moment of the machine falls on all of them alike; before its block each
    encoder waits ``settle`` seconds and makes one untimed call, so the threads another runtime left
    spinning (libgomp's and ONNX Runtime's wait busily after a call) have parked and do not take the
    cores from the one being timed (on two cores, timing call by call in turn put torch's 2-thread
    query at 59 ms against 35 ms alone)."""
    for encode in encoders.values():
        encode(list(texts[:batch]))  # warm-up
    times: dict[str, list[float]] = {name: [] for name in encoders}
    i, t_end = 0, time.perf_counter() + seconds
    while time.perf_counter() < t_end or i < 2 * block:
        batches = [[texts[((i + k) * batch + j) % len(texts)] for j in range(batch)] for k in range(block)]
        for name, encode in encoders.items():
            time.sleep(settle)
            encode(batches[0])
            for b in batches:
                t0 = time.perf_counter()
                encode(b)
                times[name].append((time.perf_counter() - t0) * 1000 / batch)
        i += block
    return {name: round(float(np.median(t)), 3) for name, t in times.items()}


def _encoders(model_dir: Path, towers: Sequence[str], threads: int | None = None) -> dict[str, Any]:
    """``{"torch", "onnx_fp32", "onnx_int8"}`` encoders of ``model_dir`` (exported here, int8 too), the
    ONNX Runtime sessions on ``threads`` intra-op threads (None: its default), their idle threads
    sleeping as the service's do; on more than one thread also ``onnx_fp32_spinning``, whose idle
    threads wait busily between operators as torch's OpenMP threads do (libgomp spins by default), so
    that the two runtimes are timed alike."""
    from ..encoders import load_encoder
    from ..encoders.onnx import export_onnx, onnx_encoder, onnx_export_info

    info = onnx_export_info(model_dir)
    if info is None or any("int8" not in info["towers"].get(t, {}) for t in towers):
        info = export_onnx(model_dir, int8=True, towers=towers)
    plain = load_encoder(model_dir)
    out = {"torch": plain, "onnx_fp32": onnx_encoder(plain, model_dir, threads=threads),
           "onnx_int8": onnx_encoder(plain, model_dir, int8=True, threads=threads), "export": info}
    if threads and threads > 1:
        out["onnx_fp32_spinning"] = onnx_encoder(plain, model_dir, threads=threads, spin=True)
    return out


def _traced(model_dir: Path, towers: Sequence[str], threads: int | None = None) -> tuple[Any, dict[str, Any]]:
    """An ONNX fp32 encoder of ``model_dir``'s towers exported by tracing (``graph="traced"``, into a
    copy beside it): what the export wrote before the CLIP text graph, for comparison."""
    from ..encoders import load_encoder
    from ..encoders.onnx import export_onnx, onnx_encoder, onnx_export_info

    copy = model_dir.with_name(model_dir.name + "-traced")
    if not copy.exists():
        shutil.copytree(model_dir, copy, ignore=shutil.ignore_patterns("onnx"))
    info = onnx_export_info(copy)
    if info is None or info["towers"].get(towers[0], {}).get("graph") != "traced":
        info = export_onnx(copy, towers=towers, graph="traced")
    return onnx_encoder(load_encoder(copy), copy, threads=threads), info


#: the thread counts the text tower is timed at: the service's default (``serve --query-threads 1``)
#: and this machine's cores
THREADS = (1, 2)
#: query lengths (the first N words of each text) timed at batch 1 beside the whole texts: a search
#: query is usually a few words, a world caption ~30 tokens, and the speed-up depends on the length
#: (torch's time per query falls less with fewer tokens than ONNX Runtime's; at ~30 tokens ONNX
#: Runtime's matrix products, ~90% of a query, run at about what one core reaches on large ones)
QUERY_WORDS = (3, 6, 10)


def _first_words(texts: Sequence[str], words: int) -> list[str]:
    """Each of ``texts`` cut to its first ``words`` words."""
    return [" ".join(t.split()[:words]) for t in texts]


def _by_length(runs: dict[str, Callable[[list[str]], Any]], encoder: Any, texts: Sequence[str],
               seconds: float, whole: dict[str, float]) -> list[dict[str, Any]]:
    """Batch-1 ms per query of ``runs`` on ``texts`` cut to each of :data:`QUERY_WORDS` words, then the
    whole texts (``whole``: their batch-1 times, already measured), with the mean token count
    (``encoder``'s tokenizer, truncated as it embeds)."""
    out = []
    for words in (*QUERY_WORDS, None):
        cut = list(texts) if words is None else _first_words(texts, words)
        ms = whole if words is None else _ms_per_query(runs, cut, 1, seconds)
        ids = encoder.tokenizer(cut[:500], truncation=True, max_length=encoder.max_length)["input_ids"]
        tokens = float(np.mean([len(i) for i in ids]))
        out.append({"words": words, "tokens": round(tokens, 1), **ms,
                    **{f"{n}_speedup": round(ms["torch"] / ms[n], 2) if ms[n] else None
                       for n in ("onnx_fp32", "onnx_fp32_spinning") if n in ms}})
    return out


def tower_speed(models: Path, texts: Sequence[str], work: Path, seconds: float = 3.0,
                threads: Sequence[int] = THREADS) -> dict[str, Any]:
    """ms per query at batch 1 and 32 of the B/32-sized text tower: torch, ONNX fp32, ONNX int8, each
    thread count of ``threads`` given to both runtimes alike (torch's intra-op threads, ONNX
    Runtime's), and at batch 1 by query length (``batch_1_by_length``: ``texts`` cut to
    :data:`QUERY_WORDS` words, then whole). The top-level rows are the first thread count's (the
    service's default: one query thread)."""
    import torch

    d = _b32_sized(models / "world-old", work / "b32-sized-text")
    before = torch.get_num_threads()
    per: dict[str, Any] = {}
    try:
        for n in threads:
            torch.set_num_threads(n)
            encs = _encoders(d, ["text"], threads=n)
            traced, traced_info = _traced(d, ["text"], threads=n)
            runs = {name: encs[name].encode_texts for name in ("torch", "onnx_fp32", "onnx_int8", "onnx_fp32_spinning")
                    if name in encs}
            runs["onnx_fp32_traced"] = traced.encode_texts
            runs["onnx_fp32_products_only"] = products_floor(encs["torch"], n)
            row: dict[str, Any] = {name: {} for name in runs}
            for b in (1, 32):
                for name, ms in _ms_per_query(runs, texts, b, seconds).items():
                    row[name][f"batch_{b}_ms_per_query"] = ms
            for b in (1, 32):
                key = f"batch_{b}_ms_per_query"
                for name in ("onnx_fp32", "onnx_fp32_traced", "onnx_fp32_spinning", "onnx_fp32_products_only"):
                    if name in row:
                        row[f"{name}_speedup_batch_{b}"] = round(row["torch"][key] / row[name][key], 2)
            row["batch_1_by_length"] = _by_length(runs, encs["torch"], texts, seconds,
                                                  {k: row[k]["batch_1_ms_per_query"] for k in runs})
            per[str(n)] = row
    finally:
        torch.set_num_threads(before)
    tower = encs["export"]["towers"]["text"]
    return {"shapes": B32_TEXT, "graph": tower["graph"], "max_abs_diff_fp32": tower["max_abs_diff"],
            "max_abs_diff_int8": tower["int8"]["max_abs_diff"],
            "max_abs_diff_fp32_traced": traced_info["towers"]["text"]["max_abs_diff"],
            "threads": threads[0], **per[str(threads[0])], "by_threads": per}


def _diffs(ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    """Max and median over vectors of each vector's max abs difference ``|ref - out|``."""
    per = np.abs(np.asarray(ref, np.float64) - np.asarray(out, np.float64)).max(axis=1)
    return {"n": int(per.size), "max_abs_diff": float(per.max()), "median_abs_diff": float(np.median(per))}


#: how many world test images the image tower's int8 difference is measured on; how many queries are
#: embedded one at a time to measure int8's batch dependence
DIFF_IMAGES, ALONE = 200, 16


def _query_diffs(encs: dict[str, Any], texts: Sequence[str], text_vecs: dict[str, np.ndarray],
                 images: Sequence[Any], image_ref: np.ndarray) -> dict[str, Any]:
    """What ONNX Runtime changes in real query vectors: fp32 and int8 against torch (``text_vecs``:
    ``texts`` embedded by each encoder, batched as a bulk embedding; ``images`` against their torch
    vectors ``image_ref``), and int8's batch dependence: the first :data:`ALONE` queries embedded one
    at a time against the same queries embedded in their batch."""
    out: dict[str, Any] = {"text": {n: _diffs(text_vecs["torch"], text_vecs[n]) for n in ("onnx_fp32", "onnx_int8")}}
    alone = np.vstack([encs["onnx_int8"].encode_texts([t]) for t in texts[:ALONE]])
    out["text"]["int8_alone_vs_batched"] = _diffs(text_vecs["onnx_int8"][:ALONE], alone)
    if len(images):
        vecs = {n: encs[n].encode_images(images) for n in ("onnx_fp32", "onnx_int8")}
        out["image"] = {n: _diffs(image_ref, v) for n, v in vecs.items()}
        alone = np.vstack([encs["onnx_int8"].encode_images([p]) for p in images[:ALONE]])
        out["image"]["int8_alone_vs_batched"] = _diffs(vecs["onnx_int8"][:ALONE], alone)
    return out


def _world_int8(models: Path, world_test: Path, work: Path, limit: int | None = None,
                images: int = DIFF_IMAGES) -> tuple[dict[str, Any], dict[str, Any]]:
    """World test t2i R@1 (``world-old``, gallery by torch) of each query encoder, and what ONNX
    Runtime changes in the query vectors (:func:`_query_diffs`: the captions, and the first ``images``
    test images through the image tower). ``limit``: the first ``limit`` test images only (a check)."""
    from ..evaluate import load_eval_data
    from ..metrics.retrieval import retrieval_metrics

    d = work / "world-old"
    shutil.copytree(models / "world-old", d, dirs_exist_ok=True)
    encs = _encoders(d, ["text", "image"])
    data = load_eval_data(world_test, "test")
    if limit is not None:
        data = data.subset_images(range(min(limit, len(data))))
    paths = data.image_paths()
    gallery = encs["torch"].encode_images(paths)
    vecs = {name: encs[name].encode_texts(data.captions) for name in ("torch", "onnx_fp32", "onnx_int8")}
    r1 = {name: round(retrieval_metrics(gallery, v, data.caption_image, ks=(1,), directions=("t2i",))["t2i"]["R@1"], 4)
          for name, v in vecs.items()}
    return r1, _query_diffs(encs, data.captions, vecs, paths[:images], gallery[:images])


def int8_recall(models: Path, world_test: Path, multi30k: Path, work: Path) -> dict[str, Any]:
    """R@1 with torch, ONNX fp32 and ONNX int8 query towers against a torch-embedded gallery, and
    (``query_diffs``) how far the ONNX query vectors are from torch's on the world test split."""
    from .xbt_text import caption_recall, load_val

    out: dict[str, Any] = {}
    out["world_t2i"], diffs = _world_int8(models, world_test, work)
    q, g = load_val(multi30k)
    d = work / "m30k-old-text"
    shutil.copytree(models / "m30k-old-text", d, dirs_exist_ok=True)
    encs = _encoders(d, ["text"])
    gallery = encs["torch"].encode_texts(g)
    out["multi30k_val_t2t"] = {name: round(caption_recall(encs[name].encode_texts(q), gallery)["R@1"], 4)
                               for name in ("torch", "onnx_fp32", "onnx_int8")}
    for k, v in out.items():
        v["int8_minus_torch"] = round(v["onnx_int8"] - v["torch"], 4)
    out["query_diffs"] = diffs
    return out


def _spinning(r: dict[str, Any]) -> str:
    """A by-length row's spinning fp32 time and speed-up ("-" on one thread, where nothing spins)."""
    if "onnx_fp32_spinning" not in r:
        return "-"
    return f"{r['onnx_fp32_spinning']} ({r['onnx_fp32_spinning_speedup'] or 0:.2f}x)"


def format_markdown(enc: dict[str, Any]) -> str:
    s = enc["speed"]
    lines = ["| query text tower (ViT-B/32 shapes) | threads | batch 1 ms/query | batch 32 ms/query | batch 1 speed-up "
             "| max abs diff vs torch (the export's check texts) |", "|---|---:|---:|---:|---:|---:|"]
    graph = "CLIP text graph" if s.get("graph") == "clip-text" else "traced graph"
    names = [("torch", "torch", "-")]
    if "max_abs_diff_fp32_traced" in s:
        names.append(("onnx_fp32_traced", "ONNX Runtime fp32, traced graph", f"{s['max_abs_diff_fp32_traced']:.1e}"))
    names += [("onnx_fp32", f"ONNX Runtime fp32, {graph}", f"{s['max_abs_diff_fp32']:.1e}"),
              ("onnx_fp32_spinning", f"ONNX Runtime fp32, {graph}, idle threads spinning (as torch's)",
               f"{s['max_abs_diff_fp32']:.1e}"),
              ("onnx_int8", f"ONNX Runtime int8, {graph}", f"{s['max_abs_diff_int8']:.1e}"),
              ("onnx_fp32_products_only", "ONNX Runtime fp32, the weight products alone (a floor for any fp32 graph)",
               "-")]
    for n, row in s.get("by_threads", {str(s.get("threads", "-")): s}).items():
        for name, label, diff in names:
            if name not in row:
                continue
            b1 = row[name]["batch_1_ms_per_query"]
            lines.append(f"| {label} | {n} | {b1} | {row[name]['batch_32_ms_per_query']} | "
                         f"{row['torch']['batch_1_ms_per_query'] / b1:.2f}x | {diff} |")
    lines += ["", "| text tower at batch 1, by query length | threads | words | tokens (mean) | torch ms | "
              "ONNX fp32 traced ms | ONNX fp32 ms | ONNX fp32 speed-up | ONNX fp32 spinning ms (speed-up) | "
              "ONNX int8 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, row in s.get("by_threads", {}).items():
        for r in row.get("batch_1_by_length", []):
            label = "whole texts" if r["words"] is None else f"first {r['words']} words"
            lines.append(f"| {label} | {n} | {r['words'] or '-'} | {r['tokens']} | {r['torch']} | "
                         f"{r.get('onnx_fp32_traced', '-')} | {r['onnx_fp32']} | {r['onnx_fp32_speedup'] or 0:.2f}x | "
                         f"{_spinning(r)} | {r['onnx_int8']} |")
    lines += ["", "| R@1 (gallery by torch) | torch | ONNX fp32 | ONNX int8 | int8 - torch |", "|---|---:|---:|---:|---:|"]
    for k, label in (("world_t2i", "world test t2i (world-old)"), ("multi30k_val_t2t", "Multi30K val t2t (m30k-old-text)")):
        r = enc["int8_recall"][k]
        lines.append(f"| {label} | {r['torch']} | {r['onnx_fp32']} | {r['onnx_int8']} | {r['int8_minus_torch']:+} |")
    diffs = enc["int8_recall"].get("query_diffs")
    if diffs:
        lines += ["", "| query vectors vs torch (world-old, world test) | inputs | max abs diff | median |",
                  "|---|---:|---:|---:|"]
        for tower, label in (("text", "captions"), ("image", "images")):
            for name, what in (("onnx_fp32", "ONNX fp32"), ("onnx_int8", "ONNX int8"),
                               ("int8_alone_vs_batched", "ONNX int8 alone vs in its batch")):
                r = diffs.get(tower, {}).get(name)
                if r:
                    lines.append(f"| {what}, {tower} tower | {r['n']} {label} | {r['max_abs_diff']:.1e} | "
                                 f"{r['median_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


__all__ = ["B32_TEXT", "QUERY_WORDS", "THREADS", "format_markdown", "int8_recall", "tower_speed"]
