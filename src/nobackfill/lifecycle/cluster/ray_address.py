"""Whether a Ray cluster answers at an address, before ``ray.init`` is asked to join it: an address
``HOST:PORT`` (or ``ray://HOST:PORT``) is dialled with a TCP connect of a few seconds; where nothing
answers the run is refused at once, naming the address and how to start a cluster there (``ray.init``
itself retries such an address for many minutes: trial Z saw a backfill hang past four minutes)."""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["CLI_RETRY", "PROBE_S", "RayUnreachable", "check_ray_address", "ray_address_error"]

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


def ray_address_error(address: str | None, timeout_s: float = PROBE_S, *, retry: str = CLI_RETRY,
                      outcome: str = "nothing was changed") -> str | None:
    """None when something answers a TCP connect at ``address`` within ``timeout_s`` (the host
    resolved as given), or when Ray finds the cluster itself (None, ``auto``, ``local``); else one
    line naming the address, why, what to do (start a cluster there, or ``retry``) and ``outcome``."""
    hp = _host_port(address) if address else None
    if hp is None:
        a = (address or "").strip()
        if a and a not in ("auto", "local") and "://" not in a:  # trial AA: Ray refused it only after the sample
            return (f"--address {address}: not an address Ray takes: give HOST:PORT (the GCS port of a Ray head, "
                    f"`ray start --head --port PORT`), ray://HOST:PORT or auto; {outcome}")
        return None
    host, port = hp
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as e:
        why = f"host {host} not found: {e.strerror or e}"
    except ConnectionRefusedError:
        why = "connection refused"
    except (socket.timeout, TimeoutError):
        why = f"no answer within {timeout_s:g} s"
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
    client = address.strip().startswith("ray://")
    try:
        ipaddress.ip_address(host)
        ip = f" --node-ip-address {host}"
    except ValueError:  # a host name: ray start takes an IP there
        ip = ""
    start = (f"ray start --head --ray-client-server-port {port}" if client
             else f"ray start --head{ip} --port {port}")
    return (f"no Ray {'Client server' if client else 'cluster'} answers at {address} ({why}): start one there "
            f"(`{start}`) or {retry}; {outcome}")


def check_ray_address(address: str | None, timeout_s: float = PROBE_S, *, retry: str = CLI_RETRY,
                      outcome: str = "nothing was changed") -> None:
    """:func:`ray_address_error` as a :class:`RayUnreachable` (a ``ConnectionError``)."""
    why = ray_address_error(address, timeout_s, retry=retry, outcome=outcome)
    if why:
        raise RayUnreachable(why)
