"""Refresh the result tables of the README and the docs pages from the committed benchmark outputs.

Every ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block of README.md and docs/*.md is replaced by
``benchmarks/results/NAME.md``, its title line dropped and its headings made bold (written by
``nobackfill bench NAME --out benchmarks/results/NAME.json``, which ``make bench`` runs). ``--check`` exits 1 if a page is out of date instead of writing.

    python scripts/readme_tables.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


HEADING = re.compile(r"^(#{1,6}) +(.+?) *$", re.M)


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
            raise SystemExit(f"{src}: missing (run `make bench`)")
        return m.group(1) + as_block(src.read_text()) + "\n" + m.group(4)

    return BLOCK.sub(fill, readme)


def documents() -> list[Path]:
    """The files whose result blocks are refreshed: the README and the docs pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="Exit 1 if the README's tables are out of date.")
    args = ap.parse_args()
    stale = []
    for path in documents():
        old = path.read_text()
        new = refresh(old, ROOT / "benchmarks" / "results")
        if new != old:
            stale.append(path)
            if not args.check:
                path.write_text(new)
        if not args.check:
            print(f"refreshed {len(BLOCK.findall(old))} table(s) in {path}")
    if args.check:
        sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
