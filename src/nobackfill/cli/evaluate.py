"""``nobackfill eval ...``: retrieval and backward compatibility of models and upgrades."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

import typer

from ._common import (NOTHING_WRITTEN, check_json_out, emit_json, fail, json_flag, langs_option, on_interrupt, quiet,
                      user_errors, write_json)


def eval_retrieval(
    query_model: Path = typer.Option(..., help="Model that embeds the queries."),
    gallery_model: Path = typer.Option(..., help="Model that embedded the gallery."),
    data: Path = typer.Option(..., help="User data folder or world root."),
    split: str = typer.Option("test", help="Split when --data is a world root."),
    langs: str = langs_option(),
    json_out: Optional[Path] = typer.Option(None, "--out", help="Write results as JSON here."),
    bridge: Optional[List[Path]] = typer.Option(None, "--bridge", help="Upgrade directory taking the query model "
                                                "into the gallery model's space; repeat to chain bridges."),
    reco: Optional[Path] = typer.Option(None, "--reco", help="RECO directory: refine the queries (queries only; "
                                        "the gallery embeddings stay the original ones)."),
    rerank: str = typer.Option("", help="Re-score each query's first-stage top --rerank-k with CMLI: cmli (Eq. 3/4 "
                                        "by direction) | cmli-sym (their mean); one model on both sides."),
    rerank_k: int = typer.Option(100, help="First-stage candidates to re-rank."),
    rerank_weight: float = typer.Option(1.0, help="Re-rank score = global + weight * CMLI (inf: CMLI only)."),
    as_json: bool = json_flag(),
) -> None:
    """Text->image and image->text R@1/5/10, median rank and mAP (R@K and mAP in %) for a query model x
    gallery model (optionally through bridges, RECO-refined queries, or CMLI re-ranking of the top-k).
    The row says what was compared: QUERY[+bridge(UPGRADE)...][+reco(RECO)]/GALLERY; notes follow the table."""
    echo = quiet(as_json)
    from ..encoders import load_encoder
    from ..evaluate import Embedded, cross_retrieval, embed_dataset, load_eval_data

    check_json_out(json_out)
    on_interrupt(NOTHING_WRITTEN)
    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        if rerank:
            return _eval_reranked(query_model, gallery_model, ds, rerank, rerank_k, rerank_weight, json_out, as_json)
        q = load_encoder(query_model)
        g = q if gallery_model == query_model else load_encoder(gallery_model)
        side = None
        if bridge or reco is not None:  # the Searcher's query pipeline (checked before anything is embedded)
            from ..search.searcher import query_side_for

            side = query_side_for(q, g.space_id, bridges=bridge or [], reco=reco, gallery_name=g.name)
        ge = embed_dataset(g, ds, progress=True)
        if side is not None:
            qe = Embedded(g.space_id, side.embed("image", ds.image_paths()), side.embed("text", ds.captions))
        else:  # the raw comparison (near chance across spaces: why upgrades exist)
            qe = ge if g is q else embed_dataset(q, ds, progress=True)
    except user_errors() as e:
        fail(e)
    res = cross_retrieval(qe, ge, ds.caption_image)
    if side is None and q.space_id != g.space_id:
        res["note"] = "; ".join(x for x in (res.get("note"), f"no bridge from the query's space {q.space_id} to "
                                            f"the gallery's {g.space_id}: near chance is expected") if x)
    label = f"{query_label(query_model, bridge or [], reco)}/{_name(gallery_model)}"
    res.update({"label": label, "query_model": str(query_model), "gallery_model": str(gallery_model),
                "n_images": len(ds), "n_captions": len(ds.captions), "query_space": q.space_id,
                "gallery_space": g.space_id, "bridges": [str(b) for b in bridge or []],
                "reco": str(reco) if reco else None})
    res["langs"] = sorted(ds.languages())
    echo(data_line(ds, bool(langs)))
    echo(metrics_table({label: res}))
    write_json(json_out, res)
    emit_json(res, as_json)


def _name(path: Path) -> str:
    return Path(os.path.abspath(path)).name or str(path)


def query_label(model: Path, bridges: Sequence[Path] = (), reco: Optional[Path] = None) -> str:
    """What the queries are, in a row's label: ``MODEL[+bridge(UPGRADE)...][+reco(RECO)]``."""
    return "+".join([_name(model)] + [f"bridge({_name(b)})" for b in bridges]
                    + ([f"reco({_name(reco)})"] if reco is not None else []))


#: the table's metrics: (key in a direction's metrics, heading)
METRICS = (("R@1", "R@1"), ("R@5", "R@5"), ("R@10", "R@10"), ("median_rank", "median rank"), ("mAP", "mAP"))


