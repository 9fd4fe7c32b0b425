"""Milvus clients for :mod:`nobackfill.milvus`: one per target in a process (credentials,
reloading released collections), the consistency levels and limits every store uses, and the
Milvus index parameters of a backend spec."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from typing import Any

from ..ann.backends import parse_spec
from ..catalog.items import CollectionBusyError, ServerUnreachable
from ..catalog.schema import one_line


TOKEN_ENV = "NOBACKFILL_MILVUS_TOKEN"
TOKEN_FILE_ENV = "NOBACKFILL_MILVUS_TOKEN_FILE"
VALUE_MAX = 60000  # characters of one VARCHAR value (Milvus allows 65535)
KEY_MAX = 512
STRONG = "Strong"
BOUNDED = "Bounded"
#: a read that waits for a timestamp of our own choosing (a commit's, from the catalog)
CUSTOMIZED = "Customized"
#: a search uses Strong consistency while the space has rows this young (Milvus' Bounded staleness,
#: 5 s by default, plus a margin for clock skew between writers and the server), Bounded after that
FRESH_S = 15.0
#: rows inserted up to this long before the newest one a reader has seen are looked for again
SEQ_MARGIN_NS = 5_000_000_000
MAX_TOPK = 16384
#: rows inserted since the last flush after which a store seals its segments (searching a large
#: unsealed segment is slow, about 20x on milvus-lite)
FLUSH_EVERY = 20000
#: rows per insert request (one round trip; 128-d rows are about 12 MB of request at this size,
#: within gRPC's limits)
INSERT_ROWS = 20000
#: keys per primary-key lookup (one round trip for a batch of a backfill or an add chunk's part)
LOOKUP_MAX = 16384
FILTER_IN_MAX = 1000  # a search restricted to this many keys or fewer filters on them directly


def insert_ts(client: Any, name: str, columns: dict[str, list], partition: str) -> int:
    """Insert rows given column by column (``{field: values}``, every field of collection ``name``)
    into partition ``partition`` in one request; the server's hybrid timestamp of the insert (0 where
    the client does not say: then readers fall back to Strong reads). Columns are sent as columns
    (pymilvus' row API converts each row's fields one at a time: 3x slower measured at 100k rows),
    through the client's connection, which also returns the timestamp ``MilvusClient.insert`` drops."""
    try:
        conn, ctx = client._get_connection(), client._generate_call_context()
    except AttributeError:  # another client: rows, no timestamp
        keys = list(columns)
        client.insert(name, [dict(zip(keys, row)) for row in zip(*columns.values())], partition_name=partition)
        return 0
    from pymilvus import DataType

    types = {"key": DataType.VARCHAR, "modality": DataType.VARCHAR, "seq": DataType.INT64, "vec": DataType.FLOAT_VECTOR}
    entities = [{"name": f, "type": types[f], "values": v} for f, v in columns.items()]
    res = conn.batch_insert(name, entities, partition_name=partition, timeout=None, context=ctx)
    return int(getattr(res, "timestamp", 0) or 0)


def alloc_ts(client: Any) -> int:
    """A fresh hybrid timestamp from the server's timestamp oracle: later than every write the
    server acknowledged before (0 when the server or client cannot say). Never asked of milvus-lite,
    which does not implement it (its in-process gRPC server logs each call as an error with a
    traceback: trial Z saw 39 in one backfill), nor again of a client whose server answered once
    that it does not (an older server: remembered per client)."""
    if getattr(client, "_nobackfill_embedded", False) or getattr(client, "_nobackfill_no_alloc_ts", False):
        return 0
    try:
        ts = int(client._get_connection().alloc_timestamp(context=client._generate_call_context()) or 0)
    except Exception as e:  # an older server: unknown; a server gone: the next call says so
        if _unimplemented(e):
            _remember_no_alloc_ts(client)
        return 0
    if not ts:  # answered without one (milvus-lite reached by a client not made here): none later either
        _remember_no_alloc_ts(client)
    return ts


def _unimplemented(e: BaseException) -> bool:
    """Whether ``e`` says the server does not implement the call (not that it did not answer)."""
    code = getattr(e, "code", None)
    code = code() if callable(code) else code
    text = f"{getattr(e, 'message', '')} {e}".lower()
    return "unimplemented" in str(code).lower() or "not implemented" in text or "unimplemented" in text


def _remember_no_alloc_ts(client: Any) -> None:
    with contextlib.suppress(Exception):  # a client that takes no attributes: asked again next time
        client._nobackfill_no_alloc_ts = True


def _q(s: str) -> str:
    """A string literal for a Milvus filter expression."""
    return json.dumps(s)


