"""Subprocess for tests/test_shared_catalog.py: ``add_items`` into a shared collection, slowly.

Usage: python _shared_adder.py URI DATA_DIR N_TEXTS

Adds the items of the data folder plus ``N_TEXTS`` texts (:func:`items`) with the old model of
``related_pair``, slowed down (0.1 s per encoder call, chunks of 4) so a SIGKILL lands mid-run;
writes ``ready.<pid>`` in its working directory once the collection is open, and prints the report
as JSON when it is done.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _collection_helpers import HashEncoder, related_pair  # noqa: E402

from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.collection.ingest import add_items, folder_items, text_item  # noqa: E402


def items(data: str | Path, n_texts: int) -> list:
    """What the adder adds: the folder's items, then ``n_texts`` texts with ids of their own."""
    return folder_items(data).items + [text_item(f"shared text number {i}", id=f"text-{i:04d}")
                                       for i in range(n_texts)]


class Slow(HashEncoder):
    def _rows(self, datas, what):
        time.sleep(0.1)
        return super()._rows(datas, what)


if __name__ == "__main__":
    uri, data, n_texts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    old, _, _ = related_pair()
    slow = Slow(old._dim, old._salt, name="old")
    c = Collection.open(uri)
    Path(f"ready.{os.getpid()}").write_text("adder")
    rep = add_items(c, slow, items(data, n_texts), chunk_size=4, progress=False, wait=True)
    print(json.dumps(rep.to_dict()), flush=True)
