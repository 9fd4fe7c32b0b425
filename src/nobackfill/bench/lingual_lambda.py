"""``nobackfill bench lingual-lambda``: where a language's training tokens land under TEIR (Eq. 6 of
the CLL-CLIP paper, Yang et al. 2024): the share of token occurrences in each task's training texts
(tokenised by the merged vocabulary V_t) on rows with lambda = 0, lambda = 1/(c+1) (overlap) and
lambda = 1 (new), and the occurrence-weighted mean lambda. Diagnoses the world benchmark, whose base
vocabulary is small and English-only; on Multi30K (``--data .../multi30k --model minilm``) the
same for MiniLM's vocabulary. The result is the list of rows, one per language."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .runner import Report


@dataclass
class LingualLambdaConfig:
    """The data (a world root or Multi30K), the model whose tokenizer is the base vocabulary
    (``minilm`` on Multi30K), the languages in task order, the task vocabulary size (default: the
    bench's, world 1000 and text 10000) and how much training text each task has."""

    data: str = "data/world"
    model: str = "models/world-new"
    langs: tuple[str, ...] = ("de", "fr", "es", "ru", "el", "zh")
    vocab_size: int | None = None
    train_images: int = 5000
    #: Multi30K: lines trained on (quick: 60 x 64)
    train_lines: int = 3840


def _tasks(cfg: LingualLambdaConfig):
    """The base tokenizer, the English texts, (lang, train texts, corpus) per task and the vocabulary size."""
    from ..lingual.data import is_multi30k, multi30k_tasks, world_parallel

    langs = list(cfg.langs)
    if is_multi30k(cfg.data):
        from ..encoders.minilm import MiniLMTextEncoder

        tokenizer = MiniLMTextEncoder.pretrained().tokenizer
        tasks, english = multi30k_tasks(cfg.data, langs, cfg.train_lines)
        return tokenizer, english, [(t.lang, t.foreign, t.corpus) for t in tasks], cfg.vocab_size or 10_000
    from ..encoders import load_encoder
    from ..evaluate import load_eval_data

    tokenizer = load_encoder(cfg.model).tokenizer
    d = load_eval_data(cfg.data, "train", langs=["en", *langs])
    d = d.subset_images(np.arange(min(cfg.train_images, len(d))))
    english = [c for c, lg in zip(d.captions, d.langs) if lg == "en"]
    texts = [(lg, world_parallel(d, lg)[0], world_parallel(d, lg)[0]) for lg in langs]
    return tokenizer, english, texts, cfg.vocab_size or 1000


def _shares(occ: np.ndarray, lam: np.ndarray, total: float) -> dict:
    overlap = (lam > 0) & (lam < 1)
    return {"share_lambda_0": round(float(occ[lam == 0].sum() / total), 3),
            "share_overlap": round(float(occ[overlap].sum() / total), 3),
            "share_lambda_1": round(float(occ[lam == 1].sum() / total), 3),
            "mean_lambda": round(float((occ * lam).sum() / total), 4),
            "overlap_weighted_mean_lambda": round(float((occ * lam)[overlap].sum() / max(occ[overlap].sum(), 1)), 4)}


def lambda_usage(cfg: LingualLambdaConfig) -> list[dict]:
    """One row per language: its new vocabulary rows and the shares for the task vocabulary
    (``vocab``) and for it plus every token its corpus uses (``vocab+used``)."""
    from ..lingual.teir import teir_row_scales
    from ..lingual.vocab import ids_of, merge_vocab, task_token_set, token_counts, train_task_vocab

    tokenizer, english, texts, vocab_size = _tasks(cfg)
    size = len(tokenizer.get_vocab())
    counts = 1.0 + token_counts(tokenizer, english, size)
    rows = []
    for lang, train_texts, corpus in texts:
        tv = train_task_vocab(tokenizer, corpus, vocab_size, 2)
        merged = merge_vocab(tokenizer, tv, n_rows=size)
        tokenizer, old, size = merged.tokenizer, size, merged.size
        counts = np.concatenate([counts, np.ones(size - len(counts))])
        occ = token_counts(tokenizer, train_texts, size)
        occ[list(tokenizer.all_special_ids)] = 0.0  # specials are not the language's words
        total = occ.sum()
        row = {"lang": lang, "new_rows": len(merged.new_tokens)}
        vocab_ids = ids_of(tokenizer, task_token_set(tv))
        used_ids = np.union1d(vocab_ids, np.flatnonzero(token_counts(tokenizer, corpus, size)))
        for key, ids in (("vocab", vocab_ids), ("vocab+used", used_ids)):
            row[key] = _shares(occ, teir_row_scales(size, old, ids, counts), total)
        rows.append(row)
        counts += token_counts(tokenizer, corpus, size)
    return rows


def format_markdown(rows: list[dict]) -> str:
    """One row per language: its new vocabulary rows, then for the task vocabulary (``vocab``) and
    for it plus every token its corpus uses (``vocab+used``) the shares of token occurrences on
    lambda = 0 / overlap / lambda = 1 rows (percent) and the mean lambda."""
    from ..report import markdown_table

    keys = ("vocab", "vocab+used")
    header = ["language", "new rows"] + [h for k in keys for h in (f"{k}: lambda 0 / overlap / 1 (%)",
                                                                   f"{k}: mean lambda")]
    body = [[row["lang"], str(row["new_rows"])] + [cell for k in keys for cell in (
        " / ".join(f"{100 * row[k][s]:.1f}" for s in ("share_lambda_0", "share_overlap", "share_lambda_1")),
        f"{row[k]['mean_lambda']:.3f}")] for row in rows]
    return markdown_table(header, body) + "\n"


def write_rows(rows: list[dict], json_path: Path) -> str:
    """The rows as JSON (one space of indent, as ``benchmarks/results/lingual_lambda_*.json``) and
    their table beside it (``.md``); returns the table (what the command shows)."""
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(rows, indent=1) + "\n")
    table = format_markdown(rows)
    Path(json_path).with_suffix(".md").write_text(table)
    return table


REPORT = Report(write_rows)

__all__ = ["LingualLambdaConfig", "REPORT", "format_markdown", "lambda_usage", "write_rows"]
