"""Subprocess for tests/test_commit_worker.py: import DATA_DIR's npy + jsonl into COLLECTION with
the catalog commits in a worker process, in small batches (the test SIGKILLs it, or its worker, at
random moments). With ``index``, for tests/test_import_index.py: build COLLECTION's missing graph
indexes (the test kills it at each of its atomic writes: NOBACKFILL_TEST_KILL_AT_WRITE).

Usage: python _import_kill_helper.py DATA_DIR COLLECTION | python _import_kill_helper.py index COLLECTION
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _collection_helpers import OLD_REF, HashEncoder  # noqa: E402

from nobackfill.adopt.importing import import_source  # noqa: E402
from nobackfill.adopt.sources import open_source  # noqa: E402

from nobackfill.collection.collection import Collection  # noqa: E402

if __name__ == "__main__" and sys.argv[1] == "index":
    built = Collection.open(Path(sys.argv[2])).build_graph_indexes()
    print(sorted(built), flush=True)
elif __name__ == "__main__":
    data, target = Path(sys.argv[1]), Path(sys.argv[2])
    src = open_source(f"npy:{data / 'e.npy'}", table=data / "t.jsonl", id_column="id", source_column="text",
                      modality="text", batch_rows=97)
    rep = import_source(target, src, HashEncoder(16, "old"), model=OLD_REF, trust_model=True, progress=False,
                        commit_process=True, wait=True)
    print(rep.added, rep.unchanged, flush=True)
