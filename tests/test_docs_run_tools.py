"""The rest of README.md and docs/ runs as written: the tour of the CLI, the methods' commands (upgrade,
eval, compat learning, CMLI, RECO, continual languages and their benchmarks), the language guide,
storage, the service and the Milvus + PostgreSQL lines, in order, in a sandbox (the shipped models and
upgrades linked in, a tiny fake Multi30K as ``../shared/data/multi30k``).

Commands are run as written; the only liberties are the placeholders of tests/test_docs_commands.py,
the size options of :data:`SIZES` (appended: click keeps an option's last value), the ``...`` of
:data:`ELLIPSIS` and the addresses of :data:`SERVERS`. The few commands too slow even so, or run with
smaller sizes by a test of their own, are in :data:`REGISTRY`, each with the test that runs the same
subcommand; :func:`test_every_documented_command_is_run_by_a_test` fails when a documented command is
run by no test, and :func:`test_each_registered_test_runs_its_command` when a registered test does not
invoke its command.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import time
import tomllib
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

from test_docs_commands import PLACEHOLDERS, DocCommand, code_blocks, doc_commands, parse
from test_docs_run import TRAINING, _args

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# ----------------------------------------------------------------------------- what is shrunk
#: command (its words after ``nobackfill``) -> arguments appended to it as written; nothing else changes
SIZES: dict[str, list[str]] = {
    "train": ["--steps", "1", "--set", "train.batch_size=8", "--set", "train.warmup=1"],
    "world": ["--n-train", "8", "--n-val", "8", "--n-test", "8", "--workers", "1"],
    "bench encode": ["--n-images", "8", "--n-texts", "16", "--set", "repeats=1"],
    "upgrade xbt": ["--n-pairs", "8", "--corpus-size", "16", "--stage1-steps", "1", "--steps", "1",
                    "--batch-size", "4"],
    "upgrade procrustes": ["--corpus-size", "16"],
    "eval compat": ["--n-unpaired", "50"],
    "bench xbt": ["--n-eval", "8", "--n-pairs", "8", "--threads", "1", "--set", "sweep=[4, 8]",
                  "--set", "corpus_size=16", "--set", "stage1.corpus_size=16", "--set", "stage1.steps=1",
                  "--set", "stage1.batch_size=8", "--set", "stage2.steps=1", "--set", "stage2.batch_size=4",
                  "--set", "n_unpaired=50",
                  "--set", "isolate=false"],  # one process: a child per job would import torch 9 times
    "lingual learn": ["--steps", "2", "--batch-size", "4", "--train-lines", "8"],
    "lingual eval": ["--limit", "8"],
    "bench lingual-text": ["--steps", "1", "--limit", "4", "--methods", "cll_clip", "--set", "langs=['de']",
                           "--set", "train_lines=4", "--set", "cll.batch_size=4",
                           "--set", "cll.task_vocab_size=150"],
    "bench lingual-world": ["--steps", "1", "--limit", "4", "--langs", "de", "--set", "train_images=4",
                            "--set", "cll.batch_size=4"],
    "compat train": ["--epochs", "0", "--train-steps", "2", "--n-render-train", "900", "--n-render-eval", "600",
                     "--n-train-classes", "8"],
    "late train": ["--steps", "2", "--batch-size", "4"],
    "reco train": ["--steps", "2", "--batch-size", "8", "--k", "2"],  # the sandbox world's memory: a few images
    "bench reco": ["--memory-size", "40", "--steps", "2", "--set", "k_sweep=[1, 2]", "--set", "batch_size=8",
                   "--set", "eval_every=2", "--set", "latency_queries=2", "--set", "calibration_scenes=4"],
}
#: a command ending in ``...`` ("plus the required options") -> the options put in its place
ELLIPSIS = {
    "upgrade xbt": "--old models/world-old --new models/world-new --text-corpus data/world --pairs data/world "
                   "--out upgrades/mine",
}
#: the documented server addresses -> the session's servers (tests marked milvus_server)
SERVERS = {"milvus": "127.0.0.1:19530", "postgresql": "postgresql://nb@127.0.0.1:5432/nb"}

# ----------------------------------------------------------------------------- run elsewhere
#: documented commands that another test runs with smaller sizes (through the CLI, exit code checked):
#: too slow here even shrunk (each `train` builds its 20k-scene tokenizer corpus; the Multi30K ones
#: load and fingerprint all-MiniLM-L6-v2, seconds per command, and languages.md repeats methods.md's),
#: or a bench whose own test drives it on a toy config. A key is the command's words, then, where only
#: some of its documented uses are registered, the option that marks them.
REGISTRY: dict[tuple[str, ...], str] = {
    # the shipped checkpoints' own commands (they would overwrite models/): a tiny preset TOML
    ("train", "--threads 1"): "tests/test_cli.py::test_train_takes_config_and_set_and_records_them",
    ("train-text",): "tests/test_xbt_text.py::test_cli_train_text_and_bench_with_eval_dir",
    ("bench", "xbt-text"): "tests/test_xbt_text.py::test_cli_train_text_and_bench_with_eval_dir",
    ("upgrade", "xbt-text"): "tests/test_xbt_text.py::test_cli_upgrade_xbt_text",  # a tiny BERT for MiniLM
    ("bench", "compat-steps"): "tests/test_compat_learning_cli.py::test_bench_compat_steps_cli",
    ("bench", "late"): "tests/test_late_bench.py::test_bench_late_cli_toy",
    ("lingual", "learn", "--data ../shared/data/multi30k"):
        "tests/test_lingual_cli.py::test_cli_learn_then_eval_on_multi30k",  # a tiny BERT for MiniLM
    ("lingual", "eval", "--data ../shared/data/multi30k"):
        "tests/test_lingual_cli.py::test_cli_learn_then_eval_on_multi30k",
    # an export of a copy of a shipped model (the command writes beside the model it names)
    ("export-onnx",): "tests/test_onnx.py::test_the_cli_exports_and_reports",
}
#: docs/serve.md's commands against a running server: every command on a path and on a served collection
SERVED = "tests/test_cli_served.py::test_every_command_on_a_path_and_on_a_server"
#: whole pages (or parts) whose commands other docs-run tests run as written
QUICKSTART = "tests/test_readme_quickstart.py::test_the_first_screen_runs_as_written"
COLLECTION_GUIDES = "tests/test_docs_run.py::test_the_collection_guides_run_as_written"
IMPORT_GUIDE = "tests/test_docs_run.py::test_the_import_guide_runs_as_written"
TRIAL = "tests/test_docs_trial.py::test_the_trial_setup_runs_as_written"  # docs/milvus.md's PostgreSQL trial
HERE = "tests/test_docs_run_tools.py::"


def _words(cmd: DocCommand) -> tuple[str, ...]:
    """The command's subcommand words (``("bench", "xbt")``), from the CLI's own command tree."""
    args = [a for a in _args(_first_alternative(cmd.text), _ANY) if a != PLACEHOLDERS["ellipsis"]]
    return tuple(parse(args, elided=True)[1:])


class _Anything(dict):
    def __missing__(self, key):
        return "PLACEHOLDER"


_ANY = _Anything()


def _first_alternative(text: str) -> str:
    """``[--rerank-weight 1.0 | inf]`` -> ``[--rerank-weight 1.0]``: an optional value's first choice."""
    return re.sub(r"\[(--[^\[\]|\n]+?)\s*\|[^\[\]\n]*\]", r"[\1]", text)


