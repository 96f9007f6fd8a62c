"""Control frames to storage nodes over their TCP data port: COMMIT (shm, rdma) and RDMA_CONNECT.

The shm and rdma transports move payload bytes without the node's help (memcpy into the mapped
segment file, one-sided RDMA WRITE), but the node must still check and record every write:
after the bytes landed, the client sends one small COMMIT frame per op (the same request header
as a WRITE, with the grant, no payload) and the node runs the WRITE checks and records the
range (see `cellar.storage_node.access.NodeAccess.commit`). RDMA_CONNECT exchanges queue-pair
descriptions the same way, under the grant of a data op the client is about to run there.

`ControlChannel` keeps a few persistent connections per node address and pipelines a whole
batch's frames: every node's frames are sent first (in windows of `window` frames), then the
replies are read in order, so one write call costs one round trip per node however many keys
it holds. A `ControlStream` (`ControlChannel.stream`) is the same call with its frames sent
in groups as the caller has them: shm commits the writes already copied while it copies the
rest (transfer/shm_commits.py), and reads every reply once at the end. Replies are checked
against their requests (id, length); a mismatch, timeout or socket error closes that
connection and fails only the calls still waiting on it.

A node whose endpoint is `tls://HOST:PORT` gets its frames over TLS (`tls_sock`), with the
same context as the tcp transport's. It never carries payload bytes (replies at most
MAX_META_BYTES) and never retries on its own.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cellar.proto.grant import Grant
from cellar.transfer._sockio import (
    MAX_IOV,
    TIMEOUT_ERRORS,
    Inbox,
    idle_alive,
    send_all,
    set_io_timeout,
)
from cellar.transfer.base import ST_CONNECT_FAILED, ST_CONNECTION_LOST, ST_TIMEOUT
from cellar.transfer.frame import (
    MAX_MESSAGE_BYTES,
    MAX_META_BYTES,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    RESPONSE_MAGIC,
    ST_OK,
    VERSION,
    request_flags,
)
from cellar.transfer.spin_wait import SpinWait
from cellar.transfer.tls_sock import dial

INBOX_BYTES = 64 << 10
assert RESPONSE.size + MAX_MESSAGE_BYTES + MAX_META_BYTES <= INBOX_BYTES
DEFAULT_WINDOW = 256          # frames in flight per connection
DEFAULT_IDLE_PER_NODE = 2     # idle connections kept per node address
_ZERO_MAC = bytes(16)


@dataclass(slots=True)
class ControlCall:
    op: int
    grant: Grant | None
    segment_id: int
    offset: int
    length: int
    meta: bytes = b""


@dataclass(slots=True)
class ControlReply:
    status: int = ST_OK
    message: str = ""
    payload: bytes = b""


class _Conn:
    __slots__ = ("sock", "inbox", "next_id")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = Inbox(sock, INBOX_BYTES)
        self.next_id = 1

    def alive(self) -> bool:
        return idle_alive(self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _pack(call: ControlCall, rid: int) -> bytes:
    g = call.grant
    if g is None:
        head = REQUEST.pack(REQUEST_MAGIC, VERSION, call.op, 0, len(call.meta), rid,
                            call.segment_id, 0, 0, 0, 0, 0, 0, _ZERO_MAC, call.offset, call.length)
    else:
        head = REQUEST.pack(REQUEST_MAGIC, VERSION, call.op, request_flags(call.op, g),
                            len(call.meta), rid, g.segment_id, g.offset, g.length, g.alloc_id,
                            g.epoch, g.expiry_ms, g.key_tag, g.mac, call.offset, call.length)
    return head + call.meta


class ControlChannel:
    """Pipelined header-only frames to node TCP addresses; thread-safe."""

    def __init__(self, *, connect_timeout_s: float = 5.0, window: int = DEFAULT_WINDOW,
                 idle_per_node: int = DEFAULT_IDLE_PER_NODE,
                 tls_context: ssl.SSLContext | None = None,
                 spin: SpinWait | None = None) -> None:
        if window < 1 or idle_per_node < 0:
            raise ValueError("window must be >= 1 and idle_per_node >= 0")
        # polls for the reply of a call of one frame before blocking (transfer/spin_wait.py):
        # a one-key put's COMMIT over shm, as tcp spins for a one-chunk transfer (not under
        # TLS, whose socket may hold a record the poll cannot see)
        self.spin = spin if tls_context is None else None
        self.connect_timeout_s = connect_timeout_s
        self.window = min(window, MAX_IOV)
        self.idle_per_node = idle_per_node
        self.tls_context = tls_context  # for `tls://` node endpoints (tls_sock)
        self._lock = threading.Lock()
        self._idle: dict[str, list[_Conn]] = {}
        self._closed = False

    def call(self, calls: Mapping[str, Sequence[ControlCall]],
             timeout_s: float) -> dict[str, list[ControlReply]]:
        """One reply per call, per address, in order. Never raises for network trouble."""
        stream = self.stream(timeout_s)
        stream.send(calls)
        out = stream.finish()
        for address in calls:  # an address with no calls still gets its (empty) list
            out.setdefault(address, [])
        return out

    def stream(self, timeout_s: float) -> ControlStream:
        """A call whose frames are sent in groups as they become ready (`ControlStream.send`),
        every reply read at the end (`finish`): a batch of shm writes commits what was copied
        while the rest is still being copied."""
        return ControlStream(self, time.monotonic() + timeout_s)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def forget(self, address: str) -> None:
        with self._lock:
            conns = self._idle.pop(address, [])
        for conn in conns:
            conn.close()

    # -- plumbing --------------------------------------------------------------------------

    def _checkout(self, address: str, deadline: float) -> _Conn:
        while True:
            with self._lock:
                if self._closed:
                    raise ConnectionError("transport closed")
                pool = self._idle.get(address)
                conn = pool.pop() if pool else None
            if conn is None:
                break
            if conn.alive():
                return conn
            conn.close()
        timeout = min(self.connect_timeout_s, deadline - time.monotonic())
        if timeout <= 0:
            raise TimeoutError("deadline passed before connecting")
        return _Conn(dial(address, timeout, 0, self.tls_context))

    def _checkin(self, address: str, conn: _Conn) -> None:
        with self._lock:
            pool = self._idle.setdefault(address, [])
            if not self._closed and len(pool) < self.idle_per_node:
                pool.append(conn)
                return
        conn.close()


class ControlStream:
    """One call's frames, sent group by group as the caller has them, replies read at the end
    (`ControlChannel.stream`). Not thread-safe: one caller sends and finishes. Sends never
    wait for replies unless a node's window of frames in flight is full."""

    def __init__(self, channel: ControlChannel, deadline: float) -> None:
        self._channel = channel
        self._deadline = deadline
        self._lanes: dict[str, _Lane] = {}

    def send(self, calls: Mapping[str, Sequence[ControlCall]]) -> None:
        """Send these frames now (what a full window holds back goes at `finish`)."""
        channel = self._channel
        for address, batch in calls.items():
            if not batch:
                continue
            lane = self._lanes.get(address)
            if lane is None:
                try:
                    lane = _Lane(address, channel._checkout(address, self._deadline))
                except (OSError, ValueError) as e:
                    status = ST_TIMEOUT if isinstance(e, TIMEOUT_ERRORS) else ST_CONNECT_FAILED
                    lane = _Lane(address, None, (status, f"{address}: {e}"))
                self._lanes[address] = lane
            lane.batch.extend(batch)
            lane.pump(channel.window, self._deadline)

    def finish(self) -> dict[str, list[ControlReply]]:
        """Every reply, per address in the order its frames were sent; every connection
        checked back in (or closed, when its node failed). Never raises for network trouble."""
        channel, deadline = self._channel, self._deadline
        lanes = [lane for lane in self._lanes.values() if not self._settle(lane)]
        lone = len(lanes) == 1 and len(lanes[0].batch) == 1
        spin = channel.spin if lone else None
        while lanes:  # window by window: send to every node, then read every node's replies
            for lane in lanes:
                lane.pump(channel.window, deadline)
            if spin is not None and lanes[0].failure is None \
                    and not lanes[0].conn.inbox.buffered:  # type: ignore[union-attr]
                spin.wait(lanes[0].conn.sock)  # type: ignore[union-attr]
            for lane in lanes:
                lane.receive(deadline)
            lanes = [lane for lane in lanes if not self._settle(lane)]
        return {address: lane.replies for address, lane in self._lanes.items()}

    def _settle(self, lane: _Lane) -> bool:
        """Whether `lane` is done; a failed one's missing replies say why, its connection is
        closed; a finished one's goes back to the channel."""
        if lane.failure is not None:
            if lane.conn is not None:
                lane.conn.close()
                lane.conn = None
            status, why = lane.failure
            lane.replies.extend(ControlReply(status, why)
                                for _ in range(len(lane.batch) - len(lane.replies)))
            return True
        if len(lane.replies) == len(lane.batch):
            if lane.conn is not None:
                self._channel._checkin(lane.address, lane.conn)
                lane.conn = None
            return True
        return False


