"""``nobackfill index`` and ``search``: single-space galleries (a gallery opens as a one-space collection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from ._common import emit_json, fail, langs_option, report_skipped, results, skip_bad_hint, user_errors, warn_truncated


def _warn_long_captions(enc, read, root: Path) -> None:
    caps = [it for it in read.items if it.modality == "text"]
    warn_truncated(enc, [it.source["text"] for it in caps],
                   [f"{root / 'captions.jsonl'} line {read.lines.get(it.id, '?')}" for it in caps])


def index(
    model: Path = typer.Option(..., help="Model directory that embeds the gallery."),
    data: Path = typer.Option(..., help="A data folder (images and/or captions.jsonl, read as `collection add` "
                                        "reads it: images no caption mentions are indexed too) or a world root."),
    out: Path = typer.Option(..., help="Gallery directory (created, or resumed if it exists)."),
    split: str = typer.Option("test", help="Split to use when --data is a world root."),
    langs: str = langs_option(),
    backend: str = typer.Option("flat", help="Vector index: a faiss factory string (Flat, HNSW32, HNSW32:efSearch=128, IVF1024,PQ16:nprobe=32) or flat | hnsw:M=16,ef=64."),
    skip_bad: bool = typer.Option(False, help="Skip malformed lines and unreadable images (and report how many)."),
    tokens: str = typer.Option("", help="Also store token outputs for CMLI re-ranking: float16 | float32."),
    token_dim: Optional[int] = typer.Option(None, help="With --tokens: PCA-project the tokens to this many dims."),
    wait: bool = typer.Option(False, help="If another process is adding to the gallery, wait for it instead of "
                                          "stopping."),
) -> None:
    """Embed a data folder's images and captions into a model-versioned gallery (resumable). The
    folder is read as `collection add` reads it: images no caption mentions are embedded too, and
    a folder without captions.jsonl is its images."""
    from ..client.upload import read_files
    from ..collection.ingest import index_folder
    from ..data.folder import split_folder
    from ..search.limits import Limits
    from ..encoders import load_encoder
    from ..gallery.build import StoreBusyError

    from ..gallery.gallery import check_buildable, check_gallery_folder, validate_spec
    from ..gallery.tokens import DTYPES

    try:  # every flag first: a refused run leaves no folder behind (trial R: a half-written gallery)
        validate_spec(backend)
        if tokens and tokens not in DTYPES:
            raise ValueError(f"--tokens must be one of {', '.join(DTYPES)}, got {tokens!r}")
        if token_dim is not None and (not tokens or token_dim < 1):
            raise ValueError(f"--token-dim must be >= 1, got {token_dim}" if tokens else
                             "--token-dim is for the token outputs: give --tokens float16 or float32 with it")
        enc = load_encoder(model)
        check_buildable(backend, enc.embed_dim)  # (hnsw:M=0, a faiss string faiss does not take) before the data
        check_gallery_folder(out, enc.space_id)  # before the data is read, and no lock left in a folder refused
        root = split_folder(data, split)
        _, read = read_files(data, split, None, [x for x in langs.split(",") if x] or None, skip_bad,
                             Limits().max_caption_chars)  # the folder as `collection add` reads it (trial AJ)
        g = index_folder(enc, read, out, model_ref=str(model), backend=backend, wait=wait,
                         before_embed=lambda r: _warn_long_captions(enc, r, root))
        texts = [(it.id, it.source["text"]) for it in read.items if it.modality == "text"]
        if tokens:
            from ..late.rerank import store_gallery_tokens

            store_gallery_tokens(enc, out, images=[(it.id, it.source["path"]) for it in read.items
                                                   if it.modality == "image"], texts=texts, dtype=tokens,
                                 dim=token_dim)
    except (ValueError, FileNotFoundError, StoreBusyError) as e:
        fail(skip_bad_hint(e))
    report_skipped(read.skipped, read.skipped_images, read.problems, root=root)
    results.print(f"gallery {out}: {g.count('image')} images, {g.count('text')} texts, space {g.space_id}"
                  + (f" ({read.uncaptioned} images without captions)" if read.uncaptioned else ""))


def search(
    gallery: Path = typer.Option(..., help="Gallery directory."),
    model: Path = typer.Option(..., help="Model that embeds the query."),
    text: Optional[str] = typer.Option(None, help="Text query (searches the gallery's images)."),
    image: Optional[Path] = typer.Option(None, help="Image query (searches the gallery's captions)."),
    k: int = typer.Option(10, "--k", "-k", help="Number of results."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    bridge: Optional[List[Path]] = typer.Option(None, "--bridge", help="Upgrade directory taking the model's "
                                                "queries into the gallery's space (XBT, phi, Procrustes); repeat "
                                                "to chain bridges."),
    reco: Optional[Path] = typer.Option(None, "--reco", help="RECO directory: refine the query with its memory "
                                        "(the gallery is searched as stored)."),
    rerank: str = typer.Option("", help="Re-score the first-stage top --rerank-k: cmli | cmli-sym (needs index "
                                        "--tokens)."),
    rerank_k: int = typer.Option(100, help="First-stage candidates to re-rank."),
    rerank_weight: float = typer.Option(1.0, help="Re-rank score = global + weight * CMLI (inf: CMLI only)."),
) -> None:
    """Search a gallery with a text or an image query (from another model through --bridge). A
    collection directory works too (all its spaces, each reached natively or through --bridge)."""
    from ..collection.collection import Collection
    from ..search import Searcher

    if (text is None) == (image is None):
        fail("give exactly one of --text or --image")
    try:
        s = Searcher(Collection.open(gallery), query_model=model, bridges=bridge or [], reco=reco, rerank=rerank,
                     rerank_k=rerank_k, rerank_weight=rerank_weight)
        r = s.search(text=text, image=image, k=k)
    except user_errors() as e:
        fail(e)
    print_hits(r, as_json, k)


def _shown_path(path: Any) -> str:
    """An item's path as the table shows it: relative to the working directory when under it."""
    if not path:
        return ""
    try:
        return Path(str(path)).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


