"""``make test``'s two shares (``pytest --shard K/N``, tests/conftest.py): every file in exactly one,
balanced by its seconds, the files that start Ray in the same share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import TOGETHER, shard_of_files
from hypothesis import given, strategies as st

ROOT = Path(__file__).resolve().parents[1]


@given(st.dictionaries(st.from_regex(r"test_[a-z]{1,8}\.py", fullmatch=True), st.floats(0, 100), min_size=1, max_size=40),
       st.integers(1, 4))
def test_every_file_is_in_one_share_and_the_shares_are_balanced(seconds, shards):
    share = shard_of_files(seconds, shards)
    assert set(share) == set(seconds) and all(0 <= k < shards for k in share.values())
    load = [sum(s for name, s in seconds.items() if share[name] == k) for k in range(shards)]
    # greedy, heaviest first: no share exceeds another by more than the heaviest file
    assert max(load) - min(load) <= max(seconds.values()) + 1e-9


def test_the_ray_files_share_a_share():
    seconds = {name: 50.0 for group in TOGETHER for name in group} | {"test_a.py": 60.0, "test_b.py": 55.0}
    share = shard_of_files(seconds, 2)
    for group in TOGETHER:
        assert len({share[name] for name in group}) == 1


def test_the_shares_of_a_folder_split_its_tests():
    """Two shares collect disjoint sets of tests that together are all of them (pytest collecting a
    few files of this folder)."""
    files = [str(ROOT / "tests" / name) for name in ("test_test_shards.py", "test_structure.py", "test_trust.py")]

    def collected(*args: str) -> set[str]:
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *args, *files],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return {line for line in r.stdout.splitlines() if "::" in line}

    whole, first, second = collected(), collected("--shard", "0/2"), collected("--shard", "1/2")
    assert first and second and not first & second and first | second == whole
    table = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert all(isinstance(v, (int, float)) and v >= 0 for v in table.values())


def test_the_table_sums_each_files_seconds_of_the_shares_only(tmp_path):
    """scripts/test_durations.py: setup, call and teardown of each file's tests summed, the Milvus
    server tests' part of the log left out."""
    import runpy

    log = tmp_path / "test.log"
    log.write_text("\n".join([
        "1.50s call     tests/test_a.py::test_one", "0.25s setup    tests/test_a.py::test_one",
        "2.00s call     tests/test_b.py::test_two[x]", "junk 3.0s call tests/test_c.py::t",
        "--- the tests against a Milvus server (run beside the suite) ---",
        "9.00s call     tests/test_a.py::test_on_a_server"]), encoding="utf-8")
    out = tmp_path / "durations.json"
    runpy.run_path(str(ROOT / "scripts" / "test_durations.py"))["main"]([str(log)], out)
    assert json.loads(out.read_text()) == {"test_a.py": 1.8, "test_b.py": 2.0}
