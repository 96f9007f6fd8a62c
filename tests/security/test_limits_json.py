"""Finding: deeply nested JSON to the admin API raised an unhandled RecursionError.

The HTTP server behind the master's and nodes' admin APIs (cellar.http) now answers 400 with a
message naming the bound (MAX_JSON_DEPTH) for too deep nesting, 413 for a body over
MAX_BODY_BYTES, 400 for a malformed Content-Length, and keeps serving. Exercised over real
sockets against a running HttpServer whose route parses the body as the admin API does, in
plaintext and over TLS (`http_tls`: the request is then read through cellar.http_tls's reader,
which must keep the same bounds).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellar.http import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    MAX_JSON_DEPTH,
    HttpServer,
    Request,
    Response,
    parse_json,
)
from tests.support.http import serving

Server = tuple[int, list[object], ssl.SSLContext | None]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it), or a skip without `cryptography`."""
    pytest.importorskip("cryptography")
    from cellar.tls import client_context, make_dev_pki, server_context

    files = make_dev_pki(Path(tmp_path_factory.mktemp("pki")), ["127.0.0.1"])
    return (server_context(str(files.cert_file), str(files.key_file)),
            client_context(str(files.ca_file)))


@pytest.fixture(params=["plain", "tls"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    seen: list[object] = []
    loop = asyncio.new_event_loop()
    http = HttpServer()
    server_tls, client_tls = request.getfixturevalue("pki") if request.param == "tls" else (None, None)

    async def echo(request: Request) -> Response:
        body = request.json()
        seen.append(body)
        return Response.json({"ok": True})

    http.route("POST", "/api/v1/tenants", echo)
    with serving(http, loop, server_tls) as port:
        yield port, seen, client_tls


def _post(server: Server, body: bytes, length: str | None = None) -> tuple[int, bytes]:
    port, _, tls = server
    head = (f"POST /api/v1/tenants HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {length if length is not None else len(body)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        sock = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
        sock.sendall(head.encode() + body)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    reply = b"".join(chunks)
    status = int(reply.split(b" ", 2)[1])
    return status, reply.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_deeply_nested_json_is_a_400_with_a_message(server: Server, depth: int) -> None:
    _, seen, _ = server
    status, body = _post(server, b"[" * depth + b"]" * depth)
    assert status == 400
    assert "nests deeper" in json.loads(body)["error"]
    assert not seen  # the handler never ran
    assert _post(server, b'{"name": "ok"}')[0] == 200  # and the server still serves


def test_nesting_inside_strings_does_not_count(server: Server) -> None:
    _, seen, _ = server
    status, _ = _post(server, json.dumps({"name": "[" * 1000}).encode())
    assert status == 200 and seen == [{"name": "[" * 1000}]


def test_body_bounds(server: Server) -> None:
    _, seen, _ = server
    assert _post(server, b"", length=str(MAX_BODY_BYTES + 1))[0] == 413
    assert _post(server, b"{}", length="-1")[0] == 400
    assert _post(server, b"{}", length="+2")[0] == 400
    assert _post(server, b"{not json")[0] == 400
    assert not seen


def test_parse_json_never_recurses() -> None:
    with pytest.raises(ValueError, match="nests deeper"):
        parse_json(b'{"a":' * 200_000)


def test_headers_over_the_limit_are_a_400(server: Server) -> None:
    port, seen, tls = server
    padding = b"X-Pad: " + b"a" * (MAX_HEADER_BYTES + 1024) + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        sock = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
        sock.sendall(b"POST /api/v1/tenants HTTP/1.1\r\n" + padding + b"\r\n{}")
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:80]
    assert not seen
    assert _post(server, b'{"name": "ok"}')[0] == 200
