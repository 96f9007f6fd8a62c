"""The asyncio face's line to the master: a `grpc.aio` channel and an asyncio fast line.

What it owns
    For one `AsyncClient` on one event loop: the gRPC channel (same options, message limit and
    bounded UNAVAILABLE retries as the sync channel, `cellar.client.rpc`), a small pool of
    persistent asyncio streams to the master's fast line (`cellar.proto.fastline`: PutStart,
    PutEnd, PutRevoke, GetReplicas, Unpin, Exists, PrefixLen), the epoch fence, and following
    the leader with the decisions every Cellar caller shares (`cellar.coord.link`).

How it differs from the sync channel, and why
    No threads: a call is a coroutine; concurrent calls share the gRPC channel and are
    pipelined over one or two fast-line connections (the master answers each connection in
    order), so 64 concurrent gets cost 64 frames on one socket, not 64 connections. The etcd client is blocking, so a leader
    lookup (rare: after a failure, or while a call has waited LEADER_CHECK_AFTER_S for a
    frozen master; rate-limited) runs in `asyncio.to_thread`.

What it must never do
    Be used from another event loop than the one that opened it (the face checks).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from cellar.client.connect_args import master_channel, tls_context
from cellar.client.request_ids import stamp
from cellar.client.rpc import (
    CHANNEL_OPTIONS,
    FAST_METHODS,
    FAST_RELEARN_S,
    LEADER_CHECK_AFTER_S,
    MAX_MESSAGE_BYTES,
    MAX_RETIRED_CHANNELS,
    LinkFace,
    fast_answer,
    trailing_metadata,
)
from cellar.client.statuses import grpc_error, retryable_grpc
from cellar.coord import link as plans
from cellar.coord.link import (
    AskEtcd,
    DropFast,
    Effect,
    LinkState,
    Moved,
    Plan,
    Refused,
    Replied,
    Sleep,
    Switch,
)
from cellar.coord.redirect import leader_from
from cellar.errors import CellarError, Timeout
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc, fastline

AsyncResolver = Callable[[float], Awaitable[str]]
Orphan = Callable[[int, bytes], None]  # takes an abandoned fast-line call's (code, reply bytes)
FAST_ASYNC_CONNECTIONS = 2  # pipelined connections per client to the master's fast line

log = logging.getLogger("cellar.client")


class _FastLineDown(Exception):
    """The fast line could not carry this call; gRPC will."""


class _LeaderMoved(Exception):
    """An unanswered call was abandoned: etcd names another master as the leader."""


class _Pipe(asyncio.Protocol):
    """One fast-line connection carrying many calls at once: requests are written as they come
    and the master answers each connection's requests in order, so replies are matched to
    callers first in, first out as they are parsed (`data_received`, no task hop). A caller that
    gives up (timeout, cancellation) leaves its slot in the queue; the reply that fills it is
    dropped, or handed to the caller's `orphans` callback (a GetReplicas's pins are released)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[asyncio.Future[tuple[int, bytes]]] = collections.deque()
        self.down = False
        self._inbox = bytearray()
        # a call's slot -> who takes its reply should its caller give up (`AsyncFastLine.call`)
        self.orphans: dict[asyncio.Future[tuple[int, bytes]], Orphan] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's TCPTransport has every method used here but does not subclass
        # asyncio.Transport (an isinstance check here failed every fast-line call on uvloop).
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        inbox = self._inbox
        inbox += data
        head_bytes = fastline.FRAME.size
        used = 0
        while len(inbox) - used >= head_bytes:
            length, code = fastline.FRAME.unpack_from(inbox, used)
            if length > MAX_MESSAGE_BYTES:
                self.close(_FastLineDown(f"fast line reply of {length} bytes"))
                return
            end = used + head_bytes + length
            if len(inbox) < end:
                break
            if not self.pending:
                self.close(_FastLineDown("fast line reply to no request"))
                return
            waiter = self.pending.popleft()
            orphan = self.orphans.pop(waiter, None) if self.orphans else None
            if not waiter.done():
                waiter.set_result((code, bytes(inbox[used + head_bytes:end])))
            elif orphan is not None:  # its caller gave up: the reply goes to who takes it
                orphan(code, bytes(inbox[used + head_bytes:end]))
            used = end
        if used:
            del inbox[:used]

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(_FastLineDown(str(exc) if exc else "fast line closed by the master"))

    def send(self, frame: bytes) -> None:
        assert self.transport is not None
        self.transport.write(frame)

    def close(self, error: BaseException | None = None) -> None:
        if not self.down:
            self.down = True
            if self.transport is not None:
                self.transport.close()
        self.orphans.clear()
        while self.pending:
            waiter = self.pending.popleft()
            if not waiter.done():
                waiter.set_exception(error or _FastLineDown("fast line closed"))


