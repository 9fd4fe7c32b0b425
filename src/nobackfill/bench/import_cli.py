"""The end-to-end rows of ``bench import`` (:mod:`nobackfill.bench.importing`, issue 40): the
``collection import`` command itself (a fresh process, the model loaded, until it returns: the
collection is searchable then, exactly while its graph index is missing) and, apart, the
``collection index`` command that builds that graph index later, each with its wall time and peak
RSS (measured by ``/usr/bin/time -v`` when the machine has it, else by ``os.wait4``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the largest resident set ``/usr/bin/time -v`` reports (kB: the command or its largest child)
_MAX_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")


def timed_command(args: list[str], *, timeout: float = 3600) -> dict[str, Any]:
    """Run ``python -m nobackfill.cli ARGS`` (this nobackfill's sources) in a fresh process: its
    wall seconds (until it returns), its peak RSS in MB (the largest of it and its children: the
    catalog's commit worker) and what it printed; an error naming the output when it fails."""
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "nobackfill.cli", *args]
    timer = Path("/usr/bin/time")
    t0 = time.perf_counter()
    if timer.exists():
        r = subprocess.run([str(timer), "-v", *cmd], capture_output=True, text=True, timeout=timeout, env=env)
        seconds = time.perf_counter() - t0
        found = _MAX_RSS.findall(r.stderr)
        peak_mb, how = (int(found[-1]) / 1024 if found else float("nan")), "/usr/bin/time -v"
        code, out = r.returncode, r.stdout + r.stderr
    else:  # wait4's ru_maxrss: the child's (a process forked from a large parent may start at its size)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out = p.communicate(timeout=timeout)[0] if p.stdout else ""
        seconds = time.perf_counter() - t0
        code = p.returncode
        peak_mb, how = _children_peak_mb(), "ru_maxrss of the children"
    if code != 0:
        raise RuntimeError(f"nobackfill {' '.join(args)} failed ({code}): {out[-500:]}")
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(peak_mb, 1), "measured_by": how, "output": out}


def _children_peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def model_of_width(models: Path, dim: int) -> Path | None:
    """A model directory under ``models`` whose vectors are ``dim``-d (from its config), or None."""
    for d in sorted(p for p in models.iterdir() if (p / "config.json").is_file()) if models.is_dir() else []:
        try:
            if int(json.loads((d / "config.json").read_text()).get("projection_dim", -1)) == dim:
                return d
        except (ValueError, OSError):
            continue
    return None


def command_rows(npy: Path, table: Path, coll: Path, model: Path) -> dict[str, Any]:
    """``collection import`` of the rows (trusted) and then ``collection index``, each a fresh
    process: wall seconds and peak RSS of each, the graph index's size on disk, and whether the
    import returned with the graph index still missing (its rows searched exactly meanwhile)."""
    from ..collection.collection import Collection

    imp = timed_command(["collection", "import", str(coll), "--model", str(model), "--from", f"npy:{npy}",
                         "--table", str(table), "--id-column", "id", "--source-column", "image_path",
                         "--modality", "image", "--trust-model"])
    missing = Collection.open(coll).missing_graph_indexes()
    idx = timed_command(["collection", "index", str(coll)])
    files = list(coll.rglob("index-image.faiss"))
    return {"command_import_s": imp["seconds"], "command_import_peak_rss_mb": imp["peak_rss_mb"],
            "graph_missing_after_import": bool(missing),
            "index_build_s": idx["seconds"], "index_build_peak_rss_mb": idx["peak_rss_mb"],
            "index_mb": round(sum(f.stat().st_size for f in files) / 2**20, 1),
            "graph_in_use_after_index": not Collection.open(coll).missing_graph_indexes(),
            "rss_measured_by": imp["measured_by"], "model": model.name}


__all__ = ["command_rows", "model_of_width", "timed_command"]
