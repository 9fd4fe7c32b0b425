"""End-to-end through the public CLI: world -> train -> index -> search -> eval -> demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nobackfill.cli import app

from _cli_helpers import world_collection
from conftest import tiny_preset



runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    r = invoke("world", "--out", root / "world", "--n-train", 40, "--n-val", 20, "--n-test", 30, "--workers", 1)
    assert r.exit_code == 0, r.output
    for name, dim in (("world-old", 32), ("world-new", 48)):
        preset = root / f"{name}.toml"
        preset.write_text(tiny_preset(dim=dim, steps=6))
        r = invoke("train", "--preset", preset, "--data", root / "world", "--out", root / "models" / name)
        assert r.exit_code == 0, r.output
    r = invoke("index", "--model", root / "models" / "world-old", "--data", root / "world", "--out", root / "g")
    assert r.exit_code == 0, r.output
    return root


def test_world_layout(setup):
    world = setup / "world"
    assert (world / "world.json").is_file()
    for split, n in (("train", 40), ("val", 20), ("test", 30)):
        assert len(list((world / split / "images").glob("*.png"))) == n


def test_train_writes_recipe_and_model(setup):
    recipe = json.loads((setup / "models" / "world-old" / "recipe.json").read_text())
    assert recipe["command"].startswith("nobackfill train")
    assert recipe["loop"]["steps"] == 6
    assert (setup / "models" / "world-old" / "model.safetensors").is_file()


def test_train_takes_config_and_set_and_records_them(setup, tmp_path):
    preset = setup / "world-old.toml"
    extra = tmp_path / "more.toml"
    extra.write_text("[train]\nsteps = 3\n")
    out = tmp_path / "m"
    r = invoke("train", "--preset", preset, "--data", setup / "world", "--out", out, "--config", extra,
               "--set", "train.batch_size=8", "--set", "train.lr=2e-3")
    assert r.exit_code == 0, r.output
    recipe = json.loads((out / "recipe.json").read_text())
    assert (recipe["loop"]["steps"], recipe["train"]["batch_size"], recipe["loop"]["lr"]) == (3, 8, 2e-3)
    assert f"--config {extra}" in recipe["command"] and "--set train.batch_size=8" in recipe["command"]


def test_train_takes_its_checkpoint_interval_and_records_it(setup, tmp_path):
    """trial V: the first checkpoint of a resumable run came at step 250, and nothing changed that."""
    out = tmp_path / "m"
    r = invoke("train", "--preset", setup / "world-old.toml", "--data", setup / "world", "--out", out, "--steps", 4,
               "--checkpoint-every", 2)
    assert r.exit_code == 0, r.output
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["loop"]["checkpoint_every"] == 2 and "--checkpoint-every 2" in recipe["command"]
    r = invoke("train", "--preset", setup / "world-old.toml", "--data", setup / "world", "--out", tmp_path / "n",
               "--checkpoint-every", 0)
    assert r.exit_code == 2 and "--checkpoint-every must be >= 1, got 0" in r.output and not (tmp_path / "n").exists()


def test_a_recipe_records_a_relative_data_folder_as_an_absolute_path_and_where_it_ran(setup, tmp_path, monkeypatch):
    """The recorded command line runs again from anywhere: --data world is recorded with its cwd."""
    monkeypatch.chdir(setup)
    out = tmp_path / "m"
    r = invoke("train", "--preset", "world-old.toml", "--data", "world", "--out", out, "--steps", 2)
    assert r.exit_code == 0, r.output
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["data"] == str((setup / "world").resolve()) and recipe["cwd"] == str(setup)
    assert "--data world" in recipe["command"]


def test_search_text_and_image_json(setup):
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-old",
               "--text", "a red circle", "--k", 3, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["modality"] == "image" and len(out["hits"]) == 3
    assert [h["rank"] for h in out["hits"]] == [1, 2, 3]
    img = setup / "world" / "test" / "images" / "000001.png"
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-old", "--image", img, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["modality"] == "text"


def test_search_from_other_space_is_refused(setup):
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-new", "--text", "a red circle")
    assert r.exit_code == 2
    assert "space" in r.output.lower()


def test_search_needs_exactly_one_query(setup):
    r = invoke("search", "--gallery", setup / "g", "--model", setup / "models" / "world-old")
    assert r.exit_code == 2


def test_index_is_resumable_without_duplicates(setup):
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", setup / "world", "--out", setup / "g")
    assert r.exit_code == 0, r.output
    from nobackfill.gallery import Gallery

    g = Gallery.open(setup / "g")
    assert g.count("image") == 30
    assert len(set(g.ids("text"))) == g.count("text") == 30 * 2 * 7  # 2 captions per image and language


def test_index_refuses_a_folder_before_it_reads_the_data_and_leaves_it_as_it_was(setup, tmp_path):
    """trial Y: `index --out` a model's folder read (and tokenized) every caption before refusing,
    and left .lock / .ingest-lock files in the folder; a gallery of another model too."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(setup / "models" / "world-old", model)
    before = sorted(p.name for p in model.iterdir())
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", setup / "world", "--out", model)
    assert r.exit_code == 2 and "is not empty and not a gallery (found config.json" in r.output, r.output
    assert sorted(p.name for p in model.iterdir()) == before  # no lock files left
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", tmp_path / "no-data", "--out",
               model / "model.safetensors" / "g")  # under a file: said before the (missing) data is read
    assert r.exit_code == 2 and "model.safetensors is a file, not a folder" in r.output, r.output
    other = invoke("index", "--model", setup / "models" / "world-new", "--data", setup / "world", "--out",
                   setup / "g")  # the gallery of world-old's space: refused naming both spaces, nothing read
    assert other.exit_code == 2 and "space" in other.output and "Traceback" not in other.output, other.output


