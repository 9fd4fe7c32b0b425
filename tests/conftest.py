"""Shared test setup: the CPU is shared with training jobs, and nothing may reach the network."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _single_thread_offline():
    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    yield