class AsyncFastLine:
    """Pipelined asyncio connections to the master's fast line, shared by every coroutine of
    one client: a call takes the connection with the fewest calls in flight (a new one while
    under FAST_ASYNC_CONNECTIONS and all are busy), writes its frame and awaits its reply."""

    def __init__(self, host: str, port: int, tls_ca: str | None = None) -> None:
        self.address = (host, port)
        self._tls = tls_context(tls_ca)  # over TLS when the master's gRPC port is
        self._pipes: list[_Pipe] = []
        self._opening: asyncio.Lock | None = None
        self._closed = False

    async def call(self, method_id: int, body: bytes, timeout_s: float,
                   orphan: Orphan | None = None) -> tuple[int, bytes]:
        """(numeric gRPC code, reply bytes); _FastLineDown if nothing could be exchanged,
        TimeoutError if the master did not answer in time. `orphan` takes the reply of a call
        given up once its request was sent (timed out, cancelled), when it comes."""
        try:
            async with asyncio.timeout(timeout_s):
                pipe = await self._pipe()
                waiter: asyncio.Future[tuple[int, bytes]] = \
                    asyncio.get_running_loop().create_future()
                pipe.pending.append(waiter)
                if orphan is not None:  # from now on: a cancelled waiter's reply goes there
                    pipe.orphans[waiter] = orphan
                pipe.send(fastline.pack_head(len(body), method_id) + body)
                try:
                    return await waiter
                except asyncio.CancelledError:
                    if (orphan is not None and not waiter.cancelled()
                            and waiter.exception() is None):
                        orphan(*waiter.result())  # answered just as the caller gave up
                    raise
        except TimeoutError:  # an OSError too: the line is fine, the master is late
            raise
        except (OSError, ValueError) as exc:
            raise _FastLineDown(str(exc)) from None

    async def _pipe(self) -> _Pipe:
        if self._closed:
            raise _FastLineDown("fast line closed")
        self._pipes = [p for p in self._pipes if not p.down]
        best = min(self._pipes, key=lambda p: len(p.pending), default=None)
        if best is not None and (not best.pending or len(self._pipes) >= FAST_ASYNC_CONNECTIONS):
            return best
        if self._opening is None:
            self._opening = asyncio.Lock()
        if best is not None and self._opening.locked():
            return best  # another call is opening one: share what is open meanwhile
        async with self._opening:  # one connect at a time
            live = [p for p in self._pipes if not p.down]
            if len(live) >= FAST_ASYNC_CONNECTIONS:
                return min(live, key=lambda p: len(p.pending))
            host, port = self.address
            _, pipe = await asyncio.get_running_loop().create_connection(
                _Pipe, host, port, ssl=self._tls, server_hostname=host if self._tls else None)
            if self._closed:
                pipe.close()
                raise _FastLineDown("fast line closed")
            self._pipes.append(pipe)
            return pipe

    def close(self) -> None:
        self._closed = True
        pipes, self._pipes = self._pipes, []
        for pipe in pipes:
            pipe.close()