def test_eval_retrieval_json(setup, tmp_path):
    out = tmp_path / "e.json"
    r = invoke("eval", "retrieval", "--query-model", setup / "models" / "world-new", "--gallery-model",
               setup / "models" / "world-old", "--data", setup / "world", "--json", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert set(res["t2i"]) >= {"R@1", "R@5", "R@10", "median_rank", "mAP"}
    assert res["n_images"] == 30 and "note" in res  # different widths: the raw comparison


def test_bad_data_folder_error_names_the_file(setup, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "captions.jsonl").write_text('{"image": "images/x.png", "caption": "a", "lang": "en"}\n{oops\n')
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", bad, "--out", tmp_path / "g2")
    assert r.exit_code == 2
    assert "captions.jsonl" in r.output and "line" in r.output


def test_error_paths_stay_whole_and_literal_on_a_narrow_terminal(setup, tmp_path, monkeypatch):
    """Errors are never wrapped (CI's terminal is 80 columns) and "[...]" in a path is not rich markup."""
    from nobackfill.cli import _common

    monkeypatch.setattr(_common.console, "_width", 30)
    bad = tmp_path / "a_rather_long_folder_name_[v2]_that_will_not_fit_in_thirty_columns"
    bad.mkdir()
    (bad / "captions.jsonl").write_text('{oops\n')
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", bad, "--out", tmp_path / "g3")
    assert r.exit_code == 2
    assert str(bad / "captions.jsonl") in r.output


def test_demo_json_keys(setup, tmp_path):
    out = tmp_path / "demo.json"
    r = invoke("demo", "--world", setup / "world", "--models", setup / "models", "--out", tmp_path / "demo",
               "--json", out)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    for key in ("old_old", "new_new", "new_old_raw"):
        for d in ("t2i", "i2t"):
            assert set(res[key][d]) >= {"R@1", "R@5", "R@10"}
            assert 0.0 <= res[key][d]["R@1"] <= 1.0
    assert res["n_images"] == 30
    page = (tmp_path / "demo" / "report.html").read_text()
    # the retrieval plot and the live upgrade without a bridge (the one with XBT needs a val split: none here)
    assert page.count("<img") == 2 and "Live upgrade without a bridge" in page and "live_upgrade" not in res
    assert res["live_upgrade_fitted"]


def test_demo_prints_its_results_on_stdout_and_its_progress_on_stderr(setup, tmp_path):
    """trial V: every line of the demo, its table included, went to stderr."""
    r = invoke("demo", "--world", setup / "world", "--models", setup / "models", "--out", tmp_path / "demo")
    assert r.exit_code == 0, r.output
    assert "old/old" in r.stdout and "live upgrade without a bridge, R@1 served" in r.stdout
    assert "report:" in r.stdout and "loading world-old" not in r.stdout
    assert "loading world-old" in r.stderr and "t2i R@5" not in r.stderr


def test_importing_the_cli_and_compat_package_loads_no_heavy_library():
    """Every command starts fast: the CLI and ``nobackfill.compat`` (lazy exports) import no torch,
    transformers or peft until a command needs them; a lazy name still resolves on first use."""
    import subprocess
    import sys

    code = ("import sys, nobackfill.cli, nobackfill.compat as c\n"
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))\n"
            "print(c.Projection.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "nobackfill.compat.phi"


