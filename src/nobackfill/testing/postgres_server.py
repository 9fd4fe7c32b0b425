"""A real PostgreSQL server for tests and benchmarks: a throwaway cluster made with ``initdb`` in a
fresh directory, listening on 127.0.0.1 only (plus a Unix socket inside that directory), trust
authentication, superuser ``nobackfill``, and a database of the same name.

The binaries (``initdb``, ``pg_ctl``, ``postgres``) are taken from ``PATH``, else from the newest
``/usr/lib/postgresql/<version>/bin`` (Debian's ``postgresql`` package); without them
:func:`start_postgres` raises :class:`PostgresServerError` naming what is missing.

PostgreSQL refuses to run as root. Started by root, the cluster is made and run as ``nobody``: its
directory is handed to that user, and when ``nobody`` cannot reach ``base_dir`` (pytest's
``/tmp/pytest-of-root`` is mode 0700) the cluster goes to a fresh ``/tmp/nobackfill-pg-*``
directory instead, removed again by :meth:`RunningPostgres.stop`.

The server never outlives the process that started it by accident: :meth:`RunningPostgres.stop`
(``pg_ctl stop -m fast``, escalated to SIGKILL of the postmaster) is registered with
:mod:`atexit`, and, when started from the main thread on Linux, the postmaster gets SIGQUIT
(PostgreSQL's immediate shutdown) if that process dies without running it (SIGKILL, a crash). Only
the main thread: the kernel sends that signal when the *thread* that started the server ends. A
server that is killed that way leaves its directory behind.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PostgresServerError", "RunningPostgres", "find_binaries", "start_postgres"]

#: the superuser made by initdb, and the database made for it
USER = "nobackfill"
DBNAME = "nobackfill"
#: where Debian's postgresql-<version> packages put their binaries (<version>/bin)
PG_LIB = Path("/usr/lib/postgresql")
#: the unprivileged account that runs the server when we are root
RUN_AS = "nobody"
#: settings for a small test server (``postgres -c``); fsync stays on (the default)
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "shared_buffers": "16MB",
    "max_connections": "100",
    "max_wal_size": "256MB",
    "log_min_messages": "warning",
    "logging_collector": "off",
}
#: a Unix socket path is limited to 107 bytes; a deeper base_dir gets no socket (TCP only)
_MAX_SOCKET_DIR = 80


class PostgresServerError(RuntimeError):
    """The PostgreSQL binaries are missing or the server did not start."""


@dataclass
class RunningPostgres:
    """A started server; ``url`` is ``postgresql://nobackfill@127.0.0.1:PORT/nobackfill``."""

    url: str
    port: int
    data_dir: Path  # the cluster
    log_path: Path  # the server's stderr
    proc: subprocess.Popen = field(repr=False)
    bindir: Path = field(repr=False)
    #: a /tmp directory made because the server's user could not reach base_dir; removed by stop()
    owned_dir: Path | None = field(default=None, repr=False)
    #: the account the server runs as when we are root, else None
    run_as: str | None = None

    def url_for(self, dbname: str) -> str:
        """The URL of another database on this server."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """``pg_ctl stop -m fast``; SIGKILL of the postmaster when that fails or takes more than
        ``grace_s``. Idempotent; also run at interpreter exit."""
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            try:
                r = subprocess.run(
                    [str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast", "-w",
                     "-t", str(max(1, int(grace_s)))],
                    capture_output=True, timeout=grace_s + 5, **_as_user(self.run_as, self.data_dir.parent),
                )
                ok = r.returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            try:
                self.proc.wait(timeout=5 if ok else 0.1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.owned_dir is not None:
            shutil.rmtree(self.owned_dir, ignore_errors=True)
            self.owned_dir = None


def find_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: that of ``initdb`` on PATH
    (symlinks resolved), else the newest ``/usr/lib/postgresql/*/bin``."""
    names = ("initdb", "pg_ctl", "postgres")
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
        candidates.append(Path(on_path).parent)
    versions = sorted(
        (p for p in PG_LIB.glob("*/bin") if re.fullmatch(r"\d+(\.\d+)?", p.parent.name)),
        key=lambda p: tuple(int(x) for x in p.parent.name.split(".")),
        reverse=True,
    )
    candidates.extend(versions)
    for d in candidates:
        if all(os.access(d / n, os.X_OK) for n in names):
            return d
    looked = ", ".join(str(d) for d in candidates) or "nothing found"
    raise PostgresServerError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH nor under "
        f"{PG_LIB}/*/bin (looked in: {looked}); install Debian's `postgresql` package"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env() -> dict[str, str]:
    # no PG* variables of the caller (PGDATA, PGPORT, ...) reach the server's tools
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    return env


def _as_user(run_as: str | None, cwd: Path) -> dict[str, Any]:
    """Popen arguments running a command as ``run_as`` (when root) in ``cwd``."""
    kw: dict[str, Any] = {"cwd": str(cwd), "env": _child_env()}
    if run_as is not None:
        pw = pwd.getpwnam(run_as)
        kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        kw["env"]["HOME"] = str(cwd)
    return kw


