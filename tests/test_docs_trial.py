"""docs/milvus.md's "Try PostgreSQL + Milvus locally" runs as written: its shell lines start a
PostgreSQL cluster (as an unprivileged user: ``nobody`` when the tests run as root, since PostgreSQL
refuses root; in a fresh /tmp directory and on a free port in place of ``/tmp/nb-trial`` and 5432),
then its ``nobackfill`` lines run on a milvus-lite collection with that PostgreSQL catalog, ``serve``
with ``--uploads`` included (an image uploaded over HTTP lands in that folder), and the stop line
stops the server. The ``milvus://`` line is run on the session's Milvus server by
tests/test_docs_run_tools.py (marked ``milvus_server``); ``milvus-server`` itself is the one line
left out (a second Milvus server would need its own network namespace and a dozen ports)."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from nobackfill.cli import app

from test_docs_commands import DocCommand, code_blocks
from test_docs_run import sandbox  # noqa: F401  (the reader's folder: my_photos, models/, upgrades/)

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "milvus.md"
HEADING = "## Try PostgreSQL + Milvus locally"
TRIAL_DIR, PORT = "/tmp/nb-trial", "5432"


def trial_blocks() -> list[list[tuple[int, str]]]:
    """The section's shell blocks, each a list of (line number, line)."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADING) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## ")) + 1
    return [block for info, block in code_blocks(PAGE) if info == "bash" and start < block[0][0] < end]


def _joined(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines with their continuations joined, comments dropped."""
    from test_docs_commands import _command_lines

    return _command_lines(block)


def _shell(script: str, run_as: str | None, cwd: str) -> subprocess.CompletedProcess:
    cmd = ["bash", "-euc", script]
    if run_as is not None:
        cmd = ["runuser", "-u", run_as, "--", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_the_section_has_the_blocks_the_test_runs():
    blocks = [[text for _, text in _joined(b)] for b in trial_blocks()]
    assert len(blocks) == 4, blocks
    assert any(t.startswith("initdb ") for t in blocks[0]) and any(t.startswith("pg_ctl ") for t in blocks[0])
    assert blocks[1][0].startswith("milvus-server ") and "milvus://127.0.0.1:19530" in blocks[1][1]
    assert all(t.startswith("nobackfill ") for t in blocks[2]) and blocks[2][-1].startswith("nobackfill serve ")
    assert "--uploads" in blocks[2][-1] and blocks[3] == ["pg_ctl -D /tmp/nb-trial/pg stop"]


def test_the_trial_setup_runs_as_written(sandbox, monkeypatch):  # noqa: F811
    if not shutil.which("bash") or not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("Debian's postgresql package is not installed (apt-get install postgresql; .ci/run does)")
    runner = sandbox
    run_as = "nobody" if os.geteuid() == 0 else None
    trial = tempfile.mkdtemp(prefix="nb-trial-", dir="/tmp")
    os.rmdir(trial)  # the page's `mkdir -p` makes it again, as the user who runs the lines
    port = _free_port()

    def fill(text: str) -> str:
        return text.replace(TRIAL_DIR, trial).replace(f"port={PORT}", f"port={port}").replace(f"-p {PORT}", f"-p {port}") \
            .replace(f"127.0.0.1:{PORT}/", f"127.0.0.1:{port}/")

    setup, _milvus_server, commands, stop = trial_blocks()  # the milvus-server block is not run here
    script = "\n".join(fill(t) for _, t in _joined(setup))
    r = _shell(script, run_as, "/tmp")
    try:
        assert r.returncode == 0, f"{PAGE.name}:{setup[0][0]}: the PostgreSQL lines failed\n{r.stdout}\n{r.stderr}"
        Path("keys.toml").write_text('read = ["trial-read-key-0123456789"]\nadmin = ["trial-admin-key-0123456789"]\n')
        served = _run_commands(runner, [DocCommand(PAGE, n, fill(t)) for n, t in _joined(commands)], monkeypatch)
        assert served["status"]["catalog"] == "postgresql" and served["status"]["items"]["image"] == 6
        uploads = Path(trial) / "uploads"
        assert any(p.is_file() for p in uploads.rglob("*")), "the uploaded image is not under --uploads"
    finally:
        stopped = _shell("\n".join(fill(t) for _, t in _joined(stop)), run_as, "/tmp")
        shutil.rmtree(trial, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert "server stopped" in stopped.stdout


def _run_commands(runner, commands: list[DocCommand], monkeypatch) -> dict:
    """The ``nobackfill`` lines in order; ``serve`` hands its app to uvicorn, here FastAPI's test
    client (status, a search, an image uploaded as an item)."""
    import shlex

    import uvicorn
    from fastapi.testclient import TestClient
    from PIL import Image

    from nobackfill import milvus

    served: dict = {}

    def fake_uvicorn_run(served_app, host, port, log_level):
        with TestClient(served_app) as api:
            admin = {"Authorization": "Bearer trial-admin-key-0123456789"}
            served["status"] = api.get("/v1/status", headers=admin).json()
            hits = api.post("/v1/search", json={"text": "a red circle", "k": 3}, headers=admin)
            assert hits.status_code == 200 and len(hits.json()["hits"]) == 3, hits.text
            buf = io.BytesIO()
            Image.new("RGB", (32, 32), (250, 10, 10)).save(buf, "PNG")
            up = api.post("/v1/items", files=[("images", ("new.png", buf.getvalue(), "image/png"))], headers=admin)
            assert up.status_code == 200 and up.json()["added"] == 1, up.text

    monkeypatch.setattr(uvicorn, "run", fake_uvicorn_run)
    try:
        for cmd in commands:
            r = runner.invoke(app, shlex.split(cmd.text)[1:])
            assert r.exit_code == 0, f"{cmd.where}: {cmd.text}\n{r.output}"
            if " status " in cmd.text:
                assert re.search(r"6 images", r.output), r.output
    finally:
        milvus.close_clients()
    assert served, "serve did not run"
    return served
