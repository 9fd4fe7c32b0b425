"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, offline: every
link between pages and every anchor resolves, every page is in the nav, every ``:::`` API reference
resolves and its docstrings parse without a warning; and docs/http-api.md lists what the service's
OpenAPI schema says."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# pages deliberately left out of the nav (none today); anything else under docs/ must be reachable
NOT_IN_NAV: set[str] = set()

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return []


def _config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


@pytest.mark.timeout(240)
def test_the_site_builds_strict_and_offline(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONWARNINGS": "ignore"}
    # offline: a proxy that refuses everything, so a plugin fetching anything fails the build
    env.update({k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=220)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stderr}\n{r.stdout}"
    assert "WARNING" not in r.stderr, r.stderr
    for page in ["index.html", "guide/index.html", "http-api/index.html", "reference/collection/index.html",
                 "reference/client/index.html", "assets/results/backfill.png", "serve.png"]:
        assert (site / page).is_file(), f"{page} missing from the built site"
    ref = (site / "reference" / "collection" / "index.html").read_text(encoding="utf-8")
    assert 'id="nobackfill.collection.collection.Collection"' in ref  # mkdocstrings rendered the class
    assert ":class:<code>" not in ref  # Sphinx roles cleaned up by docs/_hooks/site.py


def test_the_config_is_offline():
    """No plugin that fetches at build time (social cards, privacy's downloads), no web fonts."""
    cfg = _config()
    assert cfg["strict"] is True and cfg["docs_dir"] == "docs" and cfg["site_dir"] == "site"
    assert cfg["theme"]["name"] == "material" and cfg["theme"]["font"] is False
    names = {next(iter(p)) if isinstance(p, dict) else p for p in cfg.get("plugins", [])}
    assert names <= {"search", "mkdocstrings"}, names
    assert cfg.get("validation", {}).get("links", {}).get("anchors") == "warn"  # strict checks #anchors too


def test_every_page_is_in_the_nav():
    nav = _nav_pages(_config()["nav"])
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_hooks" not in p.parts}
    assert len(nav) == len(set(nav)), f"pages listed twice in the nav: {sorted(p for p in nav if nav.count(p) > 1)}"
    assert not set(nav) - pages, f"nav entries without a page: {sorted(set(nav) - pages)}"
    orphans = pages - set(nav) - NOT_IN_NAV
    assert not orphans, f"pages under docs/ not in mkdocs.yml's nav (add them, or to NOT_IN_NAV): {sorted(orphans)}"


def test_the_http_api_page_matches_the_openapi_schema():
    """docs/http-api.md's endpoint list is what ``create_app(...).openapi()`` says; refresh it with
    ``python docs/_hooks/http_api.py``."""
    pytest.importorskip("fastapi")
    gen = runpy.run_path(str(DOCS / "_hooks" / "http_api.py"))
    doc = gen["openapi"]()
    page = (DOCS / "http-api.md").read_text(encoding="utf-8")
    assert gen["refresh"](page, doc) == page, "docs/http-api.md is stale: run python docs/_hooks/http_api.py"
    for path, ops in doc["paths"].items():
        for method in ops:
            assert f"`{method.upper()} {path}`" in page


def test_every_result_block_of_the_site_is_refreshed():
    """The pages holding ``<!-- results:NAME -->`` blocks are among those the result-table refresher
    rewrites (``documents()``: nobackfill.bench.tables, formerly scripts/readme_tables.py), so moving
    a page into a subfolder cannot leave its tables stale unnoticed."""
    try:
        from nobackfill.bench.tables import documents
    except ImportError:  # the refresher before it moved into the package
        documents = runpy.run_path(str(ROOT / "scripts" / "readme_tables.py"))["documents"]
    refreshed = {p.resolve() for p in documents()}
    with_blocks = {p.resolve() for p in DOCS.rglob("*.md") if "<!-- results:" in p.read_text(encoding="utf-8")}
    assert with_blocks, "no docs page holds a result block"
    assert with_blocks <= refreshed, f"result blocks nobody refreshes: {sorted(map(str, with_blocks - refreshed))}"
