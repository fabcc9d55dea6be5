"""Free ports on the loopback interface."""

from __future__ import annotations

import socket
from contextlib import ExitStack

LOOPBACK = "127.0.0.1"


def find_free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """Return ``n`` distinct ports that were free on ``host`` a moment ago.

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
