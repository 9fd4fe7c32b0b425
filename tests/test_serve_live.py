"""``nobackfill serve`` as a real process on 127.0.0.1 over a world collection in the middle of an
upgrade (shipped world models and XBT upgrade): the Python client, a SIGKILL during ingest and a
restart that keeps every acknowledged write, and the web page in a real headless Chromium: at desktop
and phone widths (nothing overflows), its error states (each gone once the next action succeeds, stale
results never left under an error) and its favicon. Screenshots go to $NOBACKFILL_SCREENS (e.g.
runs/screens) and the README's one to $NOBACKFILL_SCREENSHOT (docs/serve.png)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")

from nobackfill.cli import app  # noqa: E402
from nobackfill.client import Client, ClientError  # noqa: E402
from nobackfill.collection.collection import Collection  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
READ, ADMIN = "live-read-key-0123", "live-admin-key-0123"
runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _invoke(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


class Server:
    def __init__(self, root: Path) -> None:
        self.root, self.port, self.proc = root, _free_port(), None

    def start(self) -> "Server":
        cmd = [sys.executable, "-m", "nobackfill.cli", "serve", str(self.root / "photos"), "--port", str(self.port),
               "--keys", str(self.root / "keys.toml"), "--models-root", str(ROOT)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read()}")
            try:
                if Client(self.url, READ, timeout=2).healthz()["ok"]:
                    return self
            except Exception:
                time.sleep(0.3)
        raise RuntimeError("server did not start in 120 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    _invoke("world", "--out", root / "world", "--n-train", 10, "--n-val", 20, "--n-test", 24, "--workers", 1,
            "--langs", "en")
    _invoke("collection", "create", root / "photos", "--model", ROOT / "models" / "world-old")
    _invoke("collection", "add", root / "photos", "--data", root / "world", "--split", "test")
    _invoke("collection", "upgrade", root / "photos", "--model", ROOT / "models" / "world-new", "--bridge",
            ROOT / "upgrades" / "world-old-to-new")
    (root / "keys.toml").write_text(f'read = ["{READ}"]\nadmin = ["{ADMIN}"]\n')
    server = Server(root).start()
    yield server
    server.kill()


def test_client_round_trip(live):
    c = Client(live.url, READ)
    out = c.search(text="a red circle", k=5)
    assert out.modality == "image" and len(out.hits) == 5 and {h.route for h in out.hits} <= {"bridge"}
    img = next((live.root / "world" / "test" / "images").iterdir())
    assert len(c.search(image=img, k=3).hits) == 3
    with pytest.raises(ClientError) as e:
        c.add(texts=[{"text": "x"}])
    assert e.value.status == 403
    st = c.status()
    assert st["items"] == {"image": 24, "text": 48} and st["backfill"]["total"] == 72


def test_the_command_line_takes_a_server_url(live, monkeypatch):
    """``nobackfill collection ... URL`` runs the same commands over HTTP (the key from
    NOBACKFILL_API_KEY): status and search as JSON, a refusal as one error line."""
    import json

    monkeypatch.setenv("NOBACKFILL_API_KEY", READ)
    st = json.loads(_invoke("collection", "status", live.url, "--json").stdout)
    assert st["items"]["image"] == 24 and st["path"] == "photos"  # the server names, never its paths
    hits = json.loads(_invoke("collection", "search", live.url, "--text", "a red circle", "--k", 3, "--json").stdout)
    assert len(hits["hits"]) == 3 and hits["modality"] == "image"
    r = runner.invoke(app, ["collection", "delete", live.url, "--id", "anything"])
    assert r.exit_code == 2 and "needs an admin key" in r.output and "403" not in r.output, r.output


def test_sigkill_during_ingest_keeps_every_acknowledged_write(live):
    admin = Client(live.url, ADMIN, timeout=30)
    acked: list[str] = []
    for i in range(6):
        acked += admin.add(texts=[{"text": f"kill test caption {i} {j}", "id": f"k{i}-{j}"} for j in range(3)]).ids
    live.kill()
    live.start()
    admin = Client(live.url, ADMIN, timeout=30)
    for i in acked:
        assert admin.get(i).modality == "text"
    assert not Collection.open(live.root / "photos").verify()


def _chrome(profile: Path):
    pytest.importorskip("selenium", reason="selenium is not installed")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("the browser test needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,900"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.fixture
def browser(tmp_path):
    b = _chrome(tmp_path / "chrome-profile")
    try:
        yield b
    finally:
        b.quit()


def _screens(tmp_path: Path) -> Path:
    """Where the screenshots go: $NOBACKFILL_SCREENS (e.g. runs/screens) or the test's tmp dir."""
    d = Path(os.environ.get("NOBACKFILL_SCREENS", tmp_path / "screens"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _viewport(browser, width: int, height: int) -> None:
    """An exact CSS viewport (a window can't be made this narrow everywhere; the emulation can)."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def _full_page(browser, path: Path) -> Path:
    """A screenshot of the whole page (not just the viewport)."""
    import base64

    w, h = browser.execute_script("return [window.innerWidth, document.documentElement.scrollHeight];")
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": w, "height": min(h, 6000), "scale": 1}})
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.stat().st_size > 5_000
    return path


_LAYOUT = """
const de = document.documentElement, vw = de.clientWidth;
const boxes = {};
for (const sel of ["header", "#text-form", "#query", "#text-form button", "#drop", "#message", "#results",
                   "#status", "#results .hit"]) {
  const el = document.querySelector(sel);
  if (el) { const r = el.getBoundingClientRect(); boxes[sel] = [r.left, r.right, r.width, r.top]; }
}
return {scrollWidth: de.scrollWidth, clientWidth: vw, innerWidth: window.innerWidth, boxes};
"""


def _fits(browser) -> dict:
    """No horizontal overflow: the page scrolls no wider than the viewport and every panel lies in it."""
    lay = browser.execute_script(_LAYOUT)
    assert lay["scrollWidth"] <= lay["innerWidth"] and lay["scrollWidth"] <= lay["clientWidth"], lay
    for sel, (left, right, width, _top) in lay["boxes"].items():
        assert left >= 0 and right <= lay["clientWidth"] + 0.5 and width > 0, (sel, lay)
    return lay


def _open(browser, live, key: str | None = READ) -> None:
    browser.get(live.url + "/")
    browser.execute_script("sessionStorage.setItem('nobackfill-key', arguments[0]);", key or "")
    browser.get(live.url + "/")


def _search(browser, wait, text: str, images: int = 12) -> None:
    from selenium.webdriver.common.by import By

    q = browser.find_element(By.ID, "query")
    q.clear()
    q.send_keys(text)
    browser.find_element(By.CSS_SELECTOR, "#text-form button").click()
    if images:
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .hit img[src^='blob:']")) >= images
                   and "answered by" in b.find_element(By.ID, "message").text)


def _errors(browser) -> list[str]:
    """The texts of the error states visible on the page now."""
    return browser.execute_script(
        "return [...document.querySelectorAll('.error')].filter((e) => e.offsetParent !== null"
        " && e.textContent.trim()).map((e) => e.id + ': ' + e.textContent.trim());")


def test_web_page_in_a_real_browser(live, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _viewport(browser, 1280, 900)
    _open(browser, live)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: "images" in b.find_element(By.ID, "collection").text)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#spaces .space")) == 2
    _search(browser, wait, "a red circle on the left")
    img = next((live.root / "world" / "test" / "images").iterdir())
    browser.find_element(By.ID, "file").send_keys(str(img))
    wait.until(lambda b: "answered by" in b.find_element(By.ID, "message").text
               and "the image" in b.find_element(By.ID, "message").text)
    captions = browser.find_elements(By.CSS_SELECTOR, "#results .hit .caption")
    assert captions and captions[0].text.strip()
    assert "captions for the image" in browser.find_element(By.ID, "message").text  # the selector's word
    # the results answer the image, shown beside them; the text box no longer says otherwise
    assert browser.find_element(By.ID, "asked-image").get_attribute("src").startswith("blob:")
    assert browser.find_element(By.ID, "asked").is_displayed() and not browser.find_element(By.ID, "query").get_attribute("value")
    # a hit's id, space and route: shown on a click (a tap), not only in a hover title
    first = browser.find_element(By.CSS_SELECTOR, "#results .hit")
    assert not first.find_element(By.CSS_SELECTOR, ".details").is_displayed()
    first.click()
    assert first.find_element(By.CSS_SELECTOR, ".details").text.startswith("id ")
    browser.save_screenshot(str(_screens(tmp_path) / "image-query.png"))
    _search(browser, wait, "a large blue square")
    assert not browser.find_element(By.ID, "asked").is_displayed()
    # desktop: the status panel beside the results, in the viewport, nothing overflowing
    lay = _fits(browser)
    assert lay["boxes"]["#status"][0] >= lay["boxes"]["#results"][1], lay
    assert lay["boxes"]["#status"][3] < 200, lay
    wait.until(lambda b: b.execute_script("return [...document.images].every((i) => i.complete);"))
    shot = Path(os.environ.get("NOBACKFILL_SCREENSHOT", tmp_path / "serve.png"))
    shot.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    _full_page(browser, _screens(tmp_path) / "desktop-1280.png")


@pytest.mark.parametrize("width,height", [(400, 800), (360, 740)])
def test_web_page_fits_a_narrow_viewport(live, browser, tmp_path, width, height):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _viewport(browser, width, height)
    _open(browser, live)
    wait = WebDriverWait(browser, 60)
    assert browser.execute_script("return window.innerWidth;") == width
    wait.until(lambda b: "images" in b.find_element(By.ID, "collection").text)
    _fits(browser)
    _search(browser, wait, "a red circle on the left")
    wait.until(lambda b: b.execute_script("return [...document.images].every((i) => i.complete);"))
    lay = _fits(browser)
    # the search row and the first results are on the first screen; the collection panel is reachable
    assert lay["boxes"]["#query"][3] < height and lay["boxes"]["#results .hit"][3] < height, lay
    browser.save_screenshot(str(_screens(tmp_path) / f"narrow-{width}.png"))
    status = browser.find_element(By.ID, "status")
    browser.execute_script("arguments[0].scrollIntoView();", status)
    assert status.is_displayed()
    browser.save_screenshot(str(_screens(tmp_path) / f"narrow-{width}-status.png"))
    # an error (a long unbroken query over the server's limit) fits too, and the next search clears it
    browser.execute_script("window.scrollTo(0, 0);")
    _search(browser, wait, "x" * 2001, images=0)
    wait.until(lambda b: any("limit" in e for e in _errors(b)))
    _fits(browser)
    browser.save_screenshot(str(_screens(tmp_path) / f"narrow-{width}-error.png"))
    _search(browser, wait, "a large blue square")
    assert not _errors(browser)
    _full_page(browser, _screens(tmp_path) / f"narrow-{width}-full.png")


def test_web_page_error_states_clear_on_the_next_success(live, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    _viewport(browser, 1280, 900)
    _open(browser, live, key="not-a-key")
    wait = WebDriverWait(browser, 60)
    # a wrong key: said, in red, and no collection or spaces shown as if they belonged to it
    wait.until(lambda b: _errors(b))
    assert not browser.find_elements(By.CSS_SELECTOR, "#spaces .space")
    _search(browser, wait, "a red circle on the left", images=0)
    wait.until(lambda b: any("key" in e for e in _errors(b))
               and "Searching" not in b.find_element(By.ID, "message").text)
    assert not browser.find_elements(By.CSS_SELECTOR, "#results .hit")
    browser.save_screenshot(str(_screens(tmp_path) / "error-wrong-key.png"))
    # the right key: every error goes, the collection comes
    key = browser.find_element(By.ID, "key")
    key.clear()
    key.send_keys(READ, Keys.ENTER)
    wait.until(lambda b: "images" in b.find_element(By.ID, "collection").text)
    wait.until(lambda b: not _errors(b))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#spaces .space")) == 2
    # results, then a failing upload: the old results go, the error stays until the next success
    _search(browser, wait, "a large blue square")
    bad = tmp_path / "not-an-image.png"
    bad.write_text("this is not an image")
    browser.find_element(By.ID, "file").send_keys(str(bad))
    wait.until(lambda b: any("not an image" in e for e in _errors(b)))
    assert not browser.find_elements(By.CSS_SELECTOR, "#results .hit"), "results of the last search stayed"
    browser.save_screenshot(str(_screens(tmp_path) / "error-upload.png"))
    # the same file chosen again is a new action too (the input was reset)
    browser.find_element(By.ID, "file").send_keys(str(bad))
    wait.until(lambda b: any("not an image" in e for e in _errors(b)))
    _search(browser, wait, "a large blue square")
    assert not _errors(browser)
    # a bad query (blank, then one over the server's limit): said, stale results gone; a good one clears it
    _search(browser, wait, "   ", images=0)
    wait.until(lambda b: _errors(b))
    assert not browser.find_elements(By.CSS_SELECTOR, "#results .hit"), "results of the last search stayed"
    _search(browser, wait, "a large blue square")
    _search(browser, wait, "x" * 2001, images=0)
    wait.until(lambda b: any("limit" in e for e in _errors(b)))
    assert not browser.find_elements(By.CSS_SELECTOR, "#results .hit")
    browser.save_screenshot(str(_screens(tmp_path) / "error-bad-query.png"))
    _search(browser, wait, "a red circle on the left")
    assert not _errors(browser)


def test_web_page_shows_an_image_hit_as_an_image_and_every_route(live, browser, tmp_path):
    """Trial AJ (D8, D10): an image whose metadata has a ``text`` key showed as a caption card without
    its thumbnail (the page guessed by the key, not the result's modality); the status panel left out
    the old space's i2i route although the page searches image -> image."""
    import json

    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    img = sorted((live.root / "world" / "test" / "images").iterdir())[-1]
    part = ("images", (img.name, img.read_bytes(), "image/png",
                       {"X-Item-Id": "withtext-1", "X-Item-Metadata": json.dumps({"text": "holiday photo, a red circle"})}))
    r = httpx.post(live.url + "/v1/items", files=[part], headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 200 and r.json()["ids"] == ["withtext-1"], r.text
    try:
        _viewport(browser, 1280, 900)
        _open(browser, live)
        wait = WebDriverWait(browser, 60)
        old = "#spaces .space:not(.current) .routes"
        wait.until(lambda b: "i2i " in b.find_element(By.CSS_SELECTOR, old).text)
        Select(browser.find_element(By.ID, "target")).select_by_value("image")
        browser.find_element(By.ID, "file").send_keys(str(img))
        wait.until(lambda b: "images for the image" in b.find_element(By.ID, "message").text)
        hit = browser.find_element(By.CSS_SELECTOR, "#results .hit[data-id='withtext-1']")
        assert not hit.find_elements(By.CSS_SELECTOR, ".caption"), hit.text
        wait.until(lambda b: hit.find_element(By.TAG_NAME, "img").get_attribute("src").startswith("blob:"))
        assert not browser.find_elements(By.CSS_SELECTOR, "#results .hit .caption")  # images, every one
    finally:
        httpx.delete(live.url + "/v1/items/withtext-1", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)


def test_web_page_names_a_fitted_bridge_beside_its_route(live, browser, tmp_path):
    """A collection upgraded with no bridge, backfilled (bridges fitted from its pairs) and the t2i
    route pinned to the fitted bridge: the status panel names the bridge beside the route."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from nobackfill.lifecycle.backfill import run_backfill
    from nobackfill.lifecycle.fit_bridges import fitted_status
    from nobackfill.lifecycle.plan_changes import pin_route, upgrade_collection
    from nobackfill.search import ModelPool
    from nobackfill.search.models import model_ref

    _invoke("collection", "create", tmp_path / "photos", "--model", ROOT / "models" / "world-old")
    _invoke("collection", "add", tmp_path / "photos", "--data", live.root / "world", "--split", "test")
    c, pool = Collection.open(tmp_path / "photos"), ModelPool()
    new_ref = model_ref(ROOT / "models" / "world-new")
    upgrade_collection(c, new_ref, pool=pool, fit_sample={"fraction": 1.0, "min_pairs": 8,
                                                          "fit": {"families": ("orthogonal",)}})
    run_backfill(c, pool.get(new_ref), order="sequential")
    t2i = next(b for b in fitted_status(Collection.open(c.path).plan) if b["direction"] == "t2i")
    pin_route(c, t2i["space"], "t2i", "bridge")
    (tmp_path / "keys.toml").write_text(f'read = ["{READ}"]\nadmin = ["{ADMIN}"]\n')
    server = Server(tmp_path).start()
    try:
        _viewport(browser, 1280, 900)
        _open(browser, server)
        # the orthogonal map on several pair sets (image, caption, both): the mean of the best-scored serves
        assert t2i["family"] == "ensemble" and len(t2i["candidate"].split(" + ")) >= 2
        want = f"t2i bridge (bridge fitted: mean of {t2i['candidate']}, {t2i['pairs']} pairs)"
        old = f"#spaces .space:not(.current)"
        WebDriverWait(browser, 60).until(lambda b: want in (b.find_element(By.CSS_SELECTOR, old).get_attribute("title")
                                                            or ""))
        # every item is in the new space: the old one says it serves nothing (its routes on hover)
        assert "serves nothing now" in browser.find_element(By.CSS_SELECTOR, old).text
        # the merge's score maps, fitted by the backfill without labels
        assert "merge calibrated (fitted without labels)" in browser.find_element(By.ID, "collection").text
        browser.save_screenshot(str(_screens(tmp_path) / "fitted-bridge.png"))
    finally:
        server.kill()


def test_favicon(live):
    import httpx

    page = httpx.get(live.url + "/", timeout=10)
    assert 'rel="icon"' in page.text
    svg = httpx.get(live.url + "/static/favicon.svg", timeout=10)
    assert svg.status_code == 200 and svg.text.lstrip().startswith("<svg")
    r = httpx.get(live.url + "/favicon.ico", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("image/") and r.content == svg.content


def test_the_api_docs_render_offline(live, browser, tmp_path):
    """``/docs`` in Chromium with every other host blocked (a machine without internet): Swagger UI
    renders the operations from the server's own copy of its files (issue 44, item 12)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["https://*", "*cdn*", "*jsdelivr*",
                                                                "*googleapis*", "*unpkg*"]})
    _viewport(browser, 1280, 900)
    browser.get(live.url + "/docs")
    WebDriverWait(browser, 60).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".opblock")) >= 10)
    assert "/v1/search" in browser.find_element(By.CSS_SELECTOR, ".swagger-ui").text
    browser.save_screenshot(str(_screens(tmp_path) / "api-docs.png"))
