"""The query encoder's share of a search, for ``nobackfill bench serve``: torch against ONNX Runtime
(fp32 and int8, :mod:`nobackfill.encoders.onnx`) on a CLIP ViT-B/32-sized text tower (the shapes of
``openai/clip-vit-base-patch32``'s text tower, seeded random weights: the time depends on the shapes,
not the values), and what int8 does to R@1 where it matters (the world test split, t2i with the
``world-old`` model; Multi30K val caption 1 -> caption 2 with ``m30k-old-text``): the gallery is
embedded by torch, the queries by each encoder."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

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


def _ms_per_query(encode: Callable[[list[str]], Any], texts: Sequence[str], batch: int, seconds: float) -> float:
    """Median milliseconds per query of ``encode`` on batches of ``batch`` texts, over ~``seconds``."""
    encode(list(texts[:batch]))  # warm-up
    times, i, t_end = [], 0, time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 5:
        b = [texts[(i + j) % len(texts)] for j in range(batch)]
        t0 = time.perf_counter()
        encode(b)
        times.append((time.perf_counter() - t0) * 1000 / batch)
        i += batch
    return round(float(np.median(times)), 3)


def _encoders(model_dir: Path, towers: Sequence[str]) -> dict[str, Any]:
    """``{"torch", "onnx_fp32", "onnx_int8"}`` encoders of ``model_dir`` (exported here, int8 too)."""
    from ..encoders import load_encoder
    from ..encoders.onnx import export_onnx, onnx_encoder

    info = export_onnx(model_dir, int8=True, towers=towers)
    plain = load_encoder(model_dir)
    return {"torch": plain, "onnx_fp32": onnx_encoder(plain, model_dir), "onnx_int8": onnx_encoder(plain, model_dir, int8=True),
            "export": info}


def tower_speed(models: Path, texts: Sequence[str], work: Path, seconds: float = 3.0) -> dict[str, Any]:
    """ms per query at batch 1 and 32 of the B/32-sized text tower: torch, ONNX fp32, ONNX int8."""
    d = _b32_sized(models / "world-old", work / "b32-sized-text")
    encs = _encoders(d, ["text"])
    out: dict[str, Any] = {"shapes": B32_TEXT, "max_abs_diff_fp32": encs["export"]["towers"]["text"]["max_abs_diff"],
                           "max_abs_diff_int8": encs["export"]["towers"]["text"]["int8"]["max_abs_diff"]}
    for name in ("torch", "onnx_fp32", "onnx_int8"):
        out[name] = {f"batch_{b}_ms_per_query": _ms_per_query(encs[name].encode_texts, texts, b, seconds)
                     for b in (1, 32)}
    for b in (1, 32):
        key = f"batch_{b}_ms_per_query"
        out[f"onnx_fp32_speedup_batch_{b}"] = round(out["torch"][key] / out["onnx_fp32"][key], 2)
    return out


def int8_recall(models: Path, world_test: Path, multi30k: Path, work: Path) -> dict[str, Any]:
    """R@1 with torch, ONNX fp32 and ONNX int8 query towers against a torch-embedded gallery."""
    from ..evaluate import load_eval_data
    from ..metrics.retrieval import retrieval_metrics
    from .xbt_text import caption_recall, load_val

    out: dict[str, Any] = {}
    d = work / "world-old"
    shutil.copytree(models / "world-old", d, dirs_exist_ok=True)
    encs = _encoders(d, ["text"])
    data = load_eval_data(world_test, "test")
    gallery = encs["torch"].encode_images(data.image_paths())
    t2i = data.caption_image
    out["world_t2i"] = {name: round(retrieval_metrics(gallery, encs[name].encode_texts(data.captions), t2i,
                                                      ks=(1,), directions=("t2i",))["t2i"]["R@1"], 4)
                        for name in ("torch", "onnx_fp32", "onnx_int8")}
    q, g = load_val(multi30k)
    d = work / "m30k-old-text"
    shutil.copytree(models / "m30k-old-text", d, dirs_exist_ok=True)
    encs = _encoders(d, ["text"])
    gallery = encs["torch"].encode_texts(g)
    out["multi30k_val_t2t"] = {name: round(caption_recall(encs[name].encode_texts(q), gallery)["R@1"], 4)
                               for name in ("torch", "onnx_fp32", "onnx_int8")}
    for k, v in out.items():
        v["int8_minus_torch"] = round(v["onnx_int8"] - v["torch"], 4)
    return out


def format_markdown(enc: dict[str, Any]) -> str:
    s = enc["speed"]
    lines = ["| query text tower (ViT-B/32 shapes) | batch 1 ms/query | batch 32 ms/query | max abs diff vs torch |",
             "|---|---:|---:|---:|"]
    for name, label, diff in (("torch", "torch", "-"), ("onnx_fp32", "ONNX Runtime fp32", f"{s['max_abs_diff_fp32']:.1e}"),
                              ("onnx_int8", "ONNX Runtime int8", f"{s['max_abs_diff_int8']:.1e}")):
        lines.append(f"| {label} | {s[name]['batch_1_ms_per_query']} | {s[name]['batch_32_ms_per_query']} | {diff} |")
    lines += ["", "| R@1 (gallery by torch) | torch | ONNX fp32 | ONNX int8 | int8 - torch |", "|---|---:|---:|---:|---:|"]
    for k, label in (("world_t2i", "world test t2i (world-old)"), ("multi30k_val_t2t", "Multi30K val t2t (m30k-old-text)")):
        r = enc["int8_recall"][k]
        lines.append(f"| {label} | {r['torch']} | {r['onnx_fp32']} | {r['onnx_int8']} | {r['int8_minus_torch']:+} |")
    return "\n".join(lines) + "\n"


__all__ = ["B32_TEXT", "format_markdown", "int8_recall", "tower_speed"]
