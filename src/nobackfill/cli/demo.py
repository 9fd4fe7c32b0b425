"""``nobackfill demo``: the main job."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._common import console, fail, write_json


def demo(
    world: Path = typer.Option(Path("data/world"), help="World folder (generated if absent)."),
    models: Path = typer.Option(Path("models"), help="Folder with the shipped checkpoints."),
    out: Path = typer.Option(Path("runs/demo"), help="Output folder (gallery, report.html)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the table as JSON here."),
    limit: Optional[int] = typer.Option(None, help="Only the first N test images (a quick look)."),
) -> None:
    """The main job: old gallery, new model, and how they compare (report.html + JSON)."""
    from ..demo import run_demo

    try:
        result = run_demo(world, models, out, log=lambda m: console.print(m), limit=limit)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    write_json(json_out, result)