class _Lane:
    """One node's share of a call on one connection."""

    __slots__ = ("address", "conn", "batch", "replies", "in_flight", "failure")

    def __init__(self, address: str, conn: _Conn | None,
                 failure: tuple[int, str] | None = None) -> None:
        self.address = address
        self.conn = conn      # None: it could not be had (`failure` says why)
        self.batch: list[ControlCall] = []
        self.replies: list[ControlReply] = []
        self.in_flight = 0    # frames sent whose replies are not read yet
        self.failure = failure

    def pump(self, window: int, deadline: float) -> None:
        """Send the frames not sent yet, as many as fit in `window` frames awaiting replies."""
        if self.failure is not None or self.conn is None:
            return
        start = len(self.replies) + self.in_flight
        chunk = self.batch[start:start + window - self.in_flight]
        if not chunk:
            return
        conn = self.conn
        first = conn.next_id
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("deadline passed")
            set_io_timeout(conn.sock, remaining)
            send_all(conn.sock, [_pack(c, first + k) for k, c in enumerate(chunk)])
            conn.next_id += len(chunk)
            self.in_flight += len(chunk)
        except Exception as e:  # noqa: BLE001 - any failure breaks only this lane
            self.failure = _failure(self.address, e)

    def receive(self, deadline: float) -> None:
        if self.failure is not None or self.conn is None:
            return
        conn, inbox = self.conn, self.conn.inbox
        first = conn.next_id - self.in_flight
        try:
            for k in range(self.in_flight):
                if time.monotonic() > deadline:
                    raise TimeoutError("deadline passed")
                head = inbox.take(RESPONSE.size)
                magic, version, status, _flags, msg_len, rid, length = RESPONSE.unpack(head)
                if (magic != RESPONSE_MAGIC or version != VERSION or rid != first + k
                        or msg_len > MAX_MESSAGE_BYTES or length > MAX_META_BYTES
                        or (length and status != ST_OK)):
                    raise ConnectionError(f"reply out of sync (request {first + k})")
                message = bytes(inbox.take(msg_len)).decode("utf-8", "replace")
                payload = bytes(inbox.take(length)) if length else b""
                self.replies.append(ControlReply(
                    status, f"{self.address}: {message}" if message else "", payload))
            self.in_flight = 0
        except Exception as e:  # noqa: BLE001 - any failure breaks only this lane
            self.failure = _failure(self.address, e)


def _failure(address: str, e: BaseException) -> tuple[int, str]:
    if isinstance(e, TIMEOUT_ERRORS):
        return ST_TIMEOUT, f"{address}: timed out ({e or type(e).__name__})"
    return ST_CONNECTION_LOST, f"{address}: {e or type(e).__name__}"
