"""The sync face's line to the master: one gRPC channel, deadlines, bounded retries.

What it owns
    One `grpc.Channel` per `Client` (thread-safe; gRPC multiplexes concurrent calls over it),
    with the master's small message limit (4 MiB: the master never carries payload, so replies
    are placements and grants only). Every call runs against the caller's deadline. A call
    that fails with UNAVAILABLE (master not up yet, restarting, connection refused) is retried
    with capped exponential backoff while the deadline allows; everything else is mapped at once
    to a typed exception by `core.grpc_error` (INVALID_ARGUMENT keeps the server's message).

Retrying UNAVAILABLE is safe for every master RPC in practice: gRPC reports it when the
request did not reach the server. In the rare case where a reply was lost after the master
acted, a repeated PutStart sees the key as being written (the first attempt is revoked by the
writer timeout) and a repeated Unpin or Remove finds nothing left to do.

Every reply's epoch goes through an `EpochFence`: a reply from a master older than one this
client already heard from (a deposed leader) raises `cellar.Unavailable`.

The fast line: PutStart, PutEnd, PutRevoke, GetReplicas and Unpin go over the master's
metadata fast line (`cellar.master.fastrpc`: the same protobuf messages, length-prefixed, over a
small pool of persistent TCP connections; about 0.12 ms per round trip instead of 0.8 ms) once
ClusterStatus's trailing metadata has named its port. A connection that fails (refused, reset,
a master restart) sends that call through gRPC instead, with gRPC's retry rules, and the port
is asked again at most once per `FAST_RELEARN_S`. Replies get the same epoch fence and status
mapping as gRPC replies.

The asyncio face will own a `grpc.aio` channel with the same options and the same mapping.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import grpc

from cellar.client.core import EpochFence, grpc_error, retryable_grpc
from cellar.errors import Timeout, Unavailable
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc
from cellar.units import parse_host_port

MAX_MESSAGE_BYTES = 4 << 20
MAX_RPC_ATTEMPTS = 64
BACKOFF_FIRST_S = 0.02
BACKOFF_MAX_S = 0.5

# The fast line's frame and method numbers: the contract of cellar.master.fastrpc (the client
# must not import cellar.master, so they are repeated here; a unit test keeps them equal).
FAST_PORT_METADATA = "cellar-fast-rpc-port"
FAST_FRAME = struct.Struct("<IB")
FAST_METHODS = {"PutStart": (1, pb.PutStartReply), "PutEnd": (2, pb.PutEndReply),
                "PutRevoke": (3, pb.PutRevokeReply), "GetReplicas": (4, pb.GetReplicasReply),
                "Unpin": (5, pb.UnpinReply)}
FAST_MAX_IDLE_CONNECTIONS = 8
FAST_RELEARN_S = 1.0
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _FastLineDown(Exception):
    """The fast line could not carry this call; gRPC will."""


class _FastLine:
    """A pool of persistent connections to the master's fast line; one call per connection at
    a time, so any number of threads may call."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._head = bytearray(FAST_FRAME.size)

    def call(self, method_id: int, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """(numeric gRPC code, reply bytes). _FastLineDown if nothing could be exchanged;
        TimeoutError if the master did not answer in time."""
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        try:
            if sock is None:
                sock = socket.create_connection(self.address, timeout=min(timeout_s, 1.0))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeout_s)
            sock.sendall(FAST_FRAME.pack(len(body), method_id) + body)
            head = _recv_exact(sock, FAST_FRAME.size)
            length, code = FAST_FRAME.unpack(head)
            if length > MAX_MESSAGE_BYTES:
                raise ConnectionError(f"fast line reply of {length} bytes")
            data = _recv_exact(sock, length) if length else b""
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise
        except (OSError, ValueError) as exc:
            if sock is not None:
                sock.close()
            raise _FastLineDown(str(exc)) from None
        with self._lock:
            if len(self._idle) < FAST_MAX_IDLE_CONNECTIONS:
                self._idle.append(sock)
                sock = None
        if sock is not None:
            sock.close()
        return code, data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = sock.recv(n, socket.MSG_WAITALL)
    if len(data) == n:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = sock.recv(n - got)
        if not more:
            raise ConnectionError("fast line closed mid-reply")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),          # retries are ours, bounded by the caller's deadline
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


