"""``nobackfill demo``: the main job."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._common import console, emit_json, fail, from_project, json_flag, results, write_json


def demo(
    world: Path = typer.Option(Path("data/world"), help="World folder (generated if absent)."),
    models: Path = typer.Option(Path("models"), callback=from_project, help="Folder with the shipped checkpoints."),
    out: Path = typer.Option(Path("runs/demo"), help="Output folder: report.html, report.json, the galleries. (A "
                                                    "path ending in .json, the old spelling, names report.json.)"),
    limit: Optional[int] = typer.Option(None, help="Only the first N test images (a quick look)."),
    as_json: bool = json_flag(),
    json_file: Optional[Path] = typer.Option(None, "--json-file", hidden=True, help="Also write the JSON here "
                                                                                   "(the old `--json FILE`)."),
) -> None:
    """The main job: old gallery, new model, and how they compare (report.html + report.json)."""
    from ..demo import run_demo

    json_path = out if out.suffix == ".json" else out / "report.json"
    folder = out.parent if out.suffix == ".json" else out
    try:
        result = run_demo(world, models, folder, log=lambda m: console.print(m), limit=limit,
                          show=None if as_json else lambda m: results.print(m))
    except (ValueError, FileNotFoundError) as e:
        fail(e)
    write_json(json_path, result)
    if json_file is not None:
        write_json(json_file, result)
    emit_json(result, as_json)