@functools.cache
def _quickstart_texts() -> frozenset[str]:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start, end = lines.index("<!-- quickstart -->") + 1, lines.index("<!-- /quickstart -->") + 1
    return frozenset(c.text for c in doc_commands([ROOT / "README.md"]) if start < c.line < end)


def who_runs(cmd: DocCommand) -> str | None:
    """The test that runs a documented command (with smaller sizes), or None."""
    page = cmd.path.relative_to(ROOT).as_posix()
    words = _words(cmd)
    for key, test in REGISTRY.items():
        if words == _key_words(key) and all(k in cmd.text for k in key if k.startswith("--")):
            return test
    if "milvus://" in cmd.text:
        return HERE + "test_the_milvus_and_postgresql_lines_run_as_written"
    if page == "docs/serve.md" and "http://127.0.0.1:8000" in cmd.text:
        return SERVED
    if page == "docs/milvus.md":
        return TRIAL
    if page in ("README.md", "docs/index.md") and cmd.text in _quickstart_texts():
        return QUICKSTART  # docs/index.md's copy: tests/test_docs_commands.py checks it is the README's
    if page in ("docs/own-data.md", "docs/upgrade.md") or (page == "docs/guide.md" and words not in TRAINING):
        return COLLECTION_GUIDES
    if page == "docs/import.md":
        return IMPORT_GUIDE
    if words == ("serve",):
        return HERE + "test_serve_runs_as_written"
    test = PAGES_HERE.get(page)
    return HERE + test if test else None


