"""A minimal asyncio HTTP/1.1 server for /metrics, /health and the JSON admin API.

Masters and storage nodes serve a handful of small GET/POST endpoints; a full web framework
would be a heavy dependency for that. Requests are bounded (header bytes, body bytes, JSON
nesting, time, concurrent connections) so a hostile peer cannot make the server allocate,
recurse or wait without limit: anything over a bound is a 4xx with a message saying which,
never an unhandled exception. A handler's `CellarError` (e.g. QuotaExceeded past max_tenants)
answers 400 with its message; anything else a handler raises is its bug and answers 500
(before, the connection closed unanswered and asyncio logged a traceback per request).

Ports a stranger cannot block: at most `max_connections` connections in all and
`max_connections_per_peer` from one peer address (more are closed at once, so one address
cannot take every slot); a request's line and headers must arrive within `header_timeout_s` of
its connection (an idle or dripping connection is closed then, not after the whole
`request_timeout_s`); its reply must drain within `response_timeout_s` (a peer that never
reads a reply larger than the kernel buffers is cut off, not left holding its slot). Every
refusal is counted by reason (`refusals`, exported through `collector`) and logged at most
once per peer per interval (cellar.refusals).

TLS (`http_tls`, docs/security.md): `start(..., ssl_context=)` serves HTTPS with the process's
own certificate (the master's gRPC one, a node's data-port one), so admin tokens never cross
the network in clear. The handshake comes after the connection limits admitted the connection
(so a stranger's half-open handshakes hold no more slots than its plain connections would) and
inside `header_timeout_s`; one that fails or does not end in time is refused, counted
(`tls_handshake`) and closed. Callers name such a port `https://HOST:PORT` (cellar.http_fetch).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cellar import http_tls
from cellar.config import UNIT_SECONDS, require, setting
from cellar.errors import CellarError
from cellar.refusals import DEFAULT_INTERVAL_S, PEER, RefusalLog

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32  # nesting of arrays/objects in a request body (the admin API needs 2)
MAX_CONNECTIONS = 256  # concurrent HTTP connections; more are closed at once
MAX_CONNECTIONS_PER_PEER = 16  # concurrent HTTP connections from one peer address
HEADER_TIMEOUT_S = 2.0  # request line and headers, from the moment the connection is accepted
REQUEST_TIMEOUT_S = 10.0  # the whole request: headers, body and handler
RESPONSE_TIMEOUT_S = 10.0  # the reply must drain to the client within this, or it is cut
# Refusal reasons, the `reason` label of <prefix>_http_refusals_total
REFUSED_MAX_CONNECTIONS = "max_connections"
REFUSED_PER_PEER = "max_connections_per_peer"
REFUSED_HEADER_TIMEOUT = "header_timeout"
REFUSED_REQUEST_TIMEOUT = "request_timeout"
REFUSED_TLS_HANDSHAKE = "tls_handshake"  # http_tls: no TLS handshake, a failed or a late one
REFUSED_RESPONSE_TIMEOUT = "response_timeout"  # a reply the client did not read in time
REFUSAL_REASONS = (REFUSED_MAX_CONNECTIONS, REFUSED_PER_PEER, REFUSED_HEADER_TIMEOUT,
                   REFUSED_REQUEST_TIMEOUT, REFUSED_TLS_HANDSHAKE, REFUSED_RESPONSE_TIMEOUT)
log = logging.getLogger("cellar.http")
# A JSON string, or one of the characters that open or close a level of nesting. A string that
# never closes runs to the end of the body (the closing quote is optional): the scan is linear.
# With the quote required, `"\"\"\"...` failed at the end and was tried again from every quote
# inside it, quadratic (1 s for 16 KiB) on the event loop (tests/security/test_json_scan.py).
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def max_connections_setting() -> Any:
    """The `http_max_connections` field of a process's typed config (master and node)."""
    return setting(MAX_CONNECTIONS, "most concurrent HTTP connections (/metrics, /health, "
                   "/api/v1/status, the master's admin API)", unit="connections")


def max_connections_per_peer_setting() -> Any:
    """The `http_max_connections_per_peer` field (master and node)."""
    return setting(MAX_CONNECTIONS_PER_PEER, "most concurrent HTTP connections from one peer "
                   "address (more are closed at once)", unit="connections")


