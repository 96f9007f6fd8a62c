"""Findings (review 2026-12-07) on replies of `cellar.http`, the master's and nodes' HTTP server.

A client that never reads its reply held its HTTP connection slot for ever.

`cellar.http` bounded the request (header and request timeouts) but then awaited the reply's
drain with no deadline. A reply larger than what the kernel buffers (a master's /metrics or
/api/v1/tenants grows with its tenants and segments: ~300 bytes per tenant, so 4 MiB at about
15,000 tenants) to a peer that shrinks its receive window and never reads kept the connection
open, and counted against `http_max_connections_per_peer` and `http_max_connections`, for as
long as the peer liked: a stranger with no token filled the port's slots and kept them. Now a
reply must drain within `RESPONSE_TIMEOUT_S` or the connection is aborted and counted
(`response_timeout`).

A real HttpServer on loopback, its one route answering 16 MiB (more than Linux's largest
default send buffer, 4 MiB), with small limits so the test stays cheap; over plain HTTP and
`http_tls`. No latency is asserted: the poll only bounds how long the test waits for the slot
that, before the fix, never came back.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellar.http import REFUSED_RESPONSE_TIMEOUT, HttpServer, Request, Response
from tests.support.http import serving

PER_PEER = 2
BIG_BYTES = 16 << 20
Server = tuple[HttpServer, int, ssl.SSLContext | None]


@pytest.fixture(params=["plain", "tls"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    server_tls = client_tls = None
    if request.param == "tls":
        pytest.importorskip("cryptography")
        from cellar.tls import client_context, make_dev_pki, server_context

        files = make_dev_pki(tmp_path, ["127.0.0.1"])
        server_tls = server_context(str(files.cert_file), str(files.key_file))
        client_tls = client_context(str(files.ca_file))
    loop = asyncio.new_event_loop()
    http = HttpServer()
    http.set_limits(max_connections=8, max_connections_per_peer=PER_PEER, header_timeout_s=10,
                    refusal_log_interval_s=60)
    http.response_timeout_s = 0.5
    big = b"x" * BIG_BYTES

    async def large(_: Request) -> Response:
        return Response(200, big)

    async def health(_: Request) -> Response:
        return Response(200, b"ok\n")

    async def broken(_: Request) -> Response:
        return Response(200, str(1.0 * 10 ** 400).encode())  # OverflowError: a handler's bug

    http.route("GET", "/broken", broken)
    http.route("GET", "/large", large)
    http.route("GET", "/health", health)
    with serving(http, loop, server_tls) as port:
        yield http, port, client_tls


def _ask(port: int, tls: ssl.SSLContext | None, path: str, *, read: bool) -> socket.socket | bytes:
    raw = socket.socket()
    if not read:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # a window that stays shut
    raw.settimeout(10)
    raw.connect(("127.0.0.1", port))
    sock = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    if not read:
        return sock
    reply = b""
    with sock:
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def _health(port: int, tls: ssl.SSLContext | None) -> bytes:
    try:
        reply = _ask(port, tls, "/health", read=True)
    except (OSError, ssl.SSLError):  # refused at the per-peer limit: reset or closed
        return b""
    assert isinstance(reply, bytes)
    return reply


def test_a_reply_nobody_reads_does_not_hold_the_slot(server: Server) -> None:
    http, port, tls = server
    stalled = [_ask(port, tls, "/large", read=False) for _ in range(PER_PEER)]
    try:
        deadline = time.monotonic() + 30  # how long to wait for a slot, not a latency bound
        reply = _health(port, tls)
        while not reply.startswith(b"HTTP/1.1 200 ") and time.monotonic() < deadline:
            time.sleep(0.2)
            reply = _health(port, tls)
        assert reply.startswith(b"HTTP/1.1 200 "), f"the unread replies kept every slot: " \
            f"{http.refusals}"
        # the first cut frees a slot; the other stalled reply's deadline may come just after
        while http.refusals[REFUSED_RESPONSE_TIMEOUT] < PER_PEER and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http.refusals[REFUSED_RESPONSE_TIMEOUT] == PER_PEER, http.refusals
    finally:
        for sock in stalled:
            assert isinstance(sock, socket.socket)
            sock.close()


def test_a_handler_that_raises_is_answered_500_and_the_server_serves_on(server: Server) -> None:
    """Finding (same review): a handler raising anything but CellarError, ValueError, KeyError
    or TypeError (an OverflowError from a number too large for a float, twice in the master's
    API) closed the connection with no reply, and asyncio logged a traceback per request."""
    http, port, tls = server
    for _ in range(3):
        reply = _ask(port, tls, "/broken", read=True)
        assert isinstance(reply, bytes) and reply.startswith(b"HTTP/1.1 500 "), reply[:200]
    assert http.handler_failures == 3
    assert _health(port, tls).startswith(b"HTTP/1.1 200 ")