#: the pages (what is left of them) this file runs
PAGES_HERE = {"README.md": "test_the_tour_runs_as_written", "docs/index.md": "test_the_tour_runs_as_written",
              "docs/guide.md": "test_the_guides_upgrade_xbt_config_runs_as_written",
              "docs/methods.md": "test_the_methods_run_as_written",
              "docs/languages.md": "test_the_language_guide_runs_as_written",
              "docs/storage.md": "test_the_storage_guide_runs_as_written"}


def _key_words(key: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in key if not k.startswith("--"))


def _mine(test: str, *pages: str) -> list[DocCommand]:
    """The commands of ``pages``, in order, that this file's ``test`` runs."""
    return [c for c in doc_commands([ROOT / p for p in pages]) if who_runs(c) == HERE + test]


# ----------------------------------------------------------------------------- the sandbox
def _fake_multi30k(root: Path) -> None:
    """Task 2 (caption pairs) and task 1 (translations en/de/fr/cs: train, val, test_2016_flickr)."""
    from _fake_multi30k import caption, fake_multi30k, write_gz

    fake_multi30k(root, n_train=24, n_val=8)
    for split, n in (("train", 24), ("val", 8), ("test_2016_flickr", 8)):
        for lang in ("en", "de", "fr", "cs"):
            write_gz(root / "task1" / "raw" / f"{split}.{lang}.gz", [f"{lang} {caption(i, 1)}" for i in range(n)])


def _shipped() -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for d in ("models", "upgrades") for p in sorted((ROOT / d).rglob("*"))}


