"""The command line as the tests drive it: ``invoke`` through typer's runner, a world folder and a
collection of it built with the CLI's own commands (a failing step fails the fixture with its output)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from nobackfill.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(*args):
    """``invoke(*args)``, which must exit 0."""
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    return r


def world_collection(root: Path, name: str, model: Path, *, n_train: int, n_val: int, n_test: int,
                     langs: str = "en", add_langs: str = "en"):
    """``root/world`` (a small world) and the collection ``root/name`` of ``model`` holding its test
    split; returns the result of ``collection add``."""
    ok("world", "--out", root / "world", "--n-train", n_train, "--n-val", n_val, "--n-test", n_test, "--workers", 1,
       "--langs", langs)
    ok("collection", "create", root / name, "--model", model)
    return ok("collection", "add", root / name, "--data", root / "world", "--split", "test", "--langs", add_langs)


def error_line(r) -> str:
    """The one line a refused command prints (exit 2)."""
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def tiny_en_de_world(root: Path) -> Path:
    """A tiny world with English and German captions at ``root/w`` (12 / 6 / 6 scenes)."""
    from nobackfill.data.world import WorldSpec, generate_world

    return generate_world(root / "w", WorldSpec(seed=3, n_train=12, n_val=6, n_test=6, langs=("en", "de")),
                          workers=1, progress=False)
