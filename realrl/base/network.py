"""Ports on the loopback interface: sockets bound now, or ports that were free a moment ago."""

from __future__ import annotations

import socket
from contextlib import ExitStack

LOOPBACK = "127.0.0.1"


def find_free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """Return ``n`` distinct ports that were free on ``host`` a moment ago (for tests; a server
    of a run listens on a ``bound_socket`` instead: a free port may be taken before it binds).

    The sockets are held open together so the kernel cannot hand out one port twice.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def find_free_port(host: str = LOOPBACK) -> int:
    return find_free_ports(1, host)[0]


def bound_socket(host: str = LOOPBACK) -> socket.socket:
    """A TCP socket bound to a free port of ``host`` (not yet listening): hand it to the server
    that will listen on it, so no other process can take the port in between."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock
