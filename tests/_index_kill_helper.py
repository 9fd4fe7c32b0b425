"""Subprocess for tests/test_index.py: build a gallery with the fake encoder (chunk_size 3).

Usage: python _index_kill_helper.py INPUT_DIR OUT_DIR N: the build SIGKILLs itself right after
committing its N-th chunk (through ``build_gallery``'s ``on_commit``).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_index import FakeEncoder, make_inputs  # noqa: E402

from nobackfill.gallery import build_gallery  # noqa: E402

if __name__ == "__main__":
    images, texts = make_inputs(Path(sys.argv[1]))
    kill_after = int(sys.argv[3])

    def die(n: int) -> None:
        if n >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    build_gallery(FakeEncoder(), sys.argv[2], images=images, texts=texts, model_ref="fake", chunk_size=3,
                  progress=False, on_commit=die)
    sys.exit("build finished although it should have been killed")
