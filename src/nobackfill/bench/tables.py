"""``nobackfill bench tables``: refresh the result tables of the README and the docs pages from the
committed benchmark outputs.

Every ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block of README.md and docs/*.md is replaced by
``benchmarks/results/NAME.md``, its title line dropped and its headings made bold (written by
``nobackfill bench NAME --out benchmarks/results/NAME.json``, which ``make bench`` runs). ``--check`` reports
the pages that are out of date instead of writing (the command then exits 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: the project (the README, docs/ and benchmarks/results/ lie under it)
ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


HEADING = re.compile(r"^(#{1,6}) +(.+?) *$", re.M)


@dataclass
class TablesConfig:
    """Where the benchmark outputs are, and whether to only check the pages (exit 1 if stale)."""

    results: Path = ROOT / "benchmarks" / "results"
    check: bool = False


def as_block(md: str) -> str:
    """A result file as a README block: its leading ``# title`` dropped (the README's section names
    it) and its other headings turned into bold lines, so they do not break the README's outline."""
    md = md.strip()
    if md.startswith("# "):
        md = md.split("\n", 1)[1].lstrip("\n") if "\n" in md else ""
    return HEADING.sub(lambda h: f"**{h.group(2)}**", md)


def refresh(readme: str, results: Path) -> str:
    def fill(m: re.Match) -> str:
        src = results / f"{m.group('name')}.md"
        if not src.is_file():
            raise FileNotFoundError(f"{src}: missing (run `make bench`)")
        return m.group(1) + as_block(src.read_text()) + "\n" + m.group(4)

    return BLOCK.sub(fill, readme)


def documents() -> list[Path]:
    """The files whose result blocks are refreshed: the README and the docs pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def refresh_documents(cfg: TablesConfig, log: Callable[[str], None] = print) -> list[Path]:
    """Refresh every page of :func:`documents` (with ``cfg.check``: only compare); returns the pages
    that were out of date."""
    stale = []
    for path in documents():
        old = path.read_text()
        new = refresh(old, Path(cfg.results))
        if new != old:
            stale.append(path)
            if not cfg.check:
                path.write_text(new)
        if not cfg.check:
            log(f"refreshed {len(BLOCK.findall(old))} table(s) in {path}")
    return stale


__all__ = ["BLOCK", "ROOT", "TablesConfig", "as_block", "documents", "refresh", "refresh_documents"]
