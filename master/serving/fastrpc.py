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
    The listener runs on the master's one event loop (an asyncio Protocol per connection, no
    threads), so the metadata code still never needs a lock: a request is handled start to
    finish inside one callback, exactly like a gRPC handler. A Protocol, not asyncio streams:
    the frames are cut from the bytes as they arrive, with no coroutine resumed and no future
    per read; that saved 3-5 us of the master's CPU per request (an echo of 200-byte frames
    under uvloop, 25-26 against 29-31 us; 2026-12-04), out of a floor of ~24 us per request.

Frames
    The layout and method numbers are the wire contract in `cellar.proto.fastline`. One
    request at a time per connection (a client keeps a small pool of connections). A body
    over the master's gRPC message limit, or an unknown method, closes the connection. A
    client that half-closes after its requests still gets every answer, then the close (on
    uvloop a transport closed with replies unsent cut the last one short: tested on both loops).

Limits (a closed connection costs a client one fallback to gRPC, never an error)
    - connections: at most MAX_CONNECTIONS in all and `max_connections_per_peer` from one
      peer address; more are closed at once, so one client cannot take every slot;
    - deadlines: a request's header must arrive within `idle_timeout_s` of the server starting
      to wait for it, its body within `frame_timeout_s` of its header, and a reply the client
      does not read must drain within `frame_timeout_s`; a sweeper closes a connection past
      its deadline (one loop-time store per frame, no timer per request), so a slow drip
      cannot hold a connection or its buffered bytes;
    - memory: the bodies being received on all connections together are bounded by
      `max_pending_bytes` (declared lengths, reserved as soon as a header is read); a request
      that does not fit closes its connection. A connection stops reading once it holds
      READ_AHEAD_BYTES past the frame it is receiving, and serves no further request while
      more than DRAIN_ABOVE_BYTES of its replies wait to be sent.

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
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from cellar.proto.fastline import FRAME, METHOD_NAMES
from cellar.proto.fastline import PORT_METADATA as FAST_PORT_METADATA
from cellar.refusals import PEER

if TYPE_CHECKING:
    from cellar.master.serving.leadership import DurableWork

__all__ = ["FAST_PORT_METADATA", "FastRpcServer"]

log = logging.getLogger("cellar.master")

MAX_CONNECTIONS = 4096  # beyond this a new connection is closed at once (its client uses gRPC)
DEFAULT_MAX_CONNECTIONS_PER_PEER = 64
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_FRAME_TIMEOUT_S = 10.0
DEFAULT_MAX_PENDING_BYTES = 64 << 20
DRAIN_ABOVE_BYTES = 256 << 10  # replies queued past this are drained before the next request
READ_AHEAD_BYTES = 64 << 10  # bytes buffered past the frame being received before reading pauses


