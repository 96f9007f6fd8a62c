"""A TCP forwarder whose node-to-client direction trickles (a slow link or a slow node mid-frame):
the cancellation tests use it to catch a read's payload half delivered when the deadline passes."""

from __future__ import annotations

import socket
import time

from tests.integration.cut_proxy import CutProxy


class SlowProxy(CutProxy):
    """Forwards TCP to `target`; replies leave in `piece_bytes` pieces, one per `pause_s`."""

    def __init__(self, target: tuple[str, int], *, piece_bytes: int = 32 << 10,
                 pause_s: float = 0.01) -> None:
        self.piece_bytes = piece_bytes
        self.pause_s = pause_s
        self.down_bytes = 0  # forwarded to clients so far
        super().__init__(target)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _pump(self, src: socket.socket, dst: socket.socket, a: socket.socket,
              b: socket.socket, direction: str) -> None:
        slow = direction == "down"
        try:
            while True:
                data = src.recv(self.piece_bytes if slow else 1 << 16)
                if not data:
                    break
                dst.sendall(data)
                if slow:
                    with self.lock:
                        self.down_bytes += len(data)
                    time.sleep(self.pause_s)
        except OSError:
            pass
        self.end_connection(a, b)