def data_line(ds, picked: bool = False) -> str:
    """What was evaluated: images, captions and their languages (every language of the data unless
    --langs picks some: trial V read numbers of 7 languages as a model's English ones)."""
    from collections import Counter

    counts = Counter(ds.langs)
    langs = ", ".join(f"{lang} {n:,}" for lang, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    pick = " (--langs picks some)" if len(counts) > 1 and not picked else ""
    return f"data: {len(ds):,} images, {len(ds.captions):,} captions by language: {langs}{pick}"


def metrics_table(rows: dict[str, dict]) -> str:
    """``{label: {"t2i": metrics, "i2t": metrics, "note"?: str}}`` as a text table, a line per label and
    direction (R@K and mAP in %, said under it), then every row's note."""
    from ..report import text_table

    def cell(key: str, v) -> str:
        return "-" if v is None else f"{v:g}" if key == "median_rank" else f"{100 * v:.1f}"

    body = [[label, d] + [cell(k, (r.get(d) or {}).get(k)) for k, _ in METRICS]
            for label, r in rows.items() for d in ("t2i", "i2t")]
    notes = [f"note: {label}: {r['note']}" for label, r in rows.items() if r.get("note")]
    return "\n".join([text_table(["row", "dir"] + [h for _, h in METRICS], body),
                      "(R@K and mAP in %; the --out JSON holds fractions)", *notes])


def _eval_reranked(query_model: Path, gallery_model: Path, ds, rerank: str, rerank_k: int, weight: float,
                   json_out: Optional[Path], as_json: bool) -> None:
    """``eval retrieval --rerank``: global and re-ranked metrics side by side, all queries at once."""
    import numpy as np

    from ..encoders import load_encoder
    from ..late.rerank import RERANK_SCORES, RerankSet, rerank_metrics, rerank_pairs

    if rerank not in RERANK_SCORES:
        raise ValueError(f"--rerank must be one of {sorted(RERANK_SCORES)}, got {rerank!r}")
    if query_model != gallery_model:
        raise ValueError("--rerank compares the token outputs of one model: give the same --query-model and "
                         "--gallery-model")
    enc = load_encoder(query_model)
    data = RerankSet("eval", ds.image_paths(), list(ds.captions),
                     np.asarray(ds.caption_image))
    scored = rerank_pairs(enc, data, rerank_k)
    variant = RERANK_SCORES[rerank]
    pair = f"{_name(query_model)}/{_name(gallery_model)}"
    res = {"global": rerank_metrics(scored, data, None),
           "reranked": rerank_metrics(scored, data, {"t2i": (variant, weight), "i2t": (variant, weight)}),
           "labels": {"global": pair, "reranked": f"{pair}+rerank({rerank}, top {rerank_k}, weight {weight:g})"},
           "rerank": rerank, "rerank_k": rerank_k, "weight": weight, "model": str(query_model),
           "n_images": len(ds), "n_captions": len(ds.captions), "langs": sorted(ds.languages()), "space": enc.space_id}
    quiet(as_json)(data_line(ds))
    quiet(as_json)(metrics_table({res["labels"][k]: res[k] for k in ("global", "reranked")}))
    write_json(json_out, res)
    emit_json(res, as_json)


def eval_compat(
    old: Path = typer.Option(..., help="The old model (gallery side)."),
    new: Path = typer.Option(..., help="The new model (query side)."),
    bridge: List[Path] = typer.Option(..., "--bridge", help="Upgrade directory new -> old (repeat to chain)."),
    data: Path = typer.Option(..., help="User data folder or world root."),
    split: str = typer.Option("test", help="Split when --data is a world root."),
    langs: str = langs_option(),
    strict: bool = typer.Option(False, help="Eq. 1 with strict inequalities (a tie fails); default: ties satisfy "
                                            "<= / >= as written."),
    n_unpaired: int = typer.Option(20000, help="Sampled unpaired (i, j) for the criterion rates."),
    json_out: Optional[Path] = typer.Option(None, "--out", help="Write results as JSON here."),
    as_json: bool = json_flag(),
) -> None:
    """Backward compatibility of an upgraded new model with an old gallery: old/old, new/new (upgrade
    off), raw new/old, upgraded new/old R@1/5/10, median rank, mAP, gap closure, Eq. 1 criterion rates,
    on/off check. A line first names the old and new models and the upgrade; notes follow the table."""
    echo = quiet(as_json)
    from ..encoders import load_encoder
    from ..evaluate import load_eval_data
    from ..search.compat_report import LABELS, compat_report

    check_json_out(json_out)
    on_interrupt(NOTHING_WRITTEN)
    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        eo, en = load_encoder(old), load_encoder(new)
        result = compat_report(eo, en, ds, bridges=bridge, strict=strict, n_unpaired=n_unpaired, progress=True)
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    rows, gap, crit, flips, onoff = (result[k] for k in ("rows", "gap_closure", "criterion", "flips",
                                                         "onoff_max_abs_diff"))
    labels = LABELS
    echo(f"old: {_name(old)} ({eo.space_id}), new: {_name(new)} ({en.space_id}), "
         f"upgraded new: {query_label(new, bridge)}")
    echo(data_line(ds, bool(langs)))
    echo(metrics_table({labels[k]: v for k, v in rows.items()}))
    echo("gap closure: " + ", ".join(f"{d} {v:.2f}" if v is not None else f"{d} -" for d, v in gap.items()))
    for case, r in crit.items():
        echo(f"criterion {case}: paired {100 * r['paired']:.1f}%  unpaired {100 * r['unpaired']:.1f}%")
    for name, f in flips.items():
        echo(f"flips vs old/old, {labels[name]}: " + ", ".join(
            f"{d} NFR {100 * v['NFR']:.1f}% PFR {100 * v['PFR']:.1f}%" for d, v in f.items()))
    if onoff is not None:
        echo(f"upgrade off vs original new model: max abs diff {onoff}")
    result["langs"] = sorted(ds.languages())
    write_json(json_out, result)
    emit_json(result, as_json)
