"""Every ``nobackfill collection`` command and ``verify`` run twice, on a collection by its path and
on the same collection served by ``nobackfill serve`` (its URL, the key in NOBACKFILL_API_KEY; a
uvicorn of this process, so typer's runner reaches it over real HTTP), with the same ids, counts and
exit codes; results on stdout, errors as one line without an HTTP status; an unreachable server one
line naming its URL; a paused backfill resumed only by ``--resume``; Ctrl-C during an import."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")

from _cli_helpers import ok  # noqa: E402
from _live_server import LiveServer  # noqa: E402
from nobackfill.cli import app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "served-admin-key-0123"
runner = CliRunner()


def run(*args, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """(a collection's path, the URL of a server of its twin): two collections of the same world test
    split, the working directory holding models/, upgrades/ and data/ (the server's roots)."""
    from nobackfill.encoders import load_encoder
    from nobackfill.encoders.base import encode
    from nobackfill.serve import KeyRing, ServeSettings, create_app

    root = tmp_path_factory.mktemp("served")
    data = root / "data"
    r = ok("world", "--out", data / "world", "--n-train", 4, "--n-val", 8, "--n-test", 10, "--workers", 1,
           "--langs", "en")
    assert "world written" in r.stdout  # a result: on stdout
    for d in ("models", "upgrades"):
        (root / d).symlink_to(ROOT / d)
    (data / "texts.jsonl").write_text("".join(json.dumps({"text": f"a caption of mine number {i}", "id": f"mine-{i}",
                                                          "source": "served"}) + "\n" for i in range(4)))
    texts = [f"an imported caption {i} of a red circle" for i in range(6)]
    import numpy as np

    np.save(data / "vecs.npy", encode(load_encoder(ROOT / "models" / "world-old"), "text", texts))
    (data / "rows.jsonl").write_text("".join(json.dumps({"key": f"imp-{i}", "caption": t}) + "\n"
                                             for i, t in enumerate(texts)))
    for name in ("p", "s"):
        ok("collection", "create", root / name, "--model", ROOT / "models" / "world-old")
    settings = ServeSettings(collection=str(root / "s"), keys=KeyRing({"admin": [ADMIN]}), models_root=root / "models",
                             upgrades_root=root / "upgrades", data_root=data)
    cwd = os.getcwd()
    os.chdir(root)
    os.environ["NOBACKFILL_API_KEY"] = ADMIN
    try:
        with LiveServer(create_app(settings)) as server:
            yield root / "p", server.url
    finally:
        os.chdir(cwd)
        os.environ.pop("NOBACKFILL_API_KEY", None)


def both(two, *args, json_out: bool = True):
    """``nobackfill collection CMD NAME ARGS`` on the path and on the URL: the two results, each
    (exit code, JSON or stdout, all output)."""
    cmd, rest = args[0], args[1:]
    outs = []
    for name in two:
        argv = ["verify", name, *rest] if cmd == "verify" else ["collection", cmd, name, *rest]
        r = run(*argv, *(["--json"] if json_out else []))
        body = json.loads(r.stdout) if json_out and r.exit_code == 0 else r.stdout
        outs.append((r.exit_code, body, r.output))
    assert outs[0][0] == outs[1][0], outs
    return outs


def test_every_command_on_a_path_and_on_a_server(two):
    (code, st, _), (_, st2, _) = both(two, "status")
    assert code == 0 and st["items"] == st2["items"] == {"image": 0, "text": 0}
    # add: a text file, a data folder (images uploaded from here, captions with their ids and metadata)
    (code, a, _), (_, b, _) = both(two, "add", "--texts", "data/texts.jsonl")
    assert code == 0 and a["ids"] == b["ids"] == [f"mine-{i}" for i in range(4)] and a["added"] == b["added"] == 4
    (code, a, _), (_, b, _) = both(two, "add", "--data", "data/world", "--split", "test")
    assert code == 0 and a["ids"] == b["ids"] and len(a["ids"]) == 30 and a["added"] == b["added"] == 30
    (code, a, _), (_, b, _) = both(two, "add", "--data", "data/world", "--split", "test")
    assert a["added"] == b["added"] == 0 and a["unchanged"] == b["unchanged"] == 30
    # search, get
    (code, a, _), (_, b, _) = both(two, "search", "--text", "a red circle", "--k", 5)
    assert code == 0 and [h["id"] for h in a["hits"]] == [h["id"] for h in b["hits"]] and len(a["hits"]) == 5
    img = sorted((two[0].parent / "data" / "world" / "test" / "images").iterdir())[0]
    (code, a, _), (_, b, _) = both(two, "search", "--image", img, "--k", 3)
    assert code == 0 and [h["id"] for h in a["hits"]] == [h["id"] for h in b["hits"]]
    (code, a, _), (_, b, _) = both(two, "get", "--id", "mine-1")
    assert code == 0 and a["metadata"]["source"] == b["metadata"]["source"] == "served" and a["space"] == b["space"]
    # import (files named relative to the working directory here, to the server's --data-root there)
    (code, a, _), (_, b, _) = both(two, "import", "--from", "npy:data/vecs.npy", "--table", "data/rows.jsonl",
                                   "--id-column", "key", "--source-column", "caption", "--modality", "text",
                                   "--model", "models/world-old")
    assert code == 0 and a["items"] == b["items"] == 6 and a["added"] == b["added"] == 6, (a, b)
    assert all(r["source"].startswith("npy ") and "vecs.npy" in r["source"] for r in (a, b)), (a["source"], b["source"])
    # upgrade, route, calibrate
    (code, a, _), (_, b, _) = both(two, "upgrade", "--model", "models/world-new", "--bridge",
                                   "upgrades/world-old-to-new")
    assert code == 0 and a["current"] == b["current"] and a["spaces"] == b["spaces"]
    old = next(s for s in a["spaces"] if s != a["current"])
    assert a["routes"][old]["t2i"]["route"] == b["routes"][old]["t2i"]["route"] == "bridge"
    (code, a, _), (_, b, _) = both(two, "route", "--space", old, "--direction", "t2i", "--route", "old-model")
    assert code == 0 and a[old]["t2i"]["pinned"] and b[old]["t2i"]["pinned"]
    (code, a, _), (_, b, _) = both(two, "route", "--space", old, "--direction", "t2i", "--unpin")
    assert code == 0 and not a[old]["t2i"]["pinned"] and not b[old]["t2i"]["pinned"]
    (code, a, _), (_, b, _) = both(two, "calibrate", "--data", "data/world", "--split", "val")
    assert code == 0 and a["merge"] == b["merge"] and a["routes"][old]["t2i"]["route"] == b["routes"][old]["t2i"]["route"]
    # the backfill: refusals, then a run to the end (the server's worker, followed by the command)
    (code, _, out), (_, _, out2) = both(two, "backfill", "--pause", json_out=False)
    assert code == 2 and "no backfill" in out and "no backfill" in out2
    (code, _, _), (_, _, out) = both(two, "retire", "--space", old, json_out=False)
    assert code == 2 and "no vector in the current space" in out
    (code, a, _), (_, b, _) = both(two, "backfill", "--order", "sequential")
    assert code == 0 and a["done"] == b["done"] == a["total"] == b["total"] == 40 and a["committed"] == b["committed"]
    (code, a, _), (_, b, _) = both(two, "backfill", "--resume")
    assert code == 0 and a["done"] == b["done"] == 40 and a["committed"] == b["committed"] == 0
    (code, a, _), (_, b, _) = both(two, "backfill", "--cancel")
    assert code == 0 and a["state"] == b["state"] == "none"
    (code, a, _), (_, b, _) = both(two, "retire", "--space", old)
    assert code == 0 and a["retired"] == b["retired"] == old
    # delete: several at once, all or nothing
    (code, _, out), (_, _, out2) = both(two, "delete", "--id", "mine-2", "--id", "nope", json_out=False)
    assert code == 2 and "nope" in out and "nope" in out2 and "404" not in out2
    (code, a, _), (_, b, _) = both(two, "delete", "--id", "mine-2", "--id", "mine-3")
    assert code == 0 and a == b == {"deleted": 2}
    (code, _, out), (_, _, out2) = both(two, "get", "--id", "mine-3", json_out=False)
    assert code == 2 and out2.startswith("error: no item with id 'mine-3'") and "404" not in out2
    # verify, and status as text on stdout
    (code, a, _), (_, b, _) = both(two, "verify")
    assert code == 0 and a["ok"] and b["ok"] and a["kind"] == b["kind"] == "collection"
    (code, a, _), (_, b, _) = both(two, "verify", json_out=False)
    assert code == 0 and ": OK" in a and ": OK" in b
    (code, a, _), (_, b, _) = both(two, "status", json_out=False)
    assert code == 0 and "10 images, 28 texts" in a.splitlines()[0] and "10 images, 28 texts" in b.splitlines()[0]


def test_what_a_server_does_not_take_is_refused_in_one_line(two):
    path, url = two
    r = run("collection", "create", url, "--model", "models/world-old")
    assert r.exit_code == 2 and "serves one existing collection" in r.output and len(r.output.splitlines()) == 1
    for flag in (["--limit", 5], ["--shards", 2], ["--shards", 0], ["--workers", 2], ["--batch-size", 8]):
        r = run("collection", "backfill", url, *flag)
        assert r.exit_code == 2 and "server's own worker" in r.output and "--limit, --workers, --shards" in r.output
    r = run("verify", url, "--repair")
    assert r.exit_code == 2 and "verify PATH --repair" in r.output
    r = run("collection", "create", "--help", env={"COLUMNS": "200"})
    assert "http" not in r.stdout.split("Options")[0].lower().split("arguments")[-1]


@pytest.mark.parametrize("args", [("collection", "status"), ("collection", "search", "--text", "x"), ("verify",),
                                  ("collection", "add", "--texts", __file__)])
def test_an_unreachable_server_is_one_line(args):
    url = "http://127.0.0.1:9"
    argv = [*args[:2], url, *args[2:]] if args[0] == "collection" else [args[0], url]
    r = run(*argv)
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and url in r.output and "refused" in r.output.lower(), r.output
    assert "Traceback" not in r.output


def test_results_go_to_stdout_and_progress_to_stderr(tmp_path):
    """What a command found is on stdout (so `| wc -c` counts it); progress and logs on stderr."""
    coll = tmp_path / "c"
    r = ok("world", "--out", tmp_path / "w", "--n-train", 2, "--n-val", 2, "--n-test", 3, "--workers", 1, "--langs", "en")
    assert "world written" in r.stdout
    r = ok("index", "--model", ROOT / "models" / "world-old", "--data", tmp_path / "w", "--out", tmp_path / "g")
    assert "gallery" in r.stdout
    r = ok("collection", "create", coll, "--model", ROOT / "models" / "world-old")
    assert "current model" in r.stdout
    r = ok("collection", "add", coll, "--data", tmp_path / "w", "--split", "test")
    assert "added 9" in r.stdout and "collection" in r.stdout
    r = ok("collection", "status", coll)
    assert r.stdout.startswith(f"collection {coll}: 3 images, 6 texts") and "merge" in r.stdout
    r = ok("collection", "upgrade", coll, "--model", ROOT / "models" / "world-new", "--bridge",
           ROOT / "upgrades" / "world-old-to-new")
    assert "current model is now" in r.stdout and "route" in r.stdout.lower()
    r = ok("collection", "get", coll, "--id", json.loads(ok("collection", "search", coll, "--text", "a", "--k", 1,
                                                           "--json").stdout)["hits"][0]["id"])
    assert "served by space" in r.stdout
    r = ok("verify", coll)
    assert ": OK" in r.stdout


def test_a_paused_backfill_holds_until_resume(tmp_path):
    coll = tmp_path / "c"
    ok("world", "--out", tmp_path / "w", "--n-train", 2, "--n-val", 2, "--n-test", 4, "--workers", 1, "--langs", "en")
    ok("collection", "create", coll, "--model", ROOT / "models" / "world-old")
    ok("collection", "add", coll, "--data", tmp_path / "w", "--split", "test")
    ok("collection", "upgrade", coll, "--model", ROOT / "models" / "world-new", "--bridge",
       ROOT / "upgrades" / "world-old-to-new")
    ok("collection", "backfill", coll, "--order", "sequential", "--limit", 2)
    r = ok("collection", "backfill", coll, "--pause")
    assert "paused" in r.stdout
    r = run("collection", "backfill", coll)
    assert r.exit_code == 2 and "paused" in r.output and "--resume" in r.output
    st = json.loads(ok("collection", "status", coll, "--json").stdout)["backfill"]
    assert st["state"] == "paused" and st["done"] == 2
    ok("collection", "backfill", coll, "--resume")
    st = json.loads(ok("collection", "status", coll, "--json").stdout)["backfill"]
    assert st["done"] == st["total"] == 12


def test_ctrl_c_during_an_import_says_what_is_committed(tmp_path, monkeypatch):
    """A KeyboardInterrupt after the first committed batch: exit 130, what the collection holds and
    that the same command finishes the import; re-running it does."""
    import numpy as np

    import nobackfill.adopt.importing as importing

    coll = tmp_path / "c"
    ok("collection", "create", coll, "--model", ROOT / "models" / "world-old")
    dim = json.loads(ok("collection", "status", coll, "--json").stdout)
    dim = next(iter(dim["spaces"].values()))["dim"]
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(10, dim)).astype(np.float32)
    np.save(tmp_path / "v.npy", vecs / np.linalg.norm(vecs, axis=1, keepdims=True))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(10)))
    real = importing.add_vectors

    def interrupted(*a, **kw):
        real(*a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(importing, "add_vectors", interrupted)
    args = ("collection", "import", coll, "--from", f"npy:{tmp_path / 'v.npy'}", "--table", tmp_path / "t.jsonl",
            "--source-column", "text", "--modality", "text", "--model", ROOT / "models" / "world-old", "--trust-model")
    r = run(*args)
    assert r.exit_code == 130, r.output
    assert "interrupted" in r.output and "holds 0 images and 10 texts now" in r.output, r.output
    assert "same command again" in r.output
    monkeypatch.setattr(importing, "add_vectors", real)
    r = ok(*args)
    assert "already there 10" in r.stdout


def test_progress_bars_are_drawn_on_stderr(monkeypatch, capsys):
    """On a terminal a progress bar is drawn on stderr, never into the results on stdout."""
    import io
    import sys

    from nobackfill.progress import progress_bar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    with progress_bar(True, "uploading things", 3) as advance:
        advance(3)
    assert "uploading things" in err.getvalue() and "uploading things" not in capsys.readouterr().out


def test_a_missing_or_wrong_key_names_the_variable_the_command_line_reads(two, monkeypatch):
    """The server's 401 asks an HTTP client for a header; the command line says where it reads its key."""
    _, url = two
    for key in ("wrong-key-0123456789", None):
        if key is None:
            monkeypatch.delenv("NOBACKFILL_API_KEY", raising=False)
        else:
            monkeypatch.setenv("NOBACKFILL_API_KEY", key)
        r = run("collection", "status", url)
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and "NOBACKFILL_API_KEY" in out and "Authorization: Bearer" not in out, r.output


def test_the_python_client_reads_its_key_from_the_environment_and_a_refusal_says_how_to_give_one(two, monkeypatch):
    """``Client(url)`` with no ``api_key`` sends the key in NOBACKFILL_API_KEY, as the command line
    does; without one a 401 tells a Python caller how to give it (``detail`` stays the server's)."""
    from nobackfill import Client
    from nobackfill.client.errors import Forbidden

    _, url = two
    monkeypatch.setenv("NOBACKFILL_API_KEY", ADMIN)
    with Client(url) as c:
        assert "items" in c.status()
    monkeypatch.delenv("NOBACKFILL_API_KEY")
    with Client(url) as c, pytest.raises(Forbidden) as e:
        c.status()
    assert "api_key=" in str(e.value) and "NOBACKFILL_API_KEY" in str(e.value)
    assert e.value.status == 401 and "api_key" not in e.value.detail
    with Client(url, api_key="not-a-key-0123456789") as c, pytest.raises(Forbidden) as e:
        c.status()
    assert "not one the server knows" in str(e.value)
    monkeypatch.setenv("NOBACKFILL_API_KEY", "also-not-a-key-0123456789")
    with Client(url, api_key=ADMIN) as c:  # a key given wins over the environment
        assert "items" in c.status()
