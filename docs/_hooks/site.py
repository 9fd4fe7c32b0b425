"""mkdocs hooks of the documentation site (mkdocs.yml ``hooks:``); nothing is fetched at build time.

* Pages link benchmark plots where they are committed, ``../benchmarks/results/NAME.png`` (so the
  pages read right on GitHub too); the site copies each such plot to ``assets/results/NAME.png`` and
  points the link there, so strict mode still checks that the file exists.
* Docstrings use Sphinx roles (``:class:`~a.B```); in the rendered API reference the role name is
  dropped and a ``~`` target shows its last part, as Sphinx would.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\((?:\.\./)+benchmarks/results/([\w.-]+)\)")
ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|obj|exc|const|ref):<code>(~?)([^<]*)</code>")


def on_files(files, config):
    docs = Path(config["docs_dir"])
    named = {m.group(1) for page in docs.rglob("*.md") for m in LINK.finditer(page.read_text(encoding="utf-8"))}
    for name in sorted(named):
        if (RESULTS / name).is_file():  # a missing one stays a broken link, which strict mode reports
            files.append(File.generated(config, f"assets/results/{name}", abs_src_path=str(RESULTS / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    up = "../" * page.file.src_uri.count("/")
    return LINK.sub(lambda m: f"]({up}assets/results/{m.group(1)})", markdown)


def on_page_content(html, page, config, files):
    return ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)
