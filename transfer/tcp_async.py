"""The asyncio TCP transport: the event loop's own non-blocking sockets, multiplexed and pipelined.

The AsyncClient's data plane. Same frames as `tcp.TcpTransport` (`frame.py`), same batch
planning (`tcp_plan`: checks, chunking across part boundaries, striping policy), but no thread:
every socket is non-blocking and driven by the loop (`add_reader`/`add_writer`, then the
syscall), and payload bytes still go straight between the socket and the caller's memory
(`sendmsg` of [header, meta, parts...] iovecs, `recvmsg_into` [inbox, destination parts]).

Why multiplexed channels instead of one lane per batch (as the threaded transport does): an
event loop runs many small concurrent calls (64 `get`s at once is the figure of issue 11), each
a batch of one op. Checking a connection out per batch would give each a round trip of its own;
instead every connection is a *channel* shared by all batches on the loop: a writer task sends
queued frames in order (many callers' frames gathered into one `sendmsg`), a reader task reads
replies in order and matches each to the request it answers (id, length), so concurrent calls
pipeline on one connection as a sync batch does. A node's pool holds at most
`connections_per_node` channels; a batch picks the least-loaded ones (more than one only when
`tcp_plan.lanes_for` stripes a large share), opening new ones while under the limit. The
reader task reads each reply with a synchronous stepper (`tcp_async_replies.ReplyStepper`),
which hashes a read as it lands where the op wants its checksum (`tcp_reads`).

Cancellation guarantee: when `read` returns (deadline passed, the caller's task was cancelled,
or done), every one of its frames still outstanding is marked cancelled before it returns.
All bytes land from the reader task, synchronously on the loop thread, and the reader checks
that mark before every receive into a caller's view: a cancelled frame's reply (or the rest of
it, if it was mid-payload) is received into scratch memory and dropped. So no byte lands in a
caller's buffer after `read` returned, and the connection stays in sync for the other callers.
A channel one of whose frames timed out is retired (no new frames; closed once drained, or
after RETIRED_DRAIN_S at the latest), so later batches do not queue behind a stalled node. A write frame already being sent when its
batch ends is sent to its end (the stream must stay whole); the SDK revokes such a put.

Invariants: a channel's `sent` queue holds exactly the frames sent and not yet answered, in
stream order; any mismatch, EOF or socket error closes the channel and fails exactly the ops
with frames on it (ST_CONNECTION_LOST); an op fails if any of its chunks fails.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections import deque
from collections.abc import Sequence

from cellar.transfer._sockio import (
    MAX_IOV,
    Inbox,
    PeerClosed,
    advance_views,
    idle_alive,
    tune_socket,
)
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    AsyncTransport,
    SegmentRoute,
    TransferOp,
    TransferResult,
)
from cellar.transfer.control import ControlCall
from cellar.transfer.frame import (
    DEFAULT_MAX_FRAME_PAYLOAD_BYTES,
    MAX_MESSAGE_BYTES,
    OP_COMMIT,
    OP_READ,
    OP_WRITE,
    RESPONSE,
)
from cellar.transfer.tcp_async_frames import Frame, Wait, wake
from cellar.transfer.tcp_async_replies import ReplyStepper
from cellar.transfer.tcp_plan import (
    Plan,
    add_request,
    deal,
    fail_chunks,
    finish,
    lanes_for,
    plan_batch,
    read_lanes,
)
from cellar.transfer.tls_async import start_tls
from cellar.transfer.tls_sock import split_endpoint

INBOX_BYTES = 64 << 10
# A retired channel still waiting for replies after this long is closed (its node stalled):
# the bound on how long a timed-out batch's connection can linger.
RETIRED_DRAIN_S = 10.0
assert RESPONSE.size + MAX_MESSAGE_BYTES <= INBOX_BYTES
RESPONSE_SIZE = RESPONSE.size


class _Channel(ReplyStepper):
    """One connection shared by every batch on the loop: a writer task and a reader task."""

    def __init__(self, pool: _Pool, sock: socket.socket, window: int) -> None:
        self.pool = pool
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.inbox = Inbox(sock, INBOX_BYTES)
        self.window = window
        self.next_id = 1
        self.queue: deque[Frame] = deque()   # waiting to be sent
        self.sent: deque[Frame] = deque()    # sent, reply not read yet (stream order)
        self.load_bytes = 0                    # payload bytes queued or in flight
        self.retired = False
        self.closed = False
        self._writer_wake: asyncio.Future[None] | None = None
        self._reader_wake: asyncio.Future[None] | None = None
        self.init_reader()
        pool.transport._channels.add(self)
        self.loop.add_reader(self.fd, self._on_readable)
        self._writer = self.loop.create_task(self._write_loop())
        self._reader = self.loop.create_task(self._read_loop())

    # -- used by batches -------------------------------------------------------------------

    def enqueue(self, frame: Frame) -> None:
        self.queue.append(frame)
        self.load_bytes += frame.chunk[3]
        if self._writer_wake is not None:
            wake(self._writer_wake)

    def retire(self) -> None:
        """No new frames; closed as soon as the outstanding ones are answered."""
        if not self.retired:
            self.retired = True
            self.pool.drop(self)
            self.loop.call_later(RETIRED_DRAIN_S, self.close, ST_TIMEOUT,
                                 f"no reply within {RETIRED_DRAIN_S} s of a timeout")
        if not self.queue and not self.sent:
            self.close(ST_CONNECTION_LOST, "retired")

    def close(self, status: int, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.drop(self)
        self.pool.transport._channels.discard(self)
        current = asyncio.current_task()
        for task in (self._writer, self._reader):
            if task is not current:
                task.cancel()
        for fd_remove in (self.loop.remove_reader, self.loop.remove_writer):
            try:
                fd_remove(self.fd)
            except (ValueError, OSError):
                pass
        try:
            self.sock.close()
        except OSError:
            pass
        message = f"{self.pool.address}: {why}"
        for frames in (self.sent, self.queue):
            while frames:
                frames.popleft().finish(status, message)

    # -- readiness -------------------------------------------------------------------------

    async def _readable(self) -> None:
        # The fd stays registered for the channel's life (`_on_readable`): one epoll_ctl per
        # connection instead of two per wait. No spin: the reader only waits right after a
        # receive found nothing, so the callback fires again only when new bytes arrive.
        fut = self.loop.create_future()
        self._reader_wake = fut
        try:
            await fut
        finally:
            self._reader_wake = None

    def _on_readable(self) -> None:
        fut = self._reader_wake
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _writable(self) -> None:
        fut = self.loop.create_future()
        self.loop.add_writer(self.fd, wake, fut)
        try:
            await fut
        finally:
            if not self.closed:
                self.loop.remove_writer(self.fd)

    # -- the writer ------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                while not self.queue or len(self.sent) >= self.window:
                    fut = self.loop.create_future()
                    self._writer_wake = fut
                    try:
                        await fut
                    finally:
                        self._writer_wake = None
                parts: list[bytes | memoryview] = []
                while self.queue and len(self.sent) < self.window and len(parts) < MAX_IOV - 2:
                    frame = self.queue.popleft()
                    if frame.cancelled:  # its batch ended before it left: never send it
                        self.load_bytes -= frame.chunk[3]
                        frame.finish(ST_TIMEOUT, "cancelled before it was sent")
                        continue
                    rid = frame.rid = self.next_id
                    self.next_id += 1
                    add_request(parts, frame.op_code, rid, frame.chunk,
                                frame.plan.metas[frame.chunk[0]])
                    self.sent.append(frame)
                if self.sent and self._reader_wake is not None:
                    wake(self._reader_wake)  # an idle reader now has a reply to wait for
                await self._send(parts)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure closes only this channel
            self.close(ST_CONNECTION_LOST, f"send: {e or type(e).__name__}")

    async def _send(self, parts: list[bytes | memoryview]) -> None:
        views = [p if isinstance(p, memoryview) else memoryview(p) for p in parts if len(p)]
        while views:
            try:
                sent = self.sock.sendmsg(views[:MAX_IOV])
            except (BlockingIOError, InterruptedError):
                await self._writable()
                continue
            advance_views(views, sent)

    # -- the reader ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while True:
                if not self.sent:
                    if self.retired and not self.queue:
                        self.close(ST_CONNECTION_LOST, "retired")
                        return
                    await self._readable()  # a reply's first bytes, EOF, or the writer's kick
                    if not self.sent and not idle_alive(self.sock):
                        raise PeerClosed("node closed an idle connection")
                    continue
                if not self._advance(self.sent[0]):
                    await self._readable()  # the socket has nothing more for now
                    continue
                self.sent.popleft()
                if self._writer_wake is not None and self.queue:
                    wake(self._writer_wake)  # the window has room again
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure closes only this channel
            self.close(ST_CONNECTION_LOST, f"{e or type(e).__name__}")

class _Pool:
    """The channels to one node address (at most `limit`, retired ones not counted), on one
    loop, and the connection attempts under way."""

    def __init__(self, transport: AsyncTcpTransport, address: str) -> None:
        self.transport = transport
        self.address = address
        self.channels: list[_Channel] = []
        self.connects: set[asyncio.Task[None]] = set()
        self.last_failure: TransferResult | None = None

    def drop(self, channel: _Channel) -> None:
        if channel in self.channels:
            self.channels.remove(channel)

    async def pick(self, lanes: int, deadline: float) -> list[_Channel] | TransferResult:
        """Up to `lanes` channels, least loaded first (never none): an idle channel is used
        as is; while under the limit, new ones are opened for lanes that would otherwise
        share a busy one; at the limit, busy ones are shared (frames pipeline on them)."""
        t = self.transport
        loop = asyncio.get_running_loop()
        while True:
            live = sorted(self.channels, key=_load)
            idle = sum(1 for c in live if c.load_bytes == 0)
            room = t.connections_per_node - len(self.channels) - len(self.connects)
            new = max(0, min(lanes - idle, room))
            if new == 0 and live:
                return live[:lanes]
            started = [loop.create_task(self._open(deadline)) for _ in range(new)]
            self.connects.update(started)
            waiting = started or list(self.connects)
            if not waiting:
                return self.last_failure or TransferResult(
                    ST_CONNECT_FAILED, f"{self.address}: no connection")
            remaining = deadline - loop.time()
            if remaining <= 0:
                return TransferResult(ST_TIMEOUT, f"{self.address}: no connection before "
                                      "the deadline")
            await asyncio.wait(waiting, timeout=remaining,
                               return_when=asyncio.ALL_COMPLETED if started
                               else asyncio.FIRST_COMPLETED)
            if started and not self.channels:
                return self.last_failure or TransferResult(
                    ST_CONNECT_FAILED, f"{self.address}: no connection")
            if started:
                return sorted(self.channels, key=_load)[:lanes]

    async def _open(self, deadline: float) -> None:
        try:
            got = await self.transport._connect(self, deadline)
            if isinstance(got, _Channel):
                self.channels.append(got)
            else:
                self.last_failure = got
        finally:
            self.connects.discard(asyncio.current_task())  # type: ignore[arg-type]


def _load(channel: _Channel) -> int:
    return channel.load_bytes


class AsyncTcpTransport(AsyncTransport):
    """`tcp.TcpTransport`'s contract on an asyncio loop (options mean the same)."""

    name = "tcp"

    def __init__(self, *, connections_per_node: int = 4, chunk_bytes: int = 4 << 20,
                 max_frame_payload_bytes: int = DEFAULT_MAX_FRAME_PAYLOAD_BYTES,
                 connect_timeout_s: float = 5.0, socket_buffer_bytes: int = 4 << 20,
                 max_inflight_per_connection: int = 64, min_stripe_bytes: int = 8 << 20,
                 read_connections_per_node: int | None = None,
                 tls_context: ssl.SSLContext | None = None, **_ignored: object) -> None:
        if connections_per_node < 1 or max_inflight_per_connection < 1:
            raise ValueError("connections_per_node and max_inflight_per_connection must be >= 1")
        self.read_connections_per_node = read_lanes(connections_per_node,
                                                    read_connections_per_node)
        if not 0 < chunk_bytes <= max_frame_payload_bytes:
            raise ValueError("chunk_bytes must be in (0, max_frame_payload_bytes]")
        self.connections_per_node = connections_per_node
        self.chunk_bytes = chunk_bytes
        self.max_frame_payload_bytes = max_frame_payload_bytes
        self.connect_timeout_s = connect_timeout_s
        self.socket_buffer_bytes = socket_buffer_bytes
        self.max_inflight_per_connection = max_inflight_per_connection
        self.min_stripe_bytes = min_stripe_bytes
        self.tls_context = tls_context
        self._pools: dict[str, _Pool] = {}
        self._channels: set[_Channel] = set()  # every open one, retired ones included
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return await self._batch(ops, timeout_s, OP_WRITE)

    async def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return await self._batch(ops, timeout_s, OP_READ)

    def forget(self, route: SegmentRoute) -> None:
        address = route.endpoints.get(self.name)
        pool = self._pools.get(address) if address else None
        if pool is not None:
            for channel in list(pool.channels):
                channel.retire()

    async def aclose(self) -> None:
        self._closed = True
        self._pools = {}
        channels = list(self._channels)
        for channel in channels:
            channel.close(ST_CONNECT_FAILED, "transport closed")
        tasks = [t for c in channels for t in (c._writer, c._reader)]
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def stats(self) -> dict[str, int]:
        """Open channels and frames in flight (for tests and metrics; a dict, as every
        transport's `stats`)."""
        channels = [c for p in self._pools.values() for c in p.channels]
        return {"channels": len(channels),
                "in_flight": sum(len(c.sent) + len(c.queue) for c in channels)}

    # -- a batch ---------------------------------------------------------------------------

    async def commit(self, calls: dict[str, list[ControlCall]],
                     timeout_s: float) -> dict[str, list[tuple[int, str, bytes]]]:
        """Header-only control frames (shm/rdma COMMIT) to node tcp addresses, pipelined on the
        same channels as payload frames; (status, message, receipt) per call, per address, in
        order."""
        order = [(address, call) for address, batch in calls.items() for call in batch]
        n = len(order)
        plan = Plan([None] * n, [call.meta for _, call in order], [False] * n, [None] * n,
                    [b""] * n)
        for k, (address, call) in enumerate(order):
            plan.by_address.setdefault(address, []).append(
                (k, call.offset, (), call.length, call.grant))  # type: ignore[arg-type]
            plan.bytes_by_address[address] = 0
        op_codes = {call.op for _, call in order}
        assert len(op_codes) <= 1 and OP_READ not in op_codes and OP_WRITE not in op_codes
        results = await self._run(plan, op_codes.pop() if op_codes else OP_COMMIT, timeout_s)
        out: dict[str, list[tuple[int, str, bytes]]] = {address: [] for address in calls}
        for (address, _), r in zip(order, results, strict=True):
            out[address].append((r.status, r.message, r.receipt))
        return out

    async def _batch(self, ops: Sequence[TransferOp], timeout_s: float,
                     op_code: int) -> list[TransferResult]:
        return await self._run(plan_batch(ops, self.name, op_code, self.chunk_bytes), op_code,
                               timeout_s)

    async def _run(self, plan: Plan, op_code: int, timeout_s: float) -> list[TransferResult]:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("AsyncTcpTransport used from a second event loop")
        deadline = loop.time() + timeout_s
        if self._closed:
            for chunks in plan.by_address.values():
                fail_chunks(plan.fail, chunks, ST_CONNECT_FAILED, "transport closed")
            return finish(plan)
        n_frames = sum(len(c) for c in plan.by_address.values())
        wait = Wait(loop, n_frames)
        frames: list[Frame] = []
        try:
            for address, chunks in plan.by_address.items():
                pool = self._pools.get(address)
                if pool is None:
                    pool = self._pools[address] = _Pool(self, address)
                lanes = lanes_for(len(chunks), plan.bytes_by_address[address],
                                  chunk_bytes=self.chunk_bytes,
                                  connections_per_node=self.connections_per_node,
                                  min_stripe_bytes=self.min_stripe_bytes,
                                  is_read=op_code == OP_READ,
                                  read_connections_per_node=self.read_connections_per_node,
                                  address=address)
                picked = await pool.pick(lanes, deadline)
                if isinstance(picked, TransferResult):
                    fail_chunks(plan.fail, chunks, picked.status, picked.message)
                    for _ in chunks:
                        wait.one_done()
                    continue
                for channel, lane in zip(picked, deal(chunks, len(picked)), strict=False):
                    for chunk in lane:
                        frame = Frame(chunk, op_code, plan, wait, channel)
                        frames.append(frame)
                        channel.enqueue(frame)
            if n_frames and not wait.future.done():
                timer = loop.call_at(deadline, wake, wait.future)  # the budget ends the wait
                try:
                    await wait.future
                finally:
                    timer.cancel()
        finally:
            # The cancellation guarantee: from here on the reader never touches these views.
            stuck: set[_Channel] = set()
            for frame in frames:
                if not frame.done:
                    frame.cancelled = True
                    stuck.add(frame.channel)
                    if plan.fail[frame.chunk[0]] is None:
                        plan.fail[frame.chunk[0]] = TransferResult(
                            ST_TIMEOUT, "timed out before the node answered")
            for channel in stuck:  # later batches must not queue behind a stalled node
                channel.retire()
        return finish(plan)

    async def _connect(self, pool: _Pool, deadline: float) -> _Channel | TransferResult:
        loop = asyncio.get_running_loop()
        timeout = min(self.connect_timeout_s, deadline - loop.time())
        if timeout <= 0:
            return TransferResult(ST_TIMEOUT, f"{pool.address}: deadline passed before connecting")
        sock: socket.socket | None = None
        try:
            host, port, tls = split_endpoint(pool.address)
            try:
                family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 \
                    else socket.AF_INET
                addr: tuple[object, ...] = (host, port)
            except ValueError:  # a name: resolve it off the loop
                info = await asyncio.wait_for(
                    loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
                family, _, _, _, addr = info[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            tune_socket(sock, self.socket_buffer_bytes)
            await asyncio.wait_for(loop.sock_connect(sock, addr), timeout)
            if tls:  # a `tls://` endpoint: the same channel over a TlsSocket (tls_async)
                sock = await asyncio.wait_for(start_tls(sock, self.tls_context, host), timeout)
        except (OSError, ValueError, TimeoutError) as e:
            if sock is not None:
                sock.close()
            status = ST_TIMEOUT if isinstance(e, TimeoutError) else ST_CONNECT_FAILED
            return TransferResult(status, f"{pool.address}: {e or type(e).__name__}")
        assert sock is not None
        if self._closed:
            sock.close()
            return TransferResult(ST_CONNECT_FAILED, "transport closed")
        return _Channel(pool, sock, self.max_inflight_per_connection)
