"""``nobackfill serve``: the HTTP API and the web page over one collection."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._common import console, fail, user_errors


def serve(
    collection: str = typer.Argument(..., help="The collection: a directory or a storage URI."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback unless told)."),
    port: int = typer.Option(8000, help="Port."),
    keys: Path = typer.Option(..., help="TOML file of API keys: read = [...], admin = [...]."),
    models_root: Path = typer.Option(Path("models"), help="Model directories that POST /v1/upgrade may name "
                                     "('model') lie under it."),
    upgrades_root: Path = typer.Option(Path("upgrades"), help="Upgrade directories (bridges) that POST /v1/upgrade "
                                       "may name ('bridges') lie under it."),
    data_root: Optional[Path] = typer.Option(None, help="Calibration data that upgrade requests may name lies under it."),
    uploads: Optional[Path] = typer.Option(None, help="Where uploaded images are kept (default: <collection>/uploads; "
                                           "required for a collection in Milvus, which has no folder: a directory every "
                                           "replica reaches)."),
    max_body_mb: float = typer.Option(20.0, help="Largest request body (MB)."),
    max_image_pixels: int = typer.Option(40_000_000, help="Largest image (pixels), against decompression bombs."),
    max_k: int = typer.Option(200, help="Largest k."),
    max_batch: int = typer.Option(256, help="Most items per add request."),
    backfill: Optional[str] = typer.Option(None, help="Start a backfill in the server at once, in this order."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Serve a collection: search, items, status, upgrades and the backfill over HTTP (API under /v1,
    OpenAPI at /docs), Prometheus metrics at /metrics, a web page at /."""
    import uvicorn

    from ..serve import KeyRing, Limits, ServeSettings, create_app

    try:
        settings = ServeSettings(collection=collection, keys=KeyRing.load(keys), models_root=models_root,
                                 upgrades_root=upgrades_root, data_root=data_root, uploads=uploads,
                                 limits=Limits(max_body_bytes=int(max_body_mb * 2**20), max_image_pixels=max_image_pixels,
                                               max_k=max_k, max_batch=max_batch))
        app = create_app(settings)
        if backfill:
            app.state.service.client.backfill_start(backfill)
    except user_errors() as e:
        fail(str(e))
    console.print(f"serving {collection} on http://{host}:{port}/ (API docs: /docs)")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
