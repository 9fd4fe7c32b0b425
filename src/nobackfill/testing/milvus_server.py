"""A real Milvus standalone server from the pip package ``milvus`` (2.3.x), for tests and the
storage benchmark: started in a fresh base directory, advertised on 127.0.0.1, stopped with
SIGTERM escalated to SIGKILL (a SIGTERM'd server has been seen to hang for more than 40 s).

Milvus 2.3's component servers listen on every interface (their listen address is not
configurable; only the advertised one is). Run the process that starts it inside a network
namespace with only loopback (``scripts/isolated.sh``, used by ``make test``) to keep it off the
network.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GROWING_CHUNK_ROWS", "MilvusServerError", "RunningServer", "start_server"]

#: ``queryNode.segcore.chunkRows``: rows of a growing (not yet sealed) segment per chunk, the unit
#: Milvus builds its interim index on. The package's 128 leaves each chunk too small for the interim
#: IVF index (nlist 128) to pay off, and a search of a segment that a backfill is filling costs time
#: in proportion to its rows (16k fresh 128-d rows: about 7 ms a search against 3 ms at 1024,
#: measured on the package's server; docs/storage.md)
GROWING_CHUNK_ROWS = 1024


class MilvusServerError(RuntimeError):
    """The server package is missing or the server did not start."""


@dataclass
class RunningServer:
    server: Any
    address: str  # HOST:PORT of the proxy

    def stop(self, grace_s: float = 15.0) -> None:
        proc = getattr(self.server, "server_proc", None)
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except Exception:
            proc.kill()
            proc.wait(timeout=30)
        for f in getattr(self.server, "proc_fds", {}).values():
            try:
                f.close()
            except OSError:
                pass


def start_server(base_dir: str | Path, timeout_s: float = 120.0) -> RunningServer:
    """Start a standalone server with its data in ``base_dir`` (use a fresh one per session: a
    restart a few seconds after a stop crashed once on a stale session)."""
    try:
        from milvus import MilvusServer
    except ImportError as e:
        raise MilvusServerError(f"the `milvus` package is not installed ({e}); pip install milvus") from None
    srv = MilvusServer(wait_for_started=True)
    srv.set_base_dir(str(base_dir))
    cfg = srv.config
    cfg.template_text = re.sub(r"(?m)^(\s*)ip:\s*#.*$", r"\g<1>ip: 127.0.0.1", cfg.template_text)
    cfg.template_text = cfg.template_text.replace("address: localhost", "address: 127.0.0.1")
    cfg.template_text, n = re.subn(r"(?m)^(\s*chunkRows:\s*)\d+", rf"\g<1>{GROWING_CHUNK_ROWS}", cfg.template_text,
                                   count=1)
    if n != 1:
        raise MilvusServerError("the milvus package's config has no queryNode.segcore.chunkRows to set")
    t0 = time.time()
    try:
        srv.start()
    except Exception as e:  # the package raises bare exceptions; name what failed
        raise MilvusServerError(f"could not start Milvus in {base_dir}: {type(e).__name__}: {e}") from None
    if time.time() - t0 > timeout_s:
        RunningServer(srv, "").stop()
        raise MilvusServerError(f"Milvus took more than {timeout_s:.0f}s to start")
    return RunningServer(srv, f"127.0.0.1:{srv.listen_port}")
