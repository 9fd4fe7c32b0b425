"""``nobackfill verify``: check a gallery, collection, upgrade or model directory; ``--repair``."""

from __future__ import annotations

import json
from typing import List

import typer

from ._common import console, fail, user_errors


def verify(
    paths: List[str] = typer.Argument(..., help="Gallery, collection (directory or URI), upgrade or model "
                                                "directories."),
    repair: bool = typer.Option(False, help="Rebuild derived files (cached indexes) and take damaged chunks out of "
                                            "service, listing the items to add again."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON report per path instead of text."),
    model_check: bool = typer.Option(False, help="Collections: re-embed a sample of each space's items with its "
                                                 "model and compare with the stored vectors."),
) -> None:
    """Check what is stored against its hashes and formats; exit 1 when a problem remains."""
    from ..lifecycle.verify import verify_path

    reports = []
    for p in paths:
        try:
            reports.append(verify_path(p, repair=repair, model_check=model_check))
        except user_errors() as e:
            fail(str(e))
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in reports] if len(reports) > 1 else reports[0].to_dict(), indent=2))
    else:
        for r in reports:
            head = "OK" if r.ok else f"{len(r.problems)} problem(s)"
            console.print(f"{r.kind} {r.path}: {head}", markup=False)
            for line in r.problems:
                console.print(f"  problem: {line}", markup=False)
            for line in r.derived:
                console.print(f"  derived: {line}", markup=False)
            for sid, v in r.model_check.items():
                console.print(f"  model check of space {sid}: {v['message']}", markup=False)
            if r.repaired:
                console.print(f"  repaired: {json.dumps(r.repaired)[:2000]}", markup=False)
            for line in r.advice:
                console.print(f"  next: {line}", markup=False)
    if not all(r.ok for r in reports):
        raise typer.Exit(code=1)
