"""Fitting bridges as the backfill advances (an upgrade registered without a bridge).

``upgrade`` without a bridge writes ``backfill/fit.json`` (:func:`enable_fit`): the backfill then
starts with a stratified sample of each modality (``fraction`` of its items, at least ``min`` and at
most ``max``; :func:`sample_first`), and the worker whose commit brings the backfilled pairs to the
next threshold fits the bridges (:func:`~.fit_bridges.fit_collection_bridges`): first once the
sample is in, then at each doubling of the pairs, and at the end. One fit per threshold: the
fitting worker holds the ``backfill/fit`` lock (others skip; a killed one releases it with its
process) and moves the threshold only after the fit, so a fit killed half-way is done again by the
next commit, and the serving bridge stays until a better one is swapped in.
"""

from __future__ import annotations

import time
from dataclasses import asdict, fields
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..collection.collection import Collection
from .backfill_jobs import JOB_DIR, BackfillJob, _iso, _now, _read, _write, lease_gone, new_owner, place_of

FIT_FILE = "fit.json"
#: a fit marked running longer ago than this is not shown as running (its process, on another
#: host, cannot be checked; a fit takes seconds to a minute)
FIT_SHOWN_S = 1800.0
DEFAULTS = {"fraction": 0.01, "min": 512, "max": 20000}


class FitSampleError(ValueError):
    """Fit settings refused (``field``: ``fit_sample``, as the HTTP API names it)."""

    field = "fit_sample"


#: what ``fit_sample`` may set
SAMPLE_FIELDS = ("fraction", "min_pairs", "max_pairs", "fit")


def fit_settings(fit_sample: Mapping[str, Any] | None = None, queries: Sequence[str] = ()) -> dict[str, Any]:
    """The settings a fitting backfill records, checked (nothing written): ``fit_sample``'s
    ``fraction`` of each modality first (default 0.01), at least ``min_pairs`` (512) and at most
    ``max_pairs`` (20,000); ``fit``: fields of :class:`~nobackfill.compat.fitted.FitConfig` every
    fit uses (default: its defaults), e.g. fewer families and MLP steps for a quick demo;
    ``queries``: example search texts (:func:`check_queries`). :class:`FitSampleError` /
    :class:`QueriesError` name what is wrong."""
    from ..compat.fitted import FitConfig

    given = dict(fit_sample or {})
    unknown = sorted(set(given) - set(SAMPLE_FIELDS))
    if unknown:
        raise FitSampleError(f"fit_sample: unknown settings {unknown} (settings: {list(SAMPLE_FIELDS)})")
    fraction, lo, hi = (given.get("fraction", DEFAULTS["fraction"]), given.get("min_pairs", DEFAULTS["min"]),
                        given.get("max_pairs", DEFAULTS["max"]))
    if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 < fraction <= 1.0) \
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or not 1 <= lo <= hi:
        raise FitSampleError(f"fit_sample: fraction in (0, 1], 1 <= min_pairs <= max_pairs (whole numbers); got "
                             f"{fraction!r}, {lo!r}, {hi!r}")
    state = {"fraction": float(fraction), "min": lo, "max": hi}
    queries = check_queries(queries)
    if queries:
        state["queries"] = queries
    fit = given.get("fit")
    if fit is not None:
        try:
            fit_cfg = asdict(FitConfig(**dict(fit)))
        except (TypeError, ValueError) as e:
            raise FitSampleError(f"fit settings {dict(fit)}: {e} (fields: {[f.name for f in fields(FitConfig)]})") \
                from None
        state["fit"] = {k: list(v) if isinstance(v, tuple) else v for k, v in fit_cfg.items()}
    return state


def enable_fit(collection: Collection, target: str, fit_sample: Mapping[str, Any] | None = None,
               queries: Sequence[str] = (), bridges: bool = True) -> dict[str, Any]:
    """Record that the backfill into ``target`` fits bridges (sample first, then refits) with the
    settings of :func:`fit_settings`; with ``bridges`` False (an upgrade without a bridge whose user
    turned the fits off) only the merge's score maps, at each doubling of the pairs, in the backfill's
    own order: the old space's items, served through the old model, are still merged on one scale
    with the moved ones (on raw scores a new user measured Multi30K R@1 0.472 -> 0.344 half-way)."""
    state = {"target": target, **fit_settings(fit_sample, queries), "next": None, "fits": [],
             **({} if bridges else {"bridges": False})}
    _write(collection, FIT_FILE, state)
    return state