# --- a small real collection (the shipped world-old model): cold commands, whole ids ----------------

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(scope="module")
def small_coll(tmp_path_factory):
    """A collection of the shipped world-old model holding 6 world images and their English captions."""
    root = tmp_path_factory.mktemp("small-coll")
    world_collection(root, "c", MODELS / "world-old", n_train=2, n_val=2, n_test=6)
    return root / "c"


def _copy(coll: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(coll, tmp_path / "c"))


def _hit_ids(*args: str) -> list[str]:
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    return [h["id"] for h in json.loads(r.stdout)["hits"]]


def test_commands_that_embed_nothing_import_no_torch(small_coll, tmp_path):
    """`collection status`, `verify`, `collection delete` and every --help run in a fresh process
    without importing torch, transformers or peft (they cost seconds of start-up)."""
    import subprocess
    import sys

    coll = _copy(small_coll, tmp_path)
    victim = _hit_ids("collection", "search", coll, "--text", "a red circle", "--k", 1)[0]
    runs = [["--help"], ["collection", "--help"], ["collection", "search", "--help"], ["verify", "--help"],
            ["collection", "status", str(coll)], ["collection", "status", str(coll), "--json"],
            ["verify", str(coll)], ["verify", str(coll), "--json"],
            ["collection", "delete", str(coll), "--id", victim]]
    code = ("import json, sys\n"
            "from typer.testing import CliRunner\n"
            "from nobackfill.cli import app\n"
            f"runs = json.loads({json.dumps(json.dumps(runs))})\n"
            "results = [CliRunner().invoke(app, args) for args in runs]\n"
            "print(json.dumps({'codes': [r.exit_code for r in results], 'outputs': [r.output for r in results],\n"
            "                  'heavy': sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', "
            "'peft'})}))\n")
    res = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert res["codes"] == [0] * len(runs), res["outputs"]
    assert "deleted 1 item(s)" in res["outputs"][-1]
    assert res["heavy"] == []


def _table_ids(output: str) -> list[str]:
    """The id column of a results table."""
    return [line.split("│")[3].strip() for line in output.splitlines()
            if line.startswith("│") and line.split("│")[1].strip().isdigit()]


