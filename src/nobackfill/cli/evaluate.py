"""``nobackfill eval ...``: retrieval and backward compatibility of models and upgrades."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ._common import emit_json, fail, json_flag, langs_option, quiet, user_errors, write_json


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
    """Text->image and image->text R@1/5/10, median rank, mAP for a query model x gallery model
    (optionally through bridges, RECO-refined queries, or CMLI re-ranking of the top-k)."""
    echo = quiet(as_json)
    from ..encoders import load_encoder
    from ..evaluate import cross_retrieval, embed_dataset, load_eval_data
    from ..report import recall_table_rows, text_table

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        if rerank:
            return _eval_reranked(query_model, gallery_model, ds, rerank, rerank_k, rerank_weight, json_out, as_json)
        q = load_encoder(query_model)
        g = q if gallery_model == query_model else load_encoder(gallery_model)
        ge = embed_dataset(g, ds, progress=True)
        if bridge or reco is not None:  # the Searcher's query pipeline: bridges and RECO refinement
            from ..evaluate import Embedded
            from ..search.searcher import query_side_for

            side = query_side_for(q, g.space_id, bridges=bridge or [], reco=reco)
            qe = Embedded(g.space_id, side.embed("image", ds.image_paths()), side.embed("text", ds.captions))
        else:  # the raw comparison (near chance across spaces: why upgrades exist)
            qe = ge if g is q else embed_dataset(q, ds, progress=True)
    except user_errors() as e:
        fail(str(e))
    res = cross_retrieval(qe, ge, ds.caption_image)
    res.update({"query_model": str(query_model), "gallery_model": str(gallery_model), "n_images": len(ds),
                "n_captions": len(ds.captions), "query_space": q.space_id, "gallery_space": g.space_id,
                "bridges": [str(b) for b in bridge or []], "reco": str(reco) if reco else None})
    echo(text_table(*recall_table_rows({f"{query_model.name}/{gallery_model.name}": res})))
    write_json(json_out, res)
    emit_json(res, as_json)

def _eval_reranked(query_model: Path, gallery_model: Path, ds, rerank: str, rerank_k: int, weight: float,
                   json_out: Optional[Path], as_json: bool) -> None:
    """``eval retrieval --rerank``: global and re-ranked metrics side by side, all queries at once."""
    import numpy as np

    from ..encoders import load_encoder
    from ..late.rerank import RERANK_SCORES, RerankSet, rerank_metrics, rerank_pairs
    from ..report import recall_table_rows, text_table

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
    res = {"global": rerank_metrics(scored, data, None),
           "reranked": rerank_metrics(scored, data, {"t2i": (variant, weight), "i2t": (variant, weight)}),
           "rerank": rerank, "rerank_k": rerank_k, "weight": weight, "model": str(query_model),
           "n_images": len(ds), "n_captions": len(ds.captions), "space": enc.space_id}
    quiet(as_json)(text_table(*recall_table_rows({"global": res["global"], f"+ {rerank} @ {weight}": res["reranked"]})))
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
    off), raw new/old, upgraded new/old R@1/5/10, gap closure, Eq. 1 criterion rates, on/off check."""
    echo = quiet(as_json)
    from ..encoders import load_encoder
    from ..evaluate import load_eval_data
    from ..report import recall_table_rows, text_table
    from ..search.compat_report import LABELS, compat_report

    try:
        ds = load_eval_data(data, split, langs=[x for x in langs.split(",") if x])
        result = compat_report(load_encoder(old), load_encoder(new), ds, bridges=bridge, strict=strict,
                               n_unpaired=n_unpaired, progress=True)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    rows, gap, crit, flips, onoff = (result[k] for k in ("rows", "gap_closure", "criterion", "flips",
                                                         "onoff_max_abs_diff"))
    labels = LABELS
    echo(text_table(*recall_table_rows({labels[k]: v for k, v in rows.items()})))
    echo("gap closure: " + ", ".join(f"{d} {v:.2f}" if v is not None else f"{d} -" for d, v in gap.items()))
    for case, r in crit.items():
        echo(f"criterion {case}: paired {100 * r['paired']:.1f}%  unpaired {100 * r['unpaired']:.1f}%")
    for name, f in flips.items():
        echo(f"flips vs old/old, {labels[name]}: " + ", ".join(
            f"{d} NFR {100 * v['NFR']:.1f}% PFR {100 * v['PFR']:.1f}%" for d, v in f.items()))
    if onoff is not None:
        echo(f"upgrade off vs original new model: max abs diff {onoff}")
    write_json(json_out, result)
    emit_json(result, as_json)
