"""`handshake(cert, key, ca, server_name)`: one TLS handshake on loopback with a server
certificate, verified by Cellar's own client context (cellar.tls) as `server_name`; raises
ssl.SSLCertVerificationError when the certificate does not name it or chain to `ca`."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from cellar.tls import client_context, server_context


def handshake(cert: Path, key: Path, ca: Path, server_name: str) -> None:
    server = server_context(str(cert), str(key))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True):
                    pass
            except OSError:  # the client refused the certificate
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw:
                client_context(str(ca)).wrap_socket(raw, server_hostname=server_name).close()
        finally:
            thread.join(timeout=10)
