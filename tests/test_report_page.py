"""The HTML reports read well in a browser window of any width: the demo's page (``runs/demo/report.html``)
shows its tables as HTML tables (never Markdown inside a ``<pre>``), its plots scale down to the
window, and long lines wrap, so the page never scrolls sideways (issue 44, item 15): checked in the
HTML, and in headless Chromium at 1280 and 390 px (skipped where chromium is not installed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nobackfill.demo import write_report
from nobackfill.report import PAGE_CSS, markdown_html

ROOT = Path(__file__).resolve().parents[1]
#: a saved live-upgrade measurement of the same shape as the demo's (bench backfill's result)
LIVE = ROOT / "benchmarks" / "results" / "backfill.json"


def demo_result() -> dict:
    def row(a: float, b: float) -> dict:
        return {d: {"R@1": x, "R@5": min(1.0, x + 0.05), "R@10": min(1.0, x + 0.1)} for d, x in (("t2i", a), ("i2t", b))}

    return {"old_old": row(0.31, 0.33), "new_new": row(0.9, 0.88), "new_old_raw": row(0.001, 0.002),
            "xbt": row(0.34, 0.48), "n_images": 1000, "n_captions": 2000, "spaces": {"old": "hf-clip-" + "a" * 20}}


@pytest.fixture(scope="module")
def page_path(tmp_path_factory) -> Path:
    live = json.loads(LIVE.read_text())
    result = {**demo_result(), "live_upgrade": {k: live[k] for k in ("old_old", "new_new", "default", "routes")}}
    return write_report(tmp_path_factory.mktemp("demo") / "report.html", result, live)


@pytest.fixture(scope="module")
def page(page_path) -> str:
    return page_path.read_text()


def test_the_demo_page_has_no_markdown_in_preformatted_blocks(page):
    """Every ``<pre>`` holds JSON (the details), never a Markdown table or a line of **bold**."""
    for block in re.findall(r"<pre>(.*?)</pre>", page, re.S):
        assert "|---" not in block and "**" not in block, block[:300]
    assert "|---" not in page and "**Default" not in page


def test_the_live_upgrade_tables_are_html_tables(page):
    """The retrieval table and both live-upgrade tables (t2i, i2t) are ``<table>`` elements, each
    in a box that scrolls on its own; the "Default: ..." line is a paragraph with its bold part."""
    live = page.split("Live upgrade")[1]
    assert live.count("<table>") == 2 and page.count("<table>") == 3
    assert page.count('<div class="table"><table>') == 3
    assert "<th>t2i R@1 % at fraction</th>" in live and "<th>i2t R@1 % at fraction</th>" in live
    assert re.search(r"<p>Default: <b>uncertainty/calibrated</b>\. old/old R@1 t2i", live)
    assert "<td>uncertainty/calibrated (default)</td>" in live


def test_the_page_fits_the_window(page):
    """Images never wider than the page, long words and lines wrap, wide tables scroll in their box,
    and a phone lays the page out at its own width (viewport)."""
    assert page.count("<img") == 2
    css = PAGE_CSS.replace(" ", "")
    assert "img{max-width:100%;height:auto" in css
    assert "overflow-wrap:anywhere" in css.split("body{")[1].split("}")[0]
    assert "pre{white-space:pre-wrap" in css and ".table{overflow-x:auto" in css
    assert "name='viewport' content='width=device-width" in page and PAGE_CSS in page


def test_markdown_html_renders_what_reports_write():
    md = ("# XBT benchmark\n\nA line with **bold** and `code` <here>.\nIts second line.\n\n"
          "| row | t2i R@1 | i2t |\n|---|---:|---:|\n| old/old | 31.6 | - |\n| a&b | 1 | 2 |\n\nafter\n")
    html = markdown_html(md)
    assert html.startswith("<h3>XBT benchmark</h3><p>A line with <b>bold</b> and <code>code</code> &lt;here&gt;. "
                           "Its second line.</p>")
    assert ("<table><thead><tr><th>row</th><th>t2i R@1</th><th>i2t</th></tr></thead><tbody>"
            "<tr><td>old/old</td><td>31.6</td><td>-</td></tr><tr><td>a&amp;b</td><td>1</td><td>2</td></tr>") in html
    assert html.endswith("<p>after</p>") and "|" not in html


def test_the_bench_pages_render_their_tables_too(tmp_path):
    """bench backfill's page (the same curves) has no Markdown in a ``<pre>`` either."""
    from nobackfill.bench.backfill import write_report as write_backfill

    write_backfill(json.loads(LIVE.read_text()), tmp_path / "backfill.json")
    page = (tmp_path / "backfill.html").read_text()
    assert "<pre>" not in page and page.count("<table>") == 3 and "|---" not in page