def header_timeout_setting() -> Any:
    """The `http_header_timeout_s` field (master and node)."""
    return setting(HEADER_TIMEOUT_S, "an HTTP request's line and headers must arrive within "
                   "this of its connection", unit=UNIT_SECONDS)


def tls_setting() -> Any:
    """The `http_tls` field (master and node)."""
    return setting(False, "serve the HTTP port over TLS with this process's tls_cert_file and "
                   "tls_key_file (callers then name it https://HOST:PORT and verify it against "
                   "$CELLAR_TLS_CA or the CA of the credentials file naming it)")


def check_limits(max_connections: int, max_connections_per_peer: int,
                 header_timeout_s: float) -> None:
    """Validate the three HTTP settings of a config (ConfigError naming the field)."""
    require(1 <= max_connections_per_peer <= max_connections <= 65536,
            "http_max_connections_per_peer", "must be 1..http_max_connections (<= 65536)")
    require(0.1 <= header_timeout_s <= 3600, "http_header_timeout_s", "must be 0.1s..1 hour")


class BadRequest(ValueError):
    """The request is refused with 400 and this message."""


class _HeaderTimeout(Exception):
    """The request line and headers did not arrive within header_timeout_s."""


def json_depth(body: bytes) -> int:
    """How deeply arrays and objects nest in `body` (strings skipped), without recursing."""
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def parse_json(body: bytes) -> Any:
    """The body as JSON; BadRequest if it is not JSON or nests over MAX_JSON_DEPTH."""
    if not body:
        return None
    if json_depth(body) > MAX_JSON_DEPTH:
        raise BadRequest(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: belt and braces
        raise BadRequest(f"body is not valid JSON: {exc}") from None


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
        """The body as JSON (None if empty); BadRequest if malformed or too deeply nested."""
        return parse_json(self.body)


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
        self._tls: ssl.SSLContext | None = None  # http_tls: each admitted connection's handshake
        self._open = 0
        self._per_peer: dict[str, int] = {}  # peer address -> open connections
        self.max_connections = MAX_CONNECTIONS
        self.max_connections_per_peer = MAX_CONNECTIONS_PER_PEER
        self.header_timeout_s = HEADER_TIMEOUT_S
        self.request_timeout_s = REQUEST_TIMEOUT_S
        self.response_timeout_s = RESPONSE_TIMEOUT_S
        self.refusals = dict.fromkeys(REFUSAL_REASONS, 0)
        self.handler_failures = 0  # handlers that raised something unexpected (answered 500)
        self.refusal_log = RefusalLog(log, "http", interval_s=DEFAULT_INTERVAL_S)

    def set_limits(self, *, max_connections: int, max_connections_per_peer: int,
                   header_timeout_s: float, refusal_log_interval_s: float) -> None:
        """The process's configured bounds (master/config.py, storage_node/config.py)."""
        if not 1 <= max_connections_per_peer <= max_connections or header_timeout_s <= 0:
            raise ValueError("HTTP limits must be positive, per peer <= in all")
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self.header_timeout_s = min(header_timeout_s, self.request_timeout_s)
        self.refusal_log = RefusalLog(log, "http", interval_s=refusal_log_interval_s)

    def collector(self, prefix: str) -> Any:
        """A Prometheus collector of `<prefix>_http_refusals_total{reason}` (every reason, zero
        included, so alerts see the series exist)."""
        from prometheus_client.core import CounterMetricFamily, Metric
        from prometheus_client.registry import Collector

        refusals = self.refusals

        class _Refusals(Collector):
            def collect(self) -> Iterator[Metric]:
                family = CounterMetricFamily(f"{prefix}_http_refusals", "HTTP connections "
                                             "refused or closed, by reason", labels=["reason"])
                for reason, count in refusals.items():
                    family.add_metric([reason], count)
                yield family

        return _Refusals()

    def _refuse(self, peer: str, reason: str, detail: str) -> None:
        self.refusals[reason] += 1
        self.refusal_log.note(peer, reason, detail)

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method.upper(), path)] = handler

    async def start(self, host: str, port: int,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0: any free port; returns the port), over TLS with
        `ssl_context` (each connection's handshake once it is admitted: `_respond`)."""
        self._tls = ssl_context
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        mine = self._per_peer.get(host, 0)
        if self._open >= self.max_connections or mine >= self.max_connections_per_peer:
            full = self._open >= self.max_connections
            self._refuse(host, REFUSED_MAX_CONNECTIONS if full else REFUSED_PER_PEER,
                         f"{self._open} open in all, {mine} from it")
            writer.transport.abort()  # no linger, no reply: nothing is spent on it
            return
        PEER.set(host)  # refusal lines deeper down name it (this connection's own task)
        self._open += 1
        self._per_peer[host] = mine + 1
        try:
            await self._respond(reader, writer, host)
        finally:
            self._open -= 1
            left = self._per_peer.get(host, 1) - 1
            if left > 0:
                self._per_peer[host] = left
            else:
                self._per_peer.pop(host, None)

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       host: str) -> None:
        loop = asyncio.get_running_loop()
        header_deadline = loop.time() + self.header_timeout_s
        stream: tuple[Any, Any] = (reader, writer)
        if self._tls is not None:
            try:  # the handshake counts against the header deadline: a stranger's stall ends
                stream = await http_tls.handshake(self._tls, reader, writer, header_deadline,
                                                  MAX_HEADER_BYTES)
            except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
                self._refuse(host, REFUSED_TLS_HANDSHAKE, f"{type(exc).__name__}: {exc}")
                writer.transport.abort()
                return
        reader, writer = stream
        try:
            response = await asyncio.wait_for(self._handle(reader, header_deadline),
                                              self.request_timeout_s)
        except BadRequest as exc:
            response = Response.json({"error": str(exc)}, 400)
        except _HeaderTimeout:
            self._refuse(host, REFUSED_HEADER_TIMEOUT, f"no request within {self.header_timeout_s} s")
            writer.transport.abort()
            return
        except asyncio.TimeoutError:
            self._refuse(host, REFUSED_REQUEST_TIMEOUT,
                         f"no complete request within {self.request_timeout_s} s")
            writer.transport.abort()
            return
        except (asyncio.IncompleteReadError, ConnectionError,
                asyncio.LimitOverrunError, ValueError, UnicodeError):
            response = Response(400, b"bad request\n")
        try:
            head = (f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}\r\n"
                    f"Content-Type: {response.content_type}\r\n"
                    f"Content-Length: {len(response.body)}\r\nConnection: close\r\n")
            for name, value in response.headers.items():
                head += f"{name}: {value}\r\n"
            writer.write(head.encode() + b"\r\n" + response.body)
            await asyncio.wait_for(writer.drain(), self.response_timeout_s)
        except asyncio.TimeoutError:  # a peer that does not read must not keep its slot
            self._refuse(host, REFUSED_RESPONSE_TIMEOUT,
                         f"reply not taken within {self.response_timeout_s} s")
            writer.transport.abort()  # (the close below then sends nothing)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, header_deadline: float) -> Response:
        left = header_deadline - asyncio.get_running_loop().time()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), max(left, 0.0))
        except asyncio.TimeoutError:
            raise _HeaderTimeout() from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) != 3:
            raise BadRequest("malformed request line")
        method, target, _version = parts
        length = 0
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
            if name.strip().lower() == "content-length":
                value = value.strip()
                if not value.isdigit() or len(value) > 12:  # digits only: no "+5", "1_0", "-1"
                    raise BadRequest("bad Content-Length")
                length = int(value)
        if length > MAX_BODY_BYTES:
            return Response.json({"error": f"body over {MAX_BODY_BYTES} bytes"}, 413)
        body = await reader.readexactly(length) if length else b""
        url = urlsplit(target)
        handler = self._routes.get((method.upper(), url.path))
        if handler is None:
            allowed = any(path == url.path for (_m, path) in self._routes)
            return Response(405 if allowed else 404, b"no such endpoint\n")
        request = Request(method.upper(), url.path, parse_qs(url.query), body, headers)
        try:
            return await handler(request)
        except (CellarError, ValueError, KeyError, TypeError) as exc:
            return Response.json({"error": str(exc)}, 400)
        except Exception:  # noqa: BLE001 - a handler's bug: still an answer, logged 1, 2, 4, ... times
            self.handler_failures += 1
            if self.handler_failures & (self.handler_failures - 1) == 0:
                log.exception("HTTP %s %s failed (%d so far)", method, url.path,
                              self.handler_failures)
            return Response.json({"error": "internal error (the server's log says more)"}, 500)
