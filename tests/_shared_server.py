"""Subprocess for tests/test_shared_catalog.py: one "machine" serving a shared collection over HTTP.

Usage: python _shared_server.py URI PORT KEY

Serves the collection URI (its catalog in PostgreSQL) on 127.0.0.1:PORT with the models of
``related_pair`` (read key KEY), from its own working directory, until it is killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _collection_helpers import NEW_REF, OLD_REF, pool_with, related_pair  # noqa: E402

if __name__ == "__main__":
    import uvicorn

    from nobackfill.serve import KeyRing, ServeSettings, create_app

    uri, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    old, new, _ = related_pair()
    settings = ServeSettings(collection=uri, keys=KeyRing({"read": [key]}), uploads=Path.cwd() / "uploads")
    app = create_app(settings, pool=pool_with((OLD_REF, old), (NEW_REF, new)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