class MasterChannel:
    """Calls master RPCs by name against an absolute deadline (`time.monotonic()` seconds)."""

    def __init__(self, address: str, *, fast: bool = True) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = cellar_pb2_grpc.MasterStub(self._channel)
        self._fence = EpochFence()
        self._use_fast = fast
        self._fast: _FastLine | None = None
        self._fast_relearn_at = 0.0  # when a lost fast line may be asked for again
        self._closed = False

    def call(self, method: str, request: Any, deadline: float) -> Any:
        fast = FAST_METHODS.get(method)
        if fast is not None and self._use_fast:
            line = self._fast
            if line is None and time.monotonic() >= self._fast_relearn_at:
                line = self._relearn(request, deadline)
            if line is not None:
                reply = self._call_fast(line, method, fast, request, deadline)
                if reply is not None:
                    return reply
        if method == "ClusterStatus":
            return self._call_grpc(method, request, deadline, learn=True)
        return self._call_grpc(method, request, deadline)

    def _call_fast(self, line: _FastLine, method: str, fast: tuple[int, Any], request: Any,
                   deadline: float) -> Any | None:
        """The reply over the fast line, or None when gRPC should carry the call."""
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise Timeout(f"{method} to master {self.address}: timed out")
        method_id, reply_cls = fast
        try:
            code, data = line.call(method_id, request.SerializeToString(), remaining_s)
        except TimeoutError:
            raise Timeout(f"{method} to master {self.address}: timed out") from None
        except _FastLineDown:
            self._fast = None
            self._fast_relearn_at = time.monotonic() + FAST_RELEARN_S
            line.close()
            return None
        if code != 0:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            if retryable_grpc(status):
                return None
            raise grpc_error(method, self.address, status, data.decode("utf-8", "replace"))
        reply = reply_cls.FromString(data)
        self._fence.check(int(reply.header.epoch), self.address)
        return reply

    def _relearn(self, request: Any, deadline: float) -> _FastLine | None:
        """Ask ClusterStatus for the fast line's port (once per FAST_RELEARN_S at most)."""
        self._fast_relearn_at = time.monotonic() + FAST_RELEARN_S
        try:
            self._call_grpc("ClusterStatus", pb.ClusterStatusRequest(header=request.header),
                            min(deadline, time.monotonic() + 1.0), learn=True)
        except Exception:  # noqa: BLE001 - the call itself will report through gRPC
            return None
        return self._fast

    def _learn(self, call: Any) -> None:
        port = 0
        try:
            for key, value in call.trailing_metadata() or ():
                if key == FAST_PORT_METADATA:
                    port = int(value)
        except (ValueError, TypeError, AttributeError):
            port = 0
        if not 0 < port < 65536 or self._closed:
            return
        host, _ = parse_host_port(self.address)
        line = self._fast
        if line is None or line.address != (host, port):
            self._fast = _FastLine(host.strip("[]"), port)
            if line is not None:
                line.close()

    def _call_grpc(self, method: str, request: Any, deadline: float, learn: bool = False) -> Any:
        rpc = getattr(self._stub, method)
        if learn and self._use_fast:
            rpc = rpc.with_call
        backoff_s = BACKOFF_FIRST_S
        last: grpc.RpcError | None = None
        for _attempt in range(MAX_RPC_ATTEMPTS):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            try:
                reply = rpc(request, timeout=remaining_s)
                if learn and self._use_fast:
                    reply, call = reply
                    self._learn(call)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                details = (exc.details() if hasattr(exc, "details") else "") or ""
                if not retryable_grpc(code):
                    raise grpc_error(method, self.address, code, details) from None
                last = exc
                if deadline - time.monotonic() <= backoff_s:
                    break
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
                continue
            self._fence.check(int(reply.header.epoch), self.address)
            return reply
        if last is None:
            raise Timeout(f"{method} to master {self.address}: timed out")
        details = (last.details() if hasattr(last, "details") else "") or "unreachable"
        raise Unavailable(f"{method} to master {self.address}: {details}")

    def close(self) -> None:
        self._closed = True
        line, self._fast = self._fast, None
        if line is not None:
            line.close()
        self._channel.close()