#: the most example query texts an upgrade keeps for its fits, and the longest one (characters)
MAX_QUERIES, MAX_QUERY_CHARS = 2000, 300


class QueriesError(ValueError):
    """Example query texts refused (``field``: ``queries``, as the HTTP API names it)."""

    field = "queries"


def check_queries(queries: Sequence[str]) -> list[str]:
    """``queries`` as a list of distinct non-empty texts (stripped, first occurrence kept); a
    :class:`QueriesError` naming the entry for a non-string or one longer than
    :data:`MAX_QUERY_CHARS`, and for more than :data:`MAX_QUERIES`."""
    if isinstance(queries, str):
        raise QueriesError("queries: a list of texts, not one string")
    out: dict[str, None] = {}
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise QueriesError(f"queries[{i}]: a text, not {type(q).__name__}")
        if len(q.strip()) > MAX_QUERY_CHARS:
            raise QueriesError(f"queries[{i}]: {len(q.strip())} characters, at most {MAX_QUERY_CHARS} (a search text)")
        if q.strip():
            out.setdefault(q.strip(), None)
    if len(out) > MAX_QUERIES:
        raise QueriesError(f"queries: {len(out)} distinct texts, at most {MAX_QUERIES} are kept for the fits; pass "
                           "a sample of them")
    return list(out)


def fit_state(collection: Collection, target: str | None = None) -> dict[str, Any] | None:
    """The fit state of the backfill into ``target`` (default: the current space), or None."""
    st = _read(collection, FIT_FILE)
    if not st or st.get("target") != (target or collection.current_space):
        return None
    return st


def fit_summary(collection: Collection) -> dict[str, Any]:
    """What status shows of the fits: the fitted bridges in service (family, pairs, held-out score,
    when), the fits so far (what each swapped in, and skipped with why), the next threshold, the
    last error."""
    from .fit_bridges import fitted_status

    st = fit_state(collection) or {}
    plan = collection.plan
    nxt = st.get("next")
    counts = {m: collection.count(m) for m in plan.current_space.modalities} if st else {}
    total = sum(counts.values())
    if st and nxt is None and not st.get("fits"):  # no backfill started yet: where its sample will end
        nxt = sum(sample_size(n, st) for n in counts.values())
    fitting = running_fit(collection, st)
    served = _served_count(collection, st["target"]) if st.get("target") and nxt is not None else 0
    return {"serving": fitted_status(plan), "fits": st.get("fits", []), "next": nxt, "items": total,
            "fitting": fitting,
            # past its threshold and no fit running: the worker that was to fit stopped (trial Q: PostgreSQL
            # stopped during a fit, and status said "next at 288" with 296 backfilled); the next commit fits
            "overdue": bool(nxt is not None and served >= nxt and fitting is None and st.get("fits") is not None
                            and served < total),
            "next_at_end": nxt is not None and nxt >= total,  # a doubling past the collection: the end's fit
            "merge_maps_said": (st.get("merge_maps") or {}).get("said", []),  # (the fits': in "fits")
            # (nothing is fitted once the old spaces are retired)
            "enabled": bool(st) and st.get("bridges", True) and bool(plan.old_spaces()),
            "maps_only": bool(st) and st.get("bridges") is False and bool(plan.old_spaces()),
            **({"error": st["error"]} if st.get("error") else {})}


