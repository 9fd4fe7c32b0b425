"""Whether a Ray cluster answers at an address, before ``ray.init`` is asked to join it: an address
``HOST:PORT`` (or ``ray://HOST:PORT``) is dialled with a TCP connect of a few seconds; where nothing
answers the run is refused at once, naming the address and how to start a cluster there (``ray.init``
itself retries such an address for many minutes: trial Z saw a backfill hang past four minutes). What
answers must speak gRPC, as a Ray head does: a web server's or a database's port, or one that says
nothing, is refused too (``ray.init`` waited there for its whole deadline)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

__all__ = ["CLI_RETRY", "PROBE_S", "RayUnreachable", "check_ray_address", "own_ray", "ray_address_error",
           "ray_address_form_error"]

#: seconds a TCP connect to a cluster's address may take before the address is said not to answer
PROBE_S = 3.0
#: what a user of the command line does to join the cluster of this machine instead
CLI_RETRY = "use --address auto for the cluster `ray start` runs on this machine"


class RayUnreachable(ConnectionError):
    """No Ray cluster answers at the address given, or ``ray.init`` did not join it in time: the
    message names the address and what to do."""


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT``, ``[V6]:PORT`` or ``ray://HOST[:PORT]`` (Ray Client's
    default port 10001); None for what Ray resolves itself (``auto``, ``local``) or cannot parse."""
    a, client = address.strip(), False
    if "://" in a:
        scheme, a = a.split("://", 1)
        client = scheme == "ray"
        if not client:
            return None
        a = a.split("/", 1)[0]
    if a.startswith("["):  # [::1]:6379
        host, _, rest = a[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port = a.rpartition(":")
        if not sep:
            host, port = a, ""
    if not port and client:
        port = "10001"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


#: what a gRPC server (a Ray head's GCS, a Ray Client server) answers first: HTTP/2's preface, then
#: a SETTINGS frame (RFC 9113 section 3.4)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _not_grpc(conn: socket.socket, timeout_s: float) -> str | None:
    """None when the peer of ``conn`` answers HTTP/2's connection preface with a SETTINGS frame, as
    every gRPC server (Ray's GCS, its Client server) does; else what it did instead, in words (a web
    server, a database, a port that takes connections and says nothing: ``ray.init`` would wait on
    it for its whole deadline; trial AA). With ``RAY_USE_TLS`` set nothing is asked (TLS first)."""
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "", "false"):
        return None
    conn.settimeout(timeout_s)
    got = b""
    try:
        conn.sendall(_H2_PREFACE)
        while len(got) < 9:
            piece = conn.recv(9 - len(got))
            if not piece:
                break
            got += piece
    except (socket.timeout, TimeoutError):
        return f"says nothing within {timeout_s:g} s when a gRPC connection starts"
    except OSError as e:
        return f"closed the connection ({e.strerror or type(e).__name__})"
    if len(got) == 9 and got[3] == 0x04:  # a frame of type SETTINGS
        return None
    if not got:
        return "closed the connection without a word of gRPC"
    if got.startswith(b"HTTP/"):
        return "answers as a web server (HTTP/1), not in gRPC"
    return "does not answer in gRPC"


def ray_address_error(address: str | None, timeout_s: float = PROBE_S, *, retry: str = CLI_RETRY,
                      outcome: str = "nothing was changed") -> str | None:
    """None when a gRPC server (as a Ray head is) answers at ``address`` within ``timeout_s`` (the
    host resolved as given), or when Ray finds the cluster itself (None, ``auto``, ``local``); else
    one line naming the address, why, what to do (start a cluster there, or ``retry``) and
    ``outcome``."""
    if own_ray(address):
        return None
    if address.strip() == "auto":
        return _auto_error(timeout_s, outcome)
    hp = _host_port(address)
    if hp is None:  # trial AA: Ray refused "HOST" only after the sample; trial AB: "", http://..., ray://
        return f"{ray_address_form_error(address)}; {outcome}"
    host, port = hp
    client = address.strip().startswith("ray://")
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            other = _not_grpc(conn, timeout_s)
        if other is None:
            return None
        return (f"{address} is not a Ray {'Client server' if client else 'cluster'}: something answers there but "
                f"{other}; give the address `ray start --head` printed (its GCS port, 6379 by default) or {retry}; "
                f"{outcome}")
    except socket.gaierror as e:
        why = f"host {host} not found: {e.strerror or e}"
    except ConnectionRefusedError:
        why = "connection refused"
    except (socket.timeout, TimeoutError):
        why = f"no answer within {timeout_s:g} s"
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
    try:
        ipaddress.ip_address(host)
        ip = f" --node-ip-address {host}"
    except ValueError:  # a host name: ray start takes an IP there
        ip = ""
    start = (f"ray start --head --ray-client-server-port {port}" if client
             else f"ray start --head{ip} --port {port}")
    return (f"no Ray {'Client server' if client else 'cluster'} answers at {address} ({why}): start one there "
            f"(`{start}`) or {retry}; {outcome}")


def own_ray(address: str | None) -> bool:
    """Whether ``address`` asks for a Ray of the run's own (none given, or Ray's word ``local``) rather
    than a cluster to join."""
    return address is None or address.strip() == "local"


def ray_address_form_error(address: str, option: str = "--address") -> str | None:
    """None when ``address`` has a form Ray takes (``HOST:PORT``, ``ray://HOST[:PORT]``, ``auto``,
    ``local``), else one line saying what is (``option``: the option that gave it). Nothing is dialled."""
    if own_ray(address) or address.strip() == "auto" or _host_port(address) is not None:
        return None
    return (f"{option} {address!r}: not an address Ray takes: give HOST:PORT (the GCS port of a Ray head, "
            "`ray start --head --port PORT`), ray://HOST:PORT or auto")


def _auto_error(timeout_s: float, outcome: str) -> str | None:
    """:func:`ray_address_error` of ``auto``, found as Ray finds it: ``RAY_ADDRESS``; a GCS server
    process of this machine (None: Ray joins it); the address the last ``ray start`` wrote
    (``ray_current_cluster`` in Ray's temporary folder), dialled. None of them: no cluster runs here
    (trial AB: ``--address auto`` made the backfill job, then Ray said it found no instance)."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return ray_address_error(env, timeout_s, retry="unset RAY_ADDRESS, or set it to a running cluster's "
                                 "address", outcome=outcome)
    if _gcs_running():
        return None
    temp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    try:
        last = (Path(temp) / "ray" / "ray_current_cluster").read_text().strip()
    except OSError:
        last = ""
    if last:
        return ray_address_error(last, timeout_s, retry="start it again, or give another --address",
                                 outcome=outcome)
    return (f"--address auto: no Ray cluster runs on this machine: start one (`ray start --head`), give HOST:PORT "
            f"of another, or leave --address out for a Ray of this run's own; {outcome}")


def _gcs_running() -> bool:
    """Whether a Ray GCS server process runs on this machine (as Ray's own ``auto`` looks for one);
    True where processes cannot be listed (no ``/proc``): Ray is left to say."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                if b"gcs_server" in (d / "cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def check_ray_address(address: str | None, timeout_s: float = PROBE_S, *, retry: str = CLI_RETRY,
                      outcome: str = "nothing was changed") -> None:
    """:func:`ray_address_error` as a :class:`RayUnreachable` (a ``ConnectionError``)."""
    why = ray_address_error(address, timeout_s, retry=retry, outcome=outcome)
    if why:
        raise RayUnreachable(why)