_LAYOUT = """
const de = document.documentElement;
for (const d of document.querySelectorAll('details')) d.open = true;
const right = (sel) => [...document.querySelectorAll(sel)].map((e) => e.getBoundingClientRect().right);
const p = [...document.querySelectorAll('p')].find((e) => e.textContent.startsWith('Default:'));
return {scrollWidth: de.scrollWidth, clientWidth: de.clientWidth, innerWidth: window.innerWidth, images: right('img'), boxes: right('div.table'),
        pre: right('pre'), default: p.getBoundingClientRect().right,
        imgWidths: [...document.images].map((i) => [i.naturalWidth, i.getBoundingClientRect().width])};
"""


@pytest.mark.parametrize("width", [1280, 390])
def test_the_demo_page_in_a_real_browser(page_path, tmp_path, width):
    """Chromium at 1280 px (the issue's window) and 390 px (a phone): the page is no wider than the
    window, the plots (1,200+ px as drawn) are scaled into it, and so are the tables' boxes, the
    "Default: ..." line and the opened JSON details."""
    from test_serve_live import _chrome, _full_page, _screens, _viewport

    browser = _chrome(tmp_path / "chrome-profile")
    try:
        _viewport(browser, width, 900)
        browser.get(page_path.as_uri())
        lay = browser.execute_script(_LAYOUT)
        _full_page(browser, _screens(tmp_path) / f"demo-report-{width}.png")
    finally:
        browser.quit()
    vw = lay["clientWidth"]  # the window less its vertical scroll bar
    assert lay["innerWidth"] == width and lay["scrollWidth"] <= vw, lay
    assert all(r <= vw + 0.5 for key in ("images", "boxes", "pre") for r in lay[key]) and lay["default"] <= vw, lay
    assert any(natural > shown + 1 for natural, shown in lay["imgWidths"]), lay  # a plot was scaled down


def test_the_fitted_bridge_row_is_in_the_table_and_the_plot(tmp_path):
    """A demo result with the fitted bridge's row shows it, named with its pairs, beside XBT."""
    from nobackfill.demo import row_labels

    result = {**demo_result(), "fitted": demo_result()["xbt"], "fitted_bridge": {"scenes": 512}}
    assert row_labels(result)["fitted"] == "fitted bridge (512 pairs)"
    page = write_report(tmp_path / "report.html", result).read_text()
    assert "<td>fitted bridge (512 pairs)</td>" in page or ">fitted bridge (512 pairs)<" in page


def test_the_live_upgrade_without_a_bridge_has_its_plot_and_table(tmp_path):
    """The live upgrade without a bridge: a plot and one table row per step, with its pairs, R@1,
    route and the bridge in service."""
    steps = [{"fraction": f, "pairs": p, "t2i": t, "i2t": i, "routes": {"t2i": r, "i2t": "old-model"},
              "bridges": b} for f, p, t, i, r, b in (
        (0.0, 0, 0.316, 0.333, "old-model", {}),
        (0.1, 300, 0.52, 0.40, "fused w=0.9", {"t2i": "mlp-plain@image on 128 pairs (v1)"}),
        (1.0, 3000, 0.94, 0.941, "bridge", {"t2i": "mlp-plain@image on 1024 pairs (v3)"}))]
    page = write_report(tmp_path / "report.html", demo_result(), None, {"steps": steps}).read_text()
    part = page.split("Live upgrade without a bridge")[1]
    assert part.count("<tr>") == 4 and "<img" in part  # a header and 3 steps, the plot
    assert "<td>10%</td><td>300</td><td>52.0</td><td>fused w=0.9 (mlp-plain@image on 128 pairs (v1))</td>" in \
        part.replace("\n", "")
    assert "old-model (no bridge yet)" in part
