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

The asyncio face will own a `grpc.aio` channel with the same options and the same mapping.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from cellar.client.core import EpochFence, grpc_error, retryable_grpc
from cellar.errors import Timeout, Unavailable
from cellar.proto import cellar_pb2_grpc

MAX_MESSAGE_BYTES = 4 << 20
MAX_RPC_ATTEMPTS = 64
BACKOFF_FIRST_S = 0.02
BACKOFF_MAX_S = 0.5

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

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = cellar_pb2_grpc.MasterStub(self._channel)
        self._fence = EpochFence()

    def call(self, method: str, request: Any, deadline: float) -> Any:
        rpc = getattr(self._stub, method)
        backoff_s = BACKOFF_FIRST_S
        last: grpc.RpcError | None = None
        for _attempt in range(MAX_RPC_ATTEMPTS):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            try:
                reply = rpc(request, timeout=remaining_s)
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
        self._channel.close()
