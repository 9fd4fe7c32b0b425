"""What README.md says about how fast ``collection status`` answers holds (issue 44, item 13): it
names where it is fast (a collection in a directory: no heavy library is imported, and the time
quoted is the one ``bench scale`` measured) and what it costs on a shared collection (the time
``bench scale --shared`` measured), never "well under a second" for every storage."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _status_paragraph() -> str:
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    m = re.search(r"Commands that embed nothing \(`collection status`.*?\. Result tables", text)
    assert m, "README.md no longer says what commands that embed nothing cost"
    return m.group(0)


def _cli_status_s(name: str) -> list[float]:
    return [r["cli_status_s"] for r in json.loads((RESULTS / f"{name}.json").read_text())["rows"]]


def test_the_readme_says_where_a_cold_status_is_fast_and_what_it_costs_when_shared():
    p = _status_paragraph()
    assert "well under a second" not in p
    local = min(_cli_status_s("scale") + _cli_status_s("scale_1m"))
    shared = _cli_status_s("scale_shared")[0]
    assert f"{local:.1f} s" in p and "in a directory" in p, p  # the embedded case, as measured
    assert f"{shared:.1f} s" in p and "PostgreSQL + a Milvus server" in p, p  # the shared case, as measured
    assert "pymilvus" in p  # what the shared case spends its time on


def test_status_of_a_collection_in_a_directory_imports_no_heavy_library(tmp_path):
    """Where the README says status is fast: no torch, no Milvus client, no pandas, no PostgreSQL
    driver and no faiss in the process."""
    code = ("import sys\nfrom nobackfill.cli import main\n"
            f"sys.argv = ['nobackfill', 'collection', 'create', {str(tmp_path / 'c')!r}, '--model',"
            f" {str(ROOT / 'models' / 'world-old')!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    probe = ("import sys\nfrom nobackfill.cli import main\n"
             f"sys.argv = ['nobackfill', 'collection', 'status', {str(tmp_path / 'c')!r}]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "heavy = ('torch', 'transformers', 'pymilvus', 'pandas', 'psycopg', 'milvus_lite', 'faiss', 'grpc')\n"
             "print(sorted(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=300)
    assert "world-old" in out.stdout + out.stderr, out  # the status printed (on stdout or stderr)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
