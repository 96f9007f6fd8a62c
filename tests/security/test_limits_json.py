"""Finding: deeply nested JSON to the admin API raised an unhandled RecursionError.

The HTTP server behind the master's and nodes' admin APIs (cellar.http) now answers 400 with a
message naming the bound (MAX_JSON_DEPTH) for too deep nesting, 413 for a body over
MAX_BODY_BYTES, 400 for a malformed Content-Length, and keeps serving. Exercised over real
sockets against a running HttpServer whose route parses the body as the admin API does.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from cellar.http import MAX_BODY_BYTES, MAX_JSON_DEPTH, HttpServer, Request, Response, parse_json


@pytest.fixture
def server() -> Iterator[tuple[int, list[object]]]:
    seen: list[object] = []
    loop = asyncio.new_event_loop()
    http = HttpServer()

    async def echo(request: Request) -> Response:
        body = request.json()
        seen.append(body)
        return Response.json({"ok": True})

    http.route("POST", "/api/v1/tenants", echo)
    port = loop.run_until_complete(http.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port, seen
    finally:
        asyncio.run_coroutine_threadsafe(http.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _post(port: int, body: bytes, length: str | None = None) -> tuple[int, bytes]:
    head = (f"POST /api/v1/tenants HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {length if length is not None else len(body)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
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
def test_deeply_nested_json_is_a_400_with_a_message(server: tuple[int, list[object]], depth: int) -> None:
    port, seen = server
    status, body = _post(port, b"[" * depth + b"]" * depth)
    assert status == 400
    assert "nests deeper" in json.loads(body)["error"]
    assert not seen  # the handler never ran
    assert _post(port, b'{"name": "ok"}')[0] == 200  # and the server still serves


def test_nesting_inside_strings_does_not_count(server: tuple[int, list[object]]) -> None:
    port, seen = server
    status, _ = _post(port, json.dumps({"name": "[" * 1000}).encode())
    assert status == 200 and seen == [{"name": "[" * 1000}]


def test_body_bounds(server: tuple[int, list[object]]) -> None:
    port, seen = server
    assert _post(port, b"", length=str(MAX_BODY_BYTES + 1))[0] == 413
    assert _post(port, b"{}", length="-1")[0] == 400
    assert _post(port, b"{}", length="+2")[0] == 400
    assert _post(port, b"{not json")[0] == 400
    assert not seen


def test_parse_json_never_recurses() -> None:
    with pytest.raises(ValueError, match="nests deeper"):
        parse_json(b'{"a":' * 200_000)
