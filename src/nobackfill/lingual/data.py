"""Language tasks and their evaluation for continual language learning (Yang et al. 2024).

* Multi30K task 1 (parallel translations en/de/fr/cs, text only): a task is a language's captions
  paired with the English line of the same image; evaluation is foreign -> English caption
  retrieval (line ``i`` of language X retrieves English line ``i``).
* The world (parallel grammars: every scene captioned in en, de, fr, es, ru, el, zh): a task pairs
  each caption of the language with the English caption in the same slot of the same image, plus
  that image's features from the frozen image tower; evaluation is text <-> image retrieval.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..evaluate import embed_texts_cached
from ..metrics.retrieval import retrieval_metrics
from .adapters import use_language
from .tasks import LanguageTask


def is_multi30k(data: str | Path) -> bool:
    return (Path(data) / "task1" / "raw").is_dir()


def recall_at_1(query: np.ndarray, gallery: np.ndarray, match: np.ndarray | None = None) -> float:
    """R@1 of ``query[i]`` -> ``gallery[match[i]]`` (default ``match[i] = i``)."""
    match = np.arange(len(query)) if match is None else match
    return float(retrieval_metrics(gallery, query, match, ks=(1,), directions=("t2i",))["t2i"]["R@1"])


# ----------------------------------------------------------------------------- Multi30K
def multi30k_tasks(root: str | Path, langs: Sequence[str], train_lines: int | None = None) -> tuple[list[LanguageTask], list[str]]:
    """One task per language from task-1 train (the first ``train_lines`` lines are trained on; the
    vocabulary sees the whole split) and the English train corpus (task 1's token statistics)."""
    from ..data.multi30k import read_task1

    english = read_task1(root, "train", "en")
    n = len(english) if train_lines is None else min(int(train_lines), len(english))
    tasks = []
    for lang in langs:
        lines = read_task1(root, "train", lang)
        if len(lines) != len(english):
            raise ValueError(f"{root}: task1 train.{lang} has {len(lines)} lines, train.en has {len(english)}")
        tasks.append(LanguageTask(lang, lines[:n], english[:n], vocab_texts=lines))
    return tasks, english


def multi30k_eval_lines(root: str | Path, split: str, langs: Sequence[str], eval_dir: str | Path | None = None,
                        limit: int | None = None) -> dict[str, list[str]]:
    """``{lang: lines}`` of a task-1 split for English and ``langs`` (from ``eval_dir`` when given:
    a folder holding ``{split}.{lang}.gz`` like ``task1/raw``)."""
    from ..data.multi30k import read_lines, read_task1

    if eval_dir is not None and not Path(eval_dir).is_dir():
        raise FileNotFoundError(f"{eval_dir}: eval dir not found")
    out = {}
    for lang in ("en", *[lg for lg in langs if lg != "en"]):
        lines = read_lines(Path(eval_dir) / f"{split}.{lang}.gz") if eval_dir is not None else read_task1(root, split, lang)
        out[lang] = lines[:limit]
        if len(out[lang]) != len(out["en"]):
            raise ValueError(f"{split}.{lang}: {len(out[lang])} lines but {split}.en has {len(out['en'])}")
    return out


def foreign_to_english(encoder, lines: dict[str, list[str]], cache_dir: str | Path | None = None) -> dict[str, float]:
    """R@1 of each non-English language's lines retrieving their English line (current model on
    both sides; a LoRA baseline uses each language's adapter)."""
    use_language(encoder, "en")
    gallery = embed_texts_cached(encoder, lines["en"], cache_dir)
    out = {}
    for lang, texts in lines.items():
        if lang != "en":
            use_language(encoder, lang)
            out[lang] = recall_at_1(embed_texts_cached(encoder, texts, cache_dir), gallery)
    return out


# ----------------------------------------------------------------------------- world
def world_parallel(data, lang: str) -> tuple[list[str], list[str], np.ndarray]:
    """``(foreign, english, image index)``: each caption of ``lang`` with the English caption in the
    same slot of the same image (the grammars describe the same scene in every language)."""
    by_image: dict[tuple[int, str], list[int]] = {}
    for j, (img, lg) in enumerate(zip(data.caption_image, data.langs)):
        by_image.setdefault((int(img), lg), []).append(j)
    foreign, english, image = [], [], []
    for (img, lg), idx in sorted(by_image.items()):
        en = by_image.get((img, "en"), [])
        if lg != lang or not en:
            continue
        for k, j in enumerate(idx):
            foreign.append(data.captions[j])
            english.append(data.captions[en[k % len(en)]])
            image.append(img)
    if not foreign:
        raise ValueError(f"{data.root}: no {lang!r} captions with an English caption of the same image")
    return foreign, english, np.asarray(image, np.int64)


def world_tasks(data, image_features: np.ndarray, langs: Sequence[str]) -> tuple[list[LanguageTask], list[str]]:
    """Tasks (with image features) for ``langs`` and the English caption corpus of ``data``."""
    tasks = []
    for lang in langs:
        foreign, english, img = world_parallel(data, lang)
        tasks.append(LanguageTask(lang, foreign, english, images=image_features[img]))
    return tasks, [c for c, lg in zip(data.captions, data.langs) if lg == "en"]


def fuse_translate_test(foreign: np.ndarray, translated: np.ndarray, eta: float) -> np.ndarray:
    """Translate-test score fusion (Fig. 5): ``s = (1 - eta) <q_F, g> + eta <q_E, g>``, realised as
    the query ``(1 - eta) q_F + eta q_E`` (cosine scores are linear in the query)."""
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    return (1.0 - eta) * foreign + eta * translated


def world_retrieval(encoder, data, image_features: np.ndarray, langs: Sequence[str],
                    cache_dir: str | Path | None = None, eta: float = 0.0, etas: Sequence[float] = ()) -> dict:
    """``{"t2i": {lang: R@1}, "i2t": {lang: R@1}}`` for ``langs`` (English included if listed);
    with ``eta > 0`` each foreign query is fused with its English translation (translate-test).
    Each weight in ``etas`` adds ``out["translate_test"][f"{w:g}"]``: the same R@1 dicts of the
    foreign languages with fusion weight ``w`` (one encoding pass serves every weight)."""
    out: dict = {"t2i": {}, "i2t": {}}
    fused: dict = {f"{w:g}": {"t2i": {}, "i2t": {}} for w in etas}
    if fused:
        out["translate_test"] = fused
    for lang in langs:
        use_language(encoder, lang)
        if lang == "en":
            texts = [c for c, lg in zip(data.captions, data.langs) if lg == "en"]
            img = np.asarray([i for i, lg in zip(data.caption_image, data.langs) if lg == "en"], np.int64)
            q = embed_texts_cached(encoder, texts, cache_dir)
        else:
            foreign, english, img = world_parallel(data, lang)
            q = embed_texts_cached(encoder, foreign, cache_dir)
            q_en = embed_texts_cached(encoder, english, cache_dir) if eta or etas else None
            for w in etas:
                m = retrieval_metrics(image_features, fuse_translate_test(q, q_en, w), img, ks=(1,),
                                      directions=("t2i", "i2t"))
                fused[f"{w:g}"]["t2i"][lang], fused[f"{w:g}"]["i2t"][lang] = m["t2i"]["R@1"], m["i2t"]["R@1"]
            if eta:
                q = fuse_translate_test(q, q_en, eta)
        m = retrieval_metrics(image_features, q, img, ks=(1,), directions=("t2i", "i2t"))
        out["t2i"][lang], out["i2t"][lang] = m["t2i"]["R@1"], m["i2t"]["R@1"]
    return out


# ----------------------------------------------------------------------------- task sequences
@dataclass
class Multi30KSequence:
    """Multi30K's tasks and evaluation lines: ``eval_lines`` (foreign -> English R@1) and the
    English task-2 val captions 1 -> 2 (English forgetting)."""

    tasks: list[LanguageTask]
    english_corpus: list[str]
    eval_lines: dict[str, list[str]]
    caption_queries: list[str]
    caption_gallery: list[str]

    def evaluator(self, cache_dir: str | Path | None) -> Callable[[object], dict]:
        """``encoder -> {"f2e": {lang: R@1}, "en_caption": R@1}``."""
        def evaluate(enc) -> dict:
            enc.invalidate_space_id()
            f2e = foreign_to_english(enc, self.eval_lines, cache_dir)
            use_language(enc, "en")
            return {"f2e": f2e, "en_caption": recall_at_1(embed_texts_cached(enc, self.caption_queries, cache_dir),
                                                          embed_texts_cached(enc, self.caption_gallery, cache_dir))}
        return evaluate


def multi30k_sequence(root: str | Path, langs: Sequence[str], train_lines: int | None, split: str,
                      eval_dir: str | Path | None = None, limit: int | None = None) -> Multi30KSequence:
    """Multi30K's tasks for ``langs`` and the evaluation lines of ``split``."""
    from ..data.multi30k import read_task2

    tasks, english = multi30k_tasks(root, langs, train_lines)
    cap = read_task2(root, "val", "en", ks=(1, 2))
    return Multi30KSequence(tasks, english, multi30k_eval_lines(root, split, langs, eval_dir, limit),
                            cap.column(1), cap.column(2))


@dataclass
class WorldSequence:
    """The world's tasks (train images through ``base``'s frozen image tower) and its evaluation
    split with frozen image features."""

    tasks: list[LanguageTask]
    english_corpus: list[str]
    eval_data: object
    eval_images: np.ndarray

    def evaluator(self, langs: Sequence[str], cache_dir: str | Path | None,
                  etas: Sequence[float] = ()) -> Callable[[object], dict]:
        """``encoder -> world_retrieval(...)`` over English and ``langs``."""
        def evaluate(enc) -> dict:
            enc.invalidate_space_id()
            return world_retrieval(enc, self.eval_data, self.eval_images, ("en", *langs), cache_dir, etas=etas)
        return evaluate

    def images_unchanged(self, base, encoder) -> dict[str, bool]:
        """Are ``encoder``'s image embeddings and image tower bit-identical to ``base``'s?"""
        import torch

        ref = base.model.vision_model.state_dict()
        return {"image_embeddings_bit_identical": bool(np.array_equal(
                    encoder.encode_images(self.eval_data.image_paths()), self.eval_images)),
                "image_tower_bit_identical": all(torch.equal(ref[k], v) for k, v in
                                                 encoder.model.vision_model.state_dict().items())}


def world_sequence(root: str | Path, base, langs: Sequence[str], train_images: int, split: str,
                   limit: int | None = None) -> WorldSequence:
    """The world's tasks for ``langs`` on the first ``train_images`` train images, and ``split``."""
    from ..evaluate import load_eval_data

    langs_all = ("en", *langs)
    train = load_eval_data(root, "train", langs=langs_all)
    train = train.subset_images(np.arange(min(train_images, len(train))))
    test = load_eval_data(root, split, langs=langs_all)
    if limit:
        test = test.subset_images(np.arange(min(limit, len(test))))
    tasks, english = world_tasks(train, base.encode_images(train.image_paths()), langs)
    return WorldSequence(tasks, english, test, base.encode_images(test.image_paths()))


__all__ = ["multi30k_sequence", "Multi30KSequence", "world_sequence", "WorldSequence", "multi30k_tasks", "multi30k_eval_lines", "foreign_to_english", "world_parallel", "world_tasks",
           "world_retrieval", "fuse_translate_test", "recall_at_1", "is_multi30k"]
