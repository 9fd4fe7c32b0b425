"""The compatibility report of an upgrade: how a new model's queries, carried through its upgrades
into an old space, search a gallery embedded by the old model. Rows old/old (today), new/new (a
full backfill, the upgrade off), raw new/old (incompatible spaces, near chance) and upgraded
new/old; gap closure ``(upgraded - old/old) / (new/new - old/old)`` per direction; the compatibility
criterion of Eq. 1 of XBT (Jang & Lim 2024, "Towards Cross-modal Backward-compatible Representation
Learning for Vision-Language Models"); prediction flips against old/old; and the on/off check (the upgraded model with its
adapters off gives the original new model's vectors). Queries go through the one query pipeline
(:func:`~nobackfill.search.searcher.query_side_for`), as the searcher's do."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..evaluate import Embedded, cross_flips, cross_retrieval, embed_dataset
from ..metrics.compat import cross_modal_criterion, gap_closure

__all__ = ["LABELS", "compat_report", "embed_through", "gap_closures", "report_row"]

#: the report's rows in words
LABELS = {"old_old": "old/old", "new_new": "new/new (upgrade off)", "new_old_raw": "raw new/old",
          "upgraded_new_old": "upgraded new/old"}


def embed_through(side: Any, data: Any) -> Embedded:
    """Every image and caption of ``data`` embedded as queries into ``side``'s space."""
    return Embedded(side.space_id, side.embed("image", data.image_paths()), side.embed("text", data.captions))


def report_row(query: Embedded, gallery: Embedded, c2i: Sequence[int], *, criterion: bool = True,
               n_unpaired: int = 20000, strict: bool = False, seed: int = 0) -> dict[str, Any]:
    """One row of the report: R@1/5/10 both directions of ``query``'s vectors against
    ``gallery``'s, and (``criterion``, same widths) the rates of Eq. 1 under ``"criterion"``."""
    row = cross_retrieval(query, gallery, c2i)
    if criterion and query.texts.shape[1] == gallery.texts.shape[1]:
        row["criterion"] = cross_modal_criterion(query.texts, query.images, gallery.texts, gallery.images, c2i,
                                                 n_unpaired=n_unpaired, strict=strict, seed=seed)
    return row


def gap_closures(row: dict[str, Any], old_old: dict[str, Any], new_new: dict[str, Any]) -> dict[str, float | None]:
    """:func:`~nobackfill.metrics.compat.gap_closure` of ``row``'s R@1, per direction."""
    return {d: gap_closure(row[d]["R@1"], old_old[d]["R@1"], new_new[d]["R@1"]) for d in ("t2i", "i2t")}


def compat_report(old: Any, new: Any, data: Any, *, bridges: Sequence[str | Path] = (), strict: bool = False,
                  n_unpaired: int = 20000, progress: bool = False) -> dict[str, Any]:
    """The report (see the module doc) of ``new``'s queries through ``bridges`` (upgrade
    directories) against ``old``'s gallery of ``data`` (a :class:`PairDataset`); without
    ``bridges``, the old/old, new/new and raw new/old rows only."""
    from .searcher import query_side_for

    if int(n_unpaired) < 1:  # (0 printed the criterion's unpaired rate as nan)
        raise ValueError(f"n_unpaired must be >= 1, got {n_unpaired}")

    side = query_side_for(new, old.space_id, bridges=bridges, gallery_name=getattr(old, "name", "")) \
        if bridges else None  # a wrong upgrade is refused before anything is embedded
    eo, en = embed_dataset(old, data, progress=progress), embed_dataset(new, data, progress=progress)
    c2i = data.caption_image
    rows = {"old_old": cross_retrieval(eo, eo, c2i), "new_new": cross_retrieval(en, en, c2i),
            "new_old_raw": cross_retrieval(en, eo, c2i)}
    out: dict[str, Any] = {"rows": rows, "strict": strict, "n_images": len(data), "n_captions": len(data.captions),
                           "bridges": [str(b) for b in bridges], "spaces": {"old": old.space_id, "new": new.space_id}}
    if side is None:  # no upgrade given: the three reference rows only
        return out
    eu = embed_through(side, data)
    rows["upgraded_new_old"] = report_row(eu, eo, c2i, n_unpaired=n_unpaired, strict=strict)
    out["criterion"] = rows["upgraded_new_old"].pop("criterion")
    out["gap_closure"] = gap_closures(rows["upgraded_new_old"], rows["old_old"], rows["new_new"])
    out["flips"] = cross_flips({"old_old": (eo, eo), "new_new": (en, en), "upgraded_new_old": (eu, eo)}, "old_old",
                               c2i)
    out["onoff_max_abs_diff"] = onoff_max_abs_diff(new, side, data, en)
    return out


def onoff_max_abs_diff(new: Any, side: Any, data: Any, original: Embedded) -> float | None:
    """The largest difference between the encoder upgrade on ``side``'s route, applied to a copy of
    ``new`` and switched off, and the original new model's vectors ``original`` (0.0 when its
    adapters leave the model untouched); None when the route has no encoder upgrade."""
    import copy

    from ..compat.upgrade import load_upgrade

    if side.path is None or not side.path.encoder_upgrade:
        return None
    encoder = load_upgrade(side.path.encoder_upgrade).apply(copy.deepcopy(new))
    with encoder.switched(False):
        off = embed_dataset(encoder, data)
    return float(max(np.abs(off.images - original.images).max(), np.abs(off.texts - original.texts).max()))
