"""Subprocess for tests/test_milvus_consistency.py: a reader of a collection in a process of its own.

Usage: python _milvus_reader.py URI

Opens the collection (texts of the old model of ``related_pair``), prints ``ready``, then for each
line of stdin prints the id of the first hit of that text (one search each, no retry).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _collection_helpers import OLD_REF, pool_with, related_pair  # noqa: E402

from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.search import Searcher  # noqa: E402

if __name__ == "__main__":
    old, _, _ = related_pair()
    s = Searcher(Collection.open(sys.argv[1]), pool=pool_with((OLD_REF, old)))
    s.search(text="base text 0", k=1, target="text")
    print("ready", flush=True)
    for line in sys.stdin:
        hits = s.search(text=line.strip(), k=1, target="text").hits
        print(hits[0].id if hits else "-", flush=True)