@pytest.mark.parametrize("columns", ["60", "40"])
def test_results_table_prints_whole_ids_that_delete_takes(small_coll, tmp_path, columns):
    """At any terminal width the table's ids are whole (not cut with "…"), and `collection delete --id`
    takes an id copied from it; the gallery `search` prints the same table."""
    coll = _copy(small_coll, tmp_path)
    query = ("--text", "a red circle", "--k", "4")
    want = _hit_ids("collection", "search", coll, *query)
    r = runner.invoke(app, ["collection", "search", str(coll), *query], env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output
    assert _table_ids(r.stdout) == want and "…" not in "".join(_table_ids(r.stdout))
    r = runner.invoke(app, ["search", "--gallery", str(coll), "--model", str(MODELS / "world-old"), *query],
                      env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output
    assert _table_ids(r.stdout) == want
    r = invoke("collection", "delete", coll, "--id", _table_ids(r.stdout)[0])
    assert r.exit_code == 0 and "deleted 1 item(s)" in r.output, r.output
    assert want[0] not in _hit_ids("collection", "search", coll, *query)


def test_results_table_shows_each_image_path_whole_at_80_columns(small_coll, tmp_path):
    """The item column wraps a long path rather than cutting its file name off with "…"."""
    coll = _copy(small_coll, tmp_path)
    query = ("--text", "a red circle", "--k", "3")
    r = invoke("collection", "search", coll, *query, "--json")
    want = [h["metadata"]["path"] for h in json.loads(r.stdout)["hits"]]
    r = runner.invoke(app, ["collection", "search", str(coll), *query], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    cells: list[str] = []
    for line in r.stdout.splitlines():
        parts = line.split("│")
        if line.startswith("│") and len(parts) > 6:
            if parts[1].strip().isdigit():
                cells.append("")
            cells[-1] += parts[6].strip()
    assert cells == want and "…" not in r.stdout, r.stdout


def test_results_table_prints_captions_as_written(small_coll, tmp_path):
    """A caption holding "[...]" is text, not rich markup, in the table."""
    coll = _copy(small_coll, tmp_path)
    texts = tmp_path / "t.txt"
    texts.write_text("a [red] circle on [bold]gray\n")
    r = invoke("collection", "add", coll, "--texts", texts)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["collection", "search", str(coll), "--text", "a [red] circle on [bold]gray", "--k", "1",
                            "--target", "text"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "a [red] circle on [bold]gray" in r.stdout and "for a [red] circle on [bold]gray" in r.stdout


# --- help texts render as written ------------------------------------------------------------------

def _help_pages():
    """(command path, its help texts as written in the source, its subcommands' first paragraphs) for
    the app and every group and command under it, read from typer's registrations (not the rendered
    click tree)."""
    import inspect

    from typer.models import DefaultPlaceholder, ParameterInfo

    def param_helps(callback):
        if callback is None or isinstance(callback, DefaultPlaceholder):
            return []
        return [p.default.help for p in inspect.signature(callback).parameters.values()
                if isinstance(p.default, ParameterInfo) and p.default.help and not getattr(p.default, "hidden", False)]

    def group(typer_app, path, help_):
        subs, pages = [], []
        for info in typer_app.registered_commands:
            name = info.name or info.callback.__name__.replace("_", "-")
            doc = info.help or inspect.getdoc(info.callback) or ""
            subs.append(doc.split("\n\n")[0])
            pages.append((path + (name,), [doc] + param_helps(info.callback), []))
        for info in typer_app.registered_groups:
            sub = info.typer_instance
            doc = info.help if isinstance(info.help, str) else sub.info.help
            doc = doc if isinstance(doc, str) else ""
            subs.append(doc.split("\n\n")[0])
            pages += group(sub, path + (info.name,), doc)
        cb = typer_app.registered_callback
        return [(path, [help_] + param_helps(cb.callback if cb else None), subs)] + pages

    from nobackfill.cli import app as root

    return group(root, (), root.info.help)


def test_every_help_text_renders_as_written():
    """`--help` of every command and group shows its help texts word for word at 80 columns: no
    "[model]" eaten as rich markup, no word cut with "…", and each subcommand's summary in its group."""
    import re

    pages = _help_pages()
    assert len(pages) > 40
    bad = []
    for path, texts, subs in pages:
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
        assert r.exit_code == 0, (path, r.output)
        words = set(r.stdout.split())
        for text in texts + subs:
            for word in text.split():
                if word not in words:
                    bad.append((" ".join(path), word))
            for bracketed in re.findall(r"\[[^\]\s]*\]", text):
                if bracketed not in r.stdout:
                    bad.append((" ".join(path), bracketed))
    assert not bad, bad


@pytest.mark.parametrize("captions", [True, False])
def test_index_reads_a_folder_as_collection_add_does(setup, tmp_path, captions):
    """Images no caption mentions are indexed, and a folder without captions.jsonl is its images:
    the gallery holds the items `collection add` adds from the same folder, under the same ids."""
    from _collection_helpers import make_folder
    from nobackfill.gallery import Gallery

    folder = make_folder(tmp_path / "d", n_images=3, captions_per_image=2, extra_images=2)
    if not captions:
        (folder / "captions.jsonl").unlink()
    r = invoke("index", "--model", setup / "models" / "world-old", "--data", folder, "--out", tmp_path / "g")
    assert r.exit_code == 0, r.output
    assert ("(2 images without captions)" if captions else "(5 images without captions)") in r.output
    r = invoke("collection", "create", tmp_path / "c", "--model", setup / "models" / "world-old")
    assert r.exit_code == 0, r.output
    r = invoke("collection", "add", tmp_path / "c", "--data", folder)
    assert r.exit_code == 0, r.output
    from nobackfill.collection.collection import Collection

    g, c = Gallery.open(tmp_path / "g"), Collection.open(tmp_path / "c")
    assert (g.count("image"), g.count("text")) == ((5, 6) if captions else (5, 0))
    assert set(g.ids("image")) | set(g.ids("text")) == set(c.items())


def test_bad_values_trial_n_found_are_one_line_each(tmp_path, monkeypatch):
    """Trial N: a permission error was a traceback (rc 1), `--threads -3` one too (and passed
    --show-config), `serve --port 70000` bound port 4464, `--max-body-mb -1` and an unresolvable
    --host were taken, and a repeated `--filter` key kept only its last value."""
    import nobackfill.collection.collection as coll

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "c"))

    with monkeypatch.context() as m:
        m.setattr(coll.Collection, "create", refuse)
        r = invoke("collection", "create", str(tmp_path / "ro" / "c"), "--model", str(ROOT / "models" / "world-old"))
    assert r.exit_code == 2 and "cannot be written or read by this user (Permission denied)" in r.output, r.output
    assert "Traceback" not in r.output
    world = tmp_path / "w"
    assert invoke("world", "--out", str(world), "--n-train", "2", "--n-val", "1", "--n-test", "1", "--workers", "1",
                  "--langs", "en").exit_code == 0
    for extra in ([], ["--show-config"]):
        r = invoke("train", "--preset", "world-tiny", "--data", str(world), "--out", str(tmp_path / "t"), "--steps",
                   "1", "--threads", "-3", *extra)
        assert r.exit_code == 2 and "--threads" in r.output and "Traceback" not in r.output, r.output
    keys = tmp_path / "keys.toml"
    keys.write_text('admin = ["admin-key-123456"]\n')
    for args, says in ((["--port", "70000"], "--port must be between 1 and 65535, got 70000"),
                       (["--max-body-mb", "-1"], "--max-body-mb must be a number above 0"),
                       (["--max-body-mb", "inf"], "--max-body-mb must be a number above 0"),
                       (["--max-k", "0"], "--max-k"), (["--host", "0.0.0.0.0"], "does not resolve")):
        r = invoke("serve", str(tmp_path / "nothing"), "--keys", str(keys), *args)
        assert r.exit_code == 2 and says in " ".join(r.output.split()) and "serving" not in r.output, (args, r.output)
    world_collection(tmp_path, "c", ROOT / "models" / "world-old", n_train=2, n_val=2, n_test=3, langs="en")
    r = invoke("collection", "search", str(tmp_path / "c"), "--text", "red", "--filter", "labels.colour=blue",
               "--filter", "labels.colour=red")
    assert r.exit_code == 2 and "--filter labels.colour is given twice" in r.output, r.output


def test_trial_o_messages_say_what_is_wrong(tmp_path):
    """An image query on a collection of a text model named a route from a space to itself; a model
    path that does not exist (or is a file) read as 'not a model directory (no config.json)'."""
    texts = tmp_path / "t.txt"
    texts.write_text("a dog runs on the beach\na cat sleeps\n")
    c = tmp_path / "tx"
    assert invoke("collection", "create", str(c), "--model", str(ROOT / "models" / "m30k-old-text")).exit_code == 0
    assert invoke("collection", "add", str(c), "--texts", str(texts)).exit_code == 0
    image = tmp_path / "q.png"
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 0, 0)).save(image)
    r = invoke("collection", "search", str(c), "--image", str(image))
    assert r.exit_code == 2 and "embeds text only: it cannot embed an image query" in r.output, r.output
    for model, says in ((tmp_path / "nope", "nope: no such directory"),
                        (ROOT / "models" / "world-old" / "config.json", "config.json: a file, not a model directory")):
        r = invoke("collection", "create", str(tmp_path / "c2"), "--model", str(model))
        assert r.exit_code == 2 and says in r.output and not (tmp_path / "c2").exists(), r.output


