"""Where a language's training tokens land under TEIR (Eq. 6 of the CLL-CLIP paper, seed 004):
the share of token occurrences in each task's training texts (tokenised by the merged vocabulary
V_t) on rows with lambda = 0, lambda = 1/(c+1) (overlap) and lambda = 1 (new), and the
occurrence-weighted mean lambda. Diagnoses the world benchmark, whose base vocabulary is small
and English-only.

    python scripts/lingual_lambda_usage.py --data data/world --model models/world-new
    python scripts/lingual_lambda_usage.py --data ../shared/data/multi30k --model minilm --langs de,fr,cs
    (--out FILE.json writes the rows; ``make bench`` writes benchmarks/results/lingual_lambda_*.json)
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/world")
    ap.add_argument("--model", default="models/world-new")
    ap.add_argument("--langs", default="de,fr,es,ru,el,zh")
    ap.add_argument("--vocab-size", type=int, default=None, help="default: the bench's (world 1000, text 10000)")
    ap.add_argument("--train-images", type=int, default=5000)
    ap.add_argument("--train-lines", type=int, default=3840, help="Multi30K: lines trained on (quick: 60 x 64)")
    ap.add_argument("--out", default=None, help="Write the JSON here (default: print it)")
    args = ap.parse_args()

    from nobackfill.lingual.data import is_multi30k, multi30k_tasks, world_parallel
    from nobackfill.lingual.teir import teir_row_scales
    from nobackfill.lingual.vocab import ids_of, merge_vocab, task_token_set, token_counts, train_task_vocab

    langs = [x for x in args.langs.split(",") if x]
    if is_multi30k(args.data):
        from nobackfill.encoders.minilm import MiniLMTextEncoder

        tokenizer = MiniLMTextEncoder.pretrained().tokenizer
        tasks, english = multi30k_tasks(args.data, langs, args.train_lines)
        texts = [(t.lang, t.foreign, t.corpus) for t in tasks]
        vocab_size = args.vocab_size or 10_000
    else:
        from nobackfill.encoders import load_encoder
        from nobackfill.evaluate import load_eval_data

        tokenizer = load_encoder(args.model).tokenizer
        d = load_eval_data(args.data, "train", langs=["en", *langs])
        d = d.subset_images(np.arange(min(args.train_images, len(d))))
        english = [c for c, lg in zip(d.captions, d.langs) if lg == "en"]
        texts = [(lg, world_parallel(d, lg)[0], world_parallel(d, lg)[0]) for lg in langs]
        vocab_size = args.vocab_size or 1000
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
            lam = teir_row_scales(size, old, ids, counts)
            overlap = (lam > 0) & (lam < 1)
            row[key] = {"share_lambda_0": round(float(occ[lam == 0].sum() / total), 3),
                        "share_overlap": round(float(occ[overlap].sum() / total), 3),
                        "share_lambda_1": round(float(occ[lam == 1].sum() / total), 3),
                        "mean_lambda": round(float((occ * lam).sum() / total), 4),
                        "overlap_weighted_mean_lambda": round(float((occ * lam)[overlap].sum()
                                                                    / max(occ[overlap].sum(), 1)), 4)}
        rows.append(row)
        counts += token_counts(tokenizer, corpus, size)
    text = json.dumps(rows, indent=1)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
