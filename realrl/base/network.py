"""Ports on the loopback interface: sockets bound now, or ports that were free a moment ago; and
the network interface that carries an address (where gloo and NCCL must open their sockets)."""

from __future__ import annotations

import fcntl
import socket
import struct
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


SIOCGIFADDR = 0x8915  # Linux: read an interface's IPv4 address


def interface_addresses() -> dict[str, str]:
    """Interface name -> its IPv4 address, for every interface that has one (Linux)."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def interface_of(address: str, addresses: dict[str, str] | None = None) -> str | None:
    """The interface whose address is ``address`` (this node's address as its peers reach it):
    gloo and NCCL open their sockets there rather than on whichever interface they guess first
    (a container bridge or a management network the other nodes cannot reach). None when no
    interface has it."""
    found = interface_addresses() if addresses is None else addresses
    return next((name for name, ip in sorted(found.items()) if ip == address), None)
