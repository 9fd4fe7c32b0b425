"""``nobackfill serve`` as a real process on 127.0.0.1 over a world collection in the middle of an
upgrade (shipped world models and XBT upgrade): the Python client, a SIGKILL during ingest and a
restart that keeps every acknowledged write, and the web page in a real headless Chromium."""

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
from nobackfill.client import Client, ServiceError  # noqa: E402
from nobackfill.index.collection import Collection  # noqa: E402

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
    assert out["modality"] == "image" and len(out["hits"]) == 5 and {h["route"] for h in out["hits"]} <= {"bridge"}
    img = next((live.root / "world" / "test" / "images").iterdir())
    assert len(c.search(image=img, k=3)["hits"]) == 3
    with pytest.raises(ServiceError) as e:
        c.add_texts([{"text": "x"}])
    assert e.value.status == 403
    st = c.status()
    assert st["items"] == {"image": 24, "text": 48} and st["backfill"]["total"] == 72


def test_sigkill_during_ingest_keeps_every_acknowledged_write(live):
    admin = Client(live.url, ADMIN, timeout=30)
    acked: list[str] = []
    for i in range(6):
        acked += admin.add_texts([{"text": f"kill test caption {i} {j}", "id": f"k{i}-{j}"} for j in range(3)])["ids"]
    live.kill()
    live.start()
    admin = Client(live.url, ADMIN, timeout=30)
    for i in acked:
        assert admin.get(i)["modality"] == "text"
    assert not Collection.open(live.root / "photos").verify()


def _chrome():
    pytest.importorskip("selenium", reason="selenium is not installed")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("the browser test needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,900"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_web_page_in_a_real_browser(live, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _chrome()
    try:
        browser.get(live.url + "/")
        browser.execute_script("localStorage.setItem('nobackfill-key', arguments[0]);", READ)
        browser.get(live.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "images" in b.find_element(By.ID, "collection").text)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#spaces .space")) == 2
        browser.find_element(By.ID, "query").send_keys("a red circle on the left")
        browser.find_element(By.CSS_SELECTOR, "#text-form button").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .hit img[src^='blob:']")) >= 12)
        assert "answered by" in browser.find_element(By.ID, "message").text
        img = next((live.root / "world" / "test" / "images").iterdir())
        browser.find_element(By.ID, "file").send_keys(str(img))
        wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "the image"))
        captions = browser.find_elements(By.CSS_SELECTOR, "#results .hit .caption")
        assert captions and captions[0].text.strip()
        browser.find_element(By.ID, "query").clear()
        browser.find_element(By.ID, "query").send_keys("a large blue square")
        browser.find_element(By.CSS_SELECTOR, "#text-form button").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .hit img[src^='blob:']")) >= 12)
        time.sleep(0.5)
        shot = Path(os.environ.get("NOBACKFILL_SCREENSHOT", tmp_path / "serve.png"))
        shot.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        browser.quit()
