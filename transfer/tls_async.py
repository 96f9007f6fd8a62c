"""TLS for the asyncio TCP transport: the client handshake on the event loop.

`tcp_async` drives its sockets with the loop's readiness callbacks and non-blocking
`sendmsg`/`recvmsg_into`; over TLS the very same channel code runs on a `tls_sock.TlsSocket`,
which gives those calls their meaning over TLS records and raises BlockingIOError where a plain
socket would. What is left is the handshake, done here without a thread: `do_handshake` on the
non-blocking socket, waiting for the fd whichever way OpenSSL asks. The caller bounds it (the
connect timeout). A certificate that does not verify raises ssl.SSLError (an OSError), so the
connection fails like a refused one: never a fallback to plaintext.
Import rule: standard library and cellar.transfer.tls_sock only.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from cellar.transfer.tls_sock import client_context


async def start_tls(sock: socket.socket, context: ssl.SSLContext | None,
                    server_hostname: str) -> socket.socket:
    """`sock` (connected, non-blocking; consumed) as a TlsSocket whose handshake is done."""
    loop = asyncio.get_running_loop()
    tls = (context or client_context(None)).wrap_socket(
        sock, server_hostname=server_hostname, do_handshake_on_connect=False)
    try:
        while True:
            try:
                tls.do_handshake()
                return tls
            except ssl.SSLWantReadError:
                await _ready(loop, tls.fileno(), writing=False)
            except ssl.SSLWantWriteError:
                await _ready(loop, tls.fileno(), writing=True)
    except BaseException:
        tls.close()
        raise


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, writing: bool) -> None:
    fut: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    (loop.add_writer if writing else loop.add_reader)(fd, wake)
    try:
        await fut
    finally:
        (loop.remove_writer if writing else loop.remove_reader)(fd)