def test_trial_n_values_once_taken_silently_are_refused(tmp_path):
    """`world --n-test -1` wrote a world without a test split (rc 0), `--captions-per-image 0` one of
    empty captions files, `--langs xx` failed after making folders; a text file's invalid id failed
    the whole add naming neither file nor line (and --skip-bad could not skip it); `import --samples
    0` said no item had a readable source."""
    import numpy as np

    for args, says in ((["--n-test", "-1"], "--n-test must be >= 0"), (["--captions-per-image", "0"], "--captions-per-image"),
                       (["--langs", "xx"], "no grammar for 'xx'"), (["--workers", "-1"], "--workers must be >= 0")):
        r = invoke("world", "--out", str(tmp_path / "w"), "--n-train", "2", "--n-val", "1", "--n-test", "1", *args)
        assert r.exit_code == 2 and says in r.output and not (tmp_path / "w").exists(), (args, r.output)
    r = invoke("world", "--out", str(tmp_path / "w"), "--n-train", "0", "--n-val", "0", "--n-test", "0")
    assert r.exit_code == 2 and "are all 0" in r.output and not (tmp_path / "w").exists(), r.output

    texts = tmp_path / "t.jsonl"
    texts.write_text('{"text": "ok one", "id": "a1"}\n{"text": "bad one", "id": "a/b"}\n{"text": "ok two"}\n')
    assert invoke("collection", "create", str(tmp_path / "c"), "--model", str(ROOT / "models" / "world-old")).exit_code == 0
    r = invoke("collection", "add", str(tmp_path / "c"), "--texts", str(texts))
    assert r.exit_code == 2 and "t.jsonl line 2: field 'id': 'a/b' is not a valid id" in " ".join(r.output.split())
    r = invoke("collection", "add", str(tmp_path / "c"), "--texts", str(texts), "--skip-bad")
    assert r.exit_code == 0 and "added 2" in r.output, r.output
    from nobackfill.encoders import load_encoder

    np.save(tmp_path / "v.npy", load_encoder(ROOT / "models" / "world-old").encode_texts(["a dog", "a cat"]))
    (tmp_path / "v.jsonl").write_text('{"id": "t0", "text": "a dog"}\n{"id": "t1", "text": "a cat"}\n')
    r = invoke("collection", "import", str(tmp_path / "i"), "--from", f"npy:{tmp_path / 'v.npy'}", "--model",
               str(ROOT / "models" / "world-old"), "--table", str(tmp_path / "v.jsonl"), "--id-column", "id",
               "--source-column", "text", "--modality", "text", "--samples", "0")
    assert r.exit_code == 2 and "samples must be an integer >= 1" in r.output and not (tmp_path / "i").exists(), r.output


