"""``nobackfill verify``: check a gallery, collection, upgrade or model directory; ``--repair``."""

from __future__ import annotations

import json
import os
from typing import Any, List

import typer

from ._common import emit_json, fail, results, user_errors


def _verify(path: str, repair: bool, model_check: bool) -> Any:
    """The report of a path, or of the collection a server at an http(s):// URL serves (read only)."""
    from ..lifecycle.verify import PathReport, verify_path

    if not path.startswith(("http://", "https://")):
        return verify_path(path, repair=repair, model_check=model_check)
    from ..client import Client

    with Client(path, api_key=os.environ.get("NOBACKFILL_API_KEY")) as client:
        rep = client.verify(repair=repair, model_check=model_check)
    return PathReport(path=path, **{k: rep[k] for k in ("kind", "problems", "derived", "advice", "model_check")
                                    if k in rep})


def verify(
    paths: List[str] = typer.Argument(..., help="Gallery, collection (directory, storage URI, or the http(s):// URL "
                                                "of a running `nobackfill serve`, key in NOBACKFILL_API_KEY, read "
                                                "only), upgrade or model directories."),
    repair: bool = typer.Option(False, help="Rebuild derived files (cached indexes) and take damaged chunks out of "
                                            "service, listing the items to add again."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON report per path instead of text."),
    model_check: bool = typer.Option(False, help="Collections: re-embed a sample of each space's items with its "
                                                 "model and compare with the stored vectors."),
) -> None:
    """Check what is stored against its hashes and formats; exit 1 when a problem remains."""
    reports = []
    for p in paths:
        try:
            reports.append(_verify(p, repair, model_check))
        except user_errors() as e:
            fail(e)
    if json_out:
        emit_json([r.to_dict() for r in reports] if len(reports) > 1 else reports[0].to_dict(), True)
    else:
        for r in reports:
            head = "OK" if r.ok else f"{len(r.problems)} problem(s)"
            results.print(f"{r.kind} {r.path}: {head}", markup=False)
            for line in r.problems:
                results.print(f"  problem: {line}", markup=False)
            for line in r.derived:
                results.print(f"  derived: {line}", markup=False)
            for sid, v in r.model_check.items():
                results.print(f"  model check of space {sid}: {v['message']}", markup=False)
            if r.repaired:
                results.print(f"  repaired: {json.dumps(r.repaired)[:2000]}", markup=False)
            for line in r.advice:
                results.print(f"  next: {line}", markup=False)
    if not all(r.ok for r in reports):
        raise typer.Exit(code=1)
