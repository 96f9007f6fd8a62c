"""A TCP forwarder that cuts one connection mid-transfer: the broken-connection tests of the
transports share it (tests/integration/test_tcp_transport.py, test_transports.py)."""

from __future__ import annotations

import socket
import threading


class CutProxy:
    """Forwards TCP to a target; when armed, cuts the first connection that has carried more
    than `after_bytes` in the armed direction (then disarms)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.armed: str | None = None  # "up" (client -> server) or "down"
        self.after_bytes = 0
        self.cuts = 0
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, direction: str, after_bytes: int) -> None:
        with self.lock:
            self.armed, self.after_bytes = direction, after_bytes

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            self.socks += [c, s]
            threading.Thread(target=self._pump, args=(c, s, c, s, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, c, s, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, a: socket.socket,
              b: socket.socket, direction: str) -> None:
        moved = 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self.lock:
                    cut = self.armed == direction and moved + len(data) > self.after_bytes
                    if cut:
                        self.armed = None
                        self.cuts += 1
                if cut:
                    dst.sendall(data[:max(0, self.after_bytes - moved)])
                    break
                dst.sendall(data)
                moved += len(data)
        except OSError:
            pass
        self.end_connection(a, b)

    @staticmethod
    def end_connection(*socks: socket.socket) -> None:
        """Either direction ending ends the whole connection."""
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()