def test_world_refuses_a_folder_holding_another_world_and_redoes_the_same_one(tmp_path):
    """trial R: `world --out` over an existing world rewrote its world.json and captions and left its
    images uncaptioned; the same settings again are nothing to do, an unfinished one is written again."""
    w, small = tmp_path / "w", ["--n-train", "3", "--n-val", "1", "--n-test", "1", "--langs", "en", "--workers", "1"]
    assert invoke("world", "--out", str(w), *small).exit_code == 0
    before = (w / "train" / "captions.jsonl").read_text()
    r = invoke("world", "--out", str(w), *small)
    assert r.exit_code == 0 and "nothing to do" in r.output
    r = invoke("world", "--out", str(w), "--n-train", "2", *small[2:])
    assert r.exit_code == 2 and "holds this world with more items" in r.output
    r = invoke("world", "--out", str(w), "--seed", "7", *small)
    assert r.exit_code == 2 and "holds another world already" in r.output
    assert (w / "train" / "captions.jsonl").read_text() == before and len(list((w / "train" / "images").iterdir())) == 3
    (w / "world.json").unlink()  # a run that was stopped before its last write
    assert invoke("world", "--out", str(w), *small).exit_code == 0 and (w / "world.json").is_file()
    image = sorted((w / "train" / "images").iterdir())[1]
    image_bytes = image.read_bytes()
    image.unlink()  # the same world with a file removed since: written again, the same bytes
    (w / "val" / "captions.jsonl").unlink()
    r = invoke("world", "--out", str(w), *small)
    assert r.exit_code == 0 and "misses files (train: 2 of 3 images; val: no captions.jsonl)" in r.output, r.output
    assert image.read_bytes() == image_bytes and (w / "val" / "captions.jsonl").is_file()
    assert (w / "train" / "captions.jsonl").read_text() == before
    train = {p.name: p.read_bytes() for p in (w / "train" / "images").iterdir()}
    r = invoke("world", "--out", str(w), "--n-train", "5", *small[2:])  # the same world, more of it: grown
    assert r.exit_code == 0 and "holds this world with fewer items (train 3, val 1, test 1)" in r.output, r.output
    grown = {p.name: p.read_bytes() for p in (w / "train" / "images").iterdir()}
    assert len(grown) == 5 and all(grown[name] == data for name, data in train.items())
    assert json.loads((w / "world.json").read_text())["n_train"] == 5
    r = invoke("world", "--out", str(w), *small)  # fewer again: refused (its other images would stay uncaptioned)
    assert r.exit_code == 2 and "holds this world with more items (train 5, val 1, test 1)" in r.output, r.output
    lines = (w / "val" / "captions.jsonl").read_text().splitlines(keepends=True)
    (w / "val" / "captions.jsonl").write_text("".join(lines[:-1]))  # a truncated captions.jsonl: written again
    r = invoke("world", "--out", str(w), "--n-train", "5", *small[2:])
    assert r.exit_code == 0 and "val: 1 of 2 caption lines" in r.output, r.output
    assert len((w / "val" / "captions.jsonl").read_text().splitlines()) == 2
    (w / "world.json").unlink()  # unfinished, with more train images than a world of 3 holds: refused
    r = invoke("world", "--out", str(w), *small)
    assert r.exit_code == 2 and "more images than this one (train: 5 images, this world has 3)" in r.output, r.output
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    r = invoke("world", "--out", str(tmp_path / "other"), *small)
    assert r.exit_code == 2 and "not empty (notes.txt)" in r.output


def test_the_defaults_naming_the_projects_files_work_from_any_folder(tmp_path, monkeypatch):
    """trial Y: `bench encode --models models` (and the other benchmarks' defaults) failed outside
    the project folder; a path that exists where the command runs is still the user's."""
    from nobackfill.cli._common import from_project

    project = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    assert from_project(Path("models")) == project / "models"
    assert from_project("models/world-old") == str(project / "models" / "world-old")
    assert from_project("minilm") == "minilm" and from_project(Path("nope")) == Path("nope")
    (tmp_path / "models").mkdir()
    assert from_project(Path("models")) == Path("models")  # the user's own
