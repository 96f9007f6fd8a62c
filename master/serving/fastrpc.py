"""The metadata fast line: the hottest master RPCs over plain persistent TCP, beside gRPC.

Why it exists
    A unary gRPC call costs about 0.8 ms round trip on the 2-core machines here (sync Python
    client, grpc.aio server), of which the master's own work for a one-key GetReplicas is a
    few tens of microseconds. A length-prefixed exchange of the same protobuf messages over a
    persistent TCP connection costs about 0.12 ms. The single-get latency target (one metadata
    plus one data round trip within 1 ms) cannot be met through gRPC, and batched metadata
    rates lose a large share of the master's single core to gRPC's per-call machinery.

The contract stays gRPC
    Only the RPCs of `cellar.proto.fastline.METHODS` (PutStart, PutEnd, PutRevoke,
    GetReplicas, Unpin, Exists, PrefixLen) are served here, with exactly the
    gRPC API's request and reply messages, run through the same servicer bodies
    (`MasterServicer.dispatch`), so validation, statistics, per-key statuses and error codes
    are the same. Every other RPC, and every client that does not know this line, uses gRPC.
    The port is advertised in the trailing metadata of ClusterStatus (`FAST_PORT_METADATA`);
    a client that cannot use it (connection refused, reset, a master restart) falls back to
    gRPC for that call and asks again later.

Single loop
    The listener runs on the master's one event loop (asyncio streams, no threads), so the
    metadata code still never needs a lock: a request is handled start to finish between two
    awaits, exactly like a gRPC handler.

Frames
    The layout and method numbers are the wire contract in `cellar.proto.fastline`. One
    request at a time per connection (a client keeps a small pool of connections). A body
    over the master's gRPC message limit, or an unknown method, closes the connection.

Limits (a closed connection costs a client one fallback to gRPC, never an error)
    - connections: at most MAX_CONNECTIONS in all and `max_connections_per_peer` from one
      peer address; more are closed at once, so one client cannot take every slot;
    - deadlines: a request's header must arrive within `idle_timeout_s` of the server starting
      to wait for it, its body within `frame_timeout_s` of its header, and a reply the client
      does not read must drain within `frame_timeout_s`; a sweeper closes a connection past
      its deadline (one loop-time store per frame, no timer per request), so a slow drip
      cannot hold a connection or its buffered bytes;
    - memory: the bodies being received on all connections together are bounded by
      `max_pending_bytes` (declared lengths, reserved before the first body byte is read); a
      request that does not fit closes its connection. Each connection's reply buffer is
      drained past DRAIN_ABOVE_BYTES before the next request is read.

Security
    Credentials travel in the request header as they do over gRPC and are checked by the same
    `Authorizer` (cellar.master.serving.auth) in `MasterServicer.dispatch`. A master serving gRPC over
    TLS serves this line over TLS too (same certificate, cellar.tls).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from cellar.proto.fastline import FRAME, METHOD_NAMES
from cellar.proto.fastline import PORT_METADATA as FAST_PORT_METADATA
from cellar.refusals import PEER

__all__ = ["FAST_PORT_METADATA", "FastRpcServer"]

log = logging.getLogger("cellar.master")

MAX_CONNECTIONS = 4096  # beyond this a new connection is closed at once (its client uses gRPC)
DEFAULT_MAX_CONNECTIONS_PER_PEER = 64
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_FRAME_TIMEOUT_S = 10.0
DEFAULT_MAX_PENDING_BYTES = 64 << 20
DRAIN_ABOVE_BYTES = 256 << 10  # replies queued past this are drained before the next read


class _Conn:
    """One connection's deadline (loop time; the sweeper closes it once passed)."""

    __slots__ = ("writer", "peer", "deadline")

    def __init__(self, writer: asyncio.StreamWriter, peer: str, deadline: float) -> None:
        self.writer = writer
        self.peer = peer
        self.deadline = deadline


