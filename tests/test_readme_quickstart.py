"""The README's first screen works as written: its `nobackfill` commands run, in order, on a small
folder of the user's kind (images + captions.jsonl, one uncaptioned image)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from nobackfill.cli import app

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart -->\n```bash\n(.*?)```\n<!-- /quickstart -->", text, re.S)
    assert block, "README.md has no quickstart block"
    cmds, line_buf = [], ""
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].rstrip() if not line.lstrip().startswith("{") else ""
        line_buf += line
        if line_buf.endswith("\\"):
            line_buf = line_buf[:-1] + " "
            continue
        if line_buf.strip():
            cmds.append(shlex.split(line_buf))
        line_buf = ""
    return cmds


def test_the_first_screen_runs_as_written(tmp_path, monkeypatch):
    from PIL import Image

    cmds = _quickstart_commands()
    assert cmds[0] == ["make", "demo"] and cmds[1][0] == "source"
    runs = [c for c in cmds if c[0] == "nobackfill"]
    assert len(runs) >= 8 and all(c[1] in ("collection", "verify") for c in runs)
    photos = tmp_path / "my_photos"
    (photos / "images").mkdir(parents=True)
    lines = []
    for k in range(6):
        Image.new("RGB", (64, 64), (200 * (k % 2), 40 * k, 90)).save(photos / "images" / f"p{k}.png")
        if k < 5:
            lines.append(json.dumps({"image": f"images/p{k}.png", "caption": f"a red circle number {k}", "lang": "en"}))
    (photos / "captions.jsonl").write_text("\n".join(lines) + "\n")
    for d in ("models", "upgrades"):
        (tmp_path / d).symlink_to(ROOT / d)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    outputs = []
    for cmd in runs:
        r = runner.invoke(app, cmd[1:])
        assert r.exit_code == 0, f"{' '.join(cmd)} failed:\n{r.output}"
        outputs.append(r.output)
    added = outputs[1]
    assert "6 images" in added and "1 images without captions" in added and "5 texts" in added
    hits = json.loads(next(o for c, o in zip(runs, outputs) if "--json" in c))["hits"]
    assert len(hits) == 3 and {h["route"] for h in hits} == {"native"}
    assert "OK" in outputs[-1]
