"""A TCP forwarder whose node-to-client direction trickles (a slow link or a slow node mid-frame):
the cancellation tests use it to catch a read's payload half delivered when the deadline passes."""

from __future__ import annotations

import socket
import threading
import time


class SlowProxy:
    """Forwards TCP to `target`; replies leave in `piece_bytes` pieces, one per `pause_s`."""

    def __init__(self, target: tuple[str, int], *, piece_bytes: int = 32 << 10,
                 pause_s: float = 0.01) -> None:
        self.target = target
        self.piece_bytes = piece_bytes
        self.pause_s = pause_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.down_bytes = 0  # forwarded to clients so far
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            self.socks += [c, s]
            threading.Thread(target=self._pump, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while True:
                data = src.recv(self.piece_bytes if slow else 1 << 16)
                if not data:
                    break
                dst.sendall(data)
                if slow:
                    with self._lock:
                        self.down_bytes += len(data)
                    time.sleep(self.pause_s)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()
