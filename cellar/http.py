"""A minimal asyncio HTTP/1.1 server for /metrics, /health and the JSON admin API.

Masters and storage nodes serve a handful of small GET/POST endpoints; a full web framework
would be a heavy dependency for that. Requests are bounded (header bytes, body bytes, time)
so a hostile peer cannot make the server allocate or wait without limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 10.0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(value, indent=1).encode(), "application/json")


Handler = Callable[[Request], Awaitable[Response]]
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class HttpServer:
    """Routes (method, path) to async handlers; everything else is 404/405."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, str], Handler] = {}
        self._server: asyncio.AbstractServer | None = None

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method.upper(), path)] = handler

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response = await asyncio.wait_for(self._handle(reader), REQUEST_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError,
                asyncio.LimitOverrunError, ValueError):
            response = Response(400, b"bad request\n")
        try:
            head = (f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}\r\n"
                    f"Content-Type: {response.content_type}\r\n"
                    f"Content-Length: {len(response.body)}\r\nConnection: close\r\n")
            for name, value in response.headers.items():
                head += f"{name}: {value}\r\n"
            writer.write(head.encode() + b"\r\n" + response.body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader) -> Response:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        length = 0
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if length < 0 or length > MAX_BODY_BYTES:
            return Response(413, b"body too large\n")
        body = await reader.readexactly(length) if length else b""
        url = urlsplit(target)
        handler = self._routes.get((method.upper(), url.path))
        if handler is None:
            allowed = any(path == url.path for (_m, path) in self._routes)
            return Response(405 if allowed else 404, b"no such endpoint\n")
        request = Request(method.upper(), url.path, parse_qs(url.query), body, headers)
        try:
            return await handler(request)
        except (ValueError, KeyError, TypeError) as exc:
            return Response.json({"error": str(exc)}, 400)