class AsyncMasterChannel(LinkFace):
    """Calls master RPCs by name against an absolute deadline (`time.monotonic()` seconds).
    What to do after each answer is decided by `cellar.coord.link`, as for the sync face."""

    def __init__(self, address: str, *, resolve: AsyncResolver | None = None) -> None:
        self._link = LinkState(address, etcd=resolve is not None)
        self._channel, self._tls_ca = master_channel(address, CHANNEL_OPTIONS, aio=True)
        self._stub = cellar_pb2_grpc.MasterStub(self._channel)
        self._retired: list[grpc.aio.Channel] = []
        self._closing: set[asyncio.Task[None]] = set()  # retired channels being closed
        self._fast: AsyncFastLine | None = None
        self._fast_relearn_at = 0.0
        self._resolve = resolve

    async def call(self, method: str, request: Any, deadline: float,
                   orphan: Callable[[Any], None] | None = None) -> Any:
        """The reply to `method`; `orphan` takes the reply of a fast-line call that the caller
        gave up on (cancelled, timed out) after its request left, should it come (a
        GetReplicas's pins, to release); a call carried by gRPC is cancelled with its caller."""
        stamp(method, request)  # one id for every attempt of this call (client/request_ids.py)
        fast = FAST_METHODS.get(method)
        if fast is not None:
            line = self._fast
            if line is None and time.monotonic() >= self._fast_relearn_at:
                line = await self._relearn(request, deadline)
            if line is not None:
                reply = await self._call_fast(line, method, fast, request, deadline,
                                              None if orphan is None else _decoded(fast, orphan))
                if reply is not None:
                    return reply
        return await self._call_grpc(method, request, deadline, learn=method == "ClusterStatus")

    async def _call_fast(self, line: AsyncFastLine, method: str, fast: tuple[int, Any],
                         request: Any, deadline: float, orphan: Orphan | None = None) -> Any | None:
        address, generation = self._link.address, self._link.generation
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise Timeout(f"{method} to master {address}: timed out")
        method_id, reply_cls = fast
        exchange = line.call(method_id, request.SerializeToString(), remaining_s, orphan)
        try:
            code, data = await (self._watched(exchange, generation, deadline)
                                if self._resolve is not None else exchange)
        except _LeaderMoved:
            return None  # the channel points at the new leader: gRPC carries the call there
        except TimeoutError:
            raise Timeout(f"{method} to master {address}: timed out") from None
        except _FastLineDown:
            self._drop_fast(line)
            return None
        answer = fast_answer(method, address, generation, code, data, reply_cls)
        return await self._drive(plans.fast_reply(self._link, answer, deadline), deadline,
                                 fast=line)

    async def _relearn(self, request: Any, deadline: float) -> AsyncFastLine | None:
        self._fast_relearn_at = time.monotonic() + FAST_RELEARN_S
        try:
            await self._call_grpc("ClusterStatus", pb.ClusterStatusRequest(header=request.header),
                                  min(deadline, time.monotonic() + 1.0), learn=True)
        except CellarError:
            return None
        return self._fast

    def _open_fast(self, host: str, port: int) -> AsyncFastLine:
        return AsyncFastLine(host, port, self._tls_ca)

    async def _call_grpc(self, method: str, request: Any, deadline: float,
                         learn: bool = False) -> Any:
        answer = await self._drive(plans.call(self._link, method, deadline), deadline, request,
                                   learn)
        if learn:
            self._learn_fast(answer.call, answer.address, answer.generation)
        return answer.reply

    # ---- performing what the link decides -----------------------------------------------------

    async def _drive(self, plan: Plan[Any], deadline: float, request: Any = None,
                     learn: bool = False, fast: AsyncFastLine | None = None) -> Any:
        async def perform(effect: Effect) -> Any:
            if isinstance(effect, plans.Attempt):
                return await self._attempt(effect, request, deadline, learn)
            if isinstance(effect, AskEtcd):
                assert self._resolve is not None
                return await self._resolve(effect.timeout_s)
            if isinstance(effect, Sleep):
                await asyncio.sleep(effect.seconds)
            elif isinstance(effect, Switch):
                self._switch(effect)
            elif isinstance(effect, DropFast):
                assert fast is not None
                self._drop_fast(fast, effect.relearn_s)
            return None
        return await plans.run_async(plan, perform)

    async def _attempt(self, attempt: plans.Attempt, request: Any, deadline: float,
                       learn: bool) -> Replied | Refused | Moved:
        address, generation = self._link.address, self._link.generation
        try:
            call = getattr(self._stub, attempt.method)(request, timeout=attempt.timeout_s)
            reply = await (self._watched(call, generation, deadline) if self._resolve is not None
                           else call)
            metadata = await call.trailing_metadata() if learn else None
        except _LeaderMoved as moved:
            return Moved(address, generation, str(moved))
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if not retryable_grpc(code):
                raise grpc_error(attempt.method, address, code, details) from None
            return Refused(address, generation, details,
                           leader_from(trailing_metadata(exc), details))
        return Replied(address, generation, reply, metadata)

    async def _watched(self, call: Any, generation: int, deadline: float) -> Any:
        """The result of `call` (a gRPC call or a fast-line exchange), asking etcd every
        LEADER_CHECK_AFTER_S while it has none: a master that froze or was cut off answers
        nothing, and once etcd names another leader the call is cancelled (a deposed master
        cannot complete it later) and sent there."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=LEADER_CHECK_AFTER_S)
                if done:
                    return task.result()
                if await self._drive(plans.moved_on(self._link, generation, deadline), deadline):
                    raise _LeaderMoved(f"no answer in {LEADER_CHECK_AFTER_S:g} s and etcd names "
                                       f"{self.address} as the leader")
        finally:
            if not task.done():
                task.cancel()

    def _switch(self, switch: Switch) -> None:
        link = self._link
        if link.generation != switch.from_generation or link.closed:
            return  # another coroutine switched first, or the channel closed
        old = link.switched(switch.target)
        self._retired.append(self._channel)  # calls still in flight on it finish there
        while len(self._retired) > MAX_RETIRED_CHANNELS:  # as the sync face: bounded
            closing = asyncio.get_running_loop().create_task(
                self._retired.pop(0).close(grace=None))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        self._channel, self._tls_ca = master_channel(switch.target, CHANNEL_OPTIONS, aio=True)
        self._stub = cellar_pb2_grpc.MasterStub(self._channel)
        fast, self._fast = self._fast, None
        self._fast_relearn_at = 0.0
        if fast is not None:
            fast.close()
        log.info("following the master leader: %s -> %s", old, switch.target)

    async def aclose(self) -> None:
        self._link.closed = True
        fast, self._fast = self._fast, None
        if fast is not None:
            fast.close()
        channels, self._retired = [self._channel, *self._retired], []
        for channel in channels:
            await channel.close(grace=None)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _decoded(fast: tuple[int, Any], take: Callable[[Any], None]) -> Orphan:
    """An `Orphan` that hands `take` the decoded reply of an answered call (a refusal, or
    bytes that do not parse, carry nothing to take)."""
    def on_reply(code: int, data: bytes) -> None:
        if code != fastline.OK_CODE:
            return
        try:
            reply = fast[1].FromString(data)
        except Exception:  # noqa: BLE001 - a reply nobody awaits: nothing to release
            return
        take(reply)
    return on_reply
