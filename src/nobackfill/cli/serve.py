"""``nobackfill serve``: the HTTP API and the web page over one collection."""

from __future__ import annotations

import math

from pathlib import Path
from typing import Optional

import typer

from ._common import console, fail, user_errors

#: ``serve --onnx`` (nobackfill.search.models.ONNX_MODES, named here so the command fails before loading torch)
ONNX_CHOICES = ("auto", "export", "int8", "off")


def serve(
    collection: str = typer.Argument(..., help="The collection: a directory or a storage URI."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback unless told)."),
    port: int = typer.Option(8000, help="Port (1 to 65535)."),
    keys: Path = typer.Option(..., help="TOML file of API keys: read = [...], admin = [...]."),
    models_root: Path = typer.Option(Path("models"), help="Model directories that POST /v1/upgrade may name "
                                     "('model') lie under it."),
    upgrades_root: Path = typer.Option(Path("upgrades"), help="Upgrade directories (bridges) that POST /v1/upgrade "
                                       "may name ('bridges') lie under it."),
    data_root: Optional[Path] = typer.Option(None, help="Files that requests may name (calibration data, files to "
                                                        "add) lie under it; responses show paths under it relative to it."),
    uploads: Optional[Path] = typer.Option(None, help="Where uploaded images are kept (default: <collection>/uploads; "
                                           "required for a collection in Milvus, which has no folder: a directory every "
                                           "replica reaches)."),
    max_body_mb: float = typer.Option(20.0, help="Largest request body (MB)."),
    max_image_pixels: int = typer.Option(40_000_000, min=1, help="Largest image (pixels), against decompression bombs."),
    max_k: int = typer.Option(1000, min=1, help="Largest k (the in-process client's limit too)."),
    max_batch: int = typer.Option(256, min=1, help="Most items per add request."),
    backfill: Optional[str] = typer.Option(None, help="Start a backfill in the server at once, in this order."),
    ray_address: Optional[str] = typer.Option(None, help="The Ray cluster that POST /v1/backfill/start with engine "
                                              "'ray' embeds on (auto: the one `ray start` runs here); without it "
                                              "such requests are refused (pip install 'nobackfill[ray]')."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
    query_cache: int = typer.Option(4096, min=0, help="Text query embeddings kept in memory (LRU; 0: none); hits in /metrics."),
    query_threads: int = typer.Option(1, help="Threads that embed a batch of queries (torch's, or each ONNX Runtime "
                                              "session's; more pays for a large query model on an idle machine, one is "
                                              "faster for small ones)."),
    onnx: Optional[str] = typer.Option(None, help="Query encoders on ONNX Runtime (pip install 'nobackfill[onnx]'): "
                                       "auto (an exported model runs on it), export (also export a model on first "
                                       "load, into MODEL/onnx/), int8 (the quantised export), off. Default: "
                                       "$NOBACKFILL_ONNX, else auto."),
) -> None:
    """Serve a collection: search, items, status, upgrades and the backfill over HTTP (API under /v1,
    OpenAPI at /docs), Prometheus metrics at /metrics, a web page at /."""
    import uvicorn

    from ..serve import KeyRing, Limits, ServeSettings, create_app

    if query_threads < 1:
        fail(f"--query-threads must be at least 1, got {query_threads}")
    if not 1 <= port <= 65535:
        fail(f"--port must be between 1 and 65535, got {port}")
    if not (max_body_mb > 0 and math.isfinite(max_body_mb)):
        fail(f"--max-body-mb must be a number above 0, got {max_body_mb}")
    try:  # an address that does not resolve: said before "serving ..." (uvicorn exited 3 after it)
        import socket

        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        fail(f"--host {host!r} does not resolve to an address ({e})")
    _check_port_free(host, port)
    if onnx is not None and onnx.strip().lower() not in ONNX_CHOICES:
        fail(f"--onnx must be one of {', '.join(ONNX_CHOICES)}, got {onnx!r}")
    _check_ray_address(ray_address)
    try:
        settings = ServeSettings(collection=collection, keys=KeyRing.load(keys), models_root=models_root,
                                 upgrades_root=upgrades_root, data_root=data_root, uploads=uploads, query_cache=query_cache,
                                 query_threads=query_threads, onnx=onnx, ray_address=ray_address,
                                 limits=Limits(max_body_bytes=int(max_body_mb * 2**20), max_image_pixels=max_image_pixels,
                                               max_k=max_k, max_batch=max_batch))
        app = create_app(settings)
        if backfill:
            app.state.service.client.backfill_start(backfill)
    except user_errors() as e:
        fail(e)
    _check_port_free(host, port)  # again: loading the models took a while
    console.print(f"serving {collection} on http://{host}:{port}/ (API docs: /docs)")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
    _end_without_threads_left(app.state.service.unfinished)


def _check_port_free(host: str, port: int) -> None:
    """Fail (one line, exit 2) where ``host:port`` cannot be bound as uvicorn binds it, before
    anything says "serving" (trial AJ: the line, then uvicorn's own error and exit 3)."""
    import errno
    import socket

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
        sock.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            fail(f"{where} is already in use (another server listens there); choose another --port")
        fail(f"cannot listen on {where}: {e.strerror or e}")
    finally:
        sock.close()


def _end_without_threads_left(unfinished: list[str]) -> None:
    """After the server stopped: with threads still running (:meth:`~nobackfill.serve.Service.close`
    waited for them), the process ends here, exit 0, before the interpreter finalises: native code
    in a thread then can abort it (trial AD: "terminate called without an active exception", 134)."""
    if unfinished:
        import logging
        import os
        import sys

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def export_onnx(
    model: Path = typer.Argument(..., help="A model directory (e.g. models/world-old or a local CLIP), or minilm "
                                           "(the shipped all-MiniLM-L6-v2: exported beside it, in its package)."),
    int8: bool = typer.Option(False, "--int8", help="Also write dynamically quantised int8 towers (used only with "
                                                   "NOBACKFILL_ONNX=int8: they change the vectors slightly)."),
    towers: Optional[str] = typer.Option(None, help="Comma-separated towers to export (default: every tower the "
                                                    "model has: text, image)."),
    graph: str = typer.Option("auto", help="auto: a CLIP text tower written as a fused graph (faster at batch 1; "
                                           "checked like the rest), other towers traced; traced: trace every tower."),
) -> None:
    """Export a model's query encoders to ONNX Runtime (MODEL/onnx/): dynamic batch and sequence axes, each
    tower checked against torch (refused above 1e-4 max abs difference; a refused export leaves the earlier
    one as it was). With --towers, the earlier export's other towers are kept where they were exported from
    the same weights and their files are unchanged. The service, the searcher and the client then run them
    when onnxruntime is installed (pip install 'nobackfill[onnx]'); NOBACKFILL_ONNX=0 keeps torch."""
    from ..encoders import model_directory
    from ..encoders.onnx import export_onnx as export
    from ..encoders.onnx import onnx_export_info

    model = model_directory(model)  # (minilm: the shipped model's directory, named in what is printed)
    before = onnx_export_info(model) or {"towers": {}}
    try:
        with console.status(f"exporting {model} to ONNX"):
            info = export(model, int8=int8, towers=towers.split(",") if towers is not None else None, graph=graph)
    except user_errors() as e:
        fail(e)
    except ImportError as e:
        fail(f"export-onnx needs onnx and onnxruntime ({e}); pip install 'nobackfill[onnx]'")
    except OSError as e:  # a read-only model directory, a full disk: nothing of the export is left
        fail(f"{model}: could not write the export ({e.strerror or e}{f': {e.filename}' if e.filename else ''})")
    earlier = info.get("earlier", {"kept": [], "dropped": {}})
    for tower, entry in info["towers"].items():
        if tower in earlier["kept"]:
            line = f"{tower}: {model / 'onnx' / entry['file']} kept from the earlier export (same weights, unchanged)"
        else:
            line = (f"{tower}: {model / 'onnx' / entry['file']} ({entry.get('graph', 'traced')} graph, max abs diff "
                    f"vs torch {entry['max_abs_diff']:.1e} on the export's check inputs)")
        if "int8" in entry:
            line += (f"; int8: {entry['int8']['file']} (max abs diff {entry['int8']['max_abs_diff']:.1e} on the check "
                     "inputs; real inputs differ more and depend on their batch: docs/serve.md)")
        print(line)
    for what, why in earlier["dropped"].items():
        tower, q = what.removesuffix(" int8"), what.endswith(" int8")
        print(f"note: the earlier {'int8 ' if q else ''}export of {tower} is gone: {why} "
              f"(nobackfill export-onnx {model} --towers {tower}{' --int8' if q else ''} exports it again)")
    dropped = [t for t, e in before["towers"].items() if isinstance(e, dict) and "int8" in e and not int8
               and t in info["towers"] and t not in earlier["kept"]]
    if dropped:
        print(f"note: the earlier int8 export of {', '.join(dropped)} is gone (export with --int8 to keep one)")


def _check_ray_address(address: Optional[str]) -> None:
    """``--ray-address``: its form, before the server starts (trial AC: a malformed one was taken and
    each start answered 503; ``local`` made the first start end the server, exit 1)."""
    if address is None:
        return
    from ..lifecycle.cluster.ray_address import own_ray, ray_address_form_error

    why = ray_address_form_error(address, "--ray-address")
    if why is None and own_ray(address):
        why = ("--ray-address local: a server joins a running Ray cluster: start one (`ray start --head`) and give "
               "auto, or give its HOST:PORT")
    if why:
        fail(why)