def _safe(name: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return out if re.match(r"^[A-Za-z_]", out) else f"_{out}"


def _token() -> str | None:
    """Credentials from ``$NOBACKFILL_MILVUS_TOKEN`` or the file ``$NOBACKFILL_MILVUS_TOKEN_FILE``
    (``user:password`` or an API key); never logged."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            return open(path, encoding="utf-8").read().strip() or None
        except OSError as e:
            raise ValueError(f"${TOKEN_FILE_ENV} names {path}, which cannot be read ({e.strerror})") from None
    return None


_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _not_loaded(e: BaseException) -> bool:
    """Whether a Milvus error says the collection is not loaded (released: after a server or
    milvus-lite restart, or by another client)."""
    msg = str(getattr(e, "message", "") or e).lower()
    return getattr(e, "code", None) == 101 or "not loaded" in msg or "released" in msg or "call load()" in msg


def _loaded(client: Any, name: str, call: Any) -> Any:
    """``call()``; if Milvus answers that collection ``name`` is not loaded, load it and call again."""
    try:
        return call()
    except Exception as e:
        if not _not_loaded(e):
            raise
    client.load_collection(name)
    return call()


def _client(kind: str, parts: dict[str, str]) -> Any:
    """One pymilvus client per target in this process (milvus-lite allows one opener per path)."""
    from pymilvus import MilvusClient

    from .._logging import tame_library_loggers

    # pymilvus installs its own handlers on import; milvus-lite runs its gRPC server in this process
    tame_library_loggers(("pymilvus", "milvus_lite", "grpc"))

    key = f"{kind}:{parts.get('path') or parts['uri']}/{parts.get('db', '')}"
    with _CLIENTS_LOCK:
        c = _CLIENTS.get(key)
        if c is None:
            if kind == "milvus-lite":
                os.makedirs(os.path.dirname(os.path.abspath(parts["path"])) or ".", exist_ok=True)
                c = _open_lite(MilvusClient, parts["path"])
                c._nobackfill_embedded = True  # milvus-lite: no segment loading to wait for
            else:
                kw: dict[str, Any] = {"uri": parts["uri"]}
                tok = _token()
                if tok:
                    kw["token"] = tok
                c = _connect(MilvusClient, kw)
                if parts["db"] != "default":
                    if parts["db"] not in c.list_databases():
                        c.create_database(parts["db"])
                    # a client of that database, not use_database(): pymilvus checks that with
                    # DescribeDatabase, which Milvus 2.3 does not have (trial H: a traceback)
                    with contextlib.suppress(Exception):
                        c.close()
                    c = _connect(MilvusClient, {**kw, "db_name": parts["db"]})
            _CLIENTS[key] = c
        return c


#: why a milvus-lite file opens in one process only (messages and the backfill's note say it)
LITE_ONE_PROCESS = "milvus-lite serves one process per file; use a Milvus server for several processes"


class LiteFileInUse(CollectionBusyError, ConnectionError):
    """Another process holds a milvus-lite file (milvus-lite's lock): nothing was read or written (a
    verify checked nothing; exit 2, 409 over HTTP); the message names the file."""

    names_its_server = True


class _Caught(logging.Handler):
    """Keeps the exception of the records it is handed (milvus-lite's own reason for not opening)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.exc: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.exc = record.exc_info[1]


def _open_lite(client_class: Any, path: str) -> Any:
    """A client of the milvus-lite database ``path``. milvus-lite opens it in this process, and on a
    failure logs its reason (with a traceback) and hands pymilvus a bare "Open local milvus failed":
    the reason is taken from that record instead (shown as well only with ``-v``), and the failure is
    one line naming the file: :class:`LiteFileInUse` when another process holds it (milvus-lite's
    lock), else a :class:`~nobackfill.catalog.items.ServerUnreachable`."""
    caught, lg = _Caught(), logging.getLogger("milvus_lite.server_manager")
    level, propagate = lg.level, lg.propagate
    shown = logging.getLogger("milvus_lite").isEnabledFor(logging.ERROR)  # -v: the library's own record too
    lg.addHandler(caught)
    lg.setLevel(logging.ERROR)
    lg.propagate = shown
    try:
        return client_class(path)
    except Exception as e:
        why = caught.exc
        if _lite_locked(path, why):
            raise LiteFileInUse(f"the milvus-lite file {path} is in use by another process ({LITE_ONE_PROCESS}, "
                                "docs/milvus.md)") from None
        if why is None:
            raise
        raise ServerUnreachable(f"cannot open the milvus-lite file {path} ({type(why).__name__}: {one_line(why)}; "
                                f"pymilvus: {one_line(getattr(e, 'message', None) or e)})") from None
    finally:
        lg.removeHandler(caught)
        lg.setLevel(level)
        lg.propagate = propagate


def _lite_locked(path: str, why: BaseException | None) -> bool:
    """Whether milvus-lite refused ``path`` because another process holds its lock: its own error
    says so, or (a version that said nothing) its lock file cannot be taken now."""
    if why is not None:
        return type(why).__name__ == "DataDirLockedError"
    lock = os.path.join(path, "LOCK")  # milvus-lite 3: a directory holding the database and its lock file
    if not os.path.isfile(lock):
        return False
    try:
        import fcntl

        fd = os.open(lock, os.O_RDWR)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def forget_client(client: Any) -> None:
    """Drop ``client`` from this process's clients (closed): the next use of its target connects
    anew. After a server restart a client's channel came back only after gRPC's back-off (trial Q:
    ~30 s of errors); a milvus-lite client is kept (its file allows one opener)."""
    if getattr(client, "_nobackfill_embedded", False):
        return
    with _CLIENTS_LOCK:
        for key, c in list(_CLIENTS.items()):
            if c is client:
                del _CLIENTS[key]
    with contextlib.suppress(Exception):
        client.close()


def _connect(client_class: Any, kw: dict[str, Any]) -> Any:
    """A client of the Milvus server at ``kw["uri"]``; a server that cannot be reached is a
    :class:`~nobackfill.catalog.items.CollectionError` naming it (not pymilvus' own exception)."""
    from pymilvus.exceptions import MilvusException

    try:
        return client_class(**kw)
    except MilvusException as e:
        why = one_line(getattr(e, "message", e))
        raise ServerUnreachable(f"cannot reach the Milvus server at {kw['uri']} ({why}); is it running, and is the "
                                "address right? (docs/milvus.md)") from None


def close_clients() -> None:
    """Close every client this process opened (a milvus-lite path can then be opened by another
    process)."""
    with _CLIENTS_LOCK:
        for c in _CLIENTS.values():
            with contextlib.suppress(Exception):
                c.close()
        _CLIENTS.clear()
    with contextlib.suppress(ImportError):  # milvus-lite keeps its in-process server (and the path's lock)
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_all()


def _dead_holder(token: str) -> bool:
    """A lease of a process of this host that is gone (killed): free at once, not after its TTL."""
    host, _, rest = token.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def milvus_index_params(spec: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Milvus index and search parameters for a backend spec (``flat``, ``hnsw:M=..,ef=..,efc=..``
    or a faiss factory string such as ``HNSW32`` / ``IVF1024,PQ16`` / ``Flat``)."""
    kind, opts = parse_spec(spec)
    if kind == "auto":  # Milvus searches growing segments exactly and indexes sealed ones: HNSW
        m = re.match(r"^HNSW(\d+)", str(opts.get("graph", "HNSW32")))
        return ({"index_type": "HNSW", "params": {"M": int(m.group(1)) if m else 32, "efConstruction": 40}},
                {"ef": int(opts.get("efSearch", 128))})
    if kind == "hnsw":
        return ({"index_type": "HNSW", "params": {"M": opts.get("M", 32), "efConstruction": opts.get("efc", 40)}},
                {"ef": opts.get("ef", 128)})
    if kind == "faiss":
        factory = opts.get("factory", "")
        m = re.match(r"^HNSW(\d+)", factory)
        if m:
            return ({"index_type": "HNSW", "params": {"M": int(m.group(1)), "efConstruction": 40}},
                    {"ef": int(opts.get("efSearch", 128))})
        m = re.match(r"^IVF(\d+)(?:,PQ(\d+))?", factory)
        if m:
            nlist = int(m.group(1))
            if m.group(2):
                return ({"index_type": "IVF_PQ", "params": {"nlist": nlist, "m": int(m.group(2)), "nbits": 8}},
                        {"nprobe": int(opts.get("nprobe", 16))})
            return {"index_type": "IVF_FLAT", "params": {"nlist": nlist}}, {"nprobe": int(opts.get("nprobe", 16))}
    return {"index_type": "FLAT", "params": {}}, {}


def wait_index_built(client: Any, name: str, deadline: float, timeout_s: float, poll_s: float) -> dict:
    """The index description of collection ``name`` once its index is built for every sealed row (or
    none is to be built); TimeoutError naming it after ``deadline`` (``time.monotonic()``)."""
    while True:
        desc = {}
        for index in client.list_indexes(name) or []:
            desc = client.describe_index(name, index) or {}
        total, done = int(desc.get("total_rows", 0)), int(desc.get("indexed_rows", 0))
        if (not desc or desc.get("index_type") == "FLAT"  # nothing to build (milvus-lite reports no progress)
                or (int(desc.get("pending_index_rows", 0)) == 0 and done >= total)):
            return desc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: index built for {done} of {total} rows after {timeout_s:.0f}s")
        time.sleep(poll_s)


def raise_if_lost(e: BaseException) -> None:
    """``ConnectionError`` if ``e`` says the Milvus server did not answer: a verify then checked
    nothing, and the storage is no damage to repair (other errors: the caller's to name)."""
    from ..catalog.schema import milvus_lost, milvus_lost_message

    if milvus_lost(e):
        raise ConnectionError(milvus_lost_message(e, "nothing was checked: run verify again once it answers")) from None
