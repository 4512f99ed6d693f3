"""How a process names the address it listens on to the others (Prometheus, ``sluice status``).

A process binds an address (``127.0.0.1``, or a wildcard such as ``0.0.0.0`` to listen on every
interface) and publishes in Redis the address others reach it at: the configured advertise host
when there is one, else the bound address; a wildcard names no address at all, so this machine's
own stands in for it: the address of the interface it reaches other hosts through (in a container
or a pod, the container's or the pod's address), or its host name when it has no route.
"""

from __future__ import annotations

import socket

#: Bind addresses that mean "every interface": they cannot be connected to from elsewhere.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
#: An address of TEST-NET-1 (RFC 5737), routed nowhere: "connecting" a UDP socket to it sends nothing
#: and only picks the interface the route to other hosts goes through.
_PROBE_ADDRESS = ("192.0.2.1", 9)


def primary_address() -> str:
    """This machine's address on the interface it reaches other hosts through; its host name without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_PROBE_ADDRESS)
            address: str = probe.getsockname()[0]
            return address
    except OSError:
        return socket.gethostname()


def advertised_host(bind_host: str, override: str | None = None) -> str:
    """The host other processes use to reach a server bound to ``bind_host``."""
    if override:
        return override
    return primary_address() if bind_host in WILDCARD_HOSTS else bind_host


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (what Prometheus targets and URLs want)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def http_url(host: str, port: int, path: str = "") -> str:
    return f"http://{host_port(host, port)}{path}"