class _Connection(asyncio.Protocol):
    """One fast-line connection: frames cut from the bytes as they arrive, served one at a
    time, in order (see the module docstring for its limits)."""

    def __init__(self, server: FastRpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.deadline = float("inf")  # loop time; the sweeper aborts the connection past it
        self.buf = bytearray()
        self.reserved = 0        # declared body bytes of the frame being received (pending_bytes)
        self.settling = False    # a reply waits to be made durable: nothing else is served
        self.write_paused = False
        self.read_paused = False
        self.eof = False  # the client half-closed: answer what it sent, then close
        self.closed = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods
        self.transport = tcp = cast(asyncio.Transport, transport)
        server = self.server
        if not server._admit(self):
            self.closed = True
            tcp.abort()
            return
        sock = tcp.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tcp.set_write_buffer_limits(high=DRAIN_ABOVE_BYTES)
        self.deadline = server.clock() + server.idle_timeout_s

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buf += data
        self._serve()

    def eof_received(self) -> bool:
        # A client that half-closes after its requests still gets every answer (as it did when
        # each request was read to the end of the stream): keep the transport open while work
        # is pending; `_serve` closes it once none is.
        self.eof = True
        if self.transport is not None and self.transport.get_extra_info("sslcontext"):
            return False  # TLS cannot stay half-open (asyncio would warn and close anyway)
        return self._pending_work()

    def pause_writing(self) -> None:
        # a client that sends without reading: its replies must drain within frame_timeout_s
        self.write_paused = True
        self.deadline = self.server.clock() + self.server.frame_timeout_s

    def resume_writing(self) -> None:
        self.write_paused = False
        self.deadline = self.server.clock() + self.server.idle_timeout_s
        self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._release()
        self.server._forget(self)

    # -- serving -------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Serve every whole request buffered, then pause or resume reading."""
        server = self.server
        buf = self.buf
        pos = 0
        head_size = FRAME.size
        unpack = FRAME.unpack_from
        token = PEER.set(self.peer)  # refusal lines name it; a settling task inherits it
        try:
            while not (self.settling or self.write_paused or self.closed):
                if len(buf) - pos < head_size:
                    break
                length, method = unpack(buf, pos)
                name = METHOD_NAMES.get(method)
                if name is None or length > server.max_message_bytes:
                    server.bad_frames += 1
                    if server.bad_frames & (server.bad_frames - 1) == 0:  # 1, 2, 4, ...: no flood
                        log.warning("fast rpc: bad frame (method %d, %d bytes) from %s; closing "
                                    "(%d so far)", method, length, self.peer, server.bad_frames)
                    self._close()
                    return
                if length and not self.reserved:  # a new body: reserve it, give it a deadline
                    if server.pending_bytes + length > server.max_pending_bytes:
                        server.refused_for_memory += 1
                        self._close()  # the client retries over gRPC
                        return
                    server.pending_bytes += length
                    self.reserved = length
                    self.deadline = server.clock() + server.frame_timeout_s
                end = pos + head_size + length
                if len(buf) < end:
                    break  # the body is still coming
                body = bytes(buf[pos + head_size:end])
                pos = end
                self._release()
                self._answer(name, body)
            if pos:
                del buf[:pos]
        except Exception:  # never let one connection take the loop down
            log.exception("fast rpc connection failed")
            self._close()
            return
        finally:
            PEER.reset(token)
        if self.eof and not self._pending_work():
            self._close()
            return
        self._flow()

    def _pending_work(self) -> bool:
        """A reply being made durable or waiting to drain, or a whole request still buffered."""
        buf = self.buf
        if self.settling or self.write_paused:
            return True
        if len(buf) < FRAME.size:
            return False
        return len(buf) >= FRAME.size + FRAME.unpack_from(buf)[0]

    def _answer(self, name: str, body: bytes) -> None:
        server = self.server
        code, out = server.dispatch(name, body)
        leadership = server.leadership
        if leadership.durable_due(name):  # an upsert's PutEnd: acknowledged once durable
            self.settling = True
            # taken now: the task starts after other connections' requests may have run
            work = leadership.take_durable()
            asyncio.get_running_loop().create_task(self._settle(name, code, out, work))
            return
        self._reply(code, out)

    async def _settle(self, name: str, code: int, out: bytes, work: DurableWork) -> None:
        try:
            code, out = await self.server.servicer.settle(name, code, out, work)
        except Exception:
            log.exception("fast rpc connection failed")
            self._close()
            return
        self.settling = False
        if self.closed:
            return
        self._reply(code, out)
        self._serve()

    def _reply(self, code: int, out: bytes) -> None:
        assert self.transport is not None
        if not self.write_paused:  # pause_writing (inside write) sets the drain deadline
            self.deadline = self.server.clock() + self.server.idle_timeout_s
        self.transport.write(FRAME.pack(len(out), code) + out)

    def _flow(self) -> None:
        """Read while no more than READ_AHEAD_BYTES past the frame being received are held."""
        transport = self.transport
        if transport is None or self.closed:
            return
        over = len(self.buf) > FRAME.size + self.reserved + READ_AHEAD_BYTES
        if over and not self.read_paused:
            self.read_paused = True
            transport.pause_reading()
        elif not over and self.read_paused:
            self.read_paused = False
            transport.resume_reading()

    def _release(self) -> None:
        if self.reserved:
            self.server.pending_bytes -= self.reserved
            self.reserved = 0

    def _close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()  # replies already written still go out
            self._release()


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
        self._conns: set[_Connection] = set()
        self.clock = time.monotonic  # replaced by the running loop's clock at start
        self.leadership = servicer.leadership
        self.dispatch = servicer.dispatch
        self._per_peer: dict[str, int] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int = 0,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on `host`:`port` (0: any free port); over TLS when `ssl_context` is given
        (as gRPC is)."""
        loop = asyncio.get_running_loop()
        self.clock = loop.time
        self._server = await loop.create_server(lambda: _Connection(self), host, port,
                                                ssl=ssl_context)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._sweeper = loop.create_task(self._sweep())
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
            for conn in list(self._conns):
                if conn.transport is not None:
                    conn.transport.close()
            await self._server.wait_closed()
            self._server = None

    async def _sweep(self) -> None:
        """Close connections past their deadline, a few times per shortest timeout."""
        loop = asyncio.get_running_loop()
        period_s = min(1.0, self.frame_timeout_s / 4, self.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            now = loop.time()
            for conn in [c for c in self._conns if c.deadline < now]:
                self.timed_out_connections += 1
                conn.deadline = float("inf")  # closed once
                if conn.transport is not None:
                    conn.transport.abort()  # connection_lost cleans up

    def _admit(self, conn: _Connection) -> bool:
        assert conn.transport is not None
        peer = conn.transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        mine = self._per_peer.get(host, 0)
        if len(self._conns) >= MAX_CONNECTIONS or mine >= self.max_connections_per_peer:
            self.refused_connections += 1
            if self.refused_connections & (self.refused_connections - 1) == 0:  # 1, 2, 4, ...
                log.warning("fast rpc: refusing a connection from %s (%d open from it, %d in all)",
                            host, mine, len(self._conns))
            return False
        conn.peer = host
        self._conns.add(conn)
        self._per_peer[host] = mine + 1
        return True

    def _forget(self, conn: _Connection) -> None:
        if conn in self._conns:
            self._conns.remove(conn)
            left = self._per_peer.get(conn.peer, 1) - 1
            if left > 0:
                self._per_peer[conn.peer] = left
            else:
                self._per_peer.pop(conn.peer, None)


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
