"""Subprocess for tests/test_index.py: build a gallery with the fake encoder (chunk_size 3).

Usage: python _index_kill_helper.py INPUT_DIR OUT_DIR. Run with NOBACKFILL_TEST_KILL_AFTER_CHUNKS
set so the build SIGKILLs itself part-way through.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_index import FakeEncoder, make_inputs  # noqa: E402

from nobackfill.index import build_gallery  # noqa: E402

if __name__ == "__main__":
    images, texts = make_inputs(Path(sys.argv[1]))
    build_gallery(FakeEncoder(), sys.argv[2], images=images, texts=texts, model_ref="fake", chunk_size=3,
                  progress=False)
    sys.exit("build finished although it should have been killed")