#: the most of a caption a result table shows (``--json`` and ``collection get`` give it whole)
SHOWN_TEXT = 300


def _shortened(text: str) -> str:
    """``text`` as a table cell: at most :data:`SHOWN_TEXT` characters (trial J: a 20,000-character
    caption filled 1,700 rows of the table)."""
    return text if len(text) <= SHOWN_TEXT else text[:SHOWN_TEXT - 1] + "…"


def applied_line(r, names: dict[str, str] | None = None) -> str:
    """What refined or re-ranked the hits of ``r`` beyond their routes, as a line under the table's
    title (empty when nothing did): ``+reco(DIR)``, ``+rerank(cmli, top K, weight W)``, as ``eval
    retrieval`` labels its rows, naming the spaces when a step served only some of the hits' spaces."""
    steps = getattr(r, "applied", ()) or ()
    shown = {h.space for h in r.hits}
    parts = []
    for a in steps:
        spaces = set(a.get("spaces") or ())
        only = "" if shown <= spaces else " in space " + ", ".join((names or {}).get(s) or s for s in sorted(spaces))
        parts.append(f"+{a['label']}{only}")
    return "\napplied: " + "; ".join(parts) if parts else ""


def print_hits(r, as_json: bool, k: int, space_names: dict[str, str] | None = None) -> None:
    """The hits of a :class:`~nobackfill.search.SearchResponse` as JSON (``--json``) or a table
    (``space_names``: a space id -> its name, shown in the table where the names tell spaces apart)."""
    if as_json:
        emit_json(r.to_json(), True)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if not r.hits:  # (an empty table titled "top 10 images for ..." read as a display fault: trial AJ)
        Console().print(Text(f"no {r.modality}s for {r.query}: nothing the search may return matched"))
        return
    names = space_names or {}
    if len(set(names.values())) < len(names) or not all(names.values()):
        names = {}  # two spaces of one name (or a nameless one): their ids
    rows = [(str(h.rank), f"{h.score:.3f}", h.id, names.get(h.space) or h.space[:24], h.route,
             _shown_path(h.metadata.get("path")) or _shortened(str(h.metadata.get("text", "")))) for h in r.hits]
    # cells are text, not rich markup (a caption or an id may hold "[...]"); ids are printed whole at
    # any width, since `collection delete --id` takes them: rank, score and id never shrink, the other
    # columns give way (down to 3 characters), and a terminal narrower than that gets a wider table
    # (its lines wrap) rather than a cut id
    fixed = [max([len(name)] + [len(row[i]) for row in rows]) for i, name in enumerate(("rank", "score", "id"))]
    needed = sum(w + 2 for w in fixed) + 3 * (3 + 2) + 7  # + padding, 3 narrow columns, 7 borders
    spaces = {h.space for h in r.hits}
    # scores of two spaces are not on one scale: the merge ranked them (trial I read 0.893, 0.839, 0.812,
    # 0.86 down the column as a bug)
    caption = Text(f"score: each hit's own, in its space; the order of hits from {len(spaces)} spaces is the "
                   "merge's") if len(spaces) > 1 else None
    title = f"top {k} {r.modality}{'s' if k != 1 else ''} for {r.query}" + applied_line(r, names)
    t = Table(title=Text(title), caption=caption)
    for col, w in zip(("rank", "score", "id"), fixed):
        t.add_column(col, no_wrap=True, min_width=w)
    for col in ("space", "route"):
        t.add_column(col, min_width=3)
    t.add_column("item", min_width=3, overflow="fold")  # a path wraps rather than losing its file name
    for row in rows:
        t.add_row(*(Text(cell) for cell in row))
    console = Console()
    if console.width < needed:
        console = Console(width=needed)
    console.print(t)
