"""``bench lingual-text`` gives the same numbers run to run (issue 44, item 16): two runs of one tiny
config, one in this process and one in spawned worker processes (``--jobs 2``: other hash seeds,
fresh interpreters), agree bit for bit, down to a fingerprint of every weight and token learned; and
a result names what its numbers depend on (the CPU code path, threads, library versions), which
``make setup`` pins (constraints.txt) to the versions the committed results were measured with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from test_lingual_cli import m30k  # noqa: F401  (tiny fake Multi30K + a tiny BERT)

ROOT = Path(__file__).resolve().parents[1]


def _config(seed: int = 0):
    from nobackfill.bench.lingual import LingualTextConfig
    from nobackfill.lingual.learner import CLLConfig

    return LingualTextConfig(langs=("de",), methods=("cll_clip", "cll_clip_teir"), train_lines=16,
                             cll=CLLConfig(steps=3, batch_size=8, task_vocab_size=150, seed=seed))


def _numbers(result: dict) -> dict:
    """Every number of the methods' results but their wall times."""
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k != "seconds"}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(result["methods"])


def test_two_runs_of_the_same_config_agree_bit_for_bit(m30k, tmp_path):  # noqa: F811
    from nobackfill.bench.lingual import run_lingual_text

    root, ev, model = m30k
    here = run_lingual_text(root, eval_dir=ev, config=_config(), model=model, cache_dir=tmp_path / "c1",
                            work_dir=tmp_path / "w1", jobs=1)
    spawned = run_lingual_text(root, eval_dir=ev, config=_config(), model=model, cache_dir=tmp_path / "c2",
                               work_dir=tmp_path / "w2", jobs=2)
    a, b = _numbers(here), _numbers(spawned)
    assert a == b, json.dumps({"in process": a, "workers": b}, indent=1, default=str)[:4000]
    fingerprints = {m["model_after"] for m in a.values()}
    assert len(fingerprints) == 2 and all(f.startswith("hf-") for f in fingerprints)
    assert all(isinstance(t["last_loss"], float) for m in a.values() for t in m["tasks"])
    # the comparison can fail: another seed trains another model
    other = run_lingual_text(root, eval_dir=ev, config=_config(seed=1), model=model, cache_dir=tmp_path / "c1",
                             work_dir=tmp_path / "w3", jobs=1)
    assert _numbers(other)["cll_clip"]["model_after"] != a["cll_clip"]["model_after"]


def test_the_deterministic_block_restores_the_process_settings():
    from nobackfill.train.loop import deterministic

    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with deterministic(seed=3, threads=1):
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
        x = torch.rand(3)
    with deterministic(seed=3, threads=1):
        assert torch.equal(torch.rand(3), x)
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (threads, det)


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line).groups()
            pins[name.lower()] = version
    return pins


def test_a_result_names_what_its_numbers_depend_on():
    from nobackfill.bench.host import NUMERIC_PACKAGES, host_info

    host = host_info()
    assert {"platform", "cpu", "torch_cpu_capability", "torch_threads", "versions"} <= set(host)
    assert set(host["versions"]) == set(NUMERIC_PACKAGES) and host["versions"]["torch"]


def test_setup_installs_the_versions_the_committed_results_were_measured_with():
    """constraints.txt pins every package a result's numbers depend on; ``make setup`` installs
    with it; the committed lingual-text results record those very versions (a run on other
    versions moved CLL-CLIP's AR by 0.03 with no change to the method)."""
    from nobackfill.bench.host import NUMERIC_PACKAGES

    pins = _constraints()
    assert set(NUMERIC_PACKAGES) <= set(pins), pins
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"pip install -e '\.\[dev\]' -c constraints\.txt", make) and "$(STAMP): pyproject.toml constraints.txt" in make
    committed = json.loads((ROOT / "benchmarks" / "results" / "lingual_text.json").read_text())
    versions = committed["host"]["versions"]
    assert {k: v.split("+")[0] for k, v in versions.items()} == {k: pins[k] for k in NUMERIC_PACKAGES}, versions


@pytest.mark.parametrize("name", ["cll_clip", "cll_clip_teir"])
def test_the_committed_rows_carry_their_model_fingerprint(name):
    """The committed CLL-CLIP rows were measured by this code (they name the model they ended with)."""
    committed = json.loads((ROOT / "benchmarks" / "results" / "lingual_text.json").read_text())
    assert committed["methods"][name]["model_after"].startswith("hf-")


def _has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_the_bench_command_pins_the_cpu_code_path_before_torch_starts():
    """``bench lingual-text`` sets the AVX2 code path before it imports torch (so an AVX-512 machine
    computes what the committed results' AVX2 machine did), and its workers inherit it; embedding
    caches are kept per code path."""
    import subprocess
    import sys

    if not _has_avx2():
        pytest.skip("not an x86-64 CPU with AVX2")
    code = ("import os, sys\nfrom typer.testing import CliRunner\nfrom nobackfill.cli import app\n"
            "assert 'torch' not in sys.modules\n"
            "r = CliRunner().invoke(app, ['bench', 'lingual-text', '--quick', '--show-config'])\n"
            "assert r.exit_code == 0, r.output\n"
            "import torch\nfrom nobackfill.bench.host import PINNED_CPU_ENV, cpu_cache_dir, pin_cpu_code_path\n"
            "print(torch.backends.cpu.get_cpu_capability(), cpu_cache_dir('c').name, pin_cpu_code_path(),\n"
            "      all(os.environ[k] == v for k, v in PINNED_CPU_ENV.items()))\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["AVX2", "cpu-avx2", "False", "True"], out.stdout


def test_the_committed_results_were_measured_on_the_pinned_code_path():
    committed = json.loads((ROOT / "benchmarks" / "results" / "lingual_text.json").read_text())
    assert committed["host"]["torch_cpu_capability"] == "AVX2" and committed["host"]["torch_threads"] == 1
