"""Free TCP ports for the processes a tool or a test starts, chosen outside the kernel's
ephemeral range.

Why
    A port found by binding port 0 comes from the ephemeral range, the same pool the kernel
    draws from for every outgoing connection; between the check and the child's bind, any
    process on the machine may take it for a connection of its own. On a 2-core CI machine
    running two engine suites side by side that happened: a master could not bind the KV
    events port the test had just found free ("Address already in use", 2026-12-06). Ports
    below the ephemeral range are never handed out implicitly, so only another explicit bind
    can take one; `free_port` picks one at random there and checks it binds.

What it must never do
    Hold the port (the caller's child binds it) or loop without a bound.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

LOWEST_PORT = 10_000      # above the well-known and most registered services' ports
DEFAULT_EPHEMERAL_START = 32_768  # Linux's default when /proc does not say
TRIES = 64
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_random = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` nothing listens on right now, below the ephemeral range when there
    is room there (else one the kernel picks: another process may still take it)."""
    top = _ephemeral_start()
    if top - LOWEST_PORT >= TRIES:
        for _ in range(TRIES):
            port = _random.randrange(LOWEST_PORT, top)
            if _binds(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