def running_fit(collection: Collection, st: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The bridge fit running now (``{pairs, owner, since, at}``), or None: one whose process is
    gone (killed during its fit: the next commit fits again) or, on another host, that began more
    than :data:`FIT_SHOWN_S` ago is not running."""
    st = fit_state(collection) if st is None else st
    fitting = (st or {}).get("fitting")
    if not fitting or lease_gone(collection, fitting) or \
            _now() - float(fitting.get("at", 0.0)) > FIT_SHOWN_S:
        return None
    return fitting


def sample_size(n: int, st: dict[str, Any]) -> int:
    return min(n, max(int(st["min"]), min(int(st["max"]), int(round(st["fraction"] * n)))))


def sample_first(collection: Collection, pending: Sequence[Any], ids: list[str], seed: int) -> tuple[list[str], int]:
    """``ids`` (the backfill order) with a stratified random sample of each modality of ``pending``
    (random images, then the captions of those images, then other captions at random) moved to the
    front, when the upgrade fits bridges (the uncertainty order puts it at the head of the sample it
    measures); returns the order and the sample's size, the first fit's threshold (0: no fitting)."""
    st = fit_state(collection)
    if st is None or st.get("bridges") is False:
        return ids, 0
    from .fit_bridges import scene_of

    rng = np.random.default_rng(seed + 7)
    images = [it for it in pending if it.modality == "image"]
    k = sample_size(len(images), st)
    picked = {images[i].id for i in rng.choice(len(images), k, replace=False)} if k else set()
    texts = [it for it in pending if it.modality == "text"]
    k = sample_size(len(texts), st)
    # the captions of the sampled images first (scenes: see fit_bridges.scene_of), then others at random
    linked = [i for i, it in enumerate(texts) if scene_of(it) in picked]
    rest = sorted(set(range(len(texts))) - set(linked))
    take = ([linked[i] for i in rng.permutation(len(linked))] + [rest[i] for i in rng.permutation(len(rest))])[:k]
    first = [it.id for it in images if it.id in picked] + [texts[i].id for i in sorted(take)]
    head = set(first)
    st["next"] = len(first)
    _write(collection, FIT_FILE, st)
    return first + [i for i in ids if i not in head], len(first)


def backfilled_count(collection: Collection, target: str) -> int:
    """The items with a vector in ``target`` (its store read again: exact, and on Milvus a query)."""
    g = collection.gallery(target)
    g.refresh()
    return sum(g.count(m) for m in ("image", "text"))


def _served_count(collection: Collection, target: str) -> int:
    """The items ``target`` serves, from the catalog alone: the gate every commit passes before the
    exact :func:`backfilled_count` (on Milvus each store read is a query, ~0.8 s on a standalone
    server: one per batch less)."""
    return int(sum(collection.served_counts()["served"].get(target, {}).values()))


#: the backfilled pairs at which the merge's score maps are first fitted (then at each doubling, until
#: the first bridge fit, which fits them too)
MERGE_FIRST = 64


def _kept(log: Callable[[str], None] | None) -> tuple[list[str], Callable[[str], None]]:
    """A ``log`` that also keeps what it is told (a fit's lines, recorded with the fit: a server's
    backfill followed over HTTP prints them as a run in process does)."""
    said: list[str] = []

    def say(m: str) -> None:
        said.append(m)
        if log is not None:
            log(m)

    return said, say


def _fit_merge(collection: Collection, n: int, log: Callable[[str], None] | None = None) -> None:
    """Before the first bridge fit: the merge's score maps alone
    (:func:`~.merge_maps.fit_merge_maps`), once per doubling of the pairs, under the fit lock (one
    worker fits; a failure is recorded and never stops the backfill)."""
    with collection.catalog.lock(f"{JOB_DIR}/fit", blocking=False) as taken:
        if not taken:
            return
        st = fit_state(collection)
        if st is None or st["fits"] or n < int(st.get("merge_next") or MERGE_FIRST):
            return  # a bridge fit or another worker came first
        from .merge_maps import fit_merge_maps

        said, say = _kept(log)
        try:
            st["merge_maps"] = {"pairs": n, "agreed": fit_merge_maps(collection, log=say), "said": said}
        except Exception as e:  # the raw merge serves on
            st["error"] = f"score maps: {type(e).__name__}: {e}"
        st["merge_next"] = 2 * n
        _write(collection, FIT_FILE, st)


def first_maps_gap(collection: Collection, limit: int | None = None,
                   log: Callable[[str], None] | None = None) -> int:
    """The items a worker's first batch must hold so that the merge's score maps are fitted as it
    commits (:data:`MERGE_FIRST` backfilled pairs, where the backfill fits them and none are yet):
    a smaller batch, or a ``--limit`` below it, left the spaces merged on raw scores meanwhile (a new
    user measured R@1 0.560 against the old model's 0.623 after 51 items). 0 when nothing is needed."""
    st = fit_state(collection)
    if st is None or st["fits"] or st.get("merge_maps"):
        return 0
    gap = max(0, MERGE_FIRST - _served_count(collection, st["target"]))
    if gap and limit is not None and limit < gap and log is not None:
        log(f"the first batch is {gap} items, past the limit of {limit}: the merge puts the spaces on one scale "
            f"from {MERGE_FIRST} backfilled pairs, and with fewer it would merge them on raw scores")
    return gap


def maybe_fit(collection: Collection, *, final: bool | None = False, pool: Any = None,
              log: Callable[[str], None] | None = None, cfg: Any = None) -> dict[str, Any] | None:
    """Fit if the backfilled pairs reached the next threshold, or ``final`` (None: whether the
    backfill job is done) and pairs came since the last fit; the report, or None. Once the backfill
    is done and fitted on every pair, no threshold is left (``next`` None: status announces none)."""
    st = fit_state(collection)
    if st is not None and st.get("bridges") is False:  # the merge's maps alone, at each doubling
        n = _served_count(collection, st["target"])
        if n >= int(st.get("merge_next") or MERGE_FIRST):
            _fit_merge(collection, n, log)
        return None
    if st is None or st.get("next") is None:
        return None
    if final is None:
        job = BackfillJob.load(collection)
        final = job is not None and job.state == "done"
    n = _served_count(collection, st["target"])
    if final and st["fits"] and st["fits"][-1]["pairs"] >= n:  # done, and the last fit saw every pair
        with collection.catalog.lock(f"{JOB_DIR}/fit", blocking=False) as taken:  # (as an upgrade writes its own)
            st = fit_state(collection, st["target"]) if taken else None
            if st is not None:
                st["next"] = None
                _write(collection, FIT_FILE, st)
        return None
    if n < int(st["next"]) and not (final and (not st["fits"] or st["fits"][-1]["pairs"] < n)):
        if not st["fits"] and n >= int(st.get("merge_next") or MERGE_FIRST):
            _fit_merge(collection, n, log)
        return None
    with collection.catalog.lock(f"{JOB_DIR}/fit", blocking=False) as taken:
        if not taken:
            return None  # another worker fits this threshold
        st = fit_state(collection)
        if st is None:
            return None
        n = backfilled_count(collection, st["target"])
        if n == 0 or (n < int(st["next"]) and not (final and (not st["fits"] or st["fits"][-1]["pairs"] < n))):
            return None  # fitted meanwhile (or no pair to fit on: a job with nothing to backfill)
        from .fit_bridges import fit_collection_bridges

        if cfg is None and (st.get("fit") or st.get("queries")):  # the settings the upgrade recorded
            from ..compat.fitted import FitConfig
            from .fit_bridges import FitBridgesConfig

            cfg = FitBridgesConfig(fit=FitConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                    for k, v in (st.get("fit") or {}).items()}),
                                   queries=tuple(st.get("queries") or ()))
        said, say = _kept(log)  # kept with the fit: a server's backfill followed over HTTP prints them too
        # status names the fit while it runs (seconds to half a minute, when the backfill seems to stall)
        st["fitting"] = {"pairs": n, "owner": new_owner(), "since": _iso(), "at": _now(),
                         **({"place": place} if (place := place_of(collection)) else {})}
        _write(collection, FIT_FILE, st)
        del st["fitting"]
        say(f"fitting bridges on {n} backfilled pairs (the backfill goes on once they are chosen)")
        t0 = time.monotonic()
        try:
            report = fit_collection_bridges(collection, cfg=cfg, pool=pool, log=say)
        except Exception as e:  # a failed fit never stops the backfill: it is recorded, the serving bridge stays
            st["error"] = f"{type(e).__name__}: {e}"
            st["next"] = 2 * max(n, 1)
            _write(collection, FIT_FILE, st)
            say(f"the bridge fit on {n} pairs failed ({st['error']}); the serving route stays")
            return None
        entries = [(f"{s}/{d}", e) for s, ds in report.items() if isinstance(ds, dict) for d, e in ds.items()
                   if isinstance(e, dict)]
        entries += [(f"{s}/any direction", ds) for s, ds in report.items()  # a space skipped whole
                    if isinstance(ds, dict) and isinstance(ds.get("skipped"), str)]
        st["fits"].append({"pairs": n, "swapped": sorted(k for k, e in entries if e.get("swapped")),
                           **({"skipped": {k: e["skipped"] for k, e in entries if e.get("skipped")}}
                              if any(e.get("skipped") for _, e in entries) else {})})
        st["next"] = None if final else 2 * max(n, 1)  # the backfill is done: no pairs will come
        swapped = st["fits"][-1]["swapped"]
        say(f"bridges fitted on {n} pairs in {time.monotonic() - t0:.1f}s: "
            + (f"swapped in for {', '.join(swapped)}" if swapped else "the serving ones kept"))
        st["fits"][-1]["said"] = said
        _write(collection, FIT_FILE, st)
        return report


__all__ = ["DEFAULTS", "FIT_FILE", "FitSampleError", "MAX_QUERIES", "MAX_QUERY_CHARS", "QueriesError",
           "SAMPLE_FIELDS", "backfilled_count", "check_queries", "enable_fit", "first_maps_gap", "fit_settings",
           "fit_state",
           "fit_summary", "maybe_fit", "running_fit", "sample_first", "sample_size"]
