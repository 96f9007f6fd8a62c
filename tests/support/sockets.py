"""Raw-socket helpers for tests that speak a wire protocol by hand (data-port frames, the fast
line, a fake gRPC peer)."""

from __future__ import annotations

import socket


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """The next `n` bytes of `sock`; ConnectionError if the peer closes first."""
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += got
    return bytes(out)
