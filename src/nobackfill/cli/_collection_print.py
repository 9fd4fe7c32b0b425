"""What ``nobackfill collection`` commands print: the results of :class:`nobackfill.Client` calls
(routes, spaces, the backfill, an import) as lines for a person; ``--json`` prints them as they are."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator, List, Optional, Sequence

import typer
from rich.markup import escape

from .._interrupts import terminated
from ._common import console, fail, redact, results


def print_import(client: Any, source: str, rep: Any) -> None:
    """What an import (a dict for Milvus in place) did, and the collection after it."""
    adopted = isinstance(rep, dict)
    for w in ([] if adopted else rep.warnings):
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", markup=True)
    mc = rep["model_check"] if adopted else rep.model_check
    results.print("model check: skipped (--trust-model)" if mc.get("skipped") else f"model check: {mc['message']}")
    if adopted:
        results.print(f"adopted {source} in place: {rep['items']} item(s), added {rep['added']}, already "
              f"there {rep['unchanged']}; its vectors were not copied and nobackfill never writes to it")
    else:
        found = rep.added - rep.stored if rep.stored is not None else 0
        results.print(f"{rep.items} item(s) read from {rep.source}: added {rep.added}"
              + (f" (of them {rep.replaced} replacing other content under their ids)" if rep.replaced else "")
              + f", already there {rep.unchanged} in {rep.seconds:.1f}s ({rep.items_per_s:,.0f} items/s)"
              + (f"; {found} of the added with their vectors stored already (new metadata or source, an "
                 "interrupted import's, a deleted item's: not stored again)" if found > 0 else ""))
    local = getattr(client, "collection", None)  # a server builds its own graph indexes
    st = local.status() if local is not None else client.status()  # (the counts only: no backfill status)
    results.print(f"collection {st['path']}: {st['items']['image']} images, {st['items']['text']} texts"
          + (f"; {st['unsourced']} without a source (cannot be backfilled)" if st.get("unsourced") else ""))
    named = redact(str(getattr(client, "target", None) or st["path"]))  # as given (trial AH: a URI's bare folder)
    for m in (local.missing_graph_indexes() if local is not None else []):
        console.print(f"searchable now (exact search of the {m['count']:,} {m['modality']} vectors of space "
                      f"{m['space']}); their {m['graph']} index is built by `nobackfill collection index "
                      f"{named}`, or in the background by `nobackfill serve`")


def print_indexes(rep: dict) -> None:
    """What ``collection index`` built (or, in a server, started)."""
    if not rep["indexes"]:
        results.print("nothing to build: every space that needs a graph index has it (small ones are searched "
                      "exactly, with none)")
    for m in rep["indexes"]:
        state = "building in the server" if m.get("building") else f"{m.get('in_use')} in use"
        results.print(f"space {m['space']}: {m['count']:,} {m['modality']} vectors, {m['graph']} index: {state}")


@contextlib.contextmanager
def interrupt_report(client: Any, name: str, kind: str = "add") -> Iterator[None]:
    """Ctrl-C during an import or add (``kind``), a backfill or an upgrade: say what the collection
    holds now (every batch committed before the interruption stays; an upgrade registers at once or
    not at all) and whether the same command goes on with the work, then exit 130 (143 after a SIGTERM)."""
    try:
        yield
    except KeyboardInterrupt as e:
        by_sigterm = terminated(e)
        try:
            st = client.status()
            now, bf = st["items"], st.get("backfill") or {}
            if kind == "upgrade":
                what = (f"the current model of {name} is {st['spaces'][st['current']]['name']} (an upgrade is "
                        "registered all at once or not at all)")
            elif kind == "backfill":
                what = (f"the current space of {name} serves {bf.get('done', 0)} of {bf.get('total', 0)} items now "
                        "(every batch committed before the interruption stays)")
            else:
                what = (f"{name} holds {now.get('image', 0)} images and {now.get('text', 0)} texts now (every batch "
                        "committed before the interruption stays)")
        except Exception:  # noqa: BLE001 - the note must not hide the interruption
            what = "what was committed before the interruption stays in the collection"
        remote = type(client).__name__ == "RemoteClient"
        if kind == "backfill":  # a server's worker is the server's: this command only followed it
            rerun = (f"; the server's backfill goes on (`nobackfill collection backfill {name} --pause` stops it)."
                     if remote else ". Run the same command again to go on from there.")
        else:
            rerun = ("; the server finishes the request it was sent" if remote else "") + (
                ". Run the same command again to finish: items already there are skipped, nothing is embedded or "
                "imported twice." if kind == "add" else ".")
        console.print(f"[yellow]interrupted{' (SIGTERM)' if by_sigterm else ''}:[/yellow] {escape(what)}" + escape(rerun),
                      markup=True)
        raise typer.Exit(code=143 if by_sigterm else 130) from None


def print_routes(routes: dict, spaces: dict | None = None) -> None:
    """The route table (per older space and direction) a client call returned; given ``spaces``
    (status's), only the directions into a modality the space holds items of (trial AK: an upgrade
    of images alone listed the routes of text queries into its captions, i2t and t2t)."""
    for sid, dirs in routes.items():
        held = {m for m in ("image", "text") if (spaces.get(sid) or {}).get(m)} if spaces is not None else None
        none = [d for d in dirs if held is not None and ("image" if d.endswith("i") else "text") not in held]
        if none:
            what = {frozenset(): "items", frozenset({"image"}): "texts", frozenset({"text"}): "images"}[frozenset(held)]
            results.print(f"  space {sid} holds no {what}: {', '.join(none)} not shown (they would answer nothing)")
            dirs = {d: r for d, r in dirs.items() if d not in none}
        for d, r in dirs.items():
            cal = r["calibration"]
            nums = ", ".join(f"{k} R@1 {v['R@1']:.3f}" + (f" (w={v['w']})" if "w" in v else "")
                             for k, v in cal.items() if isinstance(v, dict) and "R@1" in v)
            given = isinstance(cal.get("fitted"), dict) and cal["fitted"].get("given")
            how = ("pinned" if r["pinned"] else "chosen without labels, with the bridge given" if given
                   else "chosen without labels, with the fitted bridge" if "fitted" in cal
                   else "calibrated" if r["calibrated"] else "default, uncalibrated")
            results.print(f"  space {sid} {d}: {r['route']}" + (f" w={r['w']}" if r["w"] is not None else "")
                             + f" ({how})" + (f"  {nums}" if nums else ""))


def print_fitted(fitted: dict | None, spaces: dict | None = None) -> None:
    """The bridges fitted from the backfill in service: family, pairs, held-out score, when. A
    direction the last fit skipped is named only for a space of ``spaces`` (status's) that still
    serves items (trial AI D2: status asked for `--queries` for a space holding none)."""
    if fitted and fitted.get("maps_only") and not fitted.get("serving"):
        results.print("  bridge fits: off (upgraded with --no-fit-bridge): the old spaces serve through the old model, "
                      "merged with the moved items by score maps fitted from the backfilled pairs")
    if not fitted or not (fitted.get("enabled") or fitted.get("serving")):
        return
    for b in fitted.get("serving", []):
        on = f" over {b['heldout_queries']} held-out queries" if b.get("heldout_queries") else ""
        results.print(f"  fitted bridge {b['direction']} -> space {b['space']}: {b['family']} "
                             f"({b['candidate']}) on {b['pairs']} pairs, held-out agreement {b['heldout']:.3f}{on}, "
                             f"v{b['version']}, {b['fitted_at']}")
    if not fitted.get("enabled") and not fitted.get("fits"):
        return
    nxt = fitted.get("next")
    done = ", ".join(str(f["pairs"]) for f in fitted.get("fits", []))
    then = ("; next at the end of the backfill" if fitted.get("next_at_end") else f"; next at {nxt} backfilled pairs")
    results.print("  bridge fits" + (f" at {done} pairs" if done else ": none yet")
                         + (then if nxt and fitted.get("enabled") else "")
                         + (f"; last error: {fitted['error']}" if fitted.get("error") else ""))
    if fitted.get("overdue"):
        results.print(f"  the fit due at {nxt} pairs has not run (the worker that was to fit it stopped): "
                             "the next backfill commit fits")
    if fitted.get("fitting"):
        f = fitted["fitting"]
        host, pid = (str(f.get("owner", "")).split(":") + ["?", "?"])[:2]
        results.print(f"  bridge fit running: on {f['pairs']} pairs since {f['since']} (pid {pid} on {host}); "
                             "the serving bridges stay until it swaps a better one in")
    last = (fitted.get("fits") or [{}])[-1]
    empty = {sid for sid, sp in (spaces or {}).items() if not sp.get("image", 0) and not sp.get("text", 0)}
    for key, why in sorted((last.get("skipped") or {}).items()):
        if key.split("/")[0] in empty:
            continue
        results.print(f"  no fitted bridge for {key.split('/')[-1]} -> space {key.split('/')[0]}: {why}")


def parse_fit_sample(text: Optional[str]) -> dict | None:
    """``--fit-sample FRACTION[,MIN[,MAX]]`` as ``{"fraction", "min_pairs", "max_pairs"}``."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        if not 1 <= len(parts) <= 3:
            raise ValueError
        out: dict = {"fraction": float(parts[0])}
        for key, value in zip(("min_pairs", "max_pairs"), parts[1:]):
            out[key] = int(value)
    except ValueError:
        raise ValueError(f"--fit-sample: FRACTION[,MIN[,MAX]], e.g. 0.02,256,5000; got {text!r}") from None
    return out


def parse_filter(items: Optional[List[str]]) -> dict:
    out: dict = {}
    for it in items or []:
        key, eq, value = it.partition("=")
        if not eq or not key:
            raise ValueError(f"--filter must look like key=value (got {it!r})")
        if key in out:  # (the last one won: two values of one key, ANDed, match nothing)
            raise ValueError(f"--filter {key} is given twice; for any of several values give them as a JSON list: "
                             f"--filter '{key}=[\"a\", \"b\"]'")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def index_line(info: dict, served: dict | None = None) -> str:
    """``auto: HNSW32 over 1200000 stored image vectors, Flat over 3000 stored text vectors (graph
    index building)``; where the space serves fewer items (``served``: per modality) than it stores
    vectors, how many are not searched (trial J read 49 images beside "Flat for 50 images")."""
    parts = []
    for m, i in info.items():
        if i.get("adopted"):  # a user's Milvus collection searched in place (trial AL: KeyError 'count')
            ps = ", ".join(f"{k} {v}" for k, v in (i.get("search_params") or {}).items())
            parts.append(f"the Milvus collection {i['adopted']!r} adopted in place ({m} vectors; its own index "
                         f"{i.get('in_use') or '?'}, {i.get('metric') or '?'}" + (f", {ps}" if ps else "") + ")")
            continue
        idle = int(i["count"]) - int((served or {}).get(m, i["count"]))
        parts.append((f"{i['in_use']} over " if i.get("in_use") else "") + f"{i['count']} stored {m} vectors"
                     + ("" if i.get("in_use") else " (their index is loaded at the first search)")
                     + (f" ({idle} of them of items deleted, replaced or served by another space: never returned)"
                        if idle > 0 else "")
                     + (" (graph index building; searches exact meanwhile)" if i.get("building") else "")
                     + (f" (searched exactly until they can train it: {i['waiting']})" if i.get("waiting") else ""))
    backend = next((i["backend"] for i in info.values() if i.get("backend")), None)
    return (f"{backend}: " if backend else "") + ", ".join(parts)


def retired_words(space: dict) -> str:
    """What retiring ``space`` (its status entry) did to its vectors: dropped, or for a Milvus
    collection adopted in place, its registration forgotten (the user's collection is kept as it
    was: trial AH read "its vectors were dropped" there)."""
    if any(imp.get("in_place") for imp in space.get("imports") or []):
        return "its registration was forgotten; the adopted Milvus collection is kept as it was"
    return "its vectors were dropped"


def print_spaces(spaces: dict) -> None:
    for sid, s in spaces.items():
        results.print(f"  {'*' if s['current'] else ' '} {s['name']:<16} {sid}  images {s.get('image', 0)}, texts "
                  f"{s.get('text', 0)}  ({s['model']})"
                  + (f"  (retired: {retired_words(s)}; no longer searched)" if s.get("retired") else ""))
        for imp in s.get("imports", []):
            mc = imp.get("model_check") or {}
            how = "model check skipped (--trust-model)" if mc.get("skipped") else \
                f"model check median cosine {mc.get('median_cosine', 0):.4f} over {mc.get('n')} items"
            changed = imp.get("added", imp.get("items"))
            read = f"{imp.get('items')} item(s)" + \
                (f" read, {changed} of them new or changed," if changed != imp.get("items") else "")
            results.print(f"      imported {read} from {imp.get('from')} at {imp.get('at')}; " + how)
        if s.get("index"):
            results.print("      index: " + index_line(s["index"], {"image": s.get("image", 0), "text": s.get("text", 0)}))


def print_backfill(bf: dict) -> None:
    per = ", ".join(f"{m} {v['done']}/{v['total']}" for m, v in bf["per_modality"].items())
    eta = f", ETA {bf['eta_s']:.0f}s at {bf['rate']:.1f} items/s" if bf.get("eta_s") else ""
    results.print(f"  backfill into the current space: {bf['done']}/{bf['total']} ({100 * bf['fraction']:.1f}%; {per})"
              + (f" [{bf['state']}{', order ' + bf['order'] if bf.get('order') else ''}{eta}]"))
    if bf.get("no_source"):
        results.print(f"    no source: cannot be backfilled: {bf['no_source']} item(s) (imported without one; "
                  "searched in their space until it is retired)")
    for w in bf.get("holders", []):
        ray = f"ray, {w['actors']} actors, " if w.get("engine") == "ray" else ""
        results.print(f"    worker: pid {w['pid']} on {w['host']} ({ray}shard {w['shard']}, since {w['since']}, "
                      f"{w.get('rate', 0.0):.1f} items/s)")
    if bf.get("note"):
        results.print(f"    [yellow]{escape(bf['note'])}[/yellow]", markup=True)


def print_backfill_run(name: str, st: dict, limit: Optional[int]) -> None:
    head = f"backfill of {name}: {st['done']}/{st['total']} items in the current space ({100 * st['fraction']:.1f}%)"
    sample = (f" ({st['sample_committed']} of them the training sample of the uncertainty order)"
              if st.get("sample_committed") else "")
    # of the items it committed (trial I: "128 committed in 6.5s, 29.8 items/s" counted the batches
    # a pause left embedded but not committed)
    rate = f", {st['committed'] / st['seconds']:.1f} items/s" if st.get("seconds") and st.get("committed") else ""
    engine = " on ray" if st.get("engine") == "ray" else ""
    done = f"{st['committed']} committed{sample} in {st['seconds']:.1f}s{engine}{rate}"
    if st.get("busy"):  # every unfinished shard is leased: say who works, not a silent "0 committed"
        who = "; ".join(f"pid {w['pid']} on {w['host']} (shard {w['shard']}, since {w['since']})" for w in st["busy"])
        n = st.get("shards") or len(st["busy"])
        if st["committed"]:  # it did its share (trial AI D4: read as a refusal, with advice already followed)
            results.print(f"{head}; this process's share is done ({done}); the rest is another process's: {who}. "
                          "Follow it with `nobackfill collection status`.")
            return
        results.print(f"{head}; another process is doing the work: {who}; each of the job's {n} shard(s) is taken, "
                      "so none was left for this one. Follow it with `nobackfill collection status`. (A job's "
                      "shards are set by the run that started it, --shards, default its --workers: to share one "
                      "among M machines, start it with --shards M.)")
        return
    if not st.get("committed") and st["done"] >= st["total"] and st.get("state") == "done":
        # nothing was left to do (trial V / X: "0/0 items (100.0%)", "3000/3000 ... 0 committed")
        if st.get("no_source"):
            why = (f"{st['no_source']} item(s) of older spaces have no source (imported without one) and cannot be "
                   "backfilled: `collection retire --drop-unsourced` deletes them with their space")
        elif not st["total"]:
            why = "it holds no item"
        else:
            why = f"its current space serves every item already ({st['total']})"
        results.print(f"backfill of {name}: nothing to backfill; {why}")
        return
    stopped = {"limit": f"stopped at --limit {limit}; run again to go on"}.get(st.get("stopped"), st.get("stopped"))
    results.print(f"{head}; {done}" + (f" ({stopped})" if stopped else ""))
    if st.get("unreadable") and st.get("note"):  # sources gone or corrupt: named, the rest went on
        results.print(f"  [yellow]{escape(st['note'])}[/yellow]", markup=True)


def print_upgrade(name: str, rep: Any, st: dict[str, Any], seconds: float, *, calibrated: bool, bridged: bool) -> None:
    """What `collection upgrade` did: the current model, the routes, the bridges' fits to come, the merge."""
    results.print(f"collection {name}: current model is now {st['spaces'][rep.current]['name']} (space {rep.current}) "
                  f"after {seconds:.1f}s; nothing was re-embedded")
    print_routes(rep.routes, st.get("spaces"))
    fits = (st.get("fitted_bridges") or {}) if not calibrated else {}
    if fits.get("enabled") and fits.get("next") is not None:
        n, total = fits["next"], max(int(fits.get("items") or 0), 1)
        results.print(f"  bridges are fitted from the backfill's own pairs: the first fit after its sample of {n} "
                      f"of {total} items ({100 * n / total:.0f}%), then at each doubling (--fit-sample "
                      "FRACTION,MIN,MAX sets the sample); until then "
                      + ("the bridge given serves (the fit tests its route too)" if bridged else
                         "the old-model route serves"))
        if n >= total / 2:  # (trial AI D3: on a small collection the fit came when no query could use it)
            results.print(f"  on a collection this small that is when {100 * n / total:.0f}% of the items are in the "
                          "new space already, where a bridge serves only the rest: --fit-sample 0.05,64 fits the "
                          "first one after 64 items of each modality")
    if calibrated:
        results.print(f"  merge: {rep.merge} (chosen on the calibration split)")
    elif fits.get("maps_only"):  # (trial AI: --no-fit-bridge had left the merge raw)
        results.print("  no bridge is fitted (--no-fit-bridge): the old-model route serves, and the merge's score maps "
                      "are fitted without labels from the backfill's first backfilled items, then at each doubling "
                      "(--calibrate DATA chooses routes and merge on labelled data instead)")
    elif fits.get("enabled"):  # (trial AG: "pass --calibrate" read as a step the no-bridge upgrade needs)
        results.print("  routes and merge are chosen without labels as the backfill goes: the merge's score maps "
                      "from its first backfilled items, the routes with each bridge fit (--calibrate DATA chooses "
                      "them on labelled data instead)")
    else:
        kept = " (the merge keeps the score maps fitted without labels that still hold: spaces each reached by " \
               "its own model)" if st.get("merge_without_labels") else ""
        results.print("  routes and merge are uncalibrated defaults (bridge where one exists; "
                      + ("calibrated merge" if kept else "raw merge") + "): pass --calibrate DATA to choose them on "
                      "labelled data" + (", or --fit-bridge to test the bridge's route on the backfill's own pairs"
                                         if bridged and not fits.get("enabled") else "") + kept)


def upgraded_already(name: str, model: Any, e: BaseException, given: Sequence[str] = ()) -> bool:
    """True (said) when an upgrade was refused because ``model`` is the current model already: a rerun
    after an upgrade that a kill let commit, nothing to do (trial T: exit 2 broke retry scripts). With
    options that only an upgrade to another model uses (``given``: their flags) it is refused, naming
    them: they were not applied, and "nothing to do" would say they were."""
    if "is already the current model" not in str(e):
        return False
    if given:
        fail(f"{name}: {model} is its current model already, so {', '.join(given)} changed nothing (they apply to "
             "an upgrade to another model; `collection calibrate` chooses routes on labelled data)")
    results.print(f"{name}: {model} is its current model already: nothing to do (routes stay as they are: "
                  "`collection route` and `collection calibrate` change them)")
    return True
