"""The asyncio face's line to the master: a `grpc.aio` channel and an asyncio fast line.

What it owns
    For one `AsyncClient` on one event loop: the gRPC channel (same options, message limit and
    bounded UNAVAILABLE retries as the sync channel, `cellar.client.rpc`), a small pool of
    persistent asyncio streams to the master's fast line (`cellar.proto.fastline`: PutStart,
    PutEnd, PutRevoke, GetReplicas, Unpin, Exists, PrefixLen), the epoch fence, and following
    the leader with the policy every Cellar caller shares (`cellar.coord.follow`).

How it differs from the sync channel, and why
    No threads: a call is a coroutine, concurrent calls share the channel and take one fast
    connection each (an idle one, or a new one). The etcd client is blocking, so a leader
    lookup (rare: only after a failure, rate-limited) runs in `asyncio.to_thread`. A frozen
    leader with etcd is noticed when the call's attempt ends, not every LEADER_CHECK_AFTER_S
    as in the sync channel (not built here).

What it must never do
    Be used from another event loop than the one that opened it (the face checks).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from cellar.client.core import EpochFence
from cellar.client.rpc import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    CHANNEL_OPTIONS,
    FAST_MAX_IDLE_CONNECTIONS,
    FAST_METHODS,
    FAST_RELEARN_S,
    MAX_KNOWN_MASTERS,
    MAX_MESSAGE_BYTES,
    MAX_RPC_ATTEMPTS,
    RESOLVE_TIMEOUT_S,
    leader_hint,
    valid_address,
)
from cellar.client.statuses import grpc_error, retryable_grpc
from cellar.coord.follow import NO_ETCD, EtcdView, may_ask_etcd, next_master
from cellar.coord.redirect import leader_from_details
from cellar.errors import CellarError, Timeout, Unavailable
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc, fastline
from cellar.units import parse_host_port

AsyncResolver = Callable[[float], Awaitable[str]]
_CODES = {code.value[0]: code for code in grpc.StatusCode}

log = logging.getLogger("cellar.client")


class _FastLineDown(Exception):
    """The fast line could not carry this call; gRPC will."""


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AsyncFastLine:
    """Persistent asyncio connections to the master's fast line; one call per connection at
    a time (any number of coroutines may call: each takes an idle connection or opens one)."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self._idle: list[Conn] = []
        self._closed = False

    async def call(self, method_id: int, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """(numeric gRPC code, reply bytes); _FastLineDown if nothing could be exchanged,
        TimeoutError if the master did not answer in time."""
        conn = self._idle.pop() if self._idle else None
        try:
            async with asyncio.timeout(timeout_s):
                if conn is None:
                    conn = await asyncio.open_connection(*self.address)
                    sock = conn[1].get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader, writer = conn
                writer.write(fastline.pack_head(len(body), method_id) + body)
                head = await reader.readexactly(fastline.FRAME.size)
                length, code = fastline.FRAME.unpack(head)
                if length > MAX_MESSAGE_BYTES:
                    raise ConnectionError(f"fast line reply of {length} bytes")
                data = await reader.readexactly(length) if length else b""
        except TimeoutError:
            _close(conn)
            raise
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            _close(conn)
            raise _FastLineDown(str(exc)) from None
        except BaseException:  # cancelled mid-exchange: the stream can no longer be trusted
            _close(conn)
            raise
        if not self._closed and len(self._idle) < FAST_MAX_IDLE_CONNECTIONS:
            self._idle.append(conn)
        else:
            _close(conn)
        return code, data

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            _close(conn)


def _close(conn: Conn | None) -> None:
    if conn is not None:
        conn[1].close()


class AsyncMasterChannel:
    """Calls master RPCs by name against an absolute deadline (`time.monotonic()` seconds)."""

    def __init__(self, address: str, *, resolve: AsyncResolver | None = None) -> None:
        self._address = address
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = cellar_pb2_grpc.MasterStub(self._channel)
        self._retired: list[grpc.aio.Channel] = []
        self._fence = EpochFence()
        self._fast: AsyncFastLine | None = None
        self._fast_relearn_at = 0.0
        self._resolve = resolve
        self._resolved_at = -math.inf
        self._known = [address]
        self._lost: tuple[str, float] = ("", -math.inf)
        self._failing_since = 0.0
        self._closed = False
        self.generation = 0
        self.switched_at = -math.inf

    @property
    def address(self) -> str:
        return self._address

    async def call(self, method: str, request: Any, deadline: float) -> Any:
        fast = FAST_METHODS.get(method)
        if fast is not None:
            line = self._fast
            if line is None and time.monotonic() >= self._fast_relearn_at:
                line = await self._relearn(request, deadline)
            if line is not None:
                reply = await self._call_fast(line, method, fast, request, deadline)
                if reply is not None:
                    return reply
        return await self._call_grpc(method, request, deadline, learn=method == "ClusterStatus")

    async def _call_fast(self, line: AsyncFastLine, method: str, fast: tuple[int, Any],
                         request: Any, deadline: float) -> Any | None:
        address = self._address
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise Timeout(f"{method} to master {address}: timed out")
        method_id, reply_cls = fast
        try:
            code, data = await line.call(method_id, request.SerializeToString(), remaining_s)
        except TimeoutError:
            raise Timeout(f"{method} to master {address}: timed out") from None
        except _FastLineDown:
            self._drop_fast(line)
            return None
        if code != fastline.OK_CODE:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            details = data.decode("utf-8", "replace")
            if retryable_grpc(status):
                hint = valid_address(leader_from_details(details))
                if hint:
                    self._drop_fast(line, relearn_s=0.0)
                    await self._redirect(address, hint, deadline)
                return None  # gRPC carries it, with gRPC's retry rules
            raise grpc_error(method, address, status, details)
        reply = reply_cls.FromString(data)
        try:
            self._fence.check(int(reply.header.epoch), address)
        except Unavailable:
            if self._resolve is None:
                raise
            self._drop_fast(line, relearn_s=0.0)
            await self._redirect(address, "", deadline)
            return None
        return reply

    def _drop_fast(self, line: AsyncFastLine, relearn_s: float = FAST_RELEARN_S) -> None:
        if self._fast is line:
            self._fast = None
            self._fast_relearn_at = time.monotonic() + relearn_s
        line.close()

    async def _relearn(self, request: Any, deadline: float) -> AsyncFastLine | None:
        self._fast_relearn_at = time.monotonic() + FAST_RELEARN_S
        try:
            await self._call_grpc("ClusterStatus", pb.ClusterStatusRequest(header=request.header),
                                  min(deadline, time.monotonic() + 1.0), learn=True)
        except CellarError:
            return None
        return self._fast

    def _learn(self, metadata: Any, address: str) -> None:
        port = 0
        try:
            for key, value in metadata or ():
                if key == fastline.PORT_METADATA:
                    port = int(value)
        except (ValueError, TypeError):
            port = 0
        if not 0 < port < 65536 or self._closed or address != self._address:
            return
        host = parse_host_port(address)[0].strip("[]")
        fast = self._fast
        if fast is None or fast.address != (host, port):
            self._fast = AsyncFastLine(host, port)
            if fast is not None:
                fast.close()

    async def _call_grpc(self, method: str, request: Any, deadline: float,
                         learn: bool = False) -> Any:
        backoff_s = BACKOFF_FIRST_S
        failure = ""
        redirected = False
        for _attempt in range(MAX_RPC_ATTEMPTS):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            address = self._address
            hint = ""
            unreachable = False
            try:
                call = getattr(self._stub, method)(request, timeout=remaining_s)
                reply = await call
                metadata = await call.trailing_metadata() if learn else None
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if not retryable_grpc(code):
                    raise grpc_error(method, address, code, details) from None
                failure = f"{method} to master {address}: {details or 'unreachable'}"
                hint = leader_hint(exc)
                unreachable = not hint and "leader=" not in details
            else:
                if method == "ClusterStatus" and reply.role == "standby":
                    failure = (f"master {address} is a standby "
                               f"(leader {reply.leader_address or 'unknown'})")
                    hint = valid_address(reply.leader_address)
                else:
                    try:
                        self._fence.check(int(reply.header.epoch), address)
                    except Unavailable as exc:
                        if self._resolve is None:
                            raise
                        failure = str(exc)
                    else:
                        self._failing_since = 0.0
                        if learn:
                            self._learn(metadata, address)
                        return reply
            if await self._redirect(address, hint, deadline, unreachable) and not redirected:
                redirected = True
                continue
            redirected = False
            if deadline - time.monotonic() <= backoff_s:
                break
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
        if not failure:
            raise Timeout(f"{method} to master {self._address}: timed out")
        raise Unavailable(failure)

    async def _redirect(self, failed: str, hint: str, deadline: float,
                        unreachable: bool = False) -> bool:
        """Point the channel at the leader after `failed` did not serve a call (the policy of
        `cellar.coord.follow`). True when the next attempt goes to another master."""
        if self._closed:
            return False
        if failed != self._address:
            return True  # another coroutine switched already
        now = time.monotonic()
        if not self._failing_since:
            self._failing_since = now
        etcd = NO_ETCD
        if self._resolve is not None:
            etcd = EtcdView(configured=True)
            if may_ask_etcd(self._resolved_at, now):
                self._resolved_at = now
                try:
                    leader = valid_address(await self._resolve(
                        max(0.05, min(RESOLVE_TIMEOUT_S, deadline - now))))
                except CellarError:
                    leader = ""
                etcd = EtcdView(configured=True, asked=True, leader=leader)
        if failed != self._address:
            return True
        target = next_master(current=failed, hint=hint, etcd=etcd, known=self._known,
                             failing_for_s=now - self._failing_since, lost=self._lost, now=now)
        if unreachable:
            self._lost = (failed, now)
        if not target:
            return False
        self._switch(target)
        return True

    def _switch(self, address: str) -> None:
        old = self._address
        self._retired.append(self._channel)  # calls still in flight on it finish there
        self._address = address
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = cellar_pb2_grpc.MasterStub(self._channel)
        if address not in self._known:
            self._known.append(address)
            del self._known[1:-MAX_KNOWN_MASTERS + 1]
        fast, self._fast = self._fast, None
        self._fast_relearn_at = 0.0
        if fast is not None:
            fast.close()
        self._failing_since = 0.0
        self.generation += 1
        self.switched_at = time.monotonic()
        log.info("following the master leader: %s -> %s", old, address)

    async def aclose(self) -> None:
        self._closed = True
        fast, self._fast = self._fast, None
        if fast is not None:
            fast.close()
        channels, self._retired = [self._channel, *self._retired], []
        for channel in channels:
            await channel.close(grace=None)