class FastRpcServer:
    """Serves the fast line's methods for one servicer on the running loop. `start` binds; `close` stops."""

    def __init__(
        self, servicer: Any, max_message_bytes: int, *,
        max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        frame_timeout_s: float = DEFAULT_FRAME_TIMEOUT_S,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        if min(max_connections_per_peer, idle_timeout_s, frame_timeout_s, max_pending_bytes) <= 0:
            raise ValueError("fast line limits must be positive")
        self.servicer = servicer
        self.max_message_bytes = max_message_bytes
        self.max_connections_per_peer = max_connections_per_peer
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.max_pending_bytes = max_pending_bytes
        self.port = 0
        self.pending_bytes = 0  # declared body bytes being received, all connections
        self.refused_connections = 0
        self.timed_out_connections = 0
        self.refused_for_memory = 0
        self.bad_frames = 0
        self._server: asyncio.AbstractServer | None = None
        self._conns: dict[asyncio.StreamWriter, _Conn] = {}
        self._per_peer: dict[str, int] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int = 0,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on `host`:`port` (0: any free port); over TLS when `ssl_context` is given
        (as gRPC is)."""
        self._server = await asyncio.start_server(self._serve, host, port, ssl=ssl_context)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return self.port

    def collector(self) -> Collector:
        """`master_fast_line_refusals_total{reason}`: connections refused or closed."""
        return _FastLineRefusals(self)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
            for writer in list(self._conns):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def _sweep(self) -> None:
        """Close connections past their deadline, a few times per shortest timeout."""
        loop = asyncio.get_running_loop()
        period_s = min(1.0, self.frame_timeout_s / 4, self.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            now = loop.time()
            for conn in [c for c in self._conns.values() if c.deadline < now]:
                self.timed_out_connections += 1
                conn.deadline = float("inf")  # closed once
                conn.writer.transport.abort()  # the reader sees the end; its finally cleans up

    def _admit(self, writer: asyncio.StreamWriter) -> _Conn | None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        mine = self._per_peer.get(host, 0)
        if len(self._conns) >= MAX_CONNECTIONS or mine >= self.max_connections_per_peer:
            self.refused_connections += 1
            if self.refused_connections & (self.refused_connections - 1) == 0:  # 1, 2, 4, ...
                log.warning("fast rpc: refusing a connection from %s (%d open from it, %d in all)",
                            host, mine, len(self._conns))
            return None
        conn = _Conn(writer, host, asyncio.get_running_loop().time() + self.idle_timeout_s)
        self._conns[writer] = conn
        self._per_peer[host] = mine + 1
        return conn

    def _forget(self, conn: _Conn) -> None:
        if self._conns.pop(conn.writer, None) is not None:
            left = self._per_peer.get(conn.peer, 1) - 1
            if left > 0:
                self._per_peer[conn.peer] = left
            else:
                self._per_peer.pop(conn.peer, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._admit(writer)
        if conn is None:
            writer.transport.abort()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        PEER.set(conn.peer)  # refusal lines name it (this connection's own task)
        dispatch = self.servicer.dispatch
        leadership = self.servicer.leadership

        unpack = FRAME.unpack
        pack = FRAME.pack
        clock = asyncio.get_running_loop().time
        idle_s = self.idle_timeout_s
        frame_s = self.frame_timeout_s
        try:
            while True:
                conn.deadline = clock() + idle_s
                head = await reader.readexactly(FRAME.size)
                length, method = unpack(head)
                name = METHOD_NAMES.get(method)
                if name is None or length > self.max_message_bytes:
                    self.bad_frames += 1
                    if self.bad_frames & (self.bad_frames - 1) == 0:  # 1, 2, 4, ...: no flood
                        log.warning("fast rpc: bad frame (method %d, %d bytes) from %s; closing "
                                    "(%d so far)", method, length, conn.peer, self.bad_frames)
                    return
                if length:
                    if self.pending_bytes + length > self.max_pending_bytes:
                        self.refused_for_memory += 1
                        return  # the client retries over gRPC
                    conn.deadline = clock() + frame_s
                    self.pending_bytes += length
                    try:
                        body = await reader.readexactly(length)
                    finally:
                        self.pending_bytes -= length
                else:
                    body = b""
                code, out = dispatch(name, body)
                if leadership.durable_due(name):  # an upsert's PutEnd: acknowledged once durable
                    code, out = await self.servicer.settle(name, code, out)
                writer.write(pack(len(out), code) + out)
                if writer.transport.get_write_buffer_size() > DRAIN_ABOVE_BYTES:
                    conn.deadline = clock() + frame_s
                    await writer.drain()  # a client that sends without reading waits here
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # never let one connection take the loop down
            log.exception("fast rpc connection failed")
        finally:
            self._forget(conn)
            writer.close()


class _FastLineRefusals(Collector):
    """The fast line's refusals by reason, every reason always (zero included)."""

    def __init__(self, server: FastRpcServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        s = self._server
        family = CounterMetricFamily("master_fast_line_refusals", "fast-line connections "
                                     "refused or closed, by reason", labels=["reason"])
        for reason, count in (("max_connections", s.refused_connections),
                              ("frame_timeout", s.timed_out_connections),
                              ("max_pending_bytes", s.refused_for_memory),
                              ("bad_frame", s.bad_frames)):
            family.add_metric([reason], count)
        yield family