class Sandbox:
    """The reader's working directory: ``run`` a documented command, as written plus its sizes."""

    def __init__(self, work: Path):
        self.work, self.runner, self.ran = work, CliRunner(), []

    def link_shipped(self, commands: list[DocCommand]) -> None:
        """``models/`` and ``upgrades/`` hold links to the shipped ones, except what a command writes
        (``--out models/X``): never the repository's copy."""
        outputs = set()
        for c in commands:
            args = shlex.split(_first_alternative(c.text))
            outputs |= {Path(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--out"}
        for d in ("models", "upgrades"):
            (self.work / d).mkdir(exist_ok=True)
            for e in (ROOT / d).iterdir():
                if Path(d) / e.name not in outputs and not (self.work / d / e.name).exists():
                    (self.work / d / e.name).symlink_to(e)

    def run(self, cmd: DocCommand | str, filled: dict[str, str] | None = None, sizes: bool = True):
        cmd = cmd if isinstance(cmd, DocCommand) else DocCommand(ROOT, 0, cmd)
        args = _args(_first_alternative(cmd.text), filled or {})
        words = _words(cmd)
        if PLACEHOLDERS["ellipsis"] in args:
            i = args.index(PLACEHOLDERS["ellipsis"])
            args[i:i + 1] = shlex.split(ELLIPSIS[" ".join(words)])
        sizes = sizes and "--show-config" not in args  # it prints the config and runs nothing
        t0 = time.time()
        r = self.runner.invoke(app, args + (SIZES.get(" ".join(words), []) if sizes else []))
        if os.environ.get("DOCS_RUN_TIMES"):  # DOCS_RUN_TIMES=1 pytest -s: each command's seconds
            print(f"{time.time() - t0:6.2f}s {cmd.text[:110]}")
        where = cmd.where if cmd.line else "precondition"
        assert r.exit_code == 0, f"{where}: {cmd.text}\n{r.output}"
        _check_output(words, args, r)
        self.ran.append(cmd.text)
        return r


def _check_output(words: tuple[str, ...], args: list[str], r) -> None:
    """What a command leaves: its --out (a JSON file with the expected key, or a non-empty folder),
    else what it printed."""
    out = Path(args[args.index("--out") + 1]) if "--out" in args and "--show-config" not in args else None
    if out is not None and out.suffix == ".json":
        data = json.loads(out.read_text())
        key = EXPECT_KEY.get(" ".join(words))
        assert data and (key is None or key in data), (words, sorted(data))
    elif out is not None:
        assert out.is_dir() and any(out.iterdir()), out
    else:
        assert r.output.strip(), words
    text = EXPECT_TEXT.get(" ".join(words))
    assert text is None or text in r.output, (words, r.output[-2000:])


#: a key of the JSON a command writes with --out FILE.json
EXPECT_KEY = {"eval retrieval": "t2i", "eval compat": "gap_closure", "bench encode": "models", "bench xbt": "rows",
              "bench reco": "zero_shot", "bench lingual-text": "methods", "bench lingual-world": "methods"}
#: a piece of what a command prints
EXPECT_TEXT = {"index": "gallery ", "search": "top ", "compat methods": "bct", "lingual eval": "R@1",
               "demo": "old/old", "collection upgrade": "current model is now", "collection create": "photos"}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    work = tmp_path / "work"  # ../shared is the Multi30K root the docs name: a tiny fake one
    work.mkdir()
    _fake_multi30k(tmp_path / "shared" / "data" / "multi30k")
    monkeypatch.setenv("NOBACKFILL_SHARED", str(tmp_path / "shared"))
    monkeypatch.chdir(work)
    before = _shipped()
    yield Sandbox(work)
    assert _shipped() == before, "a command wrote into the repository's models/ or upgrades/"


# ----------------------------------------------------------------------------- the docs, run
#: what the reader has before a page's commands (README's tour: data/world and galleries/g)
WORLD = "nobackfill world --out data/world"
GALLERY = "nobackfill index --model models/world-old --data data/world --split test --out galleries/g"


def test_the_tour_runs_as_written(sandbox):
    """README's tour and its shipped-checkpoints block (docs/index.md's tour is the same commands),
    in order: a world, a model trained into its own folder, an index, searches, eval, the demo (on
    the shipped models, which the tour leaves alone), the encoding benchmark."""
    cmds = _mine("test_the_tour_runs_as_written", "README.md", "docs/index.md")
    sandbox.link_shipped(cmds)
    for c in cmds:
        if c.text not in sandbox.ran:
            sandbox.run(c)
    assert {c.text for c in cmds if c.path.name == "index.md"} <= set(sandbox.ran)
    assert len(sandbox.ran) >= 8, sandbox.ran
    assert json.loads(Path("runs/eval.json").read_text())["gallery_model"] == "models/world-old"
    assert (Path("models/my-world-new") / "recipe.json").is_file()
    demo = json.loads(Path("runs/demo/report.json").read_text())
    assert {"old_old", "new_new", "new_old_raw", "xbt"} <= set(demo) and Path("runs/demo/report.html").is_file()
    assert Path("benchmarks/results/encode.md").is_file()


def test_the_methods_run_as_written(sandbox):
    """docs/methods.md in order: XBT (upgrade, search and eval through it, Procrustes, its bench),
    continual languages on the world and their benches, compatibility learning, CMLI (tokens,
    re-ranking, training), RECO (memory, training, search, eval, bench)."""
    cmds = _mine("test_the_methods_run_as_written", "docs/methods.md")
    sandbox.link_shipped(cmds)
    sandbox.run(WORLD)
    sandbox.run(GALLERY)
    for c in cmds:
        sandbox.run(c)
    assert len(cmds) >= 18, [c.where for c in cmds]
    up = json.loads(Path("upgrades/world-old-to-new/upgrade.json").read_text())
    assert up["kind"] == "xbt" and not Path("upgrades/world-old-to-new").is_symlink()
    assert json.loads(Path("runs/world-de/lingual.json").read_text())["learned"] == ["en", "de"]
    assert json.loads(Path("runs/compat/bct/result.json").read_text())["method"] == "bct"
    assert Path("runs/reco/model/reco.json").is_file() and Path("runs/reco/memory/memory.json").is_file()


def test_the_language_guide_runs_as_written(sandbox):
    """docs/languages.md: the world model learns German and is evaluated (the MiniLM / Multi30K lines
    are registered), then the quick start's collection is upgraded to the learned model and
    backfilled."""
    cmds = _mine("test_the_language_guide_runs_as_written", "docs/languages.md")
    sandbox.link_shipped(cmds)
    sandbox.run(WORLD)
    sandbox.run("nobackfill collection create photos --model models/world-old")  # the quick start's collection
    sandbox.run("nobackfill collection add photos --data data/world --split test")
    for c in cmds:
        sandbox.run(c)
    st = json.loads(sandbox.runner.invoke(app, ["collection", "status", "photos", "--json"]).stdout)
    assert st["spaces"][st["current"]]["model"].endswith("runs/world-de"), st["spaces"]
    assert st["backfill"]["done"] == st["backfill"]["total"] > 0


def test_the_storage_guide_runs_as_written(sandbox):
    """docs/storage.md's local line (the Milvus + PostgreSQL one needs the servers: below)."""
    cmds = _mine("test_the_storage_guide_runs_as_written", "docs/storage.md")
    sandbox.link_shipped(cmds)
    sandbox.run(WORLD)
    for c in cmds:
        sandbox.run(c)
    sandbox.run("nobackfill collection add photos --data data/world --split test")
    st = json.loads(sandbox.runner.invoke(app, ["collection", "status", "photos", "--json"]).stdout)
    assert st["spaces"][st["current"]]["index"]["image"]["backend"] == "HNSW32:efSearch=64", st["spaces"]


def test_the_guides_upgrade_xbt_config_runs_as_written(sandbox):
    """docs/guide.md's configuration example: --show-config, then my.toml (written by the page's
    heredoc) with --set on top."""
    cmds = _mine("test_the_guides_upgrade_xbt_config_runs_as_written", "docs/guide.md")
    assert [_words(c) for c in cmds] == [("upgrade", "xbt"), ("upgrade", "xbt")]
    sandbox.link_shipped(cmds)
    sandbox.run(WORLD)
    heredoc = next(re.search(r"cat > my\.toml <<'TOML'\n(.*?\n)TOML\n", "\n".join(line for _, line in block) + "\n",
                             re.S) for _, block in code_blocks(DOCS / "guide.md")
                   if any("<<'TOML'" in line for _, line in block))
    Path("my.toml").write_text(heredoc.group(1))
    shown = json.loads(sandbox.run(cmds[0]).stdout)
    assert {"n_pairs", "stage1", "stage2"} <= set(shown), shown
    sandbox.run(cmds[1])
    recipe = json.loads(Path("upgrades/mine/upgrade.json").read_text())["recipe"]
    assert "--config my.toml" in recipe["command"] and "--set stage2.lr=1e-4" in recipe["command"]


def test_serve_runs_as_written(sandbox, monkeypatch):
    """docs/serve.md's and docs/index.md's `serve` lines, with docs/serve.md's keys.toml, on the quick
    start's collection: the command builds its app and hands it to uvicorn, which here is FastAPI's
    test client (healthz, status, a search with the documented read key)."""
    import uvicorn
    from fastapi.testclient import TestClient

    cmds = _mine("test_serve_runs_as_written", "docs/serve.md", "docs/index.md")
    assert len(cmds) == 2
    sandbox.link_shipped(cmds)
    keys = next("\n".join(line for _, line in block) for info, block in code_blocks(DOCS / "serve.md")
                if info == "toml" and any("keys.toml" in line for _, line in block))
    Path("keys.toml").write_text(keys + "\n")
    read_key = tomllib.loads(keys)["read"][0]
    sandbox.run(WORLD)
    for c in ("nobackfill collection create photos --model models/world-old",
              "nobackfill collection add photos --data data/world --split test",
              "nobackfill collection upgrade photos --model models/world-new --bridge upgrades/world-old-to-new"):
        sandbox.run(c)
    served = []

    def fake_uvicorn_run(served_app, host, port, log_level):
        client = served_app.state.service.client
        try:
            with TestClient(served_app) as api:
                auth = {"Authorization": f"Bearer {read_key}"}
                for _ in range(600):  # --backfill: the server's own worker moves every item
                    st = api.get("/v1/status", headers=auth)
                    assert st.status_code == 200, st.text
                    if st.json()["backfill"]["worker"] == "idle":
                        break
                    time.sleep(0.05)
                assert api.get("/healthz").json()["ok"]
                assert api.get("/v1/status").status_code == 401
                hits = api.post("/v1/search", json={"text": "a red circle", "k": 3}, headers=auth)
                assert hits.status_code == 200, hits.text
                served.append((host, port, st.json(), hits.json()))
        finally:  # no worker may outlive the sandbox (its paths are relative to it)
            client.close()  # stops its backfill worker, if one runs

    monkeypatch.setattr(uvicorn, "run", fake_uvicorn_run)
    for c in cmds:
        r = sandbox.run(c)
        assert "serving photos on http://127.0.0.1:8000/" in r.output
    assert len(served) == 2 and all(len(hits["hits"]) == 3 for *_, hits in served)
    (host, port, status, _), (*_, status2, _) = served
    assert (host, port) == ("127.0.0.1", 8000) and status["items"]["image"] == 8
    assert status["backfill"]["done"] == status["backfill"]["total"] > 0, status
    assert not status["backfill"].get("error"), status
    assert status2["backfill"]["done"] == status2["backfill"]["total"]


MILVUS_LINES = _mine("test_the_milvus_and_postgresql_lines_run_as_written", "docs/storage.md", "docs/import.md",
                     "docs/milvus.md")


@pytest.mark.milvus_server
@pytest.mark.parametrize("cmd", MILVUS_LINES, ids=[c.where for c in MILVUS_LINES])
def test_the_milvus_and_postgresql_lines_run_as_written(sandbox, milvus_server, postgres_db, cmd):
    """docs/storage.md's, docs/import.md's and docs/milvus.md's Milvus lines on the session's Milvus server and a fresh
    PostgreSQL database each (:data:`SERVERS`; the collection names made unique on the shared
    server): a collection created, and a user's Milvus collection of world-old image vectors
    (``products``: pk, embedding, image_path) adopted in place."""
    from nobackfill.encoders import load_encoder
    from nobackfill import milvus

    from test_milvus_adopt import _client, _fingerprint, _user_collection

    assert len(MILVUS_LINES) == 3, [c.where for c in MILVUS_LINES]
    sandbox.link_shipped([cmd])
    sandbox.run(WORLD)
    tag = uuid.uuid4().hex[:8]
    products = f"products{tag}"
    images = sorted(str(p.absolute()) for p in Path("data/world/test/images").glob("*.png"))
    client = _client(f"milvus://{milvus_server}#x")
    if "#products" in cmd.text:
        vecs = load_encoder(Path("models/world-old")).encode_images([Path(p) for p in images])
        _user_collection(client, products, vecs, images, index="IVF_FLAT", metric="COSINE", params={"nlist": 4})
        before = _fingerprint(client, products)
    text = (cmd.text.replace(SERVERS["milvus"], milvus_server).replace(SERVERS["postgresql"], postgres_db)
            .replace("#photos", f"#photos{tag}").replace("#products", f"#{products}"))
    try:
        sandbox.run(DocCommand(cmd.path, cmd.line, text))
        uri = shlex.split(text)[3]
        r = sandbox.runner.invoke(app, ["collection", "status", uri, "--json"])
        assert r.exit_code == 0, r.output
        st = json.loads(r.stdout)
        assert st["catalog"] == "postgresql", st
        if "#products" in cmd.text:
            assert st["items"]["image"] == len(images) and _fingerprint(client, products) == before, st
    finally:
        if client.has_collection(products):
            client.drop_collection(products)
        milvus.close_clients()


# ----------------------------------------------------------------------------- coverage
COMMANDS = doc_commands()


def test_every_documented_command_is_run_by_a_test():
    """Every ``nobackfill`` command of README.md and docs/ is run by a docs-run test, or is in
    :data:`REGISTRY` with the test that runs its subcommand with smaller sizes."""
    missing = [f"{c.where}: {c.text}" for c in COMMANDS if who_runs(c) is None]
    assert not missing, "documented commands no test runs:\n" + "\n".join(missing)
    assert {who_runs(c) for c in COMMANDS} >= set(REGISTRY.values())  # no stale entry
    here = {who_runs(c).split("::")[1] for c in COMMANDS if who_runs(c).startswith(HERE)}
    assert here == {n for n in globals() if n.startswith("test_") and n.endswith("_as_written")}


def _invokes(tree: ast.AST, words: tuple[str, ...]) -> bool:
    """Whether ``tree`` calls the CLI with ``words`` as its first arguments: ``invoke("bench", "late",
    ...)`` or ``runner.invoke(app, ["bench", "late", ...])``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if "invoke" not in name and name != "ok":
            continue
        for seq in [node.args, *[a.elts for a in node.args if isinstance(a, (ast.List, ast.Tuple))]]:
            consts = [a.value if isinstance(a, ast.Constant) else None for a in seq]
            if any(tuple(consts[i:i + len(words)]) == words for i in range(len(consts))):
                return True
    return False


@pytest.mark.parametrize("key", list(REGISTRY), ids=[" ".join(k) for k in REGISTRY])
def test_each_registered_test_runs_its_command(key):
    """The registered test exists and invokes the command through the CLI (in its body or in a
    fixture of its module that it takes)."""
    words = _key_words(key)
    path, name = REGISTRY[key].split("::")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    assert name in funcs, f"{REGISTRY[key]}: no such test"
    seen, todo = set(), [name]
    while todo:  # the test, and the fixtures of its module it takes (transitively)
        f = funcs[todo.pop()]
        seen.add(f.name)
        todo += [a.arg for a in f.args.args if a.arg in funcs and a.arg not in seen]
    assert any(_invokes(funcs[n], words) for n in seen), \
        f"{REGISTRY[key]} does not invoke `nobackfill {' '.join(words)}`"


def test_the_registry_check_can_fail():
    assert not _invokes(ast.parse("invoke('bench', 'xbt', '--quick')"), ("bench", "late"))
    assert _invokes(ast.parse("r = runner.invoke(app, ['bench', 'late', '--quick'])"), ("bench", "late"))
    assert not _invokes(ast.parse("x = ['bench', 'late']"), ("bench", "late"))
    page = DocCommand(DOCS / "new-page.md", 1, "nobackfill bench xbt --quick")
    assert who_runs(page) is None
