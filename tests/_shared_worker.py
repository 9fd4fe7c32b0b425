"""Subprocess for tests/test_shared_catalog.py: one "machine" backfilling a shared collection.

Usage: python _shared_worker.py URI MACHINE BATCH RATE LEASE_S

Opens the collection URI (a vectors directory or a Milvus server, and a PostgreSQL catalog), writes
``ready.<pid>`` in its working directory, then runs backfill workers (the new model of
``related_pair``) until the job is done: a worker that finds every unfinished shard leased by the
other machine waits and tries again. Its leases name ``MACHINE`` as their host
(``MACHINE:<pid>:<tag>``), so neither machine can tell whether the other's processes are alive: a
killed worker's lease is taken over only once it expires, as between two real machines. Exits 0
when the backfill is done.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _collection_helpers import related_pair  # noqa: E402

from nobackfill.collection.collection import Collection  # noqa: E402
from nobackfill.lifecycle.backfill import run_worker  # noqa: E402

if __name__ == "__main__":
    uri, machine, batch, rate, lease_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), \
        float(sys.argv[5])
    old, new, _ = related_pair()
    c = Collection.open(uri)
    Path(f"ready.{os.getpid()}").write_text(machine)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rep = run_worker(c, new, batch_size=batch, rate=rate, lease_s=lease_s,
                         owner=f"{machine}:{os.getpid()}:{uuid.uuid4().hex[:8]}", poll_s=0.05)
        print(f"{machine} pid {os.getpid()}: {rep.committed} committed, stopped: {rep.reason()}", flush=True)
        if rep.stopped == "done":
            sys.exit(0)
        if rep.stopped != "no free shard":
            sys.exit(f"{machine}: the worker stopped: {rep.reason()}")
        time.sleep(0.05)
    sys.exit(f"{machine}: the backfill did not finish in 300 s")
