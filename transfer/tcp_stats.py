"""The data server's counters: bytes, requests by op, refusals by op and status, connections.

Each connection counts into its own `ConnectionCounters` (only its thread writes them, so no lock per
request); `DataServerStats.snapshot()` adds the live and the closed ones up under a lock for
the node's /metrics (storage_node/metrics.py). Connection refusals are counted by reason
(transfer/tcp_admission.py names them). It never blocks a connection for longer than one
dict update under its lock.
"""

from __future__ import annotations

import threading
from typing import Any

from cellar.transfer.frame import (
    OP_CLAIM,
    OP_COMMIT,
    OP_PING,
    OP_RDMA_CONNECT,
    OP_READ,
    OP_WRITE,
    STATUS_NAMES,
)
from cellar.transfer.tcp_admission import CONNECTION_REFUSAL_REASONS

OP_NAMES = {OP_READ: "read", OP_WRITE: "write", OP_PING: "ping", OP_COMMIT: "commit",
            OP_RDMA_CONNECT: "rdma_connect", OP_CLAIM: "claim"}


class ConnectionCounters:
    """One connection's counters; only its own thread writes them, so no lock per request."""

    __slots__ = ("bytes_in", "bytes_out", "requests", "errors")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.requests = [0] * (max(OP_NAMES) + 1)  # by op number; 0 = undecodable
        self.errors: dict[int, int] = {}

    def error(self, status: int, op: int = 0) -> None:
        key = op << 8 | status  # by op and status (op 0: undecodable)
        self.errors[key] = self.errors.get(key, 0) + 1

    def add_to(self, other: ConnectionCounters) -> None:
        other.bytes_in += self.bytes_in
        other.bytes_out += self.bytes_out
        for op, n in enumerate(self.requests):
            other.requests[op] += n
        for status, n in dict(self.errors).items():
            other.errors[status] = other.errors.get(status, 0) + n


class DataServerStats:
    """Counters for the node's /metrics: bytes in/out, requests by op, errors by status,
    connections. Connections count on their own; `snapshot()` adds them up under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = ConnectionCounters()
        self._live: set[ConnectionCounters] = set()
        self.active_connections = 0
        self.connections_total = 0
        self.connections_refused = 0
        self.refused_by_reason = dict.fromkeys(CONNECTION_REFUSAL_REASONS, 0)

    def opened(self) -> ConnectionCounters:
        c = ConnectionCounters()
        with self._lock:
            self._live.add(c)
            self.active_connections += 1
            self.connections_total += 1
        return c

    def closed(self, c: ConnectionCounters) -> None:
        with self._lock:
            self._live.discard(c)
            c.add_to(self._closed)
            self.active_connections -= 1

    def refused(self, reason: str) -> None:
        with self._lock:
            self.connections_refused += 1
            self.refused_by_reason[reason] += 1

    def snapshot(self) -> dict[str, Any]:
        total = ConnectionCounters()
        with self._lock:
            self._closed.add_to(total)
            for c in list(self._live):
                c.add_to(total)
            active, opened, refused = (self.active_connections, self.connections_total,
                                       self.connections_refused)
            by_reason = dict(self.refused_by_reason)
        by_status: dict[str, int] = {}
        by_op: dict[str, int] = {}
        for key, n in total.errors.items():
            status = STATUS_NAMES.get(key & 0xFF, str(key & 0xFF))
            by_status[status] = by_status.get(status, 0) + n
            op = f"{OP_NAMES.get(key >> 8, 'invalid')}/{status}"
            by_op[op] = by_op.get(op, 0) + n
        return {
            "bytes_in": total.bytes_in, "bytes_out": total.bytes_out,
            "requests": {name: total.requests[op] for op, name in OP_NAMES.items()}
            | {"invalid": total.requests[0]},  # headers that did not decode
            "errors": by_status, "errors_by_op": by_op,  # "write/bad grant": n
            "active_connections": active, "connections_total": opened,
            "connections_refused": refused, "connections_refused_by_reason": by_reason,
        }
