"""Weights we write as safetensors get the file mode of every other file (the umask's), not the 0600
``safetensors.save_file`` gives: a service running as another user read the model but not its
``lingual.safetensors`` (trial R)."""

from __future__ import annotations

import os
import stat

import numpy as np
import torch
from safetensors.numpy import load_file as load_np
from safetensors.torch import load_file

from nobackfill._safetensors import save_tensors


def test_saved_tensors_read_back_with_the_umasks_mode(tmp_path):
    old = os.umask(0o022)
    try:
        save_tensors({"w": torch.arange(6.0).reshape(2, 3)}, tmp_path / "t.safetensors")
        save_tensors({"w": np.eye(3, dtype=np.float32)}, tmp_path / "n.safetensors")
    finally:
        os.umask(old)
    assert torch.equal(load_file(tmp_path / "t.safetensors")["w"], torch.arange(6.0).reshape(2, 3))
    assert np.array_equal(load_np(tmp_path / "n.safetensors")["w"], np.eye(3, dtype=np.float32))
    for name in ("t.safetensors", "n.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.safetensors", "t.safetensors"]  # no temporary left
