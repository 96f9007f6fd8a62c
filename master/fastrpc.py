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
    over the master's gRPC message limit, or an unknown method, closes the connection; so does
    a connection beyond MAX_CONNECTIONS.

Security
    Plaintext like the master's gRPC listener today; credentials travel in the request header
    as they do over gRPC and are checked, where checked, by the shared servicer bodies. A master
    serving gRPC over TLS must not open this line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from cellar.proto.fastline import FRAME, METHOD_NAMES
from cellar.proto.fastline import PORT_METADATA as FAST_PORT_METADATA

__all__ = ["FAST_PORT_METADATA", "FastRpcServer"]

log = logging.getLogger("cellar.master")

MAX_CONNECTIONS = 4096  # beyond this a new connection is closed at once (its client uses gRPC)


class FastRpcServer:
    """Serves the fast line's methods for one servicer on the running loop. `start` binds; `close` stops."""

    def __init__(self, servicer: Any, max_message_bytes: int) -> None:
        self.servicer = servicer
        self.max_message_bytes = max_message_bytes
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str) -> int:
        self._server = await asyncio.start_server(self._serve, host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if len(self._writers) > MAX_CONNECTIONS:
            log.warning("fast rpc: over %d connections; refusing one", MAX_CONNECTIONS)
            self._writers.discard(writer)
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        dispatch = self.servicer.dispatch
        unpack = FRAME.unpack
        pack = FRAME.pack
        try:
            while True:
                head = await reader.readexactly(FRAME.size)
                length, method = unpack(head)
                name = METHOD_NAMES.get(method)
                if name is None or length > self.max_message_bytes:
                    log.warning("fast rpc: bad frame (method %d, %d bytes); closing", method, length)
                    return
                body = await reader.readexactly(length) if length else b""
                code, out = dispatch(name, body)
                writer.write(pack(len(out), code) + out)
                if writer.transport.get_write_buffer_size() > self.max_message_bytes:
                    await writer.drain()  # a client that sends without reading waits here
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # never let one connection take the loop down
            log.exception("fast rpc connection failed")
        finally:
            self._writers.discard(writer)
            writer.close()