def _die_with_parent() -> Any:
    """A preexec_fn giving the child SIGQUIT when this thread dies (Linux, main thread only)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def fn() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGQUIT), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return fn


def _reachable_by(run_as: str, path: Path) -> bool:
    """Whether ``run_as`` can enter and write ``path``."""
    try:
        r = subprocess.run(["/bin/sh", "-c", 'test -x "$1" && test -w "$1"', "sh", str(path)],
                           capture_output=True, timeout=30, **_as_user(run_as, Path("/")))
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _log_tail(path: Path, n: int = 15, start: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def start_postgres(base_dir: str | Path, *, port: int | None = None, timeout_s: float = 60.0) -> RunningPostgres:
    """Make a cluster in ``base_dir/data`` (use a fresh directory), start it on 127.0.0.1:``port``
    (a free one by default), wait until it accepts connections, create the database ``nobackfill``
    and return the running server. Raises :class:`PostgresServerError` when the binaries are
    missing or it does not start within ``timeout_s``."""
    try:
        import psycopg
    except ImportError as e:
        raise PostgresServerError(
            f"the `psycopg` package is not installed ({e}); pip install 'psycopg[binary]'"
        ) from None
    bindir = find_binaries()
    base_dir = Path(base_dir).absolute()
    base_dir.mkdir(parents=True, exist_ok=True)

    run_as: str | None = None
    owned_dir: Path | None = None
    run_dir = base_dir
    if os.geteuid() == 0:
        run_as = RUN_AS
        try:
            pw = pwd.getpwnam(run_as)
        except KeyError:
            raise PostgresServerError(
                f"running as root, and there is no user {run_as!r} to run PostgreSQL as"
            ) from None
        os.chown(base_dir, pw.pw_uid, pw.pw_gid)
        if not _reachable_by(run_as, base_dir):
            owned_dir = Path(tempfile.mkdtemp(prefix="nobackfill-pg-", dir="/tmp"))
            os.chown(owned_dir, pw.pw_uid, pw.pw_gid)
            run_dir = owned_dir
            (base_dir / "CLUSTER_DIR").write_text(f"{owned_dir}\n")
            if not _reachable_by(run_as, run_dir):
                shutil.rmtree(owned_dir, ignore_errors=True)
                raise PostgresServerError(f"user {run_as!r} cannot reach {base_dir} nor {owned_dir}")
    data_dir = run_dir / "data"
    log_path = run_dir / "postgres.log"

    try:
        r = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data_dir), "-U", USER, "--auth=trust", "--encoding=UTF8",
             "--locale=C", "--no-sync"],
            capture_output=True, text=True, timeout=timeout_s, **_as_user(run_as, run_dir),
        )
    except subprocess.TimeoutExpired:
        if owned_dir is not None:
            shutil.rmtree(owned_dir, ignore_errors=True)
        raise PostgresServerError(f"initdb took more than {timeout_s:.0f}s") from None
    if r.returncode != 0:
        if owned_dir is not None:
            shutil.rmtree(owned_dir, ignore_errors=True)
        raise PostgresServerError(f"initdb failed in {data_dir}: {(r.stderr or r.stdout).strip()[-2000:]}")

    socket_dir = str(run_dir) if len(str(run_dir)) <= _MAX_SOCKET_DIR else ""
    deadline = time.monotonic() + timeout_s
    attempts = 1 if port is not None else 3
    last_err = ""
    for _ in range(attempts):
        p = port if port is not None else _free_port()
        settings = {**SETTINGS, "port": str(p), "unix_socket_directories": socket_dir}
        cmd = [str(bindir / "postgres"), "-D", str(data_dir)]
        for k, v in settings.items():
            cmd += ["-c", f"{k}={v}"]
        log_from = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_die_with_parent(),
                                    **_as_user(run_as, run_dir))
        server = RunningPostgres(url=f"postgresql://{USER}@127.0.0.1:{p}/{DBNAME}", port=p, data_dir=data_dir,
                                 log_path=log_path, proc=proc, bindir=bindir, owned_dir=owned_dir, run_as=run_as)
        atexit.register(server.stop)
        admin = server.url_for("postgres")
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with psycopg.connect(admin, autocommit=True, connect_timeout=2) as conn:
                    conn.execute(f'CREATE DATABASE "{DBNAME}"')
                return server
            except psycopg.OperationalError as e:
                last_err = str(e).strip()
                time.sleep(0.05)
        tail = _log_tail(log_path, start=log_from)
        if proc.poll() is None:  # timed out
            server.stop()
            raise PostgresServerError(f"PostgreSQL did not accept connections on 127.0.0.1:{p} within "
                                      f"{timeout_s:.0f}s ({last_err}); log:\n{tail}")
        atexit.unregister(server.stop)
        if port is None and ("could not bind" in tail or "could not create any TCP/IP sockets" in tail):
            continue  # the free port was taken in between: another one
        break
    if owned_dir is not None:
        shutil.rmtree(owned_dir, ignore_errors=True)
    raise PostgresServerError(f"PostgreSQL exited while starting (data in {data_dir}); log:\n{tail}")
